"""What choosing a checkpoint costs per GB: the load test and the CRC check that xsa_exp.run_dir.newest_checkpoint
makes before a resume (and load_trained before an evaluation), on a checkpoint of --gb GB of fp32 weights.

    python bench/checkpoint_check.py [--gb 1] [--folder /tmp] [--repeats 3]

Each repeat is timed twice: with the file in the page cache (just written or read), and after asking the kernel to
drop it (posix_fadvise DONTNEED), which reads it from the disk as a requeued job on a new node does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from xsa_exp import run_dir as rd


def uncache(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--folder", default=tempfile.gettempdir())
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        path = rd.step_checkpoint(Path(folder), 1)
        path.parent.mkdir(parents=True)
        torch.save({"global_step": 1, "w": torch.zeros(int(args.gb * 2**30) // 4)}, path)
        size = path.stat().st_size / 2**30
        for cached in (True, False):
            times = []
            for _ in range(args.repeats):
                if not cached:
                    uncache(path)
                start = time.perf_counter()
                assert rd.newest_checkpoint(Path(folder)) == path
                times.append(time.perf_counter() - start)
            median = statistics.median(times)
            print(f"{'page cache' if cached else 'from disk '}: {size:.2f} GB, newest_checkpoint "
                  f"{', '.join(f'{t:.2f}' for t in times)} s, median {median:.2f} s = {size / median:.2f} GB/s")


if __name__ == "__main__":
    main()
