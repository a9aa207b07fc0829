"""Gradients and hidden-state norms at initialization, measured against the theory.

Xiong et al. 2020, Sections 3.3-3.4, and DeepNet (Wang et al. 2022), Section 4:

  fig3-layers   Figure 3(a, b): per layer, the expected gradient of each FFN matrix of a 6-6 model
                (average the gradient entry by entry over mini-batches, then the Frobenius norm).
                Post-LN grows with the layer index; Pre-LN stays about flat.
  fig3-depth    Figure 3(c, d) / Theorem 1: gradient norm of the last FFN's W^2 against depth.
                Post-LN about constant (slope 0 in log-log), Pre-LN decreasing (slope -1/2).
  lemma2        Lemma 2: E||x||^2 / d per layer. Post-LN x^{post,5} = 3/2; Pre-LN between
                (1 + l/2) and (1 + 3l/2). Exact in expectation in the `--simplified` setting.
  after-warmup  Figure 3(a) again after `--after-warmup STEPS` updates of Post-LN with warmup.
  deepnet       DeepNet's model update ||F(x, theta*) - F(x, theta)|| / ||F|| after one SGD and one
                Adam step, against depth: grows for Post-LN, bounded for DeepNorm.
  all           everything above, then a summary table (claim, measured, theory, agrees?).

    KERAS_BACKEND=jax python analyze_grads.py                  # all, CPU size, a few minutes
    KERAS_BACKEND=jax python analyze_grads.py fig3-depth --preset paper   # d 512, 10 seeds (GPU)

Each analysis writes NAME.csv, NAME.json and NAME.png to --out (default runs/analysis/PRESET-BACKEND).
This file is the command line, without Keras; harness/grads_job.py runs the analyses.
"""

import argparse
import os
import sys

from harness import nmt_data
from harness.cli import given_flags, int_list, preset_arguments, run_script
from harness.constants import NORMS
from harness.errors import OneLineParser, UsageError
from harness.specs import ANALYSES, AnalysisSpec

PRESETS = AnalysisSpec.PRESETS  # harness/specs.py


# --- command line ---------------------------------------------------------------------------------

