"""A step's transient memory on a CPU, measured in a fresh process: bench/memory_model.py and bench/loss_head.py run
their own script with --child and these arguments, which prints (peak resident set - resident set before) in bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure_in_child(script: str, *args) -> int:
    """The bytes `script --child *args` prints last, from a fresh process."""
    # glibc then serves every block from 64 KiB with its own mmap and returns it when freed, so the resident set
    # follows the live tensors (else freed activations stay in malloc's heap and hide the next step's peak).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    result = subprocess.run([sys.executable, script, "--child", *map(str, args)], cwd=REPO, capture_output=True,
                            text=True, timeout=1800, env=env)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return int(result.stdout.strip().splitlines()[-1])


def rss_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (the peak) of this process, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")
