"""DDP on CPU: step time of 2 gloo processes vs 1 process at the same global batch.

    python bench/ddp_step_time.py [--steps 40]

The tiny preset with 4,096 tokens per step (1 process: 2 accumulated micro-batches of 8 x 256;
2 processes: one micro-batch each). Median step time over the run's train rows after the first 5.
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


def median_step_seconds(devices: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        args = ["logger=csv", "trainer=cpu", f"trainer.devices={devices}", "train.total_batch_tokens=4096",
                "train.device_batch_size=8", f"train.max_steps={steps}", "eval.every=1000", "eval.diag_every=0",
                f"hydra.run.dir={tmp}/run"]
        result = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True)
        if result.returncode:
            sys.exit(result.stderr[-3000:])
        with open(Path(tmp) / "run" / "metrics.csv") as f:
            rates = [float(r["train/tokens_per_sec"]) for r in csv.DictReader(f) if r["train/tokens_per_sec"]]
    return statistics.median(4096 / rate for rate in rates[5:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    one = median_step_seconds(1, args.steps)
    two = median_step_seconds(2, args.steps)
    print(f"1 process: {one * 1e3:.0f} ms/step; 2 processes (gloo): {two * 1e3:.0f} ms/step; ratio {two / one:.3f}")


if __name__ == "__main__":
    main()
