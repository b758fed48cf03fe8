"""Run untrusted, model-generated Python (HumanEval candidates plus the task's tests) for chat evaluation.

This is containment for evaluation: it stops the accidents and naive misbehaviour that generated code
shows (endless loops, memory blow-ups, stray writes and deletes, subprocesses, network calls). It is
not a security boundary against a determined attacker; code written to escape can (see Limits).

Layers, outermost first:
  1. Process: the program runs as ``sys.executable -I -B`` (isolated mode: no PYTHON* variables, no
     user site, no script dir on sys.path; no .pyc writes) in a fresh throw-away directory that is
     deleted afterwards whatever happens, with stdin from /dev/null, a minimal environment (no
     inherited secrets such as WANDB_API_KEY or HF_TOKEN; HOME and TMPDIR point at the work
     directory) and stdout/stderr sent to files of which only a tail is read back.
  2. Resource limits, set in the child before exec: address space (``memory_mb``), CPU seconds
     (about ``timeout_s``, a backstop for the wall clock), 16 MiB per written file (which also bounds
     the captured output), no core dumps. The child leads its own process group, which is killed
     with SIGKILL at the wall-clock timeout, and in any case when the run ends (stray children).
  3. Network: where the kernel allows it, the child enters a new user and network namespace, whose
     only interface is a loopback that is down, so every connection fails. Only then is RLIMIT_NPROC
     set too, as it then counts the tasks inside that namespace alone (outside one it would count all
     of the user's processes; for root the kernel ignores it). Where unshare is refused (EPERM in
     some containers) the run goes on silently with layer 4 alone.
  4. Guard: before the program runs, an audit hook (``sys.addaudithook``; Python code cannot remove
     one) ends the process at once, with a marker on stderr and a dedicated exit status, on: writes,
     creates, deletes, renames, mode/owner changes outside the work directory; links and symlinks;
     any process creation (fork, exec, spawn, system, subprocess, and ``_posixsubprocess.fork_exec``,
     which has no audit event of its own and is replaced); os.kill and os.killpg; changing
     resource limits; sockets; ctypes (its memory access could undo the hook). Reading is allowed
     (imports need it). It exits rather than raising PermissionError so that a bare ``except`` in
     the program cannot swallow the violation. The program itself is compiled from a file in the
     work directory and run as ``__main__``, so tracebacks show its file and line numbers.

Status: exit 0 within the limits -> "passed"; wall clock or CPU limit -> "timeout"; MemoryError (or a
SIGKILL we did not send) -> "memory"; a guard violation -> "blocked"; anything else -> "failed".

Limits: the guard is ordinary Python, so a program can defeat it, e.g. by monkeypatching the os.path
helpers the hook calls, by loading a fresh copy of an extension module, or through calls that raise
no audit event (``os.mkfifo``, ``signal.pidfd_send_signal``); the filesystem is not otherwise
protected, and programs that import ctypes indirectly (numpy does) count as "blocked". Run
adversarial code in a VM or a locked-down container.
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_SCRIPT_NAME = "program.py"
_FILE_SIZE_LIMIT = 16 * 1024**2
_NPROC_LIMIT = 64  # tasks (processes and threads) inside the child's own user namespace
_OUTPUT_TAIL_BYTES = 4096
_DETAIL_CHARS = 300
_BLOCKED_MARKER = "[xsa-sandbox] blocked:"
_BLOCKED_EXIT_CODE = 86
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000

# Runs in the child before the program: installs the guard of layer 4, then runs the program file
# named by argv[1] as __main__. The two constants above are prepended as MARKER and EXIT_CODE.
_GUARD_BODY = r'''
import os, sys, types
import _posixsubprocess

ROOT = os.path.realpath(os.getcwd())
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
BLOCKED_EVENTS = {
    "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty", "subprocess.Popen",
    "os.kill", "os.killpg", "os.link", "os.symlink", "resource.setrlimit", "resource.prlimit",
}
BLOCKED_PREFIXES = ("socket.", "ctypes.")
# _posixsubprocess may only come back through a re-import, which would restore fork_exec.
BLOCKED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess"}
# Events that modify the filesystem: the (path, dir_fd) argument positions of each target.
PATH_EVENTS = {
    "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.mkdir": ((0, 2),), "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),), "os.rename": ((0, 2), (1, 3)), "os.truncate": ((0, None),),
    "os.utime": ((0, 3),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
    "shutil.rmtree": ((0, 1),),
}


def deny(event, args):
    try:
        what = f"{event} {args[:2]!r}"[:200]  # e.g. the path and mode, not all of sys.path
    except Exception:
        what = event
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os.write(2, f"\n{MARKER} {what}\n".encode("utf-8", "replace"))
    os._exit(EXIT_CODE)


def resolve(path, dir_fd=None):
    """The real absolute path an os call acts on, or None where that cannot be told."""
    if isinstance(path, int):  # a descriptor: the kernel knows what it refers to
        return os.path.realpath(f"/proc/self/fd/{path}")
    path = os.fsdecode(path)
    if not os.path.isabs(path):
        # The "open" event does not report dir_fd, so relative paths may not climb out of their base.
        if os.path.normpath(path).split(os.sep)[0] == os.pardir:
            return None
        if isinstance(dir_fd, int) and dir_fd >= 0:
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return os.path.realpath(path)


def within(real):
    return real is not None and (real == ROOT or real.startswith(ROOT + os.sep) or real == os.devnull)


def guard(event, args):
    if event in BLOCKED_EVENTS or event.startswith(BLOCKED_PREFIXES):
        deny(event, args)
    elif event == "import" and args[0] in BLOCKED_IMPORTS:
        deny(event, args)
    elif event == "open":
        path, mode, flags = args
        if isinstance(path, int):  # wraps a descriptor that was checked when it was opened
            return
        real = resolve(path)
        # A directory descriptor from os.open (mode None) could serve as dir_fd for a later os.open,
        # whose event does not report it, so those must stay inside as well.
        writes = flags & WRITE_FLAGS
        if (writes or (mode is None and (real is None or os.path.isdir(real)))) and not within(real):
            deny(event, args)
    elif event in PATH_EVENTS:
        for path_at, dir_fd_at in PATH_EVENTS[event]:
            if not within(resolve(args[path_at], None if dir_fd_at is None else args[dir_fd_at])):
                deny(event, args)


def no_fork_exec(*args):
    deny("_posixsubprocess.fork_exec", args)


_posixsubprocess.fork_exec = no_fork_exec
sys.addaudithook(guard)

path = os.path.join(ROOT, sys.argv[1])
with open(path, encoding="utf-8") as file:
    source = file.read()
main = types.ModuleType("__main__")
main.__file__ = path
sys.modules["__main__"] = main
sys.argv = [path]
exec(compile(source, path, "exec"), main.__dict__)
'''
_GUARD_PRELUDE = f"MARKER = {_BLOCKED_MARKER!r}\nEXIT_CODE = {_BLOCKED_EXIT_CODE}\n{_GUARD_BODY}"


@dataclass
class ExecutionResult:
    status: str  # "passed" | "failed" | "timeout" | "memory" | "blocked"
    detail: str  # short reason: the last line of stderr, the limit hit, or the blocked call
    seconds: float
    stdout: str = ""  # the last few KiB the program printed

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _find_unshare() -> Callable[[int], int] | None:
    # Looked up here, in the parent: between fork and exec nothing should load libraries.
    try:
        return ctypes.CDLL(None, use_errno=True).unshare
    except AttributeError:  # not Linux
        return None


_UNSHARE = _find_unshare()


def _lower_limit(kind: int, value: int) -> None:
    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def _child_setup(timeout_s: float, memory_mb: int) -> Callable[[], None]:
    cpu_seconds = math.ceil(timeout_s) + 1

    def setup() -> None:
        # NPROC only after a successful unshare: only then does it count just the namespace's tasks.
        if _UNSHARE is not None and _UNSHARE(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
            _lower_limit(resource.RLIMIT_NPROC, _NPROC_LIMIT)
        _lower_limit(resource.RLIMIT_CPU, cpu_seconds)
        _lower_limit(resource.RLIMIT_FSIZE, _FILE_SIZE_LIMIT)
        _lower_limit(resource.RLIMIT_CORE, 0)
        # Last: this still is a copy of the parent, whose address space (e.g. CUDA's) may already
        # exceed the limit, so nothing here may allocate after it.
        _lower_limit(resource.RLIMIT_AS, memory_mb * 1024**2)

    return setup


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
    if returncode == _BLOCKED_EXIT_CODE and last.startswith(_BLOCKED_MARKER):
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


def run_program(program: str, timeout_s: float = 10.0, memory_mb: int = 1024) -> ExecutionResult:
    """Run ``program`` (a complete Python source) contained as described above; it passes when the
    process exits 0 within ``timeout_s`` seconds of wall clock and ``memory_mb`` MiB of address space."""
    with tempfile.TemporaryDirectory(prefix="xsa_sandbox_") as root:
        # The program may write only inside workdir; its output files lie beside it, out of its reach.
        workdir = os.path.join(root, "work")
        os.mkdir(workdir)
        Path(workdir, _SCRIPT_NAME).write_text(program, encoding="utf-8")
        stdout_path, stderr_path = os.path.join(root, "stdout"), os.path.join(root, "stderr")
        start = time.monotonic()
        with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-I", "-B", "-c", _GUARD_PRELUDE, _SCRIPT_NAME],
                cwd=workdir, env=_child_env(workdir), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                start_new_session=True, preexec_fn=_child_setup(timeout_s, memory_mb),
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
        status, detail = _classify(process.returncode, timed_out, _tail(stderr_path), timeout_s)
        return ExecutionResult(status, detail[:_DETAIL_CHARS], seconds, _tail(stdout_path))
