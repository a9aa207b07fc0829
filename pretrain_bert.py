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
import json
import os
import sys

from harness import bert_data
from harness.cli import add_distribution_arguments, check_distribution_arguments, run_script, show_presets
from harness.constants import NORMS, OPTIMIZERS
from harness.errors import OneLineParser, UsageError
from harness.files import holds_run, is_finite, prepare_out_dir, read_csv, write_csv, write_json
from harness.plots import bert_loss_panels, plot_panels
from harness.provenance import code_version
from harness.sweeps import strip_flags

# Devlin et al. 2019's BERT recipe, which the paper follows (Section 4, Appendix A): every preset has it.
DEVLIN = dict(
    # google-research/bert optimization.py create_optimizer: AdamWeightDecayOptimizer(weight_decay_rate=0.01,
    # beta_1=0.9, beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]).
    adam_betas=(0.9, 0.999),
    adam_epsilon=1e-6,
    weight_decay=0.01,  # decoupled (lr * 0.01 * w), and not on LayerNorm gamma / beta or biases: optimizer_flags.NO_DECAY
    clip_norm=1.0,  # harness/optimizer_flags.py: tf.clip_by_global_norm(grads, clip_norm=1.0)
    layer_norm_epsilon=1e-12,  # modeling.py layer_norm: tf.contrib.layers.layer_norm, variance epsilon 1e-12
    activation="gelu_tanh",  # modeling.py gelu: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    initializer="bert",  # modeling.py create_initializer: truncated normal, std initializer_range = 0.02
)
PRESETS = {
    # BERT-base (Devlin et al.; the paper's Appendix A): 12 layers, 768, 12 heads, FFN 3072, batches of
    # 256 sequences of 128 tokens, 1M updates, 10k warmup. For GPUs and a real corpus (--corpus).
    "base": dict(DEVLIN, layers=12, d_model=768, heads=12, ffn_dim=3072, dropout=0.1, attention_dropout=0.1,
                 vocab_size=30522, seq_len=128, batch_size=256, steps=1_000_000, warmup_steps=10_000,
                 eval_every=10_000, save_every=100_000, valid_sequences=4096),
    # Minutes on 2 CPU cores on the default corpus (about 5,300 training sequences of 128 tokens, so
    # 300 updates are under 2 epochs). The warmup keeps its role, a short start of the run, at 10 %.
    "cpu": dict(DEVLIN, layers=4, d_model=128, heads=4, ffn_dim=512, dropout=0.1, attention_dropout=0.1,
                vocab_size=8000, seq_len=128, batch_size=32, steps=300, warmup_steps=30,
                eval_every=25, save_every=100, valid_sequences=0),
    # For tests.
    "tiny": dict(DEVLIN, layers=2, d_model=32, heads=2, ffn_dim=64, dropout=0.0, attention_dropout=0.0,
                 vocab_size=300, seq_len=32, batch_size=8, steps=4, warmup_steps=2,
                 eval_every=2, save_every=2, valid_sequences=16),
}
RECIPES = {
    # Section 4: "Post-LN: 10k warmup steps to lr_max 1e-4, then linear decay".
    "post-warmup": dict(norm="post", lr=1e-4, no_warmup=False),
    # Section 4: "Pre-LN: linear decay from 3e-4 without warmup".
    "pre-no-warmup": dict(norm="pre", lr=3e-4, no_warmup=True),
}
# GLUE fine-tuning (Appendix A: batch 16 or 32, lr 1e-5 to 1e-4, 3 to 8 epochs, 6 seeds); explicit flags win.
FINETUNE = dict(lr=5e-5, batch_size=32, epochs=3)
SWEEPS = {"fig5": [("post-warmup", ["--recipe", "post-warmup"]),
                   ("pre-no-warmup", ["--recipe", "pre-no-warmup", "--no-warmup"])]}


# --- command line ---------------------------------------------------------------------------------

