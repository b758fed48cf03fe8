"""Red-team corpus for the HumanEval sandbox: programs written to escape it, each checked by its effect on
the real filesystem and processes after the run (not by the reported status), in every isolation mode.

Each technique names the harm it must not do. The namespace modes (bubblewrap, namespaces) must contain
all of them; the guard alone must contain exactly those marked ``guard=True``: the others are expected
to escape it (strict xfail), which is the documented limit of that mode. The sandbox figures of
docs/evaluation.md are this file's counts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import REPO
from tests.test_sandbox import DEFEAT_GUARD, MODE_PARAMS
from xsa_exp.eval.sandbox import run_program

SECRET = "s3cr3t-" + uuid.uuid4().hex  # planted where the program must not read it
VICTIM_TEXT = "keep me"

# A fresh copy of an extension module, loaded from its file without an import statement.
FRESH_MODULE = """
import importlib.util, sys
def fresh(name):
    spec = importlib.util.find_spec(name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
"""

# Starts a Python child (which has no guard) that outlives the program: sleeps, then acts.
LINGERING_CHILD = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "{marker}"], start_new_session=True)
"""


@dataclass
class Target:
    """What the techniques aim at, all outside the sandbox's work directory."""
    visible: Path  # a directory the sandbox shows (read-only in the namespace modes): the repository's
    victim: Path  # a file in it that must keep its content, name and mode
    home: Path  # $HOME, with a secret file in it
    port: int  # a listening local TCP port, which must accept nothing
    server: socket.socket
    udp: socket.socket  # a bound local UDP socket, which must receive nothing
    other: subprocess.Popen  # another process of the user's (in place of the parent), with SECRET in its environment
    marker: str  # on the command line of every process a technique starts

    def fields(self) -> dict:
        return {"visible": self.visible, "victim": self.victim, "home": self.home, "port": self.port,
                "udp_port": self.udp.getsockname()[1], "pid": self.other.pid, "marker": self.marker,
                "secret_file": self.home / "secret.txt"}


def processes_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:  # ended meanwhile
            pass
    return pids


# --- the harms, checked on the real system ---

def nothing_new_in(target: Target, _result) -> None:
    assert sorted(p.name for p in target.visible.iterdir()) == ["victim.txt"]


def victim_untouched(target: Target, _result) -> None:
    nothing_new_in(target, _result)
    assert target.victim.read_text() == VICTIM_TEXT and target.victim.stat().st_mode & 0o777 == 0o644


def secret_not_read(_target: Target, result) -> None:
    assert SECRET not in result.stdout


def secret_not_listed(_target: Target, result) -> None:
    assert "secret.txt" not in result.stdout.split()


def other_process_alive(target: Target, _result) -> None:
    time.sleep(0.1)  # a signal sent just before the exit may take effect now
    assert target.other.poll() is None


def no_connection(target: Target, _result) -> None:
    try:
        connection, _ = target.server.accept()
    except BlockingIOError:
        pass
    else:
        connection.close()
        raise AssertionError("a connection reached the local port")
    try:
        target.udp.recvfrom(16)
    except BlockingIOError:
        pass
    else:
        raise AssertionError("a datagram reached the local port")


def no_lingering_process(target: Target, _result) -> None:
    assert processes_with(target.marker) == []


def no_process_in_work_dir(_target: Target, result) -> None:
    """No process is left whose working directory is the program's (the first line it printed)."""
    workdir = result.stdout.split("\n", 1)[0]
    left = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "cwd") == workdir:
                left.append(int(entry.name))
        except OSError:
            pass
    assert workdir and not left, left


def contained_by_limit(status: str) -> Callable:
    def check(target: Target, result) -> None:
        assert result.status == status, result.detail
        assert len(bytearray(300 * 1024**2)) == 300 * 1024**2  # this process can still allocate
        no_lingering_process(target, result)
    return check


def disk_bounded(_target: Target, result) -> None:
    written = int(result.stdout.split()[-1])
    assert written <= 64 * 1024**2, f"{written / 1024**2:.0f} MiB written"


