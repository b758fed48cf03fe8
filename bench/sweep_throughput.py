"""Runs per hour of finished sweeps, from their run directories' file times.

    python bench/sweep_throughput.py runs/study/heads [runs/study/seq ...]

A run starts when train.py writes its config.yaml and ends when it writes checkpoints/final.ckpt. Per sweep:
the complete runs, the wall time from the first start to the last end, runs per hour over it, the median wall
time of one run, and how many ran at once on average (the sum of run times over the sweep's wall time).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from xsa_exp import run_dir as rd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="+", type=Path)
    args = parser.parse_args()
    print("| sweep | runs | wall (min) | runs/hour | median run (min) | runs at once |")
    print("|---|---|---|---|---|---|")
    for sweep in args.sweeps:
        spans = [((job / rd.CONFIG).stat().st_mtime, rd.final_checkpoint(job).stat().st_mtime)
                 for job in sorted(sweep.iterdir()) if rd.final_checkpoint(job).is_file()]
        if not spans:
            print(f"| {sweep} | 0 | | | | |")
            continue
        wall = max(end for _, end in spans) - min(start for start, _ in spans)
        runs = [end - start for start, end in spans]
        print(f"| {sweep} | {len(spans)} | {wall / 60:.1f} | {len(spans) / wall * 3600:.1f} | "
              f"{statistics.median(runs) / 60:.2f} | {sum(runs) / wall:.2f} |")


if __name__ == "__main__":
    main()
