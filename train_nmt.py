"""IWSLT14-style translation with Post-LN, Pre-LN or DeepNorm: the warmup experiments (Figures 2 and 4).

    KERAS_BACKEND=jax python train_nmt.py --norm pre --no-warmup         # minutes on a CPU, default data
    KERAS_BACKEND=jax python train_nmt.py --norm post --sweep fig2       # Figure 2 at CPU scale
    python train_nmt.py --prepare-iwslt14 de-en.tgz --data-dir data/iwslt14 --preset iwslt --norm post
    python train_nmt.py --prepare-wmt14 wmt14-archives/ --data-dir data/wmt14 --preset wmt14 --norm pre --no-warmup

Xiong et al. 2020: Post-LN needs the learning-rate warmup (Section 3.2, Figure 2); Pre-LN trains
without it (Section 4, Figure 4). Each run writes runs/NAME/{config.json, metrics.csv, checkpoints/,
results.json, curves.png}; a sweep writes one directory per run and an overlay plot.

This file is the command line (flags, presets, checks, sweeps), without Keras; harness/nmt_job.py is the
Keras side of the job (data, model, training, test BLEU).
"""

import argparse
import os
import sys

from harness import nmt_data, wmt14
from harness.cli import (
    Command,
    Mode,
    add_distribution_arguments,
    check_decoding,
    check_distribution_arguments,
    check_modes,
    flag_name,
    given_flags,
    int_list,
    preset_arguments,
    refuse_warmup_clash,
    run_script,
)
from harness.constants import MAX_LEN, NORMS, OPTIMIZERS, QKV_INITS, SCHEDULES
from harness.errors import OneLineParser, UsageError
from harness.experiments import SWEEPS, sweep_runs
from harness.specs import TranslationSpec
from harness.sweeps import run_sweep

PRESETS = TranslationSpec.PRESETS  # each value with its source: harness/specs.py


# --- command line ---------------------------------------------------------------------------------

