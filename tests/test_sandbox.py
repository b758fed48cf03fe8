"""The sandbox for model-generated programs: results and limits in every isolation mode, the filesystem
view of the namespace modes, the audit-hook guard on its own, and how the mode is chosen. Escape
attempts are in test_sandbox_redteam.py."""

from __future__ import annotations

import os
import pwd
import resource
import shutil
import socket
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from xsa_exp.eval import sandbox
from xsa_exp.eval.sandbox import MODES, SandboxUnavailable, run_program, unavailable_reason

# Every isolation mode; one that cannot run on this machine is skipped with the reason.
MODE_PARAMS = [pytest.param(m, marks=pytest.mark.skipif(unavailable_reason(m) is not None,
                                                        reason=f"{m}: {unavailable_reason(m)}"))
               for m in MODES]
NAMESPACE_MODES = MODE_PARAMS[:2]

# Defeats the audit-hook guard from Python: the hook function is reachable through the garbage
# collector and its code can be swapped for a no-op. What remains is the namespaces' boundary.
DEFEAT_GUARD = """
import gc
for hook in gc.get_objects():
    if getattr(hook, "__name__", None) == "guard" and hasattr(hook, "__code__"):
        hook.__code__ = (lambda event, args: None).__code__
"""

HUMANEVAL_STYLE = '''
from typing import List
import math, re, hashlib, collections, itertools, string, functools, heapq, bisect, random, json


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    return any(abs(a - b) < threshold for a, b in itertools.combinations(numbers, 2))


def check(candidate):
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5) == False


check(has_close_elements)
'''


def run(program: str, **kwargs) -> sandbox.ExecutionResult:
    return run_program(textwrap.dedent(program), **{"timeout_s": 3.0, "memory_mb": 1024, **kwargs})


def guard(program: str, **kwargs) -> sandbox.ExecutionResult:
    """Runs with the audit-hook guard alone, so that what it blocks is seen, not the namespaces' effect."""
    return run(program, mode="guard only", **kwargs)


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_correct_program_passes(mode):
    result = run(HUMANEVAL_STYLE, mode=mode)
    assert result.status == "passed" and result.passed, result.detail
    assert result.detail == ""


def test_wrong_assertion_fails():
    result = run(HUMANEVAL_STYLE.replace("0.3) == True", "0.3) == False"))
    assert result.status == "failed" and not result.passed
    assert result.detail == "AssertionError"


def test_syntax_error_fails():
    result = run("def f(:\n    pass\n")
    assert result.status == "failed"
    assert result.detail.startswith("SyntaxError")


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_tracebacks_show_program_lines(mode):
    result = run(mode=mode, program="""
        import traceback
        try:
            1 / 0
        except ZeroDivisionError:
            print(traceback.format_exc())
    """)
    assert result.passed, result.detail
    assert 'program.py", line 4' in result.stdout


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_infinite_loop_times_out(mode):
    start = time.monotonic()
    result = run("while True:\n    pass\n", timeout_s=2.0, mode=mode)
    assert result.status == "timeout"
    assert 2.0 <= result.seconds < 4.0 and time.monotonic() - start < 5.0


@pytest.mark.parametrize("program", [
    "x = bytearray(4 * 1024**3)",
    "chunks = []\nwhile True:\n    chunks.append(bytearray(10**6))",
])
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_memory_exhaustion(program, mode):
    limits = resource.getrlimit(resource.RLIMIT_AS)
    result = run(program, memory_mb=256, mode=mode)
    assert result.status == "memory", result.detail
    assert resource.getrlimit(resource.RLIMIT_AS) == limits  # the limit was set in the child only
    assert len(bytearray(300 * 1024**2)) == 300 * 1024**2  # and this process can still allocate


def test_write_outside_is_blocked(tmp_path):
    target = tmp_path / "out.txt"
    result = guard(f"open({str(target)!r}, 'w').write('x')")
    assert result.status == "blocked", result.detail
    assert not target.exists()