def build_parser():
    p = OneLineParser(prog="pretrain_bert.py", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cpu", choices=tuple(PRESETS),
                   help="the defaults of the flags marked [preset: ...]: cpu (default: minutes on 2 cores), base "
                        "(BERT-base, for GPUs) or tiny (tests)")
    p.add_argument("--recipe", default="post-warmup", choices=tuple(RECIPES),
                   help="post-warmup (default: Post-LN, warmup to 1e-4) or pre-no-warmup (Pre-LN, 3e-4, no warmup); "
                        "both decay linearly; --norm, --lr, --warmup-steps, --no-warmup override")
    p.add_argument("--norm", choices=NORMS, help="LayerNorm placement (default: the recipe's: post-warmup post, "
                   "pre-no-warmup pre)")
    p.add_argument("--deepnorm-rule", default="paper", choices=("paper", "torchscale", "sgd", "adam", "lamb"),
                   help="DeepNorm constants for an encoder-only stack (layers.deepnorm_constants); default paper")
    group = p.add_argument_group("data")
    group.add_argument("--corpus", nargs="+", metavar="PATH", help="text files or directories in BERT's format "
                       "(one sentence a line, a blank line between documents); default: gensim's Wikipedia sample")
    group.add_argument("--vocab-size", type=int, help="WordPiece vocabulary (BERT 30522)")
    group.add_argument("--vocab", metavar="FILE", help="use this tokenizer (RUN/vocab/wordpiece-*.json of another "
                       "run) instead of learning one: runs to compare share one vocabulary")
    group.add_argument("--seq-len", type=int, help="tokens per sequence (BERT 128)")
    group.add_argument("--nsp", action="store_true", help="next-sentence pairs and BERT's NSP head (default off)")
    group.add_argument("--valid-sequences", type=int, help="validation sequences evaluated (0 = all)")
    group = p.add_argument_group("model")
    for flag, text in (("--layers", "encoder blocks"), ("--d-model", "model width d"),
                       ("--heads", "attention heads"), ("--ffn-dim", "FFN inner width")):
        group.add_argument(flag, type=int, help=text)
    group.add_argument("--dropout", type=float, help="dropout on embeddings and on each sub-layer's output")
    group.add_argument("--attention-dropout", type=float, help="dropout on the attention probabilities")
    group.add_argument("--activation", choices=("gelu_tanh", "gelu", "relu"),
                       help="FFN and masked-LM transform (BERT's gelu_tanh, the tanh approximation)")
    group.add_argument("--initializer", choices=("bert", "xavier"),
                       help="kernels: bert (truncated normal, std 0.02) or xavier (the translation model's)")
    group.add_argument("--layer-norm-epsilon", type=float, help="LayerNorm eps (BERT 1e-12)")
    group = p.add_argument_group("training")
    group.add_argument("--steps", type=int, help="updates; the linear decay reaches 0 there (BERT 1M)")
    group.add_argument("--max-updates", type=int, default=0, help="stop after this many updates (the schedule "
                       "still spans --steps); continue with --resume (default 0: no bound)")
    group.add_argument("--batch-size", type=int,
                       help=f"sequences per update (BERT 256; --finetune {FINETUNE['batch_size']})")
    group.add_argument("--lr", type=float, help="peak learning rate (default: the recipe's: post-warmup 1e-4, "
                       f"pre-no-warmup 3e-4; --finetune {FINETUNE['lr']:g})")
    group.add_argument("--warmup-steps", type=int, help="linear warmup updates (paper 10000)")
    group.add_argument("--no-warmup", action="store_true", default=None,
                       help="no warmup: decay from the first update (default: the recipe's: pre-no-warmup has none)")
    group.add_argument("--optimizer", default="adam", choices=OPTIMIZERS,
                       help="adam (default; BERT's: AdamW with --adam-betas, --adam-epsilon, --weight-decay), sgd "
                            "or radam")
    group.add_argument("--adam-betas", type=float, nargs=2, metavar=("BETA1", "BETA2"),
                       help="Adam's betas (BERT 0.9 0.999)")
    group.add_argument("--adam-epsilon", type=float, help="Adam's epsilon (BERT 1e-6)")
    group.add_argument("--weight-decay", type=float, help="decoupled weight decay (BERT 0.01), never on LayerNorm "
                       "gamma / beta and biases")
    group.add_argument("--clip-norm", type=float, help="clip the global gradient norm (BERT 1.0; 0 = off)")
    group.add_argument("--seed", type=int, default=1, help="seed of the initialisation, dropout, masking and batch "
                       "order (default 1)")
    group.add_argument("--eval-every", type=int, help="updates between validation losses")
    group.add_argument("--log-every", type=int, default=50, metavar="UPDATES",
                       help="when the output is not a terminal, a progress line every UPDATES updates (0 = none; "
                            "default 50)")
    group.add_argument("--save-every", type=int, help="updates between checkpoints")
    group = p.add_argument_group("runs")
    group.add_argument("--out", help="run directory (default runs/NAME)")
    group.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    group.add_argument("--sweep", choices=tuple(SWEEPS), help="fig5: both recipes, an overlay plot and the speed-up")
    group = p.add_argument_group("fine-tuning (Figure 5(b, c); harness/glue.py)")
    group.add_argument("--finetune", metavar="TASK", choices=tuple(bert_data.GLUE_TASKS),
                       help="mrpc or rte: sentence-pair classification on GLUE")
    group.add_argument("--glue-dir", help="the task's train.tsv and dev.tsv (or a GLUE folder holding MRPC/, RTE/)")
    group.add_argument("--init", nargs="+", metavar="CHECKPOINT", help="pretraining checkpoints (.keras), or run "
                       "directories: all their checkpoints")
    group.add_argument("--seeds", type=int, default=6, help="fine-tuning runs per checkpoint (paper 6; default 6)")
    group.add_argument("--epochs", type=int, help=f"fine-tuning epochs (paper 3 to 8; default {FINETUNE['epochs']})")
    add_distribution_arguments(p)
    show_presets(p, PRESETS)  # each preset-dependent flag shows its default at every preset
    return p


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    recipe = RECIPES[args.recipe]
    defaults = {"norm": recipe["norm"], "lr": recipe["lr"], **(FINETUNE if args.finetune else {})}
    if args.no_warmup is None:  # an explicit --warmup-steps turns the warmup on, even in pre-no-warmup
        args.no_warmup = recipe["no_warmup"] and args.warmup_steps is None
    for key, value in {**PRESETS[args.preset], **defaults}.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def check_args(args):
    for name in ("layers", "d_model", "heads", "ffn_dim", "vocab_size", "batch_size", "steps", "eval_every",
                 "save_every", "seeds", "epochs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    for name in ("max_updates", "warmup_steps", "valid_sequences", "log_every"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not 8 <= args.seq_len <= 512:
        raise UsageError(f"--seq-len must be between 8 and 512 (BERT's positions), got {args.seq_len}")
    if not args.lr > 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    if args.d_model % args.heads:
        raise UsageError(f"--d-model {args.d_model} must be divisible by --heads {args.heads}")
    for name in ("dropout", "attention_dropout"):
        if not 0 <= getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(args, name)}")
    if args.weight_decay < 0 or args.clip_norm < 0:
        raise UsageError("--weight-decay and --clip-norm must be >= 0")
    if not all(0 <= beta < 1 for beta in args.adam_betas):
        raise UsageError(f"--adam-betas must be in [0, 1), got {' '.join(map(str, args.adam_betas))}")
    if not args.adam_epsilon > 0 or not args.layer_norm_epsilon > 0:
        raise UsageError("--adam-epsilon and --layer-norm-epsilon must be positive")
    check_distribution_arguments(args)
    if args.finetune is not None:
        if not args.glue_dir or not args.init:
            raise UsageError("--finetune needs --glue-dir (the task's train.tsv and dev.tsv) and --init CHECKPOINT...")
    elif args.init or args.glue_dir:
        raise UsageError("--init and --glue-dir go with --finetune mrpc|rte")


