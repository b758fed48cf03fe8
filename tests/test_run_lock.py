"""One writer per run directory: a second launch is refused in one line naming the holder, a dead holder's lock is
taken over (by one contender), and a run whose lock is taken from it stops without writing more."""

import csv
import errno
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SMALL
from xsa_exp import run_lock
from xsa_exp.run_lock import LockLost, RunDirInUse, acquire, await_rank_zero, process_space, process_start
from xsa_exp.training import metrics_log
from xsa_exp.training.run import train

ARGS = [*SMALL, "train.cpu_threads=1", "resume=auto"]


def train_py(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *ARGS, *extra]


def train_steps(run_dir: Path) -> list[int]:
    with open(run_dir / "metrics.csv") as f:
        return [int(r["step"]) for r in csv.DictReader(f) if r["train/loss"]]


def dead_process() -> dict:
    """The pid of a process that has exited, and its start time: a pid reused meanwhile is another process."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start(process.pid)  # readable until it is waited for
    process.wait()
    return {"pid": process.pid, "pid_start": start}


def write_lock(run_dir: Path, *, pid: int, heartbeat_age: float, host: str | None = None, **fields) -> bytes:
    """A lock file as another process would have left it (the format of docs/training.md); a host other than this
    one also has another process space."""
    record = {"host": host or socket.gethostname(), "pid": pid, "since": "2026-01-01 00:00:00 UTC",
              "heartbeat": int(time.time() - heartbeat_age), "token": "0123456789abcdef",
              "space": process_space() if host is None else f"{host} other-boot pid:[1]", "pid_start": None,
              "job": None, "launch": "", **fields}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.lock").write_text(json.dumps(record) + "\n")
    return (run_dir / "run.lock").read_bytes()


def contents(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.rglob("*")}


# -----------------------------------------------------------------------------
# Through train.py and train()


@pytest.mark.slow
def test_of_two_launches_at_once_one_trains_and_the_other_stops_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    command = train_py(run_dir, "train.max_steps=80", "train.checkpoint_every=10", "eval.every=20")
    first, second = (subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for _ in range(2))
    outputs = {p.pid: p.communicate(timeout=600) for p in (first, second)}
    winner, loser = sorted((first, second), key=lambda p: p.returncode)
    assert (winner.returncode, loser.returncode) == (0, 2), outputs[loser.pid][1][-3000:]
    loser_err = outputs[loser.pid][1]
    assert re.fullmatch(
        rf"error: run directory {run_dir} is in use by process {winner.pid} on this host "
        rf"\(since [0-9-]+ [0-9:]+ UTC\), last heartbeat \d+ s ago; wait for it to end or stop it "
        rf"\(kill {winner.pid}\), then relaunch with resume=auto; or choose another hydra.run.dir\n",
        loser_err), loser_err
    assert train_steps(run_dir) == list(range(1, 81))  # each step once
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    assert not (run_dir / "run.lock").exists()


def test_a_lock_left_by_a_process_that_no_longer_exists_is_taken_over(tmp_path, small_cfg):
    run_dir = tmp_path / "run"
    write_lock(run_dir, **dead_process(), heartbeat_age=0)  # fresh, but its process is gone: dead at once
    train(small_cfg("train.max_steps=2", "resume=auto"), run_dir)
    assert train_steps(run_dir) == [1, 2] and not (run_dir / "run.lock").exists()
    assert not list(run_dir.glob("run.lock.*"))


@pytest.mark.slow
def test_another_hosts_lock_is_refused_while_its_heartbeat_is_fresh_and_taken_over_once_old(tmp_path, small_cfg):
    run_dir = tmp_path / "run"
    lock = write_lock(run_dir, pid=4242, heartbeat_age=5, host="node17")
    before = contents(run_dir)
    refused = subprocess.run(train_py(run_dir, "train.max_steps=2"), cwd=REPO, capture_output=True, text=True,
                             timeout=300, env={**os.environ, "TZ": "America/New_York"})  # the times say UTC anyway
    assert refused.returncode == 2
    stale_at = time.strftime("%H:%M:%S", time.gmtime(json.loads(lock)["heartbeat"] + 120))
    assert re.fullmatch(
        rf"error: run directory {run_dir} is in use by process 4242 on host node17 "
        r"\(since 2026-01-01 00:00:00 UTC\), last heartbeat \d+ s ago; wait for it to end or stop it, then "
        r"relaunch with resume=auto \(if it is gone, its lock is taken over once its heartbeat is 120 s old, from "
        rf"{stale_at} UTC on\); or choose another hydra.run.dir\n", refused.stderr), refused.stderr
    assert contents(run_dir) == before and (run_dir / "run.lock").read_bytes() == lock  # nothing touched

    write_lock(run_dir, pid=4242, heartbeat_age=run_lock.STALE_S + 5, host="node17")
    train(small_cfg("train.max_steps=2", "resume=auto"), run_dir)
    assert train_steps(run_dir) == [1, 2] and not (run_dir / "run.lock").exists()


def test_a_run_whose_lock_is_taken_stops_at_its_next_update_without_writing_more(tmp_path, small_cfg, monkeypatch):
    """The heartbeat finds another holder's lock (one that took it over while this run could not refresh, say); the
    run stops at the next update: no rows, checkpoint or status of its own after that, and the other's lock kept."""
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    run_dir = tmp_path / "run"
    flush, taken = metrics_log.TrainMetrics.flush, {}

    def taken_over_at_step_3(self, trainer, pl_module):
        flush(self, trainer, pl_module)
        if trainer.global_step == 3:
            (run_dir / "run.lock").unlink()
            taken["lock"] = write_lock(run_dir, pid=4242, heartbeat_age=0, host="node17")
            time.sleep(0.5)  # the heartbeat notices
            taken["files"] = contents(run_dir)

    monkeypatch.setattr(metrics_log.TrainMetrics, "flush", taken_over_at_step_3)
    with pytest.raises(LockLost) as e:
        train(small_cfg("train.max_steps=6", "train.checkpoint_every=0", "eval.every=2", "eval.diag_every=0"), run_dir)
    assert str(e.value) == (f"run directory {run_dir} is no longer this run's to write: it was taken over by process "
                            "4242 on host node17 (since 2026-01-01 00:00:00 UTC); stopped at step 4 without writing "
                            "more; once a single process writes it, relaunch with resume=auto")
    assert contents(run_dir) == taken["files"] and (run_dir / "run.lock").read_bytes() == taken["lock"]
    assert not (run_dir / "metrics.csv").exists() and not (run_dir / "status.json").exists()  # rows held: dropped


