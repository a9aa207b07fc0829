#!/usr/bin/env bash
# The measurements a GPU host owes the README (results/speed/README.md, docs/reproduce.md), one after
# another, with the GPU's utilisation and memory sampled every second throughout:
#
#   bash bench/gpu_checks.sh [OUT]        # default runs/gpu-checks; about 15 minutes on one H100 or H200
#
# 1. main:   the README's main command end to end (the goal: at most 60 s on one H100 or H200); its
#            results.json holds the compile share.
# 2. speed:  bench/speed_table.py at 1,024 sentences x 32 tokens, every backend and precision beside plain
#            PyTorch (the goal: jax mixed_bfloat16 at least 1.5x torch.compile bfloat16).
# 3. smoke:  reproduce.py --smoke with four runs packed on one GPU (--gpu-share 0.25), then one run at a
#            time (--gpu-share 1): the wall time of each, and the utilisation while they ran.
#
# Writes OUT/times.txt (one line a step: its wall seconds and exit code), OUT/utilization.csv (nvidia-smi),
# OUT/STEP.log and each step's own files. A step that fails is recorded and the next one runs.
set -u
OUT="${1:-runs/gpu-checks}"
if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
    echo "bench/gpu_checks.sh: error: no NVIDIA GPU here (nvidia-smi finds none); run it on a GPU host" >&2
    exit 2
fi
cd "$(dirname "$0")/.." || exit 2
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

step main env KERAS_BACKEND=jax python train_nmt.py --norm pre --no-warmup --out "$OUT/main"
step speed python bench/speed_table.py --sentences 1024 --steps 20 --out "$OUT/speed.jsonl"
step smoke-packed python reproduce.py --smoke --gpu-share 0.25 --runs-dir "$OUT/smoke-packed"
step smoke-alone python reproduce.py --smoke --gpu-share 1 --runs-dir "$OUT/smoke-alone"
