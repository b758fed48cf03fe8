"""CPU matmul throughput in fp32 and bf16 at the model widths, the ceiling a training step can reach.

    python bench/cpu_matmul.py [--threads N] [--widths 128 256 ...] [--reps 50]

For each width d: (2048 x d) @ (d x 4d), the shape of an MLP's first matmul on one 2,048-token step,
timed as the median of --reps calls after 5 warm-up calls; GFLOP/s = 2 x 2048 x d x 4d / time. Where bf16 matmul
is emulated (no AVX512-BF16 or AMX), a bf16 call at 768 wide takes seconds: fewer widths and reps keep it short.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

TOKENS = 2048


def gflops(d: int, dtype: torch.dtype, reps: int = 50) -> float:
    a = torch.randn(TOKENS, d, dtype=dtype)
    b = torch.randn(d, 4 * d, dtype=dtype)
    for _ in range(5):
        a @ b
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * TOKENS * d * 4 * d / statistics.median(times) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256, 384, 768])
    parser.add_argument("--reps", type=int, default=50, help="timed calls per width and dtype")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'width':>6}{'fp32 GFLOP/s':>14}{'bf16 GFLOP/s':>14}{'bf16/fp32':>11}")
    for d in args.widths:
        fp32, bf16 = gflops(d, torch.float32, args.reps), gflops(d, torch.bfloat16, args.reps)
        print(f"{d:>6}{fp32:>14.1f}{bf16:>14.1f}{bf16 / fp32:>11.2f}")


if __name__ == "__main__":
    main()