# -----------------------------------------------------------------------------
# The lock alone


def test_of_contenders_for_a_dead_holders_lock_exactly_one_wins(tmp_path):
    """Several processes find the same dead holder's lock at once: one takes it over, the others are refused. The
    winner holds the lock until the test has seen the others refused, however late they start."""
    contender = ("import sys, time; from pathlib import Path; from xsa_exp.run_lock import acquire, RunDirInUse\n"
                 "try:\n    lock = acquire(sys.argv[1])\nexcept RunDirInUse:\n    sys.exit(3)\n"
                 "while not Path(sys.argv[2]).exists():\n    time.sleep(0.02)\nlock.release()")
    for attempt in range(3):
        run_dir, others_refused = tmp_path / f"run{attempt}", tmp_path / f"refused{attempt}"
        write_lock(run_dir, **dead_process(), heartbeat_age=0)
        processes = [subprocess.Popen([sys.executable, "-c", contender, str(run_dir), str(others_refused)], cwd=REPO)
                     for _ in range(4)]
        deadline = time.time() + 60  # a second winner never exits: the assertion below fails after this
        while sum(p.poll() is not None for p in processes) < 3 and time.time() < deadline:
            time.sleep(0.02)
        others_refused.touch()
        assert sorted(p.wait(timeout=120) for p in processes) == [0, 3, 3, 3]
        assert not list(run_dir.iterdir())  # the winner released it; no moved lock left behind


def test_a_contender_late_with_its_takeover_never_removes_the_winners_lock(tmp_path):
    """Two contenders judge the same dead lock; one takes it over and holds it before the other acts. The late one
    moves the winner's lock aside, finds it is not the lock it judged, and puts it back."""
    stale = write_lock(tmp_path, **dead_process(), heartbeat_age=0)
    winner = acquire(tmp_path)
    held = (tmp_path / "run.lock").read_bytes()
    run_lock.take_over(tmp_path / "run.lock", stale)  # the late contender, acting on what it read before
    assert (tmp_path / "run.lock").read_bytes() == held and [p.name for p in tmp_path.iterdir()] == ["run.lock"]
    with pytest.raises(RunDirInUse, match=f"in use by process {os.getpid()} on this host"):
        acquire(tmp_path)
    winner.release()


def test_a_holder_that_finds_a_lock_file_being_created_stops_at_once_and_names_its_new_holder(tmp_path):
    """A contender creates its lock file, then writes it: a heartbeat between the two finds it empty. The lock is lost
    from that moment (the run writes nothing more), and once the record is there the message names its holder."""
    lock = acquire(tmp_path)  # its own heartbeat comes in 10 s: this test calls refresh() itself
    (tmp_path / "run.lock").unlink()
    (tmp_path / "run.lock").touch()  # the contender's file, created and not yet written
    while_empty = []
    contender = threading.Timer(0.3, lambda: (while_empty.append(lock.problem()),
                                              write_lock(tmp_path, pid=4242, heartbeat_age=0, host="node17")))
    contender.start()
    lock.refresh()
    contender.join()
    assert while_empty == ["its lock file was overwritten"]
    assert lock.problem() == "it was taken over by process 4242 on host node17 (since 2026-01-01 00:00:00 UTC)"
    lock.release()
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == 4242  # the new holder's lock, kept


