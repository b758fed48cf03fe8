"""DDP on CPU: step time of 2 gloo processes vs 1 process at the same global batch, for DDP bucket sizes.

    python bench/ddp_step_time.py [--steps 40] [--bucket-mb 1 25 100] [--depth tiny]

The preset with 4,096 tokens per step (1 process: 2 accumulated micro-batches of 8 rows; 2 processes: one
micro-batch each), DDP as training runs it (gradients as bucket views, no buffer broadcast) with each
train.ddp_bucket_mb given. Median step time over the run's train rows after the first 5.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def median_step_seconds(devices: int, steps: int, depth: str, bucket_mb: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        args = ["logger=csv", f"depth={depth}", "trainer=cpu", f"trainer.devices={devices}",
                "train.total_batch_tokens=4096", "train.device_batch_size=8", f"train.max_steps={steps}",
                "eval.every=1000", "eval.diag_every=0", f"train.ddp_bucket_mb={bucket_mb}", f"hydra.run.dir={tmp}/run"]
        result = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True)
        if result.returncode:
            sys.exit(result.stderr[-3000:])
        with open(Path(tmp) / "run" / "metrics.csv") as f:
            rates = [float(r["train/tokens_per_sec"]) for r in csv.DictReader(f) if r["train/tokens_per_sec"]]
    return statistics.median(4096 / rate for rate in rates[5:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--depth", default="tiny")
    parser.add_argument("--bucket-mb", type=int, nargs="+", default=[25])
    args = parser.parse_args()
    one = median_step_seconds(1, args.steps, args.depth, args.bucket_mb[0])
    print(f"1 process: {one * 1e3:.0f} ms/step")
    for bucket_mb in args.bucket_mb:
        two = median_step_seconds(2, args.steps, args.depth, bucket_mb)
        print(f"2 processes (gloo), {bucket_mb} MB buckets: {two * 1e3:.0f} ms/step; ratio {two / one:.3f}")


if __name__ == "__main__":
    main()
