"""What the preflight of the documented commands costs (tests/test_readme_commands.py, the suite's largest share):
how many commands and sweep jobs (the presets' own sweeps included), how many distinct, and the seconds Hydra's
composition and our checks take per job, in this process (one thread).

    python bench/preflight_cost.py

Prints one table row for BENCHMARKS.md. The stand-ins are the test's (a ClimbMix mirror of empty shard files, ...).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests package, whose helpers compose as Hydra does
from tests.hydra_app import check_runs, compose_base, run_configs  # noqa: E402
from tests.test_readme_commands import BUNDLE, COMMANDS, arguments, make_finished_runs, make_stand_ins  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stand_ins = make_stand_ins(Path(tmp))
        os.chdir(tmp)
        os.environ["XSA_EXP_EVAL_BUNDLE"] = str(BUNDLE)
        jobs, distinct, compose_s, check_s = 0, set(), [], []
        for entry, args in COMMANDS:
            argv = arguments(args, stand_ins)
            started = time.perf_counter()
            base, multirun = compose_base(entry, argv)
            runs = run_configs(entry, base, multirun)
            composed = time.perf_counter()
            make_finished_runs(entry, runs, Path(tmp))
            check_runs(entry, runs, multirun)
            checked = time.perf_counter()
            jobs += len(runs)
            distinct.update((entry, tuple(OmegaConf.to_container(cfg.hydra.overrides.task))) for cfg in runs)
            compose_s.append((composed - started) / (len(runs) + multirun))  # the base config, then each job
            check_s.append((checked - composed) / len(runs))
    print("| commands | sweep jobs | distinct jobs | median s per composition | median s of checks per job |")
    print(f"| {len(COMMANDS)} | {jobs:,} | {len(distinct):,} | {statistics.median(compose_s):.3f} | "
          f"{statistics.median(check_s):.4f} |")


if __name__ == "__main__":
    main()