def build_parser():
    p = OneLineParser(prog="train_nmt.py", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add = preset_arguments(PRESETS)  # a preset flag's help ends with its value at each preset
    add(p, "--norm", choices=NORMS, help="LayerNorm placement: post (default; --benchmark: pre), pre or "
                   "deepnorm (the paper's Table 1; DeepNet)")
    add(p, "--deepnorm-rule", default="paper", choices=("paper", "torchscale"),
                   help="DeepNorm constants of an encoder-decoder: the paper's Table 1 (encoder beta 0.87 (N^4 M)^(-1/16)) "
                        "or the authors' torchscale code (1.15 (N^4 M)^(-1/16)); default paper")
    add(p, "--qkv-init", default="toolkit", choices=tuple(QKV_INITS),
                   help="the Xavier gain on W^Q, W^K, W^V: toolkit (default; 1/sqrt(2), as fairseq and torchscale "
                        "train) or theory (1, as the papers' analyses assume); W^O and the FFN keep gain 1, and "
                        "DeepNorm's beta scales W^V, W^O, W^1, W^2 on top")
    add(p, "--preset", default="cpu", choices=tuple(PRESETS),
                   help="the defaults of the flags marked [preset: ...]: cpu (default: minutes on 2 cores), iwslt "
                   "(the paper's IWSLT14), wmt14 (the paper's WMT14 En-De, en -> de) or tiny (tests)")
    group = p.add_argument_group("data")
    add(group, "--corpus", choices=nmt_data.CORPORA, default="multi30k",
                       help="built-in corpus when no --data-dir: multi30k (default, real captions, data/multi30k), "
                       "ding (Debian's trans-de-en) or synthetic (a generated toy task, for fast tests)")
    add(group, "--data-dir", help="fairseq layout {train,valid,test}.{src,tgt}; overrides --corpus")
    add(group, "--src", help="source language")
    add(group, "--tgt", help="target language")
    add(group, "--prepare-iwslt14", metavar="ARCHIVE", help="raw IWSLT14 de-en.tgz -> --data-dir (prepare-iwslt14.sh)")
    add(group, "--prepare-wmt14", metavar="ARCHIVE_DIR",
                       help="directory of the WMT14 archives -> --data-dir (prepare-wmt14en2de.sh; harness/wmt14.py)")
    add(group, "--wmt14-valid", choices=wmt14.VALID_CHOICES, default="newstest2013",
                       help="--prepare-wmt14's validation set: newstest2013 (default, the paper's) or split (the "
                       "script's: every 100th training pair)")
    add(group, "--vocab-size", type=int, help="joint BPE vocabulary (paper 10000)")
    add(group, "--dictionaries", choices=nmt_data.DICTIONARIES,
                       help="joint: one vocabulary of both sides, one embedding for encoder, decoder and output; "
                            "separate: a vocabulary per side, the decoder's embedding shared with the output "
                            "(fairseq's IWSLT'14 recipe)")
    add(group, "--max-tokens", type=int, help="tokens per batch: rows x padded length (paper 4096)")
    add(group, "--batching", choices=nmt_data.BATCHINGS,
                       help="packed (default): several sentence pairs to a row, attention kept within each pair, "
                       "one batch shape (one compiled step); grid: fairseq's batches, one pair a row, padded to "
                       "a length grid (about 20 shapes). --resume keeps the run's own (grid for runs from before "
                       "packing)")
    add(group, "--valid-sentences", type=int, help="validation sentences decoded for BLEU each epoch (0 = all)")
    add(group, "--test-sentences", type=int, default=0, metavar="N",
                       help="decode only the first N test sentences for test BLEU: a quick check, not the paper's "
                            "number (default 0: all)")
    group = p.add_argument_group("model")
    for flag, text in (("--d-model", "model width d"), ("--ffn-dim", "FFN inner width"),
                       ("--heads", "attention heads"), ("--encoder-layers", "encoder blocks N"),
                       ("--decoder-layers", "decoder blocks M")):
        add(group, flag, type=int, help=text)
    for flag, text in (("--dropout", "dropout on embeddings and on each sub-layer's output"),
                       ("--attention-dropout", "dropout on the attention probabilities"),
                       ("--activation-dropout", "dropout inside the FFN, after its ReLU")):
        add(group, flag, type=float, help=text)
    group = p.add_argument_group("training")
    add(group, "--epochs", "--max-epoch", type=int, metavar="N", help="passes over the training data")
    add(group, "--max-updates", "--max-update", type=int, default=0, metavar="N",
                       help="stop after this many updates (0 = no bound)")
    add(group, "--log-every", type=int, default=50, metavar="UPDATES",
                       help="when the output is not a terminal, a progress line every UPDATES updates (0 = none; "
                            "default 50)")
    add(group, "--eval-every", type=int, metavar="UPDATES",
                       help="validate every UPDATES updates as well as at the end of each epoch (0 = only then)")
    add(group, "--backup-every", type=int, default=0, metavar="UPDATES",
                       help="also back up the run (checkpoints/backup.keras) every UPDATES updates within an epoch, "
                            "so that --resume continues mid-epoch (0 = only the epoch checkpoints; default)")
    add(group, "--patience", type=int, default=0, metavar="VALIDATIONS",
                       help="stop training once this many validations in a row have not lowered the best validation "
                            "loss by --min-delta: trained to its plateau (0 = off; default)")
    add(group, "--min-delta", type=float, default=0.01, metavar="NATS",
                       help="with --patience: the improvement in validation loss that counts (default 0.01)")
    add(group, "--optimizer", default="adam", choices=OPTIMIZERS,
                       help="adam (default; betas 0.9, 0.98, as the paper), sgd (plain, Figure 2) or radam (Figure 4)")
    add(group, "--lr", type=float, help="peak learning rate (paper 5e-4 or 1e-3; cpu preset 1e-3)")
    add(group, "--schedule", choices=SCHEDULES, help="default: inverse_sqrt with warmup; with --no-warmup step (x0.1 after --decay-epoch; "
                            "preset wmt14: decay_then_inverse_sqrt); "
                            "decay_then_inverse_sqrt: constant until --decay-epoch, then x --decay-factor and inverse sqrt")
    add(group, "--warmup-updates", "--warmup-steps", dest="warmup_steps", type=int, metavar="N",
                       help="linear warmup updates (paper 4000)")
    add(group, "--no-warmup", action="store_true",
                       help="no warmup: the full rate from the first update; unless --schedule is given, this also "
                            "switches the schedule to step decay (x0.1 after --decay-epoch; preset wmt14: "
                            "decay_then_inverse_sqrt), Section 4's recipe; with --schedule inverse_sqrt, the "
                            "paper's warmup = 1")
    add(group, "--decay-epoch", type=int, help="epoch after which step/decay schedules decay (paper 8; "
                       "WMT14 6)")
    add(group, "--decay-factor", type=float,
                       help="the drop at --decay-epoch: default 0.1 for step (Section 4), 1 for decay_then_inverse_sqrt "
                            "(the 35.5-BLEU setting: inverse sqrt from update 8000, no drop)")
    add(group, "--weight-decay", type=float,
                       help="decoupled weight decay (iwslt: 1e-4, fairseq's recipe)")
    add(group, "--clip-norm", type=float, default=0.0, help="clip the global gradient norm (0 = off)")
    add(group, "--label-smoothing", type=float, default=0.1,
                       help="label-smoothed cross entropy (paper and fairseq 0.1; default 0.1)")
    add(group, "--seed", type=int, default=1, help="seed of the initialisation, dropout and batch order "
                       "(default 1)")
    group = p.add_argument_group("decoding", "for validation and test BLEU, --eval-only and --translate (which "
                                 "takes the run's own settings from its config.json unless given)")
    add(group, "--beam", type=int, help="beam size for test BLEU (1 = greedy; default 5, or the run's "
                       "own with --translate)")
    add(group, "--lenpen", type=float, help="length penalty: score / length^lenpen (default 1.2, or the "
                       "run's own with --translate)")
    add(group, "--max-len-a", type=float, metavar="A",
                       help="at most A x source length + B tokens before EOS (fairseq-generate's --max-len-a; default 0)")
    add(group, "--max-len-b", type=int, metavar="B", help="see --max-len-a (fairseq-generate's --max-len-b; "
                       f"default 200; at most {MAX_LEN} tokens in any case)")
    add(group, "--min-len", type=int, help="at least this many tokens before EOS (fairseq-generate's --min-len; "
                       "default 1: no empty translation)")
    add(group, "--unkpen", type=float, help="<unk> penalty: log p(<unk>) - UNKPEN (fairseq-generate's --unkpen; "
                       "default 0; inf never generates <unk>)")
    add(group, "--eval-only", metavar="RUN_OR_CHECKPOINT", help="only decode the test set with a run directory's "
                       "newest checkpoint (or this checkpoint), on the data the run trained on (its config.json) "
                       "unless data flags are given; writes RUN/eval.json")
    add(group, "--translate", metavar="RUN_OR_CHECKPOINT",
                       help="translate source lines from standard input (or --input) with a run directory's newest "
                       "checkpoint, or a checkpoint of one: one output line per input line on standard output")
    add(group, "--input", metavar="FILE", help="--translate: read source lines from FILE, not standard input")
    group = p.add_argument_group("runs")
    add(group, "--out", "--save-dir", metavar="DIR", help="run directory (default runs/NAME)")
    add(group, "--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    add(group, "--sweep", choices=SWEEPS, help="run one of the papers' comparisons (harness/experiments.py): fig2, "
                       "fig4 or depth; one run directory each under --out, a results table and plots")
    add(group, "--runs", type=_name_list, metavar="NAME,...",
                       help="--sweep: only these runs of the sweep's plan (default all; the names are its run directories)")
    add(group, "--depths", type=int_list, metavar="L,L,...",
                       help="--sweep depth: layers per stack (default: cpu 6,12; iwslt and wmt14 6,12,24,48)")
    add(group, "--jobs", type=int, default=1,
                       help="--sweep: runs at a time, each in its own process with cores / jobs threads (default 1)")
    add(group, "--benchmark", type=int, default=0, metavar="STEPS",
                       help="time STEPS train steps of the plain-PyTorch reference's workload (bench/torch_reference.py) "
                       "and print one JSON line")
    add(group, "--benchmark-sentences", type=int, default=128, metavar="N",
                       help="sentences per benchmark batch (the reference's 128; more to fill a GPU)")
    add(group, "--peak-tflops", type=float, metavar="TFLOPS",
                       help="--benchmark: the device's peak TFLOP/s for the step's matrix-product dtype, for MFU "
                       "(model FLOP rate / peak); default: the table PEAK_TFLOPS (H100, H200), none on a CPU")
    add_distribution_arguments(p)
    return p


def _name_list(text):
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names no run; give comma-separated run names, e.g. "
                                         "post-warmup-lr1e-3,post-nowarmup-lr1e-3")
    return names