@dataclass
class Technique:
    name: str
    program: str  # formatted with Target.fields()
    harm: Callable  # (target, result) -> None; asserts the harm did not happen
    guard: bool  # whether the audit-hook guard alone contains it
    needs: str | None = None  # a module the technique uses (the sandbox runs this interpreter)


REALPATH_PATCH = "import os, os.path\nos.path.realpath = lambda p, *a, **k: os.getcwd() + '/ok'\nos.path.abspath = lambda p: os.getcwd() + '/ok'\n"

TECHNIQUES = [
    # Writes, deletes, renames and other changes outside the work directory.
    Technique("write, guard helpers monkeypatched", REALPATH_PATCH + "open('{visible}/mp.txt', 'w').write('x')", nothing_new_in, False),
    Technique("write, guard's root changed via gc", "import gc\n[f for f in gc.get_objects() if getattr(f, '__name__', '') == 'guard'][0].__globals__['ROOT'] = ''\nopen('{visible}/gc.txt', 'w').write('x')", nothing_new_in, False),
    Technique("write, guard defeated", DEFEAT_GUARD + "open('{visible}/w.txt', 'w').write('x')", nothing_new_in, False),
    Technique("write", "open('{visible}/plain.txt', 'w').write('x')", nothing_new_in, True),
    Technique("delete", REALPATH_PATCH + "os.remove('{victim}')", victim_untouched, False),
    Technique("rename", REALPATH_PATCH + "os.rename('{victim}', '{visible}/moved.txt')", victim_untouched, False),
    Technique("chmod", REALPATH_PATCH + "os.chmod('{victim}', 0o777)", victim_untouched, False),
    Technique("fifo", "import os\nos.mkfifo('{visible}/fifo')", nothing_new_in, False),
    Technique("symlink", "import os\nos.symlink('/etc/passwd', '{visible}/link')", nothing_new_in, True),
    Technique("symlink, guard defeated", DEFEAT_GUARD + "import os\nos.symlink('/etc/passwd', '{visible}/link')", nothing_new_in, False),
    Technique("hard link, then write through it", DEFEAT_GUARD + "import os\nos.link('{victim}', 'hard')\nopen('hard', 'a').write('pwned')", victim_untouched, False),
    # Native code.
    Technique("ctypes", "import ctypes\nctypes.CDLL(None).mkfifo(b'{visible}/ctypes_fifo', 0o644)", nothing_new_in, True),
    Technique("cffi", "import cffi\nffi = cffi.FFI()\nffi.cdef('int mkfifo(const char *, unsigned int);')\nffi.dlopen(None).mkfifo(b'{visible}/cffi_fifo', 0o644)", nothing_new_in, True, "cffi"),
    Technique("cffi, guard defeated", DEFEAT_GUARD + "import cffi\nffi = cffi.FFI()\nffi.cdef('int mkfifo(const char *, unsigned int);')\nffi.dlopen(None).mkfifo(b'{visible}/cffi_fifo', 0o644)", nothing_new_in, False, "cffi"),
    Technique("fresh copy of _posixsubprocess", FRESH_MODULE + "fresh('_posixsubprocess')\nimport subprocess\nsubprocess.run(['touch', '{visible}/fresh'])", nothing_new_in, True),
    # Processes.
    Technique("fork", "import os\nif os.fork() == 0:\n    open('{visible}/forked', 'w').write('x')", nothing_new_in, True),
    Technique("posix_spawn", "import os\nos.posix_spawn('/usr/bin/touch', ['touch', '{visible}/spawned'], {{}})", nothing_new_in, True),
    Technique("subprocess", "import subprocess\nsubprocess.run(['touch', '{visible}/sub'])", nothing_new_in, True),
    Technique("os.system", "import os\nos.system('touch {visible}/system')", nothing_new_in, True),
    Technique("vfork via subprocess, guard defeated", DEFEAT_GUARD + FRESH_MODULE + "fresh('_posixsubprocess')\nimport subprocess\nsubprocess.run(['touch', '{visible}/vfork'])", nothing_new_in, False),
    Technique("fork bomb", "import os\nprint(os.getcwd(), flush=True)\nwhile True:\n    os.fork()", no_process_in_work_dir, True),
    Technique("child sleeping past the timeout", DEFEAT_GUARD + FRESH_MODULE + "fresh('_posixsubprocess')\n" + LINGERING_CHILD, no_lingering_process, False),
    # Signals to another of the user's processes (standing in for the parent) or its group.
    Technique("kill", "import os, signal\nos.kill({pid}, signal.SIGKILL)", other_process_alive, True),
    Technique("killpg", "import os, signal\nos.killpg({pid}, signal.SIGKILL)", other_process_alive, True),
    Technique("pidfd_send_signal", "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({pid}), signal.SIGKILL)", other_process_alive, False),
    # Reading the user's files and other processes' environment.
    Technique("read a secret in $HOME", "print(open('{secret_file}').read())", secret_not_read, False),
    Technique("list the home directory", "import os\nprint(*os.listdir('{home}'))", secret_not_listed, False),
    Technique("read another process's environment", "print(open('/proc/{pid}/environ').read())", secret_not_read, False),
    Technique("read $HOME through another process's root", "print(open('/proc/{pid}/root{secret_file}').read())", secret_not_read, False),
    # Network.
    Technique("connect to a listening local port", "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", no_connection, True),
    Technique("UDP to loopback", "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {udp_port}))", no_connection, True),
    Technique("connect, guard defeated", DEFEAT_GUARD + "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", no_connection, False),
    # Exhaustion.
    Technique("memory exhaustion", "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))", contained_by_limit("memory"), True),
    Technique("disk exhaustion", "total = 0\nfor i in range(10):\n    try:\n        with open(f'fill{{i}}', 'wb') as f:\n            f.write(bytes(16 * 1024**2 - 1))\n        total += 16 * 1024**2 - 1\n    except OSError:\n        break\nprint(total)", disk_bounded, False),
]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    marker = "xsa-redteam-" + uuid.uuid4().hex
    visible = Path(tempfile.mkdtemp(prefix=".redteam-", dir=REPO))
    home = tmp_path_factory.mktemp("home")
    (home / "secret.txt").write_text(SECRET)
    with socket.socket() as server, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        udp.bind(("127.0.0.1", 0))
        udp.setblocking(False)
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 env={"XSA_REDTEAM_SECRET": SECRET}, start_new_session=True)
        try:
            yield Target(visible, visible / "victim.txt", home, server.getsockname()[1], server, udp, other, marker)
        finally:
            other.kill()
            other.wait()
            subprocess.run(["rm", "-rf", str(visible)], check=True)


