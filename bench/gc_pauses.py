"""The garbage collector during a compiled CPU training run, with and without FrozenGC (xsa_exp/training/host.py).

    python bench/gc_pauses.py [--steps 60]

Each mode in a fresh process: the tiny preset, train.compile=true, one thread, no evaluations. After update 2 (the
first update compiled, FrozenGC has frozen), it counts the objects the collector tracks and times one full
collection (what the collector's next generation-2 pass would cost), then records every collection during the
remaining updates by generation (count, total and longest).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(frozen: bool, steps: int) -> None:
    import lightning as L
    from gpu_runs import compose_cfg  # bench/gpu_runs.py, beside this script: a config as train.py hands it over

    from xsa_exp.training import run as training
    from xsa_exp.training.host import FrozenGC

    found: dict = {"collections": []}
    started = {}

    def on_collection(phase, info):
        if phase == "start":
            started["t"] = time.perf_counter()
        else:
            found["collections"].append((info["generation"], time.perf_counter() - started["t"]))

    class AfterUpdate2(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 2 and "tracked" not in found:
                found["tracked"] = len(gc.get_objects())
                t0 = time.perf_counter()
                gc.collect()
                found["full_collection_ms"] = 1e3 * (time.perf_counter() - t0)
                gc.callbacks.append(on_collection)

    build = training.build_callbacks
    training.build_callbacks = lambda *a: [c for c in build(*a) if frozen or not isinstance(c, FrozenGC)] + [
        AfterUpdate2()]
    cfg = compose_cfg(["logger=csv", "train.compile=true", f"train.max_steps={steps}", "eval.every=0",
                       "eval.diag_every=0", f"log.print_every={steps}", "train.cpu_threads=1"])
    with tempfile.TemporaryDirectory() as tmp:
        training.train(cfg, Path(tmp) / "run")
    gc.callbacks.remove(on_collection)
    by_generation = {g: [s for gen, s in found["collections"] if gen == g] for g in (0, 1, 2)}
    print(json.dumps({"frozen": frozen, "tracked objects": found["tracked"],
                      "full collection ms": round(found["full_collection_ms"], 1),
                      **{f"generation {g}": {"count": len(v), "total ms": round(1e3 * sum(v), 2),
                                             "longest ms": round(1e3 * max(v, default=0), 2)}
                         for g, v in by_generation.items()}}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--child", choices=("frozen", "thawed"))
    args = parser.parse_args()
    if args.child:
        child(args.child == "frozen", args.steps)
        return
    for mode in ("thawed", "frozen"):
        result = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(args.steps)], cwd=REPO,
                                capture_output=True, text=True)
        if result.returncode:
            sys.exit(result.stderr[-3000:])
        print(result.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
