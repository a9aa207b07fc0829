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

import os
import sys

from harness.cli import given_flags, run_script, spec_parser
from harness.specs import AnalysisSpec

PRESETS = AnalysisSpec.PRESETS  # harness/specs.py


# --- command line ---------------------------------------------------------------------------------

def build_parser():
    """The command line: the arguments of `AnalysisSpec`'s fields (harness/specs.py)."""
    return spec_parser(AnalysisSpec, "analyze_grads.py", __doc__)


def parse_args(argv=None):
    """The analysis the command line asks for, as an `AnalysisSpec` (presets resolved)."""
    return AnalysisSpec.build(**given_flags(build_parser, argv))


def default_out(out, preset):
    """The directory the analysis writes: `out` (--out), or runs/analysis/PRESET-BACKEND (run_script has
    checked the backend and named it in KERAS_BACKEND)."""
    return out or os.path.join("runs", "analysis", f"{preset}-{os.environ['KERAS_BACKEND']}")


def run(spec):
    """The analyses, on the Keras side (harness/grads_job.py), which is imported here: once run_script has
    checked KERAS_BACKEND, so that --help and the rest of this file need no backend."""
    from harness import grads_job  # the one import inside a function (harness/cli.py says why)

    return grads_job.run(spec, default_out(spec.out, spec.preset))


def cli(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_script("analyze_grads.py", argv, parse_args, AnalysisSpec.check, run,
                      out_dir=lambda spec: default_out(spec.out, spec.preset),
                      claim=lambda spec: spec.out and (spec.out,))  # the default's name needs the backend


if __name__ == "__main__":
    sys.exit(cli())
