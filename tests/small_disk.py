"""A small disk for the tests of a full one: a tmpfs of a few MiB where the test may mount one (root, a kernel that
allows it), else a folder whose writes fail with ENOSPC past the same size, through the calls the training process
makes (every file of a run is opened with open(), or os.fdopen, which calls it).

    with small_disk(folder, mib=3) as disk:   # disk.command(...): train.py's command line on this disk
        ...
        disk.grow(mib=64)                     # space returns

XSA_EXP_TEST_SIMULATED_DISK=1 takes the simulated disk even where a tmpfs could be mounted (to test that path).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

SIMULATE = "XSA_EXP_TEST_SIMULATED_DISK"


class SmallDisk:
    def __init__(self, folder: Path, mib: int, mounted: bool):
        self.folder, self.mib, self.mounted = folder, mib, mounted

    def command(self, *args: str) -> list[str]:
        """train.py with args, writing to this disk."""
        if self.mounted or self.mib is None:
            return [sys.executable, "train.py", *args]
        return [sys.executable, "-c", f"import tests.small_disk as d; d.run_limited({str(self.folder)!r}, "
                                      f"{self.mib << 20}, {list(args)!r})"]

    def grow(self, mib: int) -> None:
        if self.mounted:
            subprocess.run(["mount", "-o", f"remount,size={mib}m", str(self.folder)], check=True)
        else:
            self.mib = None  # no limit


def mount_tmpfs(folder: Path, mib: int) -> bool:
    if os.environ.get(SIMULATE):
        return False
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(folder)],
                              capture_output=True).returncode == 0
    except OSError:  # no mount command
        return False


@contextmanager
def small_disk(folder: Path, mib: int):
    folder.mkdir(parents=True, exist_ok=True)
    mounted = mount_tmpfs(folder, mib)
    try:
        yield SmallDisk(folder, mib, mounted)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=True)


# -----------------------------------------------------------------------------
# The simulated disk, in the training process


def used(folder: Path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files
               if os.path.exists(os.path.join(d, f)))


class LimitedFile:
    """A file on the simulated disk: a write that would fill it past its size fails as a full disk's does."""

    def __init__(self, file, folder: Path, capacity: int):
        self._file, self._folder, self._capacity = file, folder, capacity

    def write(self, data):
        if used(self._folder) + len(data) > self._capacity:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __iter__(self):
        return iter(self._file)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._file.__exit__(*exc)


@contextmanager
def limited_writes(folder: Path, capacity: int):
    """In this process, every file opened for writing under folder limited to capacity bytes in all."""
    real_open, root = io.open, Path(folder).resolve()

    def limited_open(file, mode="r", *rest, **kwargs):
        f = real_open(file, mode, *rest, **kwargs)
        path = Path(os.readlink(f"/proc/self/fd/{f.fileno()}"))
        writing = any(c in mode for c in "wax+")
        return LimitedFile(f, root, capacity) if writing and root in path.parents else f

    saved = builtins.open, io.open
    builtins.open = io.open = limited_open  # os.fdopen calls io.open
    try:
        yield
    finally:
        builtins.open, io.open = saved


def run_limited(folder: str, capacity: int, args: list[str]) -> None:
    """Run train.py with args, every file opened for writing under folder limited to capacity bytes in all."""
    import runpy

    with limited_writes(Path(folder), capacity):
        sys.argv = ["train.py", *args]
        runpy.run_path("train.py", run_name="__main__")
