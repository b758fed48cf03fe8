"""The one error type for problems the user can fix, and the one handler of train.py, evaluate.py and
`python -m xsa_exp.report`.

A UserError's message is one line that names what is wrong and the fix. Its subclasses say where the
problem lies (ConfigError: a setting; RunError, BundleError, DataError, ReportError: a run, the eval
bundle, data, a report folder) and are raised as they are: nothing catches one to re-raise another.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_STATUS = 2


class UserError(Exception):
    """A problem the user can fix; the message is one line naming it and the fix."""
    label = "error"

    def __str__(self) -> str:
        # Raised in a DataLoader worker, it comes back as this type made from torch's "Caught <type> in DataLoader
        # worker process N. Original Traceback ..." text, whose last line is "<module>.<type>: <the message>".
        text = super().__str__()
        if text.startswith("Caught ") and "\nOriginal Traceback" in text:
            return text.rstrip().splitlines()[-1].split(": ", 1)[-1]
        return text


class ConfigError(UserError, ValueError):
    """A setting (a key, a value, a combination of keys) that cannot run."""
    label = "config error"


class XsaExpWarning(UserWarning):
    """A warning of ours: what happened and what was done instead, printed as one line (xsa_exp/console.py)."""


FAILED_JOBS: list[str] = []  # the lines of this process's sweep jobs that failed, in order


class JobFailed(Exception):
    """A sweep job's UserError, passed on to Hydra as an Exception: Hydra records the job as failed and runs the
    sweep's other jobs (a SystemExit would end the sweep), then raises the first one again at the sweep's end, where
    the entry point prints it (xsa_exp/config/preflight.py, run_app)."""


@contextmanager
def one_line_per_job(in_sweep: bool) -> Iterator[None]:
    """A run's UserError as exit_on_user_error's one line and exit status 2; a sweep job's printed as it happens,
    then passed on as JobFailed, so that the sweep goes on with its other jobs."""
    if not in_sweep:
        with exit_on_user_error():
            yield
        return
    try:
        yield
    except UserError as e:
        print(f"{e.label}: {e}", file=sys.stderr)
        FAILED_JOBS.append(f"{e.label}: {e}")
        raise JobFailed(FAILED_JOBS[-1]) from None


@contextmanager
def exit_on_user_error(label: str | None = None, say: bool = True) -> Iterator[None]:
    """A UserError becomes one line on stderr, `<label>: <message>`, and exit status 2. The label is the
    error's own ("error", "config error" for a ConfigError) unless given: the checks of a command line
    before it runs report every problem as a config error. say=False: the exit status only (another process
    prints the same line)."""
    try:
        yield
    except UserError as e:
        if say:
            print(f"{label or e.label}: {e}", file=sys.stderr)
        sys.exit(EXIT_STATUS)
