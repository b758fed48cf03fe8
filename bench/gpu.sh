#!/usr/bin/env bash
# Every GPU figure in one command, sized for one 10-minute call on one H100/H200. Run it where the CUDA build
# of torch and the project are installed (README, "Install and test"); it needs no eval bundle and no corpus.
#   bash bench/gpu.sh 2>&1 | tee gpu_bench.txt          # also writes gpu_runs.json
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || { echo "bench/gpu.sh: no CUDA device visible to torch; run it on a GPU machine with the CUDA build of torch"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# Each part has a time bound, so that the whole stays within 10 minutes: what finished is kept, what did not
# says so. First the real train.py at d12 and d24, compiled and eager, at the presets' micro-batches: tokens/s,
# MFU, peak memory against the prediction, first-update (compile) time; and the exactness checks on the device.
python bench/gpu_runs.py --steps 6 --budget-s 270 --out gpu_runs.json
# The XSA overhead ratio alpha=1 / alpha=0 with its 95% interval (interleaved repeats, compiled, bf16).
timeout 180 python bench/xsa_overhead.py --mode gpu --depths d12 --repeats 10 \
    || echo "bench/xsa_overhead.py: stopped at its 180 s bound, or failed (above)"
timeout 45 python bench/core_throughput.py --depth d12 --device cuda --max-per-task 50 \
    || echo "bench/core_throughput.py: stopped at its 45 s bound, or failed (above)"   # skips without a bundle
timeout 45 python bench/generation.py --depth d12 --device cuda --new-tokens 256 --samples 8 \
    || echo "bench/generation.py: stopped at its 45 s bound, or failed (above)"
