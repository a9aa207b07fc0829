"""BERT masked-LM pretraining: Post-LN with warmup against Pre-LN without warmup (Figure 5), and GLUE fine-tuning.

    KERAS_BACKEND=torch python pretrain_bert.py --sweep fig5                  # Figure 5(a) at CPU scale
    KERAS_BACKEND=torch python pretrain_bert.py --recipe pre-no-warmup        # one run, default corpus
    python pretrain_bert.py --preset base --corpus wiki/ books/ --recipe post-warmup   # the paper (GPUs)
    python pretrain_bert.py --finetune mrpc --glue-dir glue/ --init runs/fig5/post-warmup runs/fig5/pre-no-warmup

Xiong et al. 2020, Section 4: Post-LN BERT needs 10k warmup updates to lr 1e-4 (at 3e-4 it diverges);
Pre-LN trains from lr 3e-4 with no warmup, both with linear decay, and reaches Post-LN's validation
loss 40 % sooner (Figure 5(a)); fine-tuned on MRPC and RTE its checkpoints are ahead too (Figure 5(b, c)).
A run writes runs/NAME/{config.json, metrics.csv, checkpoints/stepN.keras, state.json, results.json,
curves.png, vocab/}; a sweep one directory per recipe and an overlay plot; fine-tuning results.csv.
"""

import argparse
import os
import sys

from harness import bert_data
from harness.cli import (
    Command,
    Mode,
    add_distribution_arguments,
    check_distribution_arguments,
    check_modes,
    flag_name,
    given_flags,
    preset_arguments,
    refuse_warmup_clash,
    run_script,
)
from harness.constants import NORMS, OPTIMIZERS
from harness.errors import OneLineParser, UsageError
from harness.experiments import BERT_SWEEPS, bert_sweep_runs
from harness.specs import FINETUNE, RECIPES, BertSpec
from harness.sweeps import run_sweep

PRESETS = BertSpec.PRESETS  # each value with its source: harness/specs.py


# --- command line ---------------------------------------------------------------------------------

