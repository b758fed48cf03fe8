#!/usr/bin/env bash
# Every GPU figure in one command that ends within 540 s on one H100/H200, inside one 10-minute device call with its
# transfers. Each part has a limit: its cap, or less where the time left before 540 s, less what the parts after it
# are expected to need, is less; a part stopped at its limit keeps what it finished (gpu_runs.json is rewritten
# after each of its own parts, and a run stopped mid-way keeps its phases done). The XSA overhead ratio comes first:
# it is the figure the study's cost claim needs, and d24's run, the least needed, goes last. Expected times on one
# H100/H200, from the H200's figures in BENCHMARKS.md ("GPU figures", taken before the one-graph forward, the
# compiled Muon step, bf16-compute and the fused loss head: compile times may be longer, update times shorter):
#   set-up: the wheels, the CUDA probe                                      about 10 s
#   bench/xsa_overhead.py: two compiled d12 arms (bf16-compute, the fused loss head), 10 paired repeats
#                                                                           about 100 s   cap 150 s (stopped early, it
#                                                                                          prints the table of the
#                                                                                          repeats it finished)
#   bench/gpu_runs.py (its docstring): checks 40, the sync check 60, d12 106, d24 128 (at 524,288 tokens per update
#     and 10 steady updates: the docstring says why) = 334 s, its imports and table     about 345 s   the rest,
#                                                                                          about 350 s
#   bench/generation.py: 2 x 2,048 tokens (9 s measured) and its start      about 20 s    cap 30 s
# In all about 475 s, within 540. It needs no eval bundle and no corpus (CORE's throughput,
# bench/core_throughput.py, needs the bundle, which the device machine does not have). Each part gets SIGTERM at its
# limit and SIGKILL 10 s later.
# On a machine with the CUDA build of torch and the project installed (README, "Install and test"):
#   bash bench/gpu.sh                                   # writes gpu_bench.txt and gpu_runs.json
# On the lent device machine (its image has torch and Lightning, not Hydra or rustbpe, and no network):
#   bash bench/gpu_wheels.sh here, then run "bash bench/gpu.sh" there with carry [".whl"] and timeout_s 600;
#   the log and gpu_runs.json come back from $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-.}
DEADLINE=540  # seconds after this script started (bash's SECONDS)

# limit CAP LATER: a part's limit in seconds, its CAP or the time left before the deadline less LATER (what the parts
# after it are expected to need), whichever is less; at least 1 (timeout 0 would mean no limit)
limit() {
    local left=$((DEADLINE - SECONDS - $2))
    local n=$((left < $1 ? left : $1))
    echo $((n < 1 ? 1 : n))
}

if [ -d .whl ]; then  # the wheels bench/gpu_wheels.sh made, installed beside the image's packages
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/xsa-site \
        .whl/*.whl || { echo "bench/gpu.sh: the wheels in .whl/ (for Python 3.12) do not install on $("$PYTHON" -V 2>&1);" \
        "set --python-version in bench/gpu_wheels.sh to this machine's and make them again"; exit 1; }
    export PYTHONPATH=/tmp/xsa-site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the project itself, installed or not
export PYTHONUNBUFFERED=1  # a part stopped at its limit still shows what it printed
exec > >(tee "$OUT/gpu_bench.txt") 2>&1
TEE=$!  # waited for at every exit: bash does not, and the log's last lines would be lost with it
trap 'exec >&- 2>&-; wait "$TEE"' EXIT
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || { echo "bench/gpu.sh: no CUDA device visible to torch; run it on a GPU machine with the CUDA build of torch"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not available"
# The XSA overhead ratio alpha=1 / alpha=0 with its 95% interval (interleaved repeats, compiled, bf16), first: the
# figure the study's cost claim rests on. gpu_runs.py's parts after it need at least 200 s.
T=$(limit 150 230)
timeout -k 10 "$T" "$PYTHON" bench/xsa_overhead.py --mode gpu --depths d12 --repeats 10 \
    || echo "bench/xsa_overhead.py: stopped at its $T s limit, or failed (above)"
# The study's training at d12 and d24 (compiled; 2 warm-up, 20 steady at d12 and 10 at d24, and 2 profiled updates):
# tokens/s, MFU, warm-up and steady peak memory against the prediction, graph breaks and recompiles, time by kernel
# family and the GPU's idle fraction; the exactness checks on the device; the synchronizing CUDA calls on the study's
# real path. Its own budget ends 15 s before its limit: its imports come before that clock starts, the table after.
T=$(limit 400 30)
timeout -k 10 "$T" "$PYTHON" bench/gpu_runs.py --budget-s $((T - 15)) --out "$OUT/gpu_runs.json" \
    || echo "bench/gpu_runs.py: stopped at its $T s limit, or failed (above)"
T=$(limit 30 0)
timeout -k 10 "$T" "$PYTHON" bench/generation.py --depth d12 --device cuda --new-tokens 256 --samples 8 \
    || echo "bench/generation.py: stopped at its $T s limit, or failed (above)"