@pytest.fixture
def fresh_target(target, monkeypatch):
    """The target, restored: only the victim in the visible directory, the other process running, no strays."""
    for path in target.visible.iterdir():
        path.unlink()
    target.victim.write_text(VICTIM_TEXT)
    target.victim.chmod(0o644)
    if target.other.poll() is not None:
        target.other = subprocess.Popen(target.other.args, env={"XSA_REDTEAM_SECRET": SECRET}, start_new_session=True)
    monkeypatch.setenv("HOME", str(target.home))
    yield target
    for pid in processes_with(target.marker):  # a technique that escaped must not outlive its test
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", MODE_PARAMS)
@pytest.mark.parametrize("technique", TECHNIQUES, ids=[t.name for t in TECHNIQUES])
def test_technique_is_contained(mode, technique, fresh_target, request):
    if technique.needs:
        pytest.importorskip(technique.needs)
    if mode == "guard only" and not technique.guard:
        request.applymarker(pytest.mark.xfail(strict=True, raises=AssertionError,
                                              reason="escapes the audit-hook guard alone (documented limit)"))
    program = textwrap.dedent(technique.program).format(**fresh_target.fields())
    result = run_program(program, timeout_s=3.0, memory_mb=256, mode=mode)
    technique.harm(fresh_target, result)
    no_lingering_process(fresh_target, result)


def test_corpus_size_is_the_documented_one():
    from pathlib import Path

    n = len(TECHNIQUES)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "evaluation.md").read_text()
    assert f"red-team corpus (`tests/test_sandbox_redteam.py`, run in CI in every mode): {n}" in doc.replace("\n  ", " ")
    assert f"contain {n}/{n}" in doc
    assert len({t.name for t in TECHNIQUES}) == n
