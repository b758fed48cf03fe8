"""Time `python train.py` (the README's main command) by shape, precision and compilation.

    python bench/default_run.py [--shapes tiny w256 w768] [--precisions 32-true bf16-mixed]
                                [--compile eager compiled] [--malloc tuned glibc] [--seeds 1 2 3] [--arms xsa]
                                [--set key=value ...]

Each combination runs once per seed in a fresh run directory under a temporary folder, one run at a
time, as a user runs it (default config, wandb offline included; `--arms xsa baseline` adds the α = 0
arm). Printed per combination: wall time of the whole command (median over seeds; start-up, tokenizer
cache, evaluations and checkpoint included), median tokens/s over the updates after the first 10
(pooled over seeds), peak RSS (the largest of the runs), minor page faults (median over seeds) and the final val
bpb over the whole validation split (mean and the spread min-max over seeds). `--malloc glibc` runs with glibc's
own malloc settings instead of those xsa-exp sets on a CPU (xsa_exp/training/host.py), by giving GLIBC_TUNABLES, which
xsa-exp leaves to the user: the tunable given is one at its default. `--set` overrides go to every run, e.g.
`--set train.max_steps=40 eval.every=0 eval.diag_every=0` for a throughput-only pass.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = {"xsa": [], "baseline": ["xsa.alpha=0"]}
# The default preset, and the same 4-layer stack at the widths where bf16 matmul pays (seq 256 throughout).
SHAPES = {
    "tiny": [],
    "w256": ["model.n_embd=256", "model.n_head=4", "train.device_batch_size=16", "train.total_batch_tokens=4096"],
    "w768": ["model.n_layer=2", "model.n_embd=768", "model.n_head=12", "train.device_batch_size=4",
             "train.total_batch_tokens=1024"],
}
WARMUP_UPDATES = 10
MALLOC = {"tuned": {}, "glibc": {"GLIBC_TUNABLES": "glibc.malloc.perturb=0"}}


def run_once(run_dir: Path, overrides: list[str], env: dict[str, str]) -> dict:
    """Run train.py with env added to this process's; its wall time, peak RSS and minor page faults (this child
    alone), per-update tokens/s and final val bpb."""
    with open(run_dir.with_suffix(".log"), "w") as log:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "train.py", f"hydra.run.dir={run_dir}", *overrides], cwd=REPO,
                                 stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"train.py {' '.join(overrides)} failed:\n{run_dir.with_suffix('.log').read_text()[-3000:]}")
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    speed = [float(r["train/tokens_per_sec"]) for r in rows
             if r.get("train/tokens_per_sec") and int(r["step"]) > WARMUP_UPDATES]
    bpb = [float(r["val/bpb"]) for r in rows if r.get("val/bpb")]
    return {"wall": wall, "rss_mb": usage.ru_maxrss / 1024, "faults": usage.ru_minflt, "speed": speed,
            "bpb": bpb[-1] if bpb else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=["tiny"], choices=list(SHAPES))
    parser.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"])
    parser.add_argument("--compile", nargs="+", default=["eager"], choices=["eager", "compiled"])
    parser.add_argument("--malloc", nargs="+", default=["tuned"], choices=list(MALLOC))
    parser.add_argument("--seeds", nargs="+", type=int, default=[42])
    parser.add_argument("--arms", nargs="+", default=["xsa"], choices=list(ARMS))
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run")
    args = parser.parse_args()
    print(f"{'shape':<6}{'arm':<9}{'precision':<12}{'mode':<10}{'malloc':<7}{'seeds':>6}{'wall s':>8}{'tok/s':>9}"
          f"{'RSS MB':>8}{'faults':>11}{'val bpb (min-max)':>26}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for shape, arm, precision, mode, malloc in itertools.product(args.shapes, args.arms, args.precisions,
                                                                     args.compile, args.malloc):
            results = []
            for seed in args.seeds:
                overrides = [*SHAPES[shape], *ARMS[arm], f"trainer.precision={precision}",
                             f"train.compile={mode == 'compiled'}", f"seed={seed}", *args.set]
                run_dir = Path(tmp) / f"{shape}-{arm}-{precision}-{mode}-{malloc}-{seed}"
                results.append(run_once(run_dir, overrides, MALLOC[malloc]))
            bpbs = [r["bpb"] for r in results if r["bpb"] is not None]
            quality = (f"{statistics.mean(bpbs):.4f} ({min(bpbs):.4f}-{max(bpbs):.4f})" if bpbs else "-")
            print(f"{shape:<6}{arm:<9}{precision:<12}{mode:<10}{malloc:<7}{len(results):>6}"
                  f"{statistics.median(r['wall'] for r in results):>8.1f}"
                  f"{statistics.median(s for r in results for s in r['speed']):>9,.0f}"
                  f"{max(r['rss_mb'] for r in results):>8.0f}{statistics.median(r['faults'] for r in results):>11,.0f}"
                  f"{quality:>26}", flush=True)


if __name__ == "__main__":
    main()
