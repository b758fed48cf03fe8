"""The sandbox for model-generated programs: results, limits, and that blocked actions leave no trace."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import textwrap
import time

import pytest

from xsa_exp.eval import sandbox
from xsa_exp.eval.sandbox import run_program

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
    return run_program(textwrap.dedent(program), **{"timeout_s": 3.0, **kwargs})


def namespaces_available() -> bool:
    tool = shutil.which("unshare")
    return tool is not None and subprocess.run([tool, "-rn", "true"], capture_output=True).returncode == 0


def test_correct_program_passes():
    result = run(HUMANEVAL_STYLE)
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


def test_tracebacks_show_program_lines():
    result = run("""
        import traceback
        try:
            1 / 0
        except ZeroDivisionError:
            print(traceback.format_exc())
    """)
    assert result.passed, result.detail
    assert 'program.py", line 4' in result.stdout


def test_infinite_loop_times_out():
    start = time.monotonic()
    result = run("while True:\n    pass\n", timeout_s=2.0)
    assert result.status == "timeout"
    assert 2.0 <= result.seconds < 4.0 and time.monotonic() - start < 5.0


@pytest.mark.parametrize("program", [
    "x = bytearray(4 * 1024**3)",
    "chunks = []\nwhile True:\n    chunks.append(bytearray(10**6))",
])
def test_memory_exhaustion(program):
    limits = resource.getrlimit(resource.RLIMIT_AS)
    result = run(program, memory_mb=256)
    assert result.status == "memory", result.detail
    assert resource.getrlimit(resource.RLIMIT_AS) == limits  # the limit was set in the child only
    assert len(bytearray(300 * 1024**2)) == 300 * 1024**2  # and this process can still allocate


def test_write_outside_is_blocked(tmp_path):
    target = tmp_path / "out.txt"
    result = run(f"open({str(target)!r}, 'w').write('x')")
    assert result.status == "blocked", result.detail
    assert not target.exists()


def test_blocked_write_cannot_be_swallowed(tmp_path):
    target = tmp_path / "out.txt"
    result = run(f"""
        try:
            open({str(target)!r}, 'w').write('x')
        except BaseException:
            pass
    """)
    assert result.status == "blocked", result.detail
    assert not target.exists()


def test_writing_inside_the_work_dir_is_allowed():
    result = run("""
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
    result = run(f"import os\nos.remove({str(victim)!r})")
    assert result.status == "blocked", result.detail
    assert victim.read_text() == "keep me"


def test_directory_descriptor_cannot_reach_outside(tmp_path):
    result = run(f"""
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
    result = run(call.format(target=target))
    assert result.status == "blocked", result.detail
    assert not target.exists()


def test_network_is_unreachable():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        result = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert not result.passed and result.status == "blocked", result.detail
        with pytest.raises(TimeoutError):
            server.accept()


@pytest.mark.skipif(not namespaces_available(), reason="user/network namespaces are not allowed here")
def test_child_runs_in_its_own_network_namespace():
    result = run("""
        import os
        print(os.readlink("/proc/self/ns/net"))
        print(open("/proc/net/dev").read())
    """)
    assert result.passed, result.detail
    namespace, devices = result.stdout.split("\n", 1)
    assert namespace != os.readlink("/proc/self/ns/net")
    interfaces = [line.split(":")[0].strip() for line in devices.splitlines()[2:] if line.strip()]
    assert interfaces == ["lo"]


def test_runs_without_namespaces_when_unshare_is_refused(monkeypatch):
    monkeypatch.setattr(sandbox, "_UNSHARE", lambda flags: -1)  # as where the kernel says EPERM
    result = run("import os\nprint(os.readlink('/proc/self/ns/net'))")
    assert result.passed, result.detail
    assert result.stdout.strip() == os.readlink("/proc/self/ns/net")
    assert run("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)").status == "blocked"


@pytest.mark.parametrize("program", [
    "import os\nif os.fork() == 0:\n    os._exit(0)",
    "import multiprocessing\nmultiprocessing.get_context('spawn').Process(target=print).start()",
    "import ctypes\nctypes.CDLL(None).getpid()",
    "import _ctypes",
    "import os\nos.kill(os.getppid(), 0)",
    "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
], ids=["fork", "multiprocessing", "ctypes", "_ctypes", "kill", "setrlimit"])
def test_forks_ctypes_signals_and_limit_changes_are_blocked(program):
    result = run(program)
    assert result.status == "blocked", result.detail


@pytest.mark.parametrize("program, status", [
    ("import os\nprint(os.getcwd(), flush=True)\nopen('left.txt', 'w').write('x')", "passed"),
    ("import os\nprint(os.getcwd(), flush=True)\nwhile True:\n    pass", "timeout"),
])
def test_work_dir_is_removed(program, status):
    result = run(program, timeout_s=2.0)
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


def test_output_is_bounded():
    result = run("import sys\nwhile True:\n    sys.stdout.write('x' * 100_000)")
    assert result.status == "failed"  # the 16 MiB file size limit ends it
    assert "File too large" in result.detail
    assert len(result.stdout) <= 4096