SWEEP_FLAGS = ("sweep", "runs", "depths", "jobs")  # the sweep's own flags: not part of any run's spec


def parse_command(argv=None):
    """The command line as a `cli.Command`: the run's spec, built once, and the sweep's own flags."""
    given = given_flags(build_parser, argv)
    sweep = {k: given.pop(k) for k in SWEEP_FLAGS if k in given}
    return Command(TranslationSpec.build(**given), sweep.get("sweep"), sweep.get("runs") and tuple(sweep["runs"]),
                   sweep.get("depths") and tuple(sweep["depths"]), sweep.get("jobs", 1))


def parse_args(argv=None):
    """The spec of the run the command line describes (`TranslationSpec`), without a sweep's own flags."""
    return parse_command(argv).spec


# One mode per command line: besides training, these (their own flags, and the others each takes).
DECODING_FLAGS = ("beam", "lenpen", "max_len_a", "max_len_b", "min_len", "unkpen")
COMMAND_MODES = {
    "sweep": Mode("--sweep", ("runs", "depths", "jobs")),
    "translate": Mode("--translate", ("input",), DECODING_FLAGS,
                      "takes the run's own settings and only decoding flags"),
    "eval_only": Mode("--eval-only", (), DECODING_FLAGS + ("preset", "corpus", "data_dir", "src", "tgt", "vocab_size",
                                                         "dictionaries", "max_tokens", "test_sentences", "seed"),
                      "takes the model from its checkpoint and only data and decoding flags"),
    "benchmark": Mode("--benchmark", ("benchmark_sentences", "peak_tflops"),
                      ("preset", "norm", "deepnorm_rule", "qkv_init", "vocab_size", "d_model", "ffn_dim", "heads",
                       "encoder_layers", "decoder_layers", "dropout", "attention_dropout", "activation_dropout",
                       "optimizer", "lr", "weight_decay", "clip_norm", "label_smoothing", "seed"),
                      "times train steps of one model: only model and optimizer flags"),
}