def build_parser():
    p = OneLineParser(prog="pretrain_bert.py", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add = preset_arguments(PRESETS)  # a preset flag's help ends with its value at each preset
    add(p, "--preset", default="cpu", choices=tuple(PRESETS),
                   help="the defaults of the flags marked [preset: ...]: cpu (default: minutes on 2 cores), base "
                        "(BERT-base, for GPUs) or tiny (tests)")
    add(p, "--recipe", default="post-warmup", choices=tuple(RECIPES),
                   help="post-warmup (default: Post-LN, warmup to 1e-4) or pre-no-warmup (Pre-LN, 3e-4, no warmup); "
                        "both decay linearly; --norm, --lr, --warmup-updates, --no-warmup override")
    add(p, "--norm", choices=NORMS, help="LayerNorm placement (default: the recipe's: post-warmup post, "
                   "pre-no-warmup pre)")
    add(p, "--deepnorm-rule", default="paper", choices=("paper", "torchscale", "sgd", "adam", "lamb"),
                   help="DeepNorm constants for an encoder-only stack (layers.deepnorm_constants); default paper")
    group = p.add_argument_group("data")
    add(group, "--corpus", nargs="+", metavar="PATH", help="text files or directories in BERT's format "
                       "(one sentence a line, a blank line between documents; .gz and .bz2 too); default: the English "
                       "Wikipedia sample shipped in data/wikipedia")
    add(group, "--vocab-size", type=int, help="WordPiece vocabulary (BERT 30522)")
    add(group, "--vocab", metavar="FILE", help="use this tokenizer (RUN/vocab/wordpiece-*.json of another "
                       "run) instead of learning one: runs to compare share one vocabulary")
    add(group, "--seq-len", type=int, help="tokens per sequence (BERT 128)")
    add(group, "--nsp", action="store_true", help="next-sentence pairs and BERT's NSP head (default off)")
    add(group, "--valid-sequences", type=int, help="validation sequences evaluated (0 = all)")
    group = p.add_argument_group("model")
    for flag, text in (("--layers", "encoder blocks"), ("--d-model", "model width d"),
                       ("--heads", "attention heads"), ("--ffn-dim", "FFN inner width")):
        add(group, flag, type=int, help=text)
    add(group, "--dropout", type=float, help="dropout on embeddings and on each sub-layer's output")
    add(group, "--attention-dropout", type=float, help="dropout on the attention probabilities")
    add(group, "--activation", choices=("gelu_tanh", "gelu", "relu"),
                       help="FFN and masked-LM transform (BERT's gelu_tanh, the tanh approximation)")
    add(group, "--initializer", choices=("bert", "xavier"),
                       help="kernels: bert (truncated normal, std 0.02) or xavier (the translation model's)")
    add(group, "--layer-norm-epsilon", type=float, help="LayerNorm eps (BERT 1e-12)")
    group = p.add_argument_group("training")
    add(group, "--total-updates", "--total-num-update", "--steps", dest="steps", type=int, metavar="N",
        help="updates of the whole schedule: the linear decay reaches 0 there (BERT 1M)")
    add(group, "--max-updates", "--max-update", type=int, default=0, metavar="N", help="stop after this many updates (the schedule "
                       "still spans --total-updates); continue with --resume (default 0: no bound)")
    add(group, "--batch-size", type=int,
                       help=f"sequences per update (BERT 256; --finetune {FINETUNE['batch_size']})")
    add(group, "--lr", type=float, help="peak learning rate (default: the recipe's: post-warmup 1e-4, "
                       f"pre-no-warmup 3e-4; --finetune {FINETUNE['lr']:g})")
    add(group, "--warmup-updates", "--warmup-steps", dest="warmup_steps", type=int, metavar="N",
        help="linear warmup updates (paper 10000)")
    add(group, "--no-warmup", action="store_true", default=None,
                       help="no warmup: decay from the first update (default: the recipe's: pre-no-warmup has none)")
    add(group, "--optimizer", default="adam", choices=OPTIMIZERS,
                       help="adam (default; BERT's: AdamW with --adam-betas, --adam-epsilon, --weight-decay), sgd "
                            "or radam")
    add(group, "--adam-betas", type=float, nargs=2, metavar=("BETA1", "BETA2"),
                       help="Adam's betas (BERT 0.9 0.999)")
    add(group, "--adam-epsilon", type=float, help="Adam's epsilon (BERT 1e-6)")
    add(group, "--weight-decay", type=float, help="decoupled weight decay (BERT 0.01), never on LayerNorm "
                       "gamma / beta and biases")
    add(group, "--clip-norm", type=float, help="clip the global gradient norm (BERT 1.0; 0 = off)")
    add(group, "--seed", type=int, default=1, help="seed of the initialisation, dropout, masking and batch "
                       "order (default 1)")
    add(group, "--eval-every", type=int, help="updates between validation losses")
    add(group, "--log-every", type=int, default=50, metavar="UPDATES",
                       help="when the output is not a terminal, a progress line every UPDATES updates (0 = none; "
                            "default 50)")
    add(group, "--save-every", type=int, help="updates between checkpoints")
    group = p.add_argument_group("runs")
    add(group, "--out", "--save-dir", metavar="DIR", help="run directory (default runs/NAME)")
    add(group, "--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    add(group, "--sweep", choices=BERT_SWEEPS, help="fig5: Figure 5(a)'s two recipes (at the cpu preset each "
        "at the four rates of its protocol, results/protocols.md), an overlay plot and the speed-up")
    group = p.add_argument_group("fine-tuning (Figure 5(b, c); harness/glue.py)")
    add(group, "--finetune", metavar="TASK", choices=tuple(bert_data.GLUE_TASKS),
                       help="mrpc or rte: sentence-pair classification on GLUE")
    add(group, "--glue-dir", help="the task's train.tsv and dev.tsv (or a GLUE folder holding MRPC/, RTE/)")
    add(group, "--init", nargs="+", metavar="CHECKPOINT", help="pretraining checkpoints (.keras), or run "
                       "directories: all their checkpoints")
    add(group, "--seeds", type=int, default=6, help="fine-tuning runs per checkpoint (paper 6; default 6)")
    add(group, "--epochs", "--max-epoch", type=int, metavar="N", help=f"fine-tuning epochs (paper 3 to 8; default {FINETUNE['epochs']})")
    add_distribution_arguments(p)
    return p


def parse_command(argv=None):
    """The command line as a `cli.Command`: the run's spec, built once, and --sweep."""
    given = given_flags(build_parser, argv)
    sweep = given.pop("sweep", None)
    return Command(BertSpec.build(**given), sweep)


def parse_args(argv=None):
    """The spec of the run the command line describes (`BertSpec`: presets and the recipe resolved)."""
    return parse_command(argv).spec


# Besides pretraining, two modes: --sweep, and --finetune, which takes the rest from the pretraining checkpoints.
COMMAND_MODES = {
    "sweep": Mode("--sweep"),
    "finetune": Mode("--finetune mrpc|rte", ("glue_dir", "init", "seeds", "epochs"),
                     ("lr", "batch_size", "seed", "seq_len", "preset", "out"), "takes the model from --init"),
}


def check_mode(command):
    """Refuse, with one line, a command line that mixes pretraining, --sweep and --finetune, or gives
    two flags that contradict."""
    check_modes(COMMAND_MODES, set(command.spec.given) | ({"sweep"} if command.sweep else set()))
    refuse_warmup_clash(command.spec)


def check_args(command):
    """Refuse bad settings with one line (`UsageError`) before any work; `command` is a `cli.Command` or a spec."""
    if isinstance(command, Command):
        check_mode(command)
    args = command.spec if isinstance(command, Command) else command
    for name in ("layers", "d_model", "heads", "ffn_dim", "vocab_size", "batch_size", "steps", "eval_every",
                 "save_every", "seeds", "epochs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"{flag_name(name)} must be a positive integer, got {getattr(args, name)}")
    for name in ("max_updates", "warmup_steps", "valid_sequences", "log_every"):
        if getattr(args, name) < 0:
            raise UsageError(f"{flag_name(name)} must be >= 0, got {getattr(args, name)}")
    if not 8 <= args.seq_len <= 512:
        raise UsageError(f"--seq-len must be between 8 and 512 (BERT's positions), got {args.seq_len}")
    if not args.lr > 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    if args.d_model % args.heads:
        raise UsageError(f"--d-model {args.d_model} must be divisible by --heads {args.heads}")
    for name in ("dropout", "attention_dropout"):
        if not 0 <= getattr(args, name) < 1:
            raise UsageError(f"{flag_name(name)} must be in [0, 1), got {getattr(args, name)}")
    if args.weight_decay < 0 or args.clip_norm < 0:
        raise UsageError("--weight-decay and --clip-norm must be >= 0")
    if not all(0 <= beta < 1 for beta in args.adam_betas):
        raise UsageError(f"--adam-betas must be in [0, 1), got {' '.join(map(str, args.adam_betas))}")
    if not args.adam_epsilon > 0 or not args.layer_norm_epsilon > 0:
        raise UsageError("--adam-epsilon and --layer-norm-epsilon must be positive")
    check_distribution_arguments(args)
    if args.finetune is not None and (not args.glue_dir or not args.init):
        raise UsageError("--finetune needs --glue-dir (the task's train.tsv and dev.tsv) and --init CHECKPOINT...")


# --- running --------------------------------------------------------------------------------------

def run(command):
    """What the command line asks for: --sweep fig5 (its runs each in a process of its own,
    `harness.sweeps`), or one run on the Keras side (harness/bert_job.py), which is imported here: once
    run_script has checked KERAS_BACKEND, so that --help and the rest of this file need no backend."""
    if command.sweep:
        runs = bert_sweep_runs(command.sweep, command.spec)
        for run in runs:
            check_args(run.spec)
        return run_sweep("bert", command.sweep, runs, default_out(command), 1, command.spec.resume)
    from harness import bert_job  # the one import inside a function (harness/cli.py says why)

    return bert_job.run(command.spec, default_out(command), command.spec.name())


def default_out(command):
    """The directory a command writes: --out, or one under runs/ named after the job."""
    args = command.spec if isinstance(command, Command) else command
    sweep = command.sweep if isinstance(command, Command) else None
    return args.out or os.path.join("runs", f"finetune-{args.finetune}" if args.finetune else
                                    f"sweep-{sweep}-{args.preset}" if sweep else args.name())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_script("pretrain_bert.py", argv, parse_command, check_args, run, out_dir=default_out)


if __name__ == "__main__":
    sys.exit(main())
