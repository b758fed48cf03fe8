"""Time `python train.py` (the README's main command) for both arms and report their final val bpb.

    python bench/default_run.py [--arms xsa baseline] [extra overrides...]

Runs each arm in a fresh run directory under a temporary folder, with the user's default config
(wandb offline included), and prints wall time, peak RSS, final val bpb and the corpus's unigram bpb.
"""

from __future__ import annotations

import argparse
import csv
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = {"xsa": [], "baseline": ["xsa.alpha=0"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args, overrides = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'arm':<10}{'wall s':>8}{'peak RSS MB':>13}{'val bpb':>9}{'unigram bpb':>13}")
        for arm in args.arms:
            run_dir = Path(tmp) / arm
            start = time.perf_counter()
            result = subprocess.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", *ARMS[arm], *overrides],
                                    cwd=REPO, capture_output=True, text=True)
            wall = time.perf_counter() - start
            if result.returncode:
                sys.exit(f"{arm} failed:\n{result.stderr[-3000:]}")
            rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            with open(run_dir / "metrics.csv") as f:
                bpb = [float(r["val/bpb"]) for r in csv.DictReader(f) if r["val/bpb"]][-1]
            unigram = re.search(r"unigram baseline ([\d.]+) bits/byte", result.stderr + result.stdout).group(1)
            print(f"{arm:<10}{wall:>8.1f}{rss_mb:>13.0f}{bpb:>9.4f}{unigram:>13}")


if __name__ == "__main__":
    main()