def check_mode(command):
    """Refuse, with one line, a command line that asks for two modes (train, --sweep, --translate,
    --eval-only, --benchmark), a flag of a mode it does not ask for, or two flags that contradict."""
    spec, given = command.spec, set(command.spec.given)
    given |= {dest for dest, value in (("runs", command.runs), ("depths", command.depths)) if value}
    given |= {"sweep"} if command.sweep else set()
    given |= {"jobs"} if command.jobs != 1 else set()
    check_modes(COMMAND_MODES, given, [d for d in COMMAND_MODES if d in given and (d != "benchmark" or spec.benchmark)])
    if "depths" in given and command.sweep != "depth":
        raise UsageError(f"--depths sets the depths of --sweep depth, not of --sweep {command.sweep}")
    if "wmt14_valid" in given and not spec.prepare_wmt14:
        raise UsageError("--wmt14-valid chooses --prepare-wmt14's validation set; add --prepare-wmt14 ARCHIVE_DIR")
    if spec.prepare_iwslt14 and spec.prepare_wmt14:
        raise UsageError("--prepare-iwslt14 and --prepare-wmt14 both write --data-dir; pass one of them")
    refuse_warmup_clash(spec)


def check_args(command):
    """Refuse bad settings with one line (`UsageError`) before any work; `command` is a `cli.Command` or a spec."""
    if isinstance(command, TranslationSpec):
        command = Command(command)
    else:  # a command line, not one of a sweep's runs: one mode, and no flag that contradicts another
        check_mode(command)
    args = command.spec
    if command.runs:
        names = [run.name for run in sweep_runs(command.sweep, args, command.depths)]
        unknown = [name for name in command.runs if name not in names]
        if unknown:
            raise UsageError(f"--runs {','.join(unknown)}: not in the {command.sweep} sweep at --preset {args.preset}; "
                             f"choose from {', '.join(names)}")
    if command.jobs < 1:
        raise UsageError(f"--jobs must be a positive number of runs at a time, got {command.jobs}")
    positive = ("d_model", "ffn_dim", "heads", "encoder_layers", "decoder_layers", "epochs", "max_tokens",
                "vocab_size", "beam", "decay_epoch")
    for name in positive:
        if getattr(args, name) < 1:
            raise UsageError(f"{flag_name(name)} must be a positive integer, got {getattr(args, name)}")
    for name in ("max_updates", "warmup_steps", "valid_sentences", "test_sentences", "eval_every", "log_every",
                 "backup_every", "patience", "min_delta"):
        if getattr(args, name) < 0:
            raise UsageError(f"{flag_name(name)} must be >= 0, got {getattr(args, name)}")
    if not args.lr > 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    if args.d_model % args.heads:
        raise UsageError(f"--d-model {args.d_model} must be divisible by --heads {args.heads}")
    for name in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
        if not 0 <= getattr(args, name) < 1:
            raise UsageError(f"{flag_name(name)} must be in [0, 1), got {getattr(args, name)}")
    check_distribution_arguments(args)
    if args.benchmark < 0:
        raise UsageError(f"--benchmark must be a positive number of steps, got {args.benchmark}")
    if args.benchmark_sentences < 1:
        raise UsageError(f"--benchmark-sentences must be a positive number, got {args.benchmark_sentences}")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise UsageError(f"--peak-tflops must be a positive number of TFLOP/s, got {args.peak_tflops}")
    if args.weight_decay < 0 or args.clip_norm < 0 or args.decay_factor <= 0 or args.lenpen < 0:
        raise UsageError("--weight-decay, --clip-norm and --lenpen must be >= 0 and --decay-factor > 0")
    check_decoding(args)


