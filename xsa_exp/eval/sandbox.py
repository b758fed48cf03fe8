"""Run untrusted, model-generated Python (HumanEval candidates plus the task's tests) for chat evaluation.

Three isolation modes (MODES), strongest first; run_program uses the first that works on the machine
(isolation_mode(), found once by running a small program in each) unless told one:
  - "bubblewrap" (``bwrap`` on PATH) and "namespaces" (the same set up directly, through libc, in the
    child before exec): the program runs in its own user, mount, pid, network and IPC namespaces, as an
    unprivileged uid with no capabilities and no_new_privs. The filesystem is a boundary there: the
    root is mounted read-only (and nosuid); /tmp, /var/tmp, /dev/shm, the temporary directory, the
    user's home (by $HOME and by the password database), the project's runs/ and the data cache
    ($XSA_EXP_CACHE, else ~/.cache/xsa-exp) are covered by empty read-only tmpfs, with only the
    interpreter's prefix bound back read-only where it lies inside them (pyenv, conda, a venv under the
    home); the work directory, at its usual path, is a fresh 64 MiB tmpfs holding the program, the one
    writable place. /proc is the pid namespace's own, so other processes (their environment, their
    root) are out of sight and out of reach of signals, and when the program ends every process it
    started ends with it. The network namespace has only a loopback that is down.
  - "guard only", the fallback where neither works (bwrap absent, user namespaces refused): the
    program shares the host's namespaces and is held by the layers below alone; isolation_mode() says
    so once on stderr, and ChatCORE records the mode in chatcore.json and summary.json ("sandbox").

Layers in every mode (depth behind the namespaces; the only protection in "guard only"):
  1. Process: the program runs as ``sys.executable -I -B`` (isolated mode: no PYTHON* variables, no
     user site, no script dir on sys.path; no .pyc writes) in a fresh throw-away directory that is
     deleted afterwards whatever happens, with stdin from /dev/null, a minimal environment (no
     inherited secrets such as WANDB_API_KEY or HF_TOKEN; HOME and TMPDIR point at the work
     directory) and stdout/stderr sent to files outside it of which only a tail is read back.
  2. Resource limits, set before exec: address space (``memory_mb``), CPU seconds (about
     ``timeout_s``, a backstop for the wall clock), 16 MiB per written file (which also bounds the
     captured output), no core dumps; inside namespaces also RLIMIT_NPROC (64), which outside one would
     count all of the user's processes (for root the kernel ignores it). The child leads its own
     process group, which is killed with SIGKILL at the wall-clock timeout, and in any case when the
     run ends (stray children).
  3. Guard: before the program runs, an audit hook (``sys.addaudithook``; Python code cannot remove
     one) ends the process at once, with a marker on stderr and a dedicated exit status, on: writes,
     creates, deletes, renames, mode/owner changes outside the work directory; links and symlinks;
     any process creation (fork, exec, spawn, system, subprocess, and ``_posixsubprocess.fork_exec``,
     which has no audit event of its own and is replaced); os.kill and os.killpg; changing
     resource limits; sockets; ctypes and cffi (their memory access could undo the hook). Reading is
     allowed (imports need it). It exits rather than raising PermissionError so that a bare ``except``
     in the program cannot swallow the violation. The program itself is compiled from a file in the
     work directory and run as ``__main__``, so tracebacks show its file and line numbers.

Measured by the red-team corpus (tests/test_sandbox_redteam.py: 34 escape techniques, each checked by
its effect on the real filesystem and processes): the namespace modes contain all 34; the guard alone
contains 15. It is ordinary Python, so a program can defeat it (swap the hook's code through the
garbage collector, monkeypatch the os.path helpers it calls) and then write, delete, rename, link,
spawn processes that outlive the run, connect to local ports; calls without audit events
(``os.mkfifo``, ``signal.pidfd_send_signal``) pass it, reading is allowed (the home, other processes'
environment through /proc), and only single files are size-limited. Programs that import ctypes
indirectly (numpy does) count as "blocked" in every mode.

Status: exit 0 within the limits -> "passed"; wall clock or CPU limit -> "timeout"; MemoryError (or a
SIGKILL we did not send) -> "memory"; a guard violation -> "blocked"; anything else -> "failed".

This module runs a program and reads its result; the guard's program is sandbox_guard.py, the
namespaces, mounts, limits and bubblewrap's command line are sandbox_isolation.py.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from xsa_exp.eval.sandbox_guard import BLOCKED_EXIT_CODE, BLOCKED_MARKER, guard_program
from xsa_exp.eval.sandbox_isolation import LIBC, NPROC_LIMIT, SCRIPT_NAME, bwrap_command, child_setup, layout_for

MODES = ("bubblewrap", "namespaces", "guard only")  # strongest first; by default the first available is used

_OUTPUT_TAIL_BYTES = 4096
_DETAIL_CHARS = 300
_PROBE_PROGRAM = "open('probe.txt', 'w').write('x')\n"


class SandboxUnavailable(RuntimeError):
    """The requested isolation mode cannot run on this machine."""


@dataclass
class ExecutionResult:
    status: str  # "passed" | "failed" | "timeout" | "memory" | "blocked"
    detail: str  # short reason: the last line of stderr, the limit hit, or the blocked call
    seconds: float
    stdout: str = ""  # the last few KiB the program printed

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _child_env(workdir: str) -> dict[str, str]:
    return {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LC_ALL": "C.UTF-8"}


def _tail(path: str) -> str:
    with open(path, "rb") as file:
        file.seek(max(0, os.path.getsize(path) - _OUTPUT_TAIL_BYTES))
        return file.read().decode("utf-8", "replace")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already empty
        pass


def _classify(returncode: int, timed_out: bool, stderr: str, timeout_s: float) -> tuple[str, str]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if timed_out:
        return "timeout", f"wall-clock limit of {timeout_s:g}s exceeded"
    if returncode == 0:
        return "passed", ""
    if returncode == BLOCKED_EXIT_CODE and last.startswith(BLOCKED_MARKER):
        return "blocked", last
    if returncode == -signal.SIGXCPU:
        return "timeout", "CPU time limit exceeded"
    if "MemoryError" in last:
        return "memory", last
    if returncode == -signal.SIGKILL:  # not our timeout, so most likely the kernel's OOM killer
        return "memory", "killed by SIGKILL (most likely out of memory)"
    if returncode < 0:
        return "failed", f"killed by signal {-returncode} ({signal.strsignal(-returncode)})"
    return "failed", last or f"exit status {returncode}"


@functools.cache
def unavailable_reason(mode: str) -> str | None:
    """Why ``mode`` cannot run here, or None where it can: found once, by running a small program in it."""
    if mode not in MODES:
        raise ValueError(f"unknown sandbox mode {mode!r}; expected one of: {', '.join(MODES)}")
    if mode == "guard only":
        return None
    if mode == "bubblewrap" and shutil.which("bwrap") is None:
        return "bwrap is not on PATH (package bubblewrap)"
    if mode == "namespaces" and LIBC is None:
        return "needs Linux (unshare, mount)"
    try:
        result = _run(_PROBE_PROGRAM, 10.0, 256, mode)
    except (OSError, subprocess.SubprocessError) as e:
        return f"setting it up failed ({e})"
    return None if result.passed else f"a test program did not pass ({result.status}: {result.detail})"


@functools.cache
def isolation_mode() -> str:
    """The strongest mode that runs here, which run_program uses by default; when that is the guard
    alone, says so once on stderr."""
    mode = next(m for m in MODES if unavailable_reason(m) is None)
    if mode == "guard only":
        reasons = "; ".join(f"{m}: {unavailable_reason(m)}" for m in MODES[:-1])
        print(f"warning: the HumanEval sandbox has no filesystem boundary on this machine ({reasons}); generated "
              "code runs under the audit-hook guard alone, which code written to escape can defeat", file=sys.stderr)
    return mode


def run_program(program: str, timeout_s: float, memory_mb: int, mode: str | None = None) -> ExecutionResult:
    """Run ``program`` (a complete Python source) contained as described above; it passes when the
    process exits 0 within ``timeout_s`` seconds of wall clock and ``memory_mb`` MiB of address space.
    ``mode`` is one of MODES; by default the strongest available (isolation_mode())."""
    if mode is None:
        mode = isolation_mode()
    elif (reason := unavailable_reason(mode)) is not None:
        raise SandboxUnavailable(f"sandbox mode {mode!r} is not available here: {reason}")
    return _run(program, timeout_s, memory_mb, mode)


def _run(program: str, timeout_s: float, memory_mb: int, mode: str) -> ExecutionResult:
    with tempfile.TemporaryDirectory(prefix="xsa_sandbox_") as root:
        # The program may write only inside workdir; its output files lie beside it, out of its reach.
        workdir = os.path.join(root, "work")
        os.mkdir(workdir)
        program_path = Path(workdir, SCRIPT_NAME)
        program_path.write_text(program, encoding="utf-8")
        stdout_path, stderr_path = os.path.join(root, "stdout"), os.path.join(root, "stderr")
        layout = None if mode == "guard only" else layout_for(workdir)
        # outside a namespace it would count all the user's processes
        nproc = 0 if mode == "guard only" else NPROC_LIMIT
        command = [sys.executable, "-I", "-B", "-c", guard_program(nproc), SCRIPT_NAME]
        start = time.monotonic()
        with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr, open(program_path, "rb") as source:
            if mode == "bubblewrap":
                command = bwrap_command(layout, source.fileno(), command)
            process = subprocess.Popen(
                command, cwd=workdir, env=_child_env(workdir), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                start_new_session=True, pass_fds=(source.fileno(),) if mode == "bubblewrap" else (),
                preexec_fn=child_setup(mode, timeout_s, memory_mb, layout, program),
            )
        timed_out = False
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(process.pid)
            process.wait()
        seconds = time.monotonic() - start
        returncode = process.returncode
        if mode == "bubblewrap" and returncode > 128:  # bwrap reports a death by signal N as exit status 128 + N
            returncode = 128 - returncode
        status, detail = _classify(returncode, timed_out, _tail(stderr_path), timeout_s)
        return ExecutionResult(status, detail[:_DETAIL_CHARS], seconds, _tail(stdout_path))
