"""How long a command line the preflight refuses takes, end to end, and whether it imported torch on the way.

    python bench/refused_command.py [--runs 5] [-- train.py model.qk_norm=flase]

Runs the command (default: train.py with a misspelt boolean) that many times from an empty folder and prints the
median wall time and the error line, for BENCHMARKS.md; then once more with PYTHONPROFILEIMPORTTIME, which lists
the imports on stderr (untimed: listing them costs time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("command", nargs="*", default=["train.py", "model.qk_norm=flase"])
    args = parser.parse_args()
    script, *overrides = args.command
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        def run(env=None):
            return subprocess.run([sys.executable, str(REPO / script), *overrides], cwd=tmp, env=env,
                                  capture_output=True, text=True)

        for _ in range(args.runs):
            started = time.perf_counter()
            result = run()
            times.append(time.perf_counter() - started)
        listed = run({**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}).stderr.splitlines()
    imported = {line.rpartition("|")[2].strip() for line in listed if line.startswith("import time:")}
    error = result.stderr.strip()
    print(f"{script} {' '.join(overrides)}: exit {result.returncode}, median {statistics.median(times):.2f} s of "
          f"{args.runs} ({', '.join(f'{t:.2f}' for t in times)}); torch imported: {'torch' in imported}")
    print(error)


if __name__ == "__main__":
    main()
