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
This file holds the run (`analyze`: each analysis in turn, then the summary) and its command line; the
analyses themselves are harness/grads_job.py's, imported once the command line is checked.
"""

import os
import sys
import time

from harness.cli import given_flags, run_script, spec_parser
from harness.files import prepare_out_dir
from harness.rundir import RunDir
from harness.specs import ANALYSES, AnalysisSpec

PRESETS = AnalysisSpec.PRESETS  # harness/specs.py


# --- the analyses -------------------------------------------------------------------------------

def analyze(spec, out):
    """`spec.analysis`, or with "all" each of `ANALYSES` in turn and the summary table; files go to `out`.
    The Keras side (harness/grads_job.py) is imported here, once run_script has checked KERAS_BACKEND, so
    that --help and the rest of this file need no backend."""
    import keras  # (harness/cli.py says why)

    from harness import devices
    from harness.grads_job import (print_summary, run_after_warmup, run_deepnet, run_fig3_depth, run_fig3_layers,
                                   run_lemma2, summary_rows)

    devices.tune_runtime()
    backend = keras.backend.backend()
    out = prepare_out_dir(out)
    todo = ANALYSES if spec.analysis == "all" else (spec.analysis,)
    results, start = {}, time.time()
    print(f"backend {backend}, preset {spec.preset}: d {spec.d_model}, ffn {spec.ffn_dim}, heads {spec.heads}; "
          f"output in {out}; Xavier init with gain 1 on every matrix, as the theorems assume (training's "
          "default is the toolkits' 1/sqrt(2) on W^Q, W^K, W^V)")
    parts = spec.model, spec.data  # what every analysis reads, and most the loss part too
    measured = parts + (spec.part("loss"), out)
    for name in todo:
        t = time.time()
        if name == "fig3-layers":
            results[name] = run_fig3_layers(*measured, spec.norms, spec.layers, spec.batches, spec.seed)
        elif name == "fig3-depth":
            results[name] = run_fig3_depth(*measured, spec.depths, spec.seeds, spec.batches, spec.seed)
        elif name == "lemma2":
            if spec.analysis == "all" or spec.simplified:
                results["lemma2-simplified"] = run_lemma2(*parts, out, spec.layers, spec.seeds, spec.seed, True)
            if spec.analysis == "all" or not spec.simplified:
                results["lemma2"] = run_lemma2(*parts, out, spec.layers, spec.seeds, spec.seed, False)
        elif name == "after-warmup":
            results[name] = run_after_warmup(*measured, spec.layers, spec.batches, spec.after_warmup, spec.lr,
                                             spec.seed)
        elif name == "deepnet":
            results[name] = run_deepnet(*measured, spec.deepnet_depths, spec.lr, spec.seed)
        print(f"  {name}: {time.time() - t:.1f}s", flush=True)
    data = next((r.get("data") for r in results.values() if isinstance(r, dict) and r.get("data")), None)
    if data:
        print(f"data: {data}")
    rows = summary_rows(results)
    if rows:
        print_summary(rows, out)
    print(f"done in {time.time() - start:.0f}s; files in {out}")
    RunDir(out).write_results(dict(outcome="finished", analyses=list(results),
                                        seconds=round(time.time() - start, 1)))
    return results


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
    """The analyses the spec asks for, in --out or the default folder."""
    return analyze(spec, default_out(spec.out, spec.preset))


def cli(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_script("analyze_grads.py", argv, parse_args, AnalysisSpec.check, run,
                      out_dir=lambda spec: default_out(spec.out, spec.preset),
                      claim=lambda spec: spec.out and (spec.out,))  # the default's name needs the backend


if __name__ == "__main__":
    sys.exit(cli())
