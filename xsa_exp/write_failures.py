"""A write to the run directory that fails for want of space or of the file system, as one line.

The run's writers name the file they write (`writing`), since an OSError from write() names none and torch's
checkpoint writer wraps it in a RuntimeError. `write_failure` finds such a failure in an exception's chain (the first
one: a full disk makes the cleanup's writes fail too), and `failure_line` says what happened, where, what is safe and
what to do:

    no space left on /scratch while writing /scratch/runs/x/checkpoints/step000400.ckpt; the newest complete
    checkpoint is /scratch/runs/x/checkpoints/step000200.ckpt; free space and relaunch with resume=auto
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from xsa_exp.errors import UserError

# errno: (what happened, with {fs} the file system's mount point; what to do before relaunching)
CAUSES = {
    errno.ENOSPC: ("no space left on {fs}", "free space"),
    errno.EDQUOT: ("disk quota exceeded on {fs} (EDQUOT)", "free space or raise the quota"),
    errno.EROFS: ("{fs} became read-only (EROFS; a file system is remounted read-only after an error)",
                  "check it, remount it read-write"),
    errno.ESTALE: ("the network file system {fs} was lost (ESTALE)", "remount it"),
    errno.EIO: ("an I/O error on {fs} (EIO: a failing disk or a lost network mount)", "check the file system"),
    errno.ENOENT: ("the run directory vanished from {fs} (ENOENT: a lost mount, or it was deleted)", "restore it"),
}


class WriteFailed(UserError):
    """A write to the run directory failed (full disk, quota, read-only or lost file system); one line."""


@contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Name `path` on the OSErrors of writing it, for write_failure."""
    try:
        yield
    except Exception as e:
        for error in chain(e):
            if isinstance(error, OSError) and getattr(error, "written_file", None) is None:
                error.written_file = Path(path)
        raise


def chain(error: BaseException | None) -> Iterator[BaseException]:
    """error, then the exception it was raised from or while handling, and so on."""
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def write_failure(error: BaseException, run_dir: Path) -> OSError | None:
    """The first failed write of a named file in error's chain that CAUSES explains. A missing file is one only if
    the run directory itself is gone: any other is a bug, and keeps its traceback."""
    failures = [e for e in chain(error) if isinstance(e, OSError) and getattr(e, "written_file", None) is not None
                and e.errno in CAUSES and (e.errno != errno.ENOENT or not Path(run_dir).is_dir())]
    return failures[-1] if failures else None


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding path (or that held it, for a path that is gone)."""
    path = Path(os.path.abspath(path))
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def kept_checkpoint(run_dir: Path) -> str:
    """What a relaunch continues from: the newest checkpoint by name (a checkpoint is renamed into place only once
    complete, and loading one from a failing file system could hang)."""
    from xsa_exp import run_dir as rd  # here: run_dir.py imports this module

    try:
        newest = rd.checkpoints_newest_first(run_dir)[:1] if Path(run_dir).is_dir() else None
    except OSError:
        newest = None
    if newest is None:
        return "its checkpoints cannot be listed now"
    return f"the newest complete checkpoint is {newest[0]}" if newest else \
        "there is no complete checkpoint yet (a relaunch starts from step 0)"


def cause_and_fix(failure: OSError) -> tuple[str, str]:
    """What happened, where ("no space left on /scratch"), and what to do before trying again ("free space")."""
    cause, fix = CAUSES[failure.errno]
    return cause.format(fs=mount_point(failure.written_file)), fix


def failure_line(failure: OSError, run_dir: Path) -> str:
    cause, fix = cause_and_fix(failure)
    return (f"{cause} while writing {failure.written_file}; {kept_checkpoint(run_dir)}; "
            f"{fix} and relaunch with resume=auto")
