"""Cost of the HumanEval sandbox per isolation mode: per-program overhead and HumanEval's sandbox time.

    python bench/sandbox_overhead.py [--repeats 50] [--bundle ../shared/eval_bundle]

Per program: the median wall time of run_program on a trivial program ("pass"), which is all setup
(temporary directory, fork, namespaces and mounts, interpreter start, guard, clean-up). HumanEval:
the wall time of running all 164 canonical solutions (prompt + solution + tests) through run_program
one after another, i.e. the sandbox's share of ChatCORE's HumanEval time (generation not included),
with the number that pass. Modes are interleaved per repeat; a mode unavailable here is reported, not run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from xsa_exp.config.schema import ChatCoreConfig
from xsa_exp.eval.bundle import resolve_bundle_dir
from xsa_exp.eval.chat import BUNDLE_FILES, humaneval_program
from xsa_exp.eval.sandbox import MODES, run_program, unavailable_reason

LIMITS = (ChatCoreConfig().humaneval_timeout_s, ChatCoreConfig().humaneval_memory_mb)  # ChatCORE's, per program


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--bundle", default=None)
    args = parser.parse_args()
    modes = [m for m in MODES if unavailable_reason(m) is None]
    for mode in MODES:
        if mode not in modes:
            print(f"{mode}: not available here ({unavailable_reason(mode)})")

    times: dict[str, list[float]] = {m: [] for m in modes}
    for mode in modes:  # warm-up: page cache, first-use costs
        run_program("pass", *LIMITS, mode=mode)
    for _ in range(args.repeats):
        for mode in modes:
            start = time.perf_counter()
            result = run_program("pass", *LIMITS, mode=mode)
            times[mode].append(time.perf_counter() - start)
            assert result.passed, (mode, result.detail)
    print(f"\nper program (trivial program, median of {args.repeats}):")
    for mode in modes:
        print(f"  {mode:<11} {1000 * statistics.median(times[mode]):7.1f} ms")

    path = resolve_bundle_dir(args.bundle) / "eval_data" / BUNDLE_FILES["humaneval"]
    if not path.is_file():
        print(f"\nHumanEval: {path} not found; set --bundle")
        return
    examples = [json.loads(line) for line in path.read_text().splitlines()]
    programs = [humaneval_program(e, e["prompt"] + e["canonical_solution"], marker="done") for e in examples]
    print(f"\nHumanEval, {len(programs)} canonical solutions through run_program:")
    for mode in modes:
        start = time.perf_counter()
        passed = sum(run_program(program, 20, LIMITS[1], mode=mode).passed for program in programs)
        print(f"  {mode:<11} {time.perf_counter() - start:6.1f} s   {passed}/{len(programs)} pass")


if __name__ == "__main__":
    main()