def test_an_earlier_attempt_of_the_same_slurm_job_on_another_node_is_waited_for(tmp_path, monkeypatch):
    """A requeue after a node failure: the earlier attempt's lock is fresh, from another host; it is taken over once
    stale, unless its heartbeat moves (then that attempt is alive and the run refused)."""
    monkeypatch.setenv("SLURM_JOB_ID", "991")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    earlier = {"host": "node17", "job": "slurm:991", "launch": "SLURM_JOB_ID=991"}
    write_lock(tmp_path, pid=4242, heartbeat_age=run_lock.STALE_S - 2, **earlier)
    said = []
    start = time.monotonic()
    acquire(tmp_path, announce=said.append).release()
    assert 1.5 < time.monotonic() - start < 10
    assert said[0].startswith("waiting up to 120 s for the lock of process 4242 on host node17")

    write_lock(tmp_path, pid=4242, heartbeat_age=5, **earlier)
    monkeypatch.setattr(run_lock.time, "sleep", lambda s: write_lock(tmp_path, pid=4242, heartbeat_age=0, **earlier))
    with pytest.raises(RunDirInUse, match="is in use by process 4242 on host node17"):
        acquire(tmp_path, announce=said.append)
    monkeypatch.delenv("SLURM_JOB_ID")  # another job's fresh lock: refused at once
    with pytest.raises(RunDirInUse):
        acquire(tmp_path, announce=pytest.fail)


def test_the_other_ranks_go_on_once_rank_zero_holds_the_lock_of_their_launch(tmp_path, monkeypatch):
    monkeypatch.delenv(run_lock.TOKEN_VARIABLE, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    lock = acquire(tmp_path)
    await_rank_zero(tmp_path, rank=1, timeout_s=1)  # an external launcher's rank: same launch
    monkeypatch.setenv(run_lock.TOKEN_VARIABLE, lock.token)
    await_rank_zero(tmp_path, rank=1, timeout_s=1)  # a rank Lightning started: rank 0's token
    monkeypatch.setenv(run_lock.TOKEN_VARIABLE, "another hold's")
    with pytest.raises(LockLost, match="rank 1: run directory .* is no longer locked by rank 0"):
        await_rank_zero(tmp_path, rank=1, timeout_s=1)
    lock.release()

    monkeypatch.delenv(run_lock.TOKEN_VARIABLE)
    write_lock(tmp_path, pid=4242, heartbeat_age=0, host="node17", launch="another launch")
    monkeypatch.setattr(run_lock.time, "sleep", lambda s: write_lock(tmp_path, pid=4242, heartbeat_age=-10,
                                                                     host="node17", launch="another launch"))
    with pytest.raises(RunDirInUse, match="is in use by process 4242 on host node17"):  # alive: rank 0 was refused
        await_rank_zero(tmp_path, rank=1, timeout_s=60)


def test_a_lock_file_without_a_record_beats_with_its_modification_time(tmp_path):
    """Left by a process killed as it created it: refused while recent, taken over once as old as a stale heartbeat."""
    (tmp_path / "run.lock").write_bytes(b"")
    with pytest.raises(RunDirInUse, match=r"is in use by an unreadable lock file, last heartbeat \d s ago"):
        acquire(tmp_path)
    old = time.time() - run_lock.STALE_S - 5
    os.utime(tmp_path / "run.lock", (old, old))
    acquire(tmp_path).release()
    assert not list(tmp_path.iterdir())


def test_a_lock_that_cannot_be_written_whole_is_not_left_half_written(tmp_path, monkeypatch):
    """On a full disk the empty file would block the directory until it looked stale."""
    def full(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_lock.os, "fsync", full)
    with pytest.raises(OSError):
        acquire(tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_heartbeat_refreshes_the_lock_and_a_lock_not_refreshed_in_time_is_lost(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    lock = acquire(tmp_path)
    first = json.loads((tmp_path / "run.lock").read_text())
    assert first["pid"] == os.getpid() and first["space"] == process_space()
    time.sleep(1.2)
    assert json.loads((tmp_path / "run.lock").read_text())["heartbeat"] > first["heartbeat"]
    assert lock.problem() is None
    lock.stop.set()  # the heartbeat stops, as in a process paused for longer than HOLD_S
    lock.thread.join()
    monkeypatch.setattr(run_lock, "HOLD_S", 0.5)
    time.sleep(0.6)
    assert lock.problem() == "its heartbeat could not be written for 0.5 s (the process was paused, or the file " \
                             "system hung)"
    lock.release()
    assert (tmp_path / "run.lock").exists()  # a lost lock is never removed: it may be someone else's by then

    (tmp_path / "gone").mkdir()
    lock = acquire(tmp_path / "gone")  # a file system that fails by the end: its own failure is the run's message
    (tmp_path / "gone" / "run.lock").unlink()
    (tmp_path / "gone").rmdir()
    (tmp_path / "gone").write_text("")  # reading gone/run.lock now fails (ENOTDIR), as on a lost mount (ESTALE)
    lock.release()
