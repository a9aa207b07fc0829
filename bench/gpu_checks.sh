#!/usr/bin/env bash
# The measurements a GPU host owes the README (results/speed/README.md, docs/reproduce.md), one after
# another, with the GPU's utilisation and memory sampled every second throughout:
#
#   bash bench/gpu_checks.sh [OUT [STEP ...]]   # default runs/gpu-checks, every step; about 15 minutes on one H100
#
# STEP, any of (default all, in this order):
#   main            the README's main command end to end (the goal: at most 60 s on one H100 or H200), with
#                   a compilation cache of its own, empty; its results.json holds the compile share.
#   main-autotune0  the same with XLA's GPU autotuning off (XLA_FLAGS=--xla_gpu_autotune_level=0): how much
#                   of the compiling is autotuning, and what the step loses without it.
#   speed           bench/speed_table.py at 1,024 sentences x 32 tokens, every backend and precision beside
#                   plain PyTorch (the goal: jax mixed_bfloat16 at least 1.5x torch.compile bfloat16).
#   packing         runs packed on one GPU against one at a time, the wall time of each: with Ray,
#                   reproduce.py --smoke with four runs a GPU (--gpu-share 0.25), then one (--gpu-share 1);
#                   without Ray, bench/packing.py, four of fig4's runs at the tiny size, four then one at a time.
#
# The interpreter is python3 (or python), or the one PYTHON names.
# Writes OUT/times.txt (one line a step: its wall seconds and exit code), OUT/utilization.csv (nvidia-smi),
# OUT/STEP.log and each step's own files. A step that fails is recorded and the next one runs.
set -u
OUT="${1:-runs/gpu-checks}"
shift
STEPS=" ${*:-main main-autotune0 speed packing} "
for name in $STEPS; do
    case "$name" in
        main|main-autotune0|speed|packing) ;;
        *) echo "bench/gpu_checks.sh: error: unknown step $name; choose from main, main-autotune0, speed, packing" >&2
           exit 2 ;;
    esac
done
if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
    echo "bench/gpu_checks.sh: error: no NVIDIA GPU here (nvidia-smi finds none); run it on a GPU host" >&2
    exit 2
fi
cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}  # GPU images often hold their frameworks in python3
mkdir -p "$OUT" || exit 2
nvidia-smi --query-gpu=timestamp,name,utilization.gpu,memory.used,memory.total --format=csv -l 1 \
    > "$OUT/utilization.csv" &
SAMPLER=$!
trap 'kill "$SAMPLER" 2> /dev/null' EXIT

step() {  # step NAME COMMAND...: run it, its output in OUT/NAME.log, its wall time in OUT/times.txt
    local name=$1 start code
    shift
    start=$(date +%s.%N)
    "$@" > "$OUT/$name.log" 2>&1
    code=$?
    echo "$name $(date +%s.%N) $start $code" | awk '{printf "%s: %.1f s, exit code %d\n", $1, $2 - $3, $4}' \
        | tee -a "$OUT/times.txt"
}

wants() { [[ "$STEPS" == *" $1 "* ]]; }

if wants main; then
    step main env KERAS_BACKEND=jax JAX_COMPILATION_CACHE_DIR="$OUT/cache-main" \
        "$PYTHON" train_nmt.py --norm pre --no-warmup --out "$OUT/main"
fi
if wants main-autotune0; then
    step main-autotune0 env KERAS_BACKEND=jax JAX_COMPILATION_CACHE_DIR="$OUT/cache-autotune0" \
        XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_autotune_level=0" \
        "$PYTHON" train_nmt.py --norm pre --no-warmup --out "$OUT/main-autotune0"
fi
if wants speed; then
    step speed "$PYTHON" bench/speed_table.py --sentences 1024 --steps 20 --out "$OUT/speed.jsonl"
fi
if wants packing; then
    if "$PYTHON" -c "import ray" > /dev/null 2>&1; then
        step smoke-packed "$PYTHON" reproduce.py --smoke --gpu-share 0.25 --runs-dir "$OUT/smoke-packed"
        step smoke-alone "$PYTHON" reproduce.py --smoke --gpu-share 1 --runs-dir "$OUT/smoke-alone"
    else
        step packing "$PYTHON" bench/packing.py --only fig4 --runs 4 --at-a-time 4 --smoke --out "$OUT/packing"
    fi
fi