def run_name(args):
    warm = "nowarmup" if args.no_warmup else f"warmup{args.warmup_steps}"
    return f"bert-{args.norm}-{warm}-lr{args.lr:g}-{args.preset}"


# --- Figure 5(a): the sweep -----------------------------------------------------------------------

def first_reaching(rows, target):
    """The first update whose validation loss is at most `target`, or None."""
    return next((int(r["updates"]) for r in rows if is_finite(r["valid_loss"]) and float(r["valid_loss"]) <= target),
                None)


def speedup(post_rows, pre_rows, unigram_entropy=None):
    """Figure 5(a)'s measure: the update at which Pre-LN first reaches Post-LN's final validation loss.

    ratio = (update at which Post-LN reaches it) / (update at which Pre-LN does), speed-up = ratio - 1;
    the paper: 700k / 500k = 1.4, a 40 % speed-up. `unigram_entropy` is recorded beside the target loss:
    a target above it is reached by a model that has learned little more than word frequencies.
    """
    finite = [r for r in post_rows if is_finite(r["valid_loss"])]
    if not finite:
        return dict(target_loss=None, post_update=None, pre_update=None, ratio=None, speedup=None,
                    unigram_entropy=unigram_entropy)
    target = float(finite[-1]["valid_loss"])
    post, pre = first_reaching(post_rows, target), first_reaching(pre_rows, target)
    return dict(target_loss=target, post_update=post, pre_update=pre, ratio=post / pre if pre else None,
                speedup=post / pre - 1 if pre else None, unigram_entropy=unigram_entropy)