def build_parser():
    p = OneLineParser(prog="analyze_grads.py", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add = preset_arguments(PRESETS)  # a preset flag's help ends with its value at each preset
    add(p, "analysis", nargs="?", default="all", choices=("all",) + ANALYSES,
                   help="all (default: each analysis, then a summary table), fig3-layers (Figure 3(a, b)), "
                        "fig3-depth (Figure 3(c, d)), lemma2 (Lemma 2), after-warmup (Figure 3(a) after warmup) "
                        "or deepnet (DeepNet's model update against depth)")
    add(p, "--preset", default="cpu", choices=tuple(PRESETS),
                   help="the defaults of the flags marked [preset: ...]: cpu (default: minutes on 2 cores), paper "
                        "(d 512, depths 6..14, 10 seeds; a GPU) or tiny (tests)")
    add(p, "--d-model", type=int, help="model width (paper 512)")
    add(p, "--ffn-dim", type=int, help="FFN width (paper 1024)")
    add(p, "--heads", type=int, help="attention heads (paper 4)")
    add(p, "--layers", type=int, help="layers per stack for fig3-layers, lemma2, after-warmup (paper 6)")
    add(p, "--depths", type=int_list, metavar="L,L,...", help="fig3-depth stack depths, e.g. 6,8,10,12,14")
    add(p, "--deepnet-depths", type=int_list, metavar="L,L,...", help="deepnet depths, e.g. 6,12,24,48")
    add(p, "--seeds", type=int, help="random initializations to average (paper 10)")
    add(p, "--batches", type=int, help="mini-batches averaged into the expected gradient")
    add(p, "--max-tokens", type=int, help="tokens per batch")
    add(p, "--length", type=int, help="padded sentence length of the analysis batches")
    add(p, "--after-warmup", type=int, metavar="STEPS",
                   help="warmup updates of Post-LN before measuring again")
    add(p, "--lr", type=float, default=5e-4, help="peak lr (after-warmup) and step size (deepnet); default 5e-4")
    add(p, "--norms", default="post,pre,deepnorm", metavar="NORM,...",
                   help=f"placements for fig3-layers, of {', '.join(NORMS)} (default post,pre,deepnorm)")
    add(p, "--simplified", action="store_true",
                   help="lemma2 in the paper's simplified setting (one head, W^Q = W^K = 0, d x d, Gaussian input); "
                        "all runs both")
    add(p, "--corpus", choices=nmt_data.CORPORA, default="multi30k",
                   help="built-in corpus of the sentences when no --data-dir (default multi30k, data/multi30k)")
    add(p, "--data-dir", help="translation data in fairseq layout; overrides --corpus")
    add(p, "--src", default="de", help="source language of --data-dir (default de)")
    add(p, "--tgt", default="en", help="target language of --data-dir (default en)")
    add(p, "--random-tokens", action="store_true", help="random token ids instead of sentences")
    add(p, "--vocab-size", type=int, help="joint BPE vocabulary size")
    add(p, "--loss", default="label_smoothed", choices=("label_smoothed", "cross_entropy"),
                   help="the loss whose gradients are measured (default label_smoothed)")
    add(p, "--label-smoothing", type=float, default=0.1, help="with --loss label_smoothed (default 0.1)")
    add(p, "--seed", type=int, default=1,
                   help="the first seed of the initialisations, and of the batches (default 1)")
    add(p, "--out", help="output directory (default runs/analysis/PRESET-BACKEND)")
    return p


def parse_args(argv=None):
    """The analysis the command line asks for, as an `AnalysisSpec` (presets resolved)."""
    given = given_flags(build_parser, argv)
    if "norms" in given:
        given["norms"] = tuple(n.strip() for n in given["norms"].split(",") if n.strip())
    return AnalysisSpec.build(**given)


# The flags that only some analyses read: given with another analysis alone, they would be ignored.
ONLY_FOR = {"norms": ("fig3-layers", "after-warmup"), "simplified": ("lemma2",), "depths": ("fig3-depth",),
            "deepnet_depths": ("deepnet",), "after_warmup": ("after-warmup",),
            "layers": ("fig3-layers", "lemma2", "after-warmup"), "lr": ("after-warmup", "deepnet")}


def check_args(args):
    for name in ("d_model", "ffn_dim", "heads", "layers", "seeds", "batches", "max_tokens", "length",
                 "vocab_size", "after_warmup"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.d_model % args.heads:
        raise UsageError(f"--d-model {args.d_model} must be divisible by --heads {args.heads}")
    if args.lr <= 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    if not 0 <= args.label_smoothing < 1:
        raise UsageError(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
    bad = [n for n in args.norms if n not in NORMS]
    if bad or not args.norms:
        raise UsageError(f"--norms: unknown placement {', '.join(bad) or '(none)'}; choose from {', '.join(NORMS)}")
    if args.max_tokens < args.length:
        raise UsageError(f"--max-tokens {args.max_tokens} is smaller than --length {args.length}")
    stray = [name for name, analyses in ONLY_FOR.items()
             if name in args.given and args.analysis != "all" and args.analysis not in analyses]
    if stray:
        raise UsageError(f"{args.analysis} does not read "
                         + ", ".join(f"--{name.replace('_', '-')} ({' and '.join(ONLY_FOR[name])})" for name in stray)
                         + "; drop it, or run the analysis it belongs to")


def default_out(args):
    """The directory the analysis writes: --out, or runs/analysis/PRESET-BACKEND (run_script has checked
    the backend and named it in KERAS_BACKEND)."""
    return args.out or os.path.join("runs", "analysis", f"{args.preset}-{os.environ['KERAS_BACKEND']}")


def run(args):
    """The analyses, on the Keras side (harness/grads_job.py), which is imported here: once run_script has
    checked KERAS_BACKEND, so that --help and the rest of this file need no backend."""
    from harness import grads_job  # the one import inside a function (harness/cli.py says why)

    return grads_job.run(args, default_out(args), ANALYSES)


def cli(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_script("analyze_grads.py", argv, parse_args, check_args, run, out_dir=default_out)


if __name__ == "__main__":
    sys.exit(cli())
