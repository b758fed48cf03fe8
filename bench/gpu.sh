#!/usr/bin/env bash
# Every GPU figure in one command, sized to end inside one 10-minute call on one H100/H200 (at most 520 s:
# each part has a time bound; what finished is kept, what did not says so). It needs no eval bundle and no corpus.
# On a machine with the CUDA build of torch and the project installed (README, "Install and test"):
#   bash bench/gpu.sh                                   # writes gpu_bench.txt and gpu_runs.json
# On the lent device machine (its image has torch and Lightning, not Hydra or rustbpe, and no network):
#   bash bench/gpu_wheels.sh here, then run "bash bench/gpu.sh" there with carry [".whl"] and timeout_s 600;
#   the log and gpu_runs.json come back from $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-.}
if [ -d .whl ]; then  # the wheels bench/gpu_wheels.sh made, installed beside the image's packages
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/xsa-site \
        .whl/*.whl
    export PYTHONPATH=/tmp/xsa-site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the project itself, installed or not
export PYTHONUNBUFFERED=1  # a part stopped at its bound still shows what it printed
exec > >(tee "$OUT/gpu_bench.txt") 2>&1
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || { echo "bench/gpu.sh: no CUDA device visible to torch; run it on a GPU machine with the CUDA build of torch"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# First the real train.py at d12 and d24, compiled and eager, at the presets' micro-batches: tokens/s, MFU, peak
# memory against the prediction, first-update (compile) time; the exactness checks on the device; the count of
# synchronizing CUDA calls between host syncs. gpu_runs.json is rewritten after each part.
timeout 320 "$PYTHON" bench/gpu_runs.py --steps 6 --budget-s 290 --out "$OUT/gpu_runs.json" \
    || echo "bench/gpu_runs.py: stopped at its 320 s bound, or failed (above)"
# The XSA overhead ratio alpha=1 / alpha=0 with its 95% interval (interleaved repeats, compiled, bf16).
timeout 120 "$PYTHON" bench/xsa_overhead.py --mode gpu --depths d12 --repeats 10 \
    || echo "bench/xsa_overhead.py: stopped at its 120 s bound, or failed (above)"
timeout 40 "$PYTHON" bench/core_throughput.py --depth d12 --device cuda --max-per-task 50 \
    || echo "bench/core_throughput.py: stopped at its 40 s bound, or failed (above)"   # skips without a bundle
timeout 40 "$PYTHON" bench/generation.py --depth d12 --device cuda --new-tokens 256 --samples 8 \
    || echo "bench/generation.py: stopped at its 40 s bound, or failed (above)"