def sweep(args, argv, train):
    """Figure 5(a): both recipes (`train(args)` trains one run here), an overlay plot, the speed-up."""
    out = prepare_out_dir(default_out(args))
    base = strip_flags(argv, {"--sweep": 1, "--out": 1, "--recipe": 1, "--norm": 1, "--lr": 1, "--no-warmup": 0,
                         "--resume": 0, "--vocab": 1})
    results, curves, vocab = [], {}, []
    for name, extra in SWEEPS[args.sweep]:
        run_dir = os.path.join(out, name)
        resume = ["--resume"] if args.resume and holds_run(run_dir) else []
        run_args = parse_args(base + extra + ["--out", run_dir] + resume + vocab)
        check_args(run_args)
        done = os.path.join(run_dir, "results.json")
        finished = os.path.exists(done) and json.load(open(done))["outcome"] != "stopped"
        print(f"== {name}" + (f": done already ({run_dir})" if finished else ""))
        results.append(json.load(open(done)) if finished else train(run_args))
        curves[name] = read_csv(os.path.join(run_dir, "metrics.csv"))
        if not vocab:  # the WordPiece trainer is not deterministic: the later runs take the first one's vocabulary
            tokenizer = json.load(open(os.path.join(run_dir, "config.json")))["tokenizer"]
            vocab = ["--vocab", os.path.join(run_dir, tokenizer)]
    names = [name for name, _ in SWEEPS[args.sweep]]
    gain = speedup(curves[names[0]], curves[names[1]], results[0].get("unigram_entropy"))
    table = [dict(run=name, outcome=r["outcome"], updates=r["updates"], final_valid_loss=r["final_valid_loss"],
                  final_valid_accuracy=r["final_valid_accuracy"], minutes=round(r["elapsed_s"] / 60, 1),
                  code_version=(r.get("code_version") or {}).get("fingerprint"),
                  measured=(r.get("code_version") or {}).get("measured"))
             for name, r in zip(names, results)]
    write_csv(os.path.join(out, "results.csv"), table)
    write_csv(os.path.join(out, "curves.csv"), [dict(run=name, **{k: r[k] for k in ("updates", "lr", "valid_loss",
                                                                                 "valid_accuracy")})
                                                for name, rows in curves.items() for r in rows])
    write_json(os.path.join(out, "speedup.json"), dict(gain, code_version=code_version()))
    plot_panels(os.path.join(out, "curves.png"), "updates", bert_loss_panels(curves))
    print(f"\n{'run':<16} {'outcome':<9} {'updates':>7} {'valid loss':>10} {'accuracy':>8} {'minutes':>7}")
    for row in table:
        loss = f"{row['final_valid_loss']:.3f}" if row["final_valid_loss"] is not None else "-"
        accuracy = f"{row['final_valid_accuracy']:.3f}" if row["final_valid_accuracy"] is not None else "-"
        print(f"{row['run']:<16} {row['outcome']:<9} {row['updates']:>7} {loss:>10} {accuracy:>8} {row['minutes']:>7}")
    if gain["pre_update"]:
        print(f"speed-up: Pre-LN reaches Post-LN's final validation loss {gain['target_loss']:.3f} at update "
              f"{gain['pre_update']}, Post-LN at {gain['post_update']}: {100 * gain['speedup']:.0f} % faster")
    else:
        print("speed-up: Pre-LN never reached Post-LN's final validation loss")
    print(f"overlay plot: {os.path.join(out, 'curves.png')}")
    return table, gain


# --- running --------------------------------------------------------------------------------------

def run(args, argv):
    """What the flags ask for, on the Keras side (harness/bert_job.py), which is imported here: once
    run_script has checked KERAS_BACKEND, so that --help and the rest of this file need no backend."""
    from harness import bert_job  # the one import inside a function (harness/cli.py says why)

    if args.sweep:
        return sweep(args, argv, lambda args: bert_job.train(args, default_out(args), run_name(args)))
    return bert_job.run(args, default_out(args), run_name(args))


def default_out(args):
    """The directory a command writes: --out, or one under runs/ named after the job."""
    return args.out or os.path.join("runs", f"finetune-{args.finetune}" if args.finetune else
                                    f"sweep-{args.sweep}-{args.preset}" if args.sweep else run_name(args))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_script("pretrain_bert.py", argv, parse_args, check_args, lambda args: run(args, argv),
                      out_dir=default_out)


if __name__ == "__main__":
    sys.exit(main())