# --- sweeps and runs ------------------------------------------------------------------------------

def sweep(command):
    """--sweep NAME: the experiment's runs (`experiments.sweep_runs`), one run directory each under the
    sweep's directory, then its table and plots (`sweeps.run_sweep`)."""
    runs = sweep_runs(command.sweep, command.spec, command.depths)
    if command.runs:  # names checked by check_args
        runs = tuple(run for run in runs if run.name in command.runs)
    for run in runs:
        check_args(run.spec)  # every run's settings are checked before the first one starts
    return run_sweep("translation", command.sweep, runs, default_out(command), command.jobs, command.spec.resume)


def run(command):
    """What the command line asks for, on the Keras side (harness/nmt_job.py), which is imported here: once
    run_script has checked KERAS_BACKEND, so that --help and the rest of this file need no backend."""
    if command.sweep:
        return sweep(command)
    from harness import nmt_job  # the one import inside a function (harness/cli.py says why)

    return nmt_job.run(command.spec, default_out(command), PRESETS)


def default_out(command):
    """The directory a command writes: --out, or one under runs/ named after the job."""
    spec = command.spec
    return spec.out or os.path.join("runs", f"sweep-{command.sweep}-{spec.preset}" if command.sweep else spec.name())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_script("train_nmt.py", argv, parse_command, check_args, run,
                      out_dir=lambda c: None if c.spec.benchmark or c.spec.eval_only or c.sweep or c.spec.translate
                      else default_out(c))


if __name__ == "__main__":
    sys.exit(main())