def test_blocked_write_cannot_be_swallowed(tmp_path):
    target = tmp_path / "out.txt"
    result = guard(f"""
        try:
            open({str(target)!r}, 'w').write('x')
        except BaseException:
            pass
    """)
    assert result.status == "blocked", result.detail
    assert not target.exists()


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_writing_inside_the_work_dir_is_allowed(mode):
    result = run(mode=mode, program="""
        import os, tempfile
        with open("inside.txt", "w") as f:
            f.write("x")
        os.mkdir("sub")
        os.rename("inside.txt", "sub/moved.txt")
        assert open("sub/moved.txt").read() == "x"
        with tempfile.TemporaryDirectory() as tmp:  # TMPDIR is the work dir
            open(os.path.join(tmp, "t"), "w").close()
        open(os.devnull, "w").write("x")
    """)
    assert result.passed, result.detail


def test_delete_outside_is_blocked(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    result = guard(f"import os\nos.remove({str(victim)!r})")
    assert result.status == "blocked", result.detail
    assert victim.read_text() == "keep me"


def test_directory_descriptor_cannot_reach_outside(tmp_path):
    result = guard(f"""
        import os
        fd = os.open({str(tmp_path)!r}, os.O_RDONLY)
        os.close(os.open("x", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    """)
    assert result.status == "blocked", result.detail
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("call", [
    "import os; os.system('touch {target}')",
    "import subprocess; subprocess.run(['touch', '{target}'])",
    "import os; os.posix_spawn('/usr/bin/touch', ['touch', '{target}'], {{}})",
    "import _posixsubprocess; _posixsubprocess.fork_exec(['touch', '{target}'])",
])
def test_subprocesses_are_blocked(tmp_path, call):
    target = tmp_path / "x"
    result = guard(call.format(target=target))
    assert result.status == "blocked", result.detail
    assert not target.exists()


def test_network_is_unreachable():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        result = guard(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert not result.passed and result.status == "blocked", result.detail
        with pytest.raises(TimeoutError):
            server.accept()


@pytest.mark.parametrize("mode", NAMESPACE_MODES)
def test_child_runs_in_its_own_network_namespace(mode):
    result = run(mode=mode, program="""
        import os
        print(os.readlink("/proc/self/ns/net"))
        print(open("/proc/net/dev").read())
    """)
    assert result.passed, result.detail
    namespace, devices = result.stdout.split("\n", 1)
    assert namespace != os.readlink("/proc/self/ns/net")
    interfaces = [line.split(":")[0].strip() for line in devices.splitlines()[2:] if line.strip()]
    assert interfaces == ["lo"]


def test_guard_only_shares_the_host_namespaces():
    result = guard("import os\nprint(os.readlink('/proc/self/ns/net'), os.readlink('/proc/self/ns/mnt'))")
    assert result.passed, result.detail
    assert result.stdout.split() == [os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/mnt")]


@pytest.mark.parametrize("mode", NAMESPACE_MODES)
def test_namespace_view_of_the_filesystem(mode, monkeypatch, request):
    """The root is read-only, the work directory the one writable place, temporary directories and the
    home empty but for the interpreter, the project's runs/ and the cache hidden; no capabilities."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    project = Path(sandbox.__file__).resolve().parents[2]
    runs = project / "runs"
    cache = Path(tempfile.mkdtemp(prefix=".cache-", dir=project))  # not under /tmp, which is hidden anyway
    request.addfinalizer(lambda: shutil.rmtree(cache))
    (cache / "tokenizers").mkdir()
    monkeypatch.setenv("XSA_EXP_CACHE", str(cache))
    result = run(mode=mode, program=DEFEAT_GUARD + f"""
import os, sys
def writable(path):
    try:
        open(os.path.join(path, "probe"), "w").close()
        return True
    except OSError:
        return False
print(writable(os.getcwd()), \
[p for p in ("/", "/usr", "/etc", {str(home)!r}, "/tmp", "/var/tmp", "/dev/shm") if writable(p)])
print(os.getcwd())
# The cache is hidden by an empty mount, or not there at all where the project itself is under /tmp.
print(sorted(os.listdir("/tmp")), os.listdir("/var/tmp"), os.listdir("/dev/shm"),
      os.listdir({str(cache)!r}) if os.path.isdir({str(cache)!r}) else [])
print(os.listdir({str(runs)!r}) if os.path.isdir({str(runs)!r}) else [])
print(sorted(os.listdir({str(home)!r})))
print(open("/proc/self/status").read().split("CapEff:")[1].split()[0], os.getuid())
print(sum(p.isdigit() for p in os.listdir("/proc")))
    """)
    assert result.passed, result.detail
    writable, workdir, temporary, runs_listing, home_listing, credentials, n_processes = result.stdout.splitlines()
    assert writable == "True []"
    # /tmp holds only the way to the work directory (when that is under /tmp, as by default) and to the
    # interpreter (when that is under /tmp, as in a virtual environment of a clone there).
    under_tmp = sorted({Path(p).relative_to("/tmp").parts[0] for p in (workdir, sys.prefix, sys.base_prefix)
                        if Path(p).is_relative_to("/tmp")})
    assert temporary == f"{under_tmp} [] [] []"
    assert runs_listing == "[]"
    interpreter = [Path(p).relative_to(home).parts[0] for p in (sys.base_prefix, sys.prefix)
                   if Path(p).is_relative_to(home)]
    assert home_listing == str(sorted(set(interpreter)))
    assert credentials == "0000000000000000 1000"  # no capabilities, an unprivileged uid
    assert int(n_processes) <= 2  # this pid namespace's processes only (bubblewrap's init, the program)


def test_unknown_or_unavailable_mode_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="unknown sandbox mode 'docker'"):
        run("pass", mode="docker")
    monkeypatch.setattr(sandbox, "unavailable_reason", lambda mode: None if mode == "guard only" else "not here")
    with pytest.raises(SandboxUnavailable, match="'bubblewrap' is not available here: not here"):
        run("pass", mode="bubblewrap")


def test_guard_only_fallback_says_so_once(monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "unavailable_reason", lambda mode: None if mode == "guard only" else f"no {mode}")
    assert sandbox.isolation_mode.__wrapped__() == "guard only"
    err = capsys.readouterr().err
    assert "no filesystem boundary" in err and "bubblewrap: no bubblewrap; namespaces: no namespaces" in err


@pytest.mark.parametrize("program", [
    "import os\nif os.fork() == 0:\n    os._exit(0)",
    "import multiprocessing\nmultiprocessing.get_context('spawn').Process(target=print).start()",
    "import ctypes\nctypes.CDLL(None).getpid()",
    "import _ctypes",
    "import os\nos.kill(os.getppid(), 0)",
    "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
], ids=["fork", "multiprocessing", "ctypes", "_ctypes", "kill", "setrlimit"])
def test_forks_ctypes_signals_and_limit_changes_are_blocked(program):
    result = guard(program)
    assert result.status == "blocked", result.detail


@pytest.mark.parametrize("program, status", [
    ("import os\nprint(os.getcwd(), flush=True)\nopen('left.txt', 'w').write('x')", "passed"),
    ("import os\nprint(os.getcwd(), flush=True)\nwhile True:\n    pass", "timeout"),
])
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_work_dir_is_removed(program, status, mode):
    result = run(program, timeout_s=2.0, mode=mode)
    assert result.status == status, result.detail
    workdir = result.stdout.strip()
    assert os.path.basename(workdir) == "work" and os.path.isabs(workdir)
    assert not os.path.exists(workdir) and not os.path.exists(os.path.dirname(workdir))


def test_parent_secrets_are_not_inherited(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_fake_secret")
    monkeypatch.setenv("WANDB_API_KEY", "fake_wandb_key")
    result = run("import os\nprint(sorted(os.environ))\nassert 'HF_TOKEN' not in os.environ")
    assert result.passed, result.detail
    assert "HF_TOKEN" not in result.stdout and "WANDB_API_KEY" not in result.stdout


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_output_is_bounded(mode):
    result = run("import sys\nwhile True:\n    sys.stdout.write('x' * 100_000)", mode=mode)
    assert result.status == "failed"  # the 16 MiB file size limit ends it
    assert "File too large" in result.detail
    assert len(result.stdout) <= 4096
