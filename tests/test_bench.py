"""bench/: the plain-PyTorch reference of the benchmark's workload and the speed table, in tiny mode on CPU."""

import argparse
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import once

from bench import speed_table
from harness import flops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_TORCH = importlib.util.find_spec("torch") is None
TINY = ["--d-model", "32", "--ffn-dim", "64", "--heads", "2", "--layers", "1", "--vocab", "200", "--sentences", "4",
        "--warmup", "1", "--steps", "2", "--device", "cpu"]
ONE_THREAD = dict(os.environ, OMP_NUM_THREADS="1")  # a tiny step on a busy machine: threads would only wait
# bench/torch_reference.py is plain PyTorch in a subprocess, whatever KERAS_BACKEND says: run its tests once.
ONCE = once("subprocesses", backend="torch")


def reference(*argv):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "torch_reference.py"), *argv],
                          capture_output=True, text=True, env=ONE_THREAD, timeout=300)


@pytest.mark.skipif(NO_TORCH, reason="the reference needs torch (pip install torch)")
@ONCE
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_prints_one_json_line(dtype):
    done = reference(*TINY, "--dtype", dtype, "--peak-tflops", "0.5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["dtype"] == dtype and result["compile"] is False and result["device"] == "cpu"
    assert result["sentences"] == 4 and result["length"] == 32 and result["steps"] == 2
    # step_s is printed to 5 decimals: a tiny step (3.7e-3 s) is known from it only to 0.14 %, so the rate is
    # checked against the step's interval of rounding (and the rate's own rounding, 0.05 tokens/s)
    step = result["step_s"]
    assert 4 * 32 / (step + 5e-6) - 0.05 <= result["tgt_tokens_per_s"] <= 4 * 32 / (step - 5e-6) + 0.05
    assert result["flop_per_tgt_token"] == flops.train_flops(
        dict(d_model=32, ffn_dim=64, vocab_size=200, encoder_layers=1, decoder_layers=1), 4, 32) // (4 * 32)
    tflops = result["tgt_tokens_per_s"] * result["flop_per_tgt_token"] / 1e12
    assert result["peak_tflops"] == 0.5 and result["mfu"] == pytest.approx(tflops / 0.5, rel=1e-2)
    assert result["matmul_tflops_per_s"] > 0
    assert result["matmul_bound_fraction"] == pytest.approx(
        result["tgt_tokens_per_s"] / result["matmul_bound_tokens_per_s"], rel=1e-2)


@pytest.mark.skipif(NO_TORCH, reason="the reference needs torch (pip install torch)")
def test_flop_count_matches_the_reference_models_weights():
    """train_flops's matrix-product weights are the reference model's 2-D weights (all but the embedding)
    plus the tied output projection: the count the benchmark's MFU rests on."""
    from bench import torch_reference

    a = argparse.Namespace(d_model=32, ffn_dim=48, heads=2, layers=2, vocab=50, length=8)
    model = torch_reference.build_model(a)
    products = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embedding" not in name)
    products += a.d_model * a.vocab
    attention = 2 * 2 * a.length * a.d_model * (a.layers + 2 * a.layers)
    args = dict(d_model=32, ffn_dim=48, vocab_size=50, encoder_layers=2, decoder_layers=2)
    assert flops.train_flops(args, 3, a.length) == 3 * 3 * a.length * (2 * products + attention)


def test_peak_table():
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16") == 989
    assert flops.peak_tflops("NVIDIA H200", "tf32") == 494
    assert flops.peak_tflops("NVIDIA H100 PCIe", "bfloat16") is None  # a lower peak: give --peak-tflops
    assert flops.peak_tflops("cpu", "float32") is None


@pytest.mark.parametrize("argv, expected", [
    (["--heads", "3"], "not a multiple of --heads 3"),
    (["--dtype", "float16"], "invalid choice: 'float16'"),
    (["--peak-tflops", "0"], "--peak-tflops must be a positive number"),
])
@pytest.mark.skipif(NO_TORCH, reason="the reference needs torch (pip install torch)")
@ONCE
def test_reference_bad_input_is_one_line(argv, expected):
    done = reference(*argv)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("bench/torch_reference.py: error: ") and expected in done.stderr


def test_speed_table_bad_configuration_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        speed_table.main(["--only", "torch-float32,keras-numpy"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert "unknown configuration keras-numpy" in err and "keras-jax-float32" in err


def test_speed_table_skips_a_missing_package(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(speed_table.CONFIGS, "keras-jax-float32", ("jax", "no_such_package_here", []))
    out = tmp_path / "table.jsonl"
    assert speed_table.main(["--tiny", "--only", "keras-jax-float32", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| keras-jax-float32 | - |" in printed and "skipped: no_such_package_here is not installed" in printed
    assert "No reference configuration ran" in printed
    assert [json.loads(line)["config"] for line in out.read_text().splitlines()] == ["keras-jax-float32"]


@pytest.mark.skipif(NO_TORCH, reason="the reference needs torch (pip install torch)")
@ONCE
def test_speed_table_tiny_prints_the_table(tmp_path):
    out = tmp_path / "table.jsonl"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "speed_table.py"), "--tiny", "--only",
                           "torch-float32,torch-bfloat16", "--out", str(out)], capture_output=True, text=True,
                          env=ONE_THREAD, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["config"] for r in rows] == ["torch-float32", "torch-bfloat16"]
    assert [r["dtype"] for r in rows] == ["float32", "bfloat16"] and all(r["sentences"] == 4 for r in rows)
    best = max(rows, key=lambda r: r["tgt_tokens_per_s"])
    assert "| configuration | target tokens/s | vs the best PyTorch reference |" in done.stdout
    assert f"| {best['config']} | {best['tgt_tokens_per_s']:,.1f} | 1.00x |" in done.stdout
    assert f"Ratios against {best['config']}" in done.stdout


GPU_CHECKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "gpu_checks.sh")


def _stub(folder, name, script):
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


@ONCE
def test_gpu_checks_refuse_a_host_without_a_gpu(tmp_path):
    """bench/gpu_checks.sh on a host where nvidia-smi finds no GPU: one line, exit code 2, nothing written."""
    _stub(tmp_path, "nvidia-smi", "exit 9\n")
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    done = subprocess.run(["bash", GPU_CHECKS, str(tmp_path / "out")], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and not (tmp_path / "out").exists()
    assert done.stderr.splitlines() == ["bench/gpu_checks.sh: error: no NVIDIA GPU here (nvidia-smi finds none); "
                                        "run it on a GPU host"]


def _gpu_checks(tmp_path, *steps, ray=True):
    """bench/gpu_checks.sh OUT STEPS with a stand-in nvidia-smi and python3 (which records its arguments, the
    compilation cache and XLA_FLAGS; fails the speed table, and `import ray` unless `ray`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "nvidia-smi", 'if [ "$1" = -L ]; then echo "GPU 0: stand-in"; else echo sampled; fi\n')
    _stub(bin_dir, "python3", 'echo "$@ [${JAX_COMPILATION_CACHE_DIR:-}] [${XLA_FLAGS:-}]" >> "$CALLS"\n'
          f'case "$*" in *speed_table*) exit 1;; "-c import ray") exit {0 if ray else 1};; esac\n')
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(tmp_path / "calls"))
    env.pop("XLA_FLAGS", None)
    env.pop("PYTHON", None)
    done = subprocess.run(["bash", GPU_CHECKS, str(out), *steps], env=env, capture_output=True, text=True)
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return done, out, calls


@ONCE
def test_gpu_checks_run_every_step_and_record_each_time_and_exit_code(tmp_path):
    """With a GPU (here a stand-in nvidia-smi) each step runs in turn, a failing one too, and OUT/times.txt
    gets a line each: the main command with and without XLA's autotuning, each compiling afresh, the speed
    table, and the smoke runs packed and alone on Ray."""
    done, out, calls = _gpu_checks(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = (out / "times.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in lines] == ["main", "main-autotune0", "speed", "smoke-packed", "smoke-alone"]
    assert [line.split("exit code ")[1] for line in lines] == ["0", "0", "1", "0", "0"]
    assert calls[0] == f"train_nmt.py --norm pre --no-warmup --out {out}/main [{out}/cache-main] []"
    assert calls[1] == (f"train_nmt.py --norm pre --no-warmup --out {out}/main-autotune0 [{out}/cache-autotune0] "
                        "[--xla_gpu_autotune_level=0]")
    assert calls[4].startswith(f"reproduce.py --smoke --gpu-share 0.25 --runs-dir {out}/smoke-packed")
    assert calls[5].startswith(f"reproduce.py --smoke --gpu-share 1 --runs-dir {out}/smoke-alone")


@ONCE
def test_gpu_checks_pack_runs_without_ray_and_run_the_steps_named(tmp_path):
    """Where Ray is not installed, the packing step is bench/packing.py's; named steps run alone, in order; an
    unknown step is refused in one line before anything is written."""
    done, out, calls = _gpu_checks(tmp_path, "packing", "main", ray=False)
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in (out / "times.txt").read_text().splitlines()] == ["main", "packing"]
    assert calls[-1].startswith(f"bench/packing.py --only fig4 --runs 4 --at-a-time 4 --smoke --out {out}/packing")
    refused = subprocess.run(["bash", GPU_CHECKS, str(tmp_path / "other"), "mian"], capture_output=True, text=True)
    assert refused.returncode == 2 and not (tmp_path / "other").exists()
    assert refused.stderr.splitlines() == ["bench/gpu_checks.sh: error: unknown step mian; choose from main, "
                                           "main-autotune0, speed, packing"]


PACKING = os.path.join(ROOT, "bench", "packing.py")


@once("a packing round's processes", backend="tensorflow")
def test_packing_runs_the_packed_round_side_by_side_then_one_at_a_time(tmp_path):
    """bench/packing.py: fig4's first two runs at the tiny size, both at once, then one at a time, each round in a
    folder of its own; a JSON line a round, in packing.jsonl too."""
    out = tmp_path / "packing"
    done = subprocess.run([sys.executable, PACKING, "--only", "fig4", "--runs", "2", "--at-a-time", "2", "--smoke",
                           "--gpu-share", "0", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    packed, alone = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert (out / "packing.jsonl").read_text().splitlines() == [json.dumps(packed), json.dumps(alone)]
    assert (packed["at_a_time"], alone["at_a_time"]) == (2, 1) and packed["exit_codes"] == alone["exit_codes"] == [0, 0]
    assert packed["wall_s"] < sum(packed["run_s"])  # the two ran side by side
    # one after the other: the wall time holds both runs (each figure rounded to 0.1 s, so up to 0.05 s each apart)
    assert alone["wall_s"] + 0.05 * (len(alone["run_s"]) + 1) >= sum(alone["run_s"])
    for round_dir in ("2-at-a-time", "1-at-a-time"):
        assert sorted(p.parent.name for p in (out / round_dir).glob("*/results.json")) == \
            ["post-adam-nowarmup-lr5e-4", "post-adam-warmup-lr5e-4"]


@once("bench/packing.py's command line")
@pytest.mark.parametrize("flags, message", [
    (["--runs", "0"], "--runs must be a positive number, got 0"),
    (["--gpu-share", "2"], "--gpu-share must lie in [0, 1], got 2.0"),
    (["--out", "README.md"], "--out README.md: a file, not a folder; choose a new folder"),
    (["--out", "harness"], "--out harness: not an empty folder; choose a new one"),
])
def test_packing_refuses_bad_flags_in_one_line(flags, message):
    done = subprocess.run([sys.executable, PACKING, *flags], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"bench/packing.py: error: {message}"]
