"""The namespace modes of the HumanEval sandbox (xsa_exp/eval/sandbox.py): the program's view of the
filesystem (Layout), the child's setup between fork and exec (resource limits; in "namespaces" mode the
user, mount, pid, network and IPC namespaces and their mounts, through libc), and bubblewrap's command
line for the same view.
"""

from __future__ import annotations

import ctypes
import math
import os
import pwd
import resource
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SCRIPT_NAME = "program.py"
_FILE_SIZE_LIMIT = 16 * 1024**2
_WORK_DIR_BYTES = 64 * 1024**2  # the work directory's tmpfs: bounds everything the program writes together
NPROC_LIMIT = 64  # tasks (processes and threads) inside the child's own user namespace
_SANDBOX_UID = 1000  # any uid but 0: exec then leaves the program no capabilities in its namespaces
_PROJECT_DIR = Path(__file__).resolve().parents[2]

# Linux constants (linux/sched.h, linux/mount.h, linux/fcntl.h, linux/prctl.h).
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x20000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = (
    0x1, 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000)
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID = 0x1, 0x2
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_SYS_MOUNT_SETATTR = 442  # the same number on every architecture
_PR_SET_NO_NEW_PRIVS = 38


@dataclass(frozen=True)
class Layout:
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


def layout_for(workdir: str) -> Layout:
    # Temporary directories (other runs' work directories among them), the user's home (by $HOME and by
    # the password database), the project's runs and the data cache.
    hidden = _outermost([
        "/tmp", "/var/tmp", "/dev/shm", tempfile.gettempdir(), str(Path.home()), pwd.getpwuid(os.getuid()).pw_dir,
        os.path.expanduser(os.environ.get("XSA_EXP_CACHE", "~/.cache/xsa-exp")), "runs", _PROJECT_DIR / "runs",
    ])
    # The interpreter and its standard library may live in the home directory (pyenv, conda, a venv).
    interpreter = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))]
    revealed = [p for p in _outermost(interpreter) if any(p.startswith(h + "/") for h in hidden)]
    return Layout(hidden, tuple(revealed), workdir)


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


LIBC = _load_libc()


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _c_string(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, options: str | None = None) -> None:
    _check(LIBC.mount(_c_string(source), _c_string(target), _c_string(fstype), flags, _c_string(options)),
           f"mount {target}")


def _make_tree_read_only(path: str) -> None:
    attr = (ctypes.c_uint64 * 4)(_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID, 0, 0, 0)  # struct mount_attr
    _check(LIBC.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(_AT_FDCWD), os.fsencode(path),
                         ctypes.c_uint(_AT_RECURSIVE), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))),
           f"read-only {path}")


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _enter_namespaces(layout: Layout, program: bytes, uid: int, gid: int) -> None:
    """Run in the child before exec ("namespaces" mode): new user, mount, network, IPC and pid
    namespaces, then the filesystem view of the layout; the next fork is the pid namespace's first process."""
    _check(LIBC.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWPID), "unshare")
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
    _write_file(os.path.join(layout.workdir, SCRIPT_NAME), program)
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


def child_setup(mode: str, timeout_s: float, memory_mb: int, layout: Layout | None, program: str) -> Callable[[], None]:
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
            _check(LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        # Last: this still is a copy of the parent, whose address space (e.g. CUDA's) may already
        # exceed the limit, so nothing here may allocate after it.
        _lower_limit(resource.RLIMIT_AS, memory_mb * 1024**2)

    return setup


def bwrap_command(layout: Layout, program_fd: int, python: list[str]) -> list[str]:
    """bubblewrap's version of _enter_namespaces (plus its own /dev); its options apply in order."""
    command = [shutil.which("bwrap"), "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
               "--unshare-uts", "--uid", str(_SANDBOX_UID), "--gid", str(_SANDBOX_UID), "--die-with-parent",
               "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for path in layout.hidden:
        command += ["--tmpfs", path]
    for path in layout.revealed:
        command += ["--ro-bind", path, path]
    command += ["--size", str(_WORK_DIR_BYTES), "--tmpfs", layout.workdir,
                "--file", str(program_fd), os.path.join(layout.workdir, SCRIPT_NAME)]
    for path in layout.hidden:
        command += ["--remount-ro", path]
    return [*command, "--chdir", layout.workdir, "--", *python]
