"""Every backend and precision against the plain-PyTorch reference, side by side in one run.

    python bench/speed_table.py                          # the full table: 128 sentences x 32 tokens, 10 steps
    python bench/speed_table.py --sentences 1024 --steps 20 --out results/speed/table-h100.jsonl
    python bench/speed_table.py --tiny                   # a tiny model on one CPU thread, seconds a row (tests)

Runs each configuration as its own process, one after another (never two at once, which would share
the device): `train_nmt.py --benchmark` under Keras on jax and tensorflow (float32, mixed_bfloat16) and
torch (float32), and `bench/torch_reference.py` in float32, bfloat16 autocast, and both under
torch.compile. Writes each configuration's JSON line (or the reason it was skipped) to --out and
prints a markdown table: target tokens/s, the ratio to the fastest reference configuration, MFU
(model FLOP rate over the device's peak for the products' arithmetic; none on a CPU without
--peak-tflops) and the product-bound fraction (model FLOP rate over the measured rate of one
FFN-sized matrix product in the same dtype on the same device: how close the whole step comes to
running every FLOP as fast as a lone product). A configuration whose package is missing, or which
fails (torch.compile without a compiler), gets a row saying why.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness.console import OneLineParser  # noqa: E402

PROG = "bench/speed_table.py"
# name: (what runs, the package it needs, its arguments)
CONFIGS = {
    "keras-jax-float32": ("jax", "jax", ["--precision", "float32"]),
    "keras-jax-mixed_bfloat16": ("jax", "jax", ["--precision", "mixed_bfloat16"]),
    "keras-tensorflow-float32": ("tensorflow", "tensorflow", ["--precision", "float32"]),
    "keras-tensorflow-mixed_bfloat16": ("tensorflow", "tensorflow", ["--precision", "mixed_bfloat16"]),
    "keras-torch-float32": ("torch", "torch", ["--precision", "float32"]),
    "torch-float32": ("reference", "torch", ["--dtype", "float32"]),
    "torch-bfloat16": ("reference", "torch", ["--dtype", "bfloat16"]),
    "torch-compile-float32": ("reference", "torch", ["--dtype", "float32", "--compile"]),
    "torch-compile-bfloat16": ("reference", "torch", ["--dtype", "bfloat16", "--compile"]),
}
# --tiny: train_nmt's tiny preset (d 32, FFN 64, 2 heads, 1 + 1 layers, 200 tokens) with the reference's
# dropout 0.1, and the reference with the same sizes; 4 sentences x 32 tokens, 1 warm-up and 2 timed steps.
TINY_KERAS = ["--preset", "tiny", "--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1"]
TINY_REFERENCE = ["--d-model", "32", "--ffn-dim", "64", "--heads", "2", "--layers", "1", "--vocab", "200",
                  "--warmup", "1"]


def _config_list(text):
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown configuration {', '.join(unknown) or '(none given)'}; "
                                         f"choose from {', '.join(CONFIGS)}")
    return names


def build_parser():
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", type=_config_list, metavar="NAME,...", help="only these configurations, in this "
                   f"order (default all: {', '.join(CONFIGS)})")
    p.add_argument("--tiny", action="store_true", help="a tiny model, 4 sentences and 2 timed steps: seconds a "
                   "configuration on a CPU, for tests")
    p.add_argument("--steps", type=int, help="timed steps of each configuration (default 10; --tiny 2)")
    p.add_argument("--sentences", type=int, help="sentences per batch (default 128; --tiny 4)")
    p.add_argument("--peak-tflops", type=float, metavar="TFLOPS", help="the device's peak TFLOP/s for MFU, "
                   "passed to every configuration (default: their table, H100 and H200; none on a CPU)")
    p.add_argument("--timeout", type=float, default=1800, metavar="SECONDS", help="give up on a configuration "
                   "after this long (default 1800)")
    p.add_argument("--out", default=os.path.join("runs", "speed-table.jsonl"),
                   help="the JSON lines, one per configuration (default runs/speed-table.jsonl)")
    return p


def command(name, steps, sentences, tiny, peak_tflops):
    """The command line of one configuration, timing `steps` steps of `sentences` sentences (`tiny`: the tiny
    model on one CPU thread; `peak_tflops`: the device's peak for MFU, or None), and the environment it runs in."""
    runner, _, extra = CONFIGS[name]
    peak = ["--peak-tflops", str(peak_tflops)] if peak_tflops else []
    env = dict(os.environ)
    if tiny:  # on the CPU, one thread: a tiny step is too short to share, and spinning threads crawl on a busy machine
        env.setdefault("OMP_NUM_THREADS", "1")
        env["CUDA_VISIBLE_DEVICES"] = ""
    if runner == "reference":
        argv = [os.path.join(ROOT, "bench", "torch_reference.py"), *extra, "--steps", str(steps),
                "--sentences", str(sentences), *(TINY_REFERENCE if tiny else []), *peak]
        if tiny:
            argv += ["--device", "cpu"]
    else:
        env["KERAS_BACKEND"] = runner
        argv = [os.path.join(ROOT, "train_nmt.py"), "--benchmark", str(steps), "--benchmark-sentences",
                str(sentences), *extra, *(TINY_KERAS if tiny else []), *peak]
    return [sys.executable, *argv], env


def run_one(name, argv, env, timeout):
    """One configuration's JSON line as a dict, with `config`; or {config, skipped: why}: its command line
    `argv` run in the environment `env` (`command`) for at most `timeout` seconds."""
    runner, package, _ = CONFIGS[name]
    if importlib.util.find_spec(package) is None:
        return dict(config=name, skipped=f"{package} is not installed")
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return dict(config=name, skipped=f"ran past --timeout {timeout:g} s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        errors = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        return dict(config=name, skipped=f"exit code {done.returncode}: {errors[-1][:300] if errors else 'no output'}")
    return dict(json.loads(lines[-1]), config=name, wall_s=round(time.perf_counter() - started, 1))


def table(rows):
    """The markdown table of the rows; ratios against the fastest reference configuration that ran."""
    references = [r["tgt_tokens_per_s"] for r in rows if r["config"].startswith("torch-") and "skipped" not in r]
    best = max(references, default=None)
    best_name = next((r["config"] for r in rows if r.get("tgt_tokens_per_s") == best and r["config"].startswith("torch-")),
                     None)

    def number(value, digits):
        return "-" if value is None else f"{value:,.{digits}f}"

    lines = ["| configuration | target tokens/s | vs the best PyTorch reference | model TFLOP/s | MFU | "
             "product-bound fraction | device, or why skipped |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['config']} | - | - | - | - | - | skipped: {r['skipped']} |")
            continue
        tokens = r["tgt_tokens_per_s"]
        ratio = f"{tokens / best:.2f}x" if best else "-"
        mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f} %"
        tflops = tokens * r["flop_per_tgt_token"] / 1e12
        lines.append(f"| {r['config']} | {number(tokens, 1)} | {ratio} | {tflops:.4g} | {mfu} | "
                     f"{number(r.get('matmul_bound_fraction'), 2)} | {r.get('device_name', '')} |")
    footer = (f"Ratios against {best_name} ({best:,.1f} target tokens/s)." if best
              else "No reference configuration ran: no ratios.")
    return "\n".join(lines) + "\n\n" + footer


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    for flag in ("steps", "sentences"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            p.error(f"--{flag} must be a positive number, got {getattr(args, flag)}")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        p.error(f"--peak-tflops must be a positive number of TFLOP/s, got {args.peak_tflops}")
    steps = args.steps or (2 if args.tiny else 10)
    sentences = args.sentences or (4 if args.tiny else 128)
    rows = []
    for name in args.only or list(CONFIGS):
        print(f"{name}: running", file=sys.stderr, flush=True)
        rows.append(run_one(name, *command(name, steps, sentences, args.tiny, args.peak_tflops), args.timeout))
        print(f"{name}: {rows[-1].get('skipped') or str(rows[-1]['tgt_tokens_per_s']) + ' target tokens/s'}",
              file=sys.stderr, flush=True)
    if os.path.dirname(args.out):
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
    partial = args.out + ".partial"
    with open(partial, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(partial, args.out)
    print(table(rows))
    print(f"JSON lines: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
