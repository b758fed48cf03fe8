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
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MODES = ("bubblewrap", "namespaces", "guard only")  # strongest first; by default the first available is used

_SCRIPT_NAME = "program.py"
_FILE_SIZE_LIMIT = 16 * 1024**2
_WORK_DIR_BYTES = 64 * 1024**2  # the work directory's tmpfs: bounds everything the program writes together
_NPROC_LIMIT = 64  # tasks (processes and threads) inside the child's own user namespace
_SANDBOX_UID = 1000  # any uid but 0: exec then leaves the program no capabilities in its namespaces
_OUTPUT_TAIL_BYTES = 4096
_DETAIL_CHARS = 300
_BLOCKED_MARKER = "[xsa-sandbox] blocked:"
_BLOCKED_EXIT_CODE = 86
_PROBE_PROGRAM = "open('probe.txt', 'w').write('x')\n"
_PROJECT_DIR = Path(__file__).resolve().parents[2]

# Linux constants (linux/sched.h, linux/mount.h, linux/fcntl.h, linux/prctl.h).
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x20000, 0x8000000, 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x1, 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID = 0x1, 0x2
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_SYS_MOUNT_SETATTR = 442  # the same number on every architecture
_PR_SET_NO_NEW_PRIVS = 38

_GUARD_BODY = r'''
import os, sys, types
import _posixsubprocess

if NPROC_LIMIT:  # set here, inside the namespaces, before the guard forbids it
    import resource
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    limit = NPROC_LIMIT if hard == resource.RLIM_INFINITY else min(NPROC_LIMIT, hard)
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))

ROOT = os.path.realpath(os.getcwd())
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
BLOCKED_EVENTS = {
    "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty", "subprocess.Popen",
    "os.kill", "os.killpg", "os.link", "os.symlink", "resource.setrlimit", "resource.prlimit",
}
BLOCKED_PREFIXES = ("socket.", "ctypes.")
# _posixsubprocess may only come back through a re-import, which would restore fork_exec; cffi's
# backend calls C functions without audit events.
BLOCKED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess", "_cffi_backend"}
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


_GUARD_HEADER = f"MARKER = {_BLOCKED_MARKER!r}\nEXIT_CODE = {_BLOCKED_EXIT_CODE}\n"


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


@dataclass(frozen=True)
class _Layout:
    """The program's view of the filesystem in the namespace modes (real paths)."""
    hidden: tuple[str, ...]  # each covered by an empty read-only tmpfs
    revealed: tuple[str, ...]  # directories inside hidden ones bound back read-only: the interpreter
    workdir: str  # a fresh writable tmpfs at the work directory's path, holding the program


def _outermost(paths) -> tuple[str, ...]:
    """The distinct existing directories among paths (resolved), without those inside another one."""
    real = sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)} - {"/"})
    kept: list[str] = []
    for path in real:  # sorted, so a directory comes before everything inside it
        if not any(path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return tuple(kept)


def _layout(workdir: str) -> _Layout:
    # Temporary directories (other runs' work directories among them), the user's home (by $HOME and by
    # the password database), the project's runs and the data cache.
    hidden = _outermost([
        "/tmp", "/var/tmp", "/dev/shm", tempfile.gettempdir(), str(Path.home()), pwd.getpwuid(os.getuid()).pw_dir,
        os.path.expanduser(os.environ.get("XSA_EXP_CACHE", "~/.cache/xsa-exp")), "runs", _PROJECT_DIR / "runs",
    ])
    # The interpreter and its standard library may live in the home directory (pyenv, conda, a venv).
    interpreter = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))]
    revealed = [p for p in _outermost(interpreter) if any(p.startswith(h + "/") for h in hidden)]
    return _Layout(hidden, tuple(revealed), workdir)


def _load_libc():
    # Looked up here, in the parent: between fork and exec nothing should load libraries.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for name in ("unshare", "mount", "syscall", "prctl"):
            getattr(libc, name)
    except (OSError, AttributeError):  # not Linux
        return None
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    return libc


_LIBC = _load_libc()


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _c_string(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, options: str | None = None) -> None:
    _check(_LIBC.mount(_c_string(source), _c_string(target), _c_string(fstype), flags, _c_string(options)), f"mount {target}")


def _make_tree_read_only(path: str) -> None:
    attr = (ctypes.c_uint64 * 4)(_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID, 0, 0, 0)  # struct mount_attr
    _check(_LIBC.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(_AT_FDCWD), os.fsencode(path),
                         ctypes.c_uint(_AT_RECURSIVE), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))),
           f"read-only {path}")


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _enter_namespaces(layout: _Layout, program: bytes, uid: int, gid: int) -> None:
    """Run in the child before exec ("namespaces" mode): new user, mount, network, IPC and pid
    namespaces, then the filesystem view of the layout; the next fork is the pid namespace's first process."""
    _check(_LIBC.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWPID), "unshare")
    _write_file("/proc/self/setgroups", b"deny")  # required before an unprivileged gid_map
    _write_file("/proc/self/uid_map", f"{_SANDBOX_UID} {uid} 1".encode())
    _write_file("/proc/self/gid_map", f"{_SANDBOX_UID} {gid} 1".encode())
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing mounted here propagates to the host
    sources = [os.open(path, os.O_PATH | os.O_DIRECTORY) for path in layout.revealed]  # reachable once hidden
    for path in layout.hidden:
        _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
    for path, source in zip(layout.revealed, sources):
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{source}", path, None, _MS_BIND | _MS_REC)
        os.close(source)
    os.makedirs(layout.workdir, exist_ok=True)  # a mount point inside the hidden /tmp
    _make_tree_read_only("/")  # everything so far, the hidden tmpfs and the interpreter included
    _mount("tmpfs", layout.workdir, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=0700,size={_WORK_DIR_BYTES}")
    _write_file(os.path.join(layout.workdir, _SCRIPT_NAME), program)
    os.chdir(layout.workdir)  # the cwd Popen set is the host's directory, now covered


def _relay_exit(child: int, cpu_seconds: int) -> None:
    """End this process (outside the pid namespace, the one the parent waits for) as ``child`` ended."""
    # Among the descriptors is subprocess's error pipe, which the parent reads until every copy is closed.
    os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    _, status, usage = os.wait4(child, 0)
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status)
    if sig == signal.SIGKILL and usage.ru_utime + usage.ru_stime >= cpu_seconds:
        sig = signal.SIGXCPU  # a pid namespace's first process ignores SIGXCPU; the hard limit's SIGKILL ended it
    if sig != signal.SIGKILL:
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def _lower_limit(kind: int, value: int) -> None:
    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def _child_setup(mode: str, timeout_s: float, memory_mb: int, layout: _Layout | None, program: str) -> Callable[[], None]:
    cpu_seconds = math.ceil(timeout_s) + 1
    program_bytes, uid, gid = program.encode("utf-8"), os.getuid(), os.getgid()

    def setup() -> None:
        _lower_limit(resource.RLIMIT_CPU, cpu_seconds)
        _lower_limit(resource.RLIMIT_FSIZE, _FILE_SIZE_LIMIT)
        _lower_limit(resource.RLIMIT_CORE, 0)
        if mode == "namespaces":
            _enter_namespaces(layout, program_bytes, uid, gid)
            child = os.fork()
            if child:
                _relay_exit(child, cpu_seconds)
            # The pid namespace's first process: a /proc that shows only this namespace's processes.
            _mount("proc", "/proc", "proc", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
            _check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        # Last: this still is a copy of the parent, whose address space (e.g. CUDA's) may already
        # exceed the limit, so nothing here may allocate after it.
        _lower_limit(resource.RLIMIT_AS, memory_mb * 1024**2)

    return setup


def _bwrap_command(layout: _Layout, program_fd: int, python: list[str]) -> list[str]:
    """bubblewrap's version of _enter_namespaces (plus its own /dev); its options apply in order."""
    command = [shutil.which("bwrap"), "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
               "--unshare-uts", "--uid", str(_SANDBOX_UID), "--gid", str(_SANDBOX_UID), "--die-with-parent",
               "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for path in layout.hidden:
        command += ["--tmpfs", path]
    for path in layout.revealed:
        command += ["--ro-bind", path, path]
    command += ["--size", str(_WORK_DIR_BYTES), "--tmpfs", layout.workdir,
                "--file", str(program_fd), os.path.join(layout.workdir, _SCRIPT_NAME)]
    for path in layout.hidden:
        command += ["--remount-ro", path]
    return [*command, "--chdir", layout.workdir, "--", *python]


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


@functools.cache
def unavailable_reason(mode: str) -> str | None:
    """Why ``mode`` cannot run here, or None where it can: found once, by running a small program in it."""
    if mode not in MODES:
        raise ValueError(f"unknown sandbox mode {mode!r}; expected one of: {', '.join(MODES)}")
    if mode == "guard only":
        return None
    if mode == "bubblewrap" and shutil.which("bwrap") is None:
        return "bwrap is not on PATH (package bubblewrap)"
    if mode == "namespaces" and _LIBC is None:
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


def run_program(program: str, timeout_s: float = 10.0, memory_mb: int = 1024, mode: str | None = None) -> ExecutionResult:
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
        program_path = Path(workdir, _SCRIPT_NAME)
        program_path.write_text(program, encoding="utf-8")
        stdout_path, stderr_path = os.path.join(root, "stdout"), os.path.join(root, "stderr")
        layout = None if mode == "guard only" else _layout(workdir)
        nproc = 0 if mode == "guard only" else _NPROC_LIMIT  # outside a namespace it would count all the user's processes
        command = [sys.executable, "-I", "-B", "-c", f"{_GUARD_HEADER}NPROC_LIMIT = {nproc}\n{_GUARD_BODY}", _SCRIPT_NAME]
        start = time.monotonic()
        with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr, open(program_path, "rb") as source:
            if mode == "bubblewrap":
                command = _bwrap_command(layout, source.fileno(), command)
            process = subprocess.Popen(
                command, cwd=workdir, env=_child_env(workdir), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                start_new_session=True, pass_fds=(source.fileno(),) if mode == "bubblewrap" else (),
                preexec_fn=_child_setup(mode, timeout_s, memory_mb, layout, program),
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
