"""The guard of the HumanEval sandbox (xsa_exp/eval/sandbox.py, layer 3): the program the child's
interpreter runs first. It sets RLIMIT_NPROC inside the namespaces, installs an audit hook that ends the
process (a marker line on stderr, exit status BLOCKED_EXIT_CODE) on writes outside the work directory,
process creation, signals, sockets, ctypes and cffi, then runs the candidate program as ``__main__``.
"""

from __future__ import annotations

BLOCKED_MARKER = "[xsa-sandbox] blocked:"
BLOCKED_EXIT_CODE = 86

GUARD_BODY = r'''
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


def guard_program(nproc_limit: int) -> str:
    """The source `python -I -B -c <it> <script>` runs: the guard, then the program in <script> (relative
    to the work directory). nproc_limit 0 leaves RLIMIT_NPROC alone (outside a user namespace it would count
    all of the user's processes)."""
    return f"MARKER = {BLOCKED_MARKER!r}\nEXIT_CODE = {BLOCKED_EXIT_CODE}\nNPROC_LIMIT = {nproc_limit}\n{GUARD_BODY}"
