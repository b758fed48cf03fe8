#!/usr/bin/env bash
# Every GPU figure in one command, sized for a single 10-minute call on one GPU; installs nothing
# (run it from an environment where `pip install -e .` with a CUDA torch is already done).
#   bash bench/gpu.sh 2>&1 | tee gpu_bench.txt
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || { echo "bench/gpu.sh: no CUDA device visible to torch; run it on a GPU machine with the CUDA build of torch"; exit 1; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python bench/xsa_overhead.py --mode gpu --repeats 20      # d12 and d24, seq 2048, bf16, torch.compile, MFU
python bench/core_throughput.py --depth d12 --device cuda --max-per-task 50   # skips, saying so, without a bundle
python bench/generation.py --depth d12 --device cuda --new-tokens 256 --samples 8
