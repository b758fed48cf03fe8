"""One writer per run directory: the lock file <run>/run.lock.

The file is created with O_CREAT|O_EXCL (atomic on local disks, NFSv3+ and the other shared file systems where
`flock` may not be honoured) and holds one JSON line:

    {"host": "node17", "pid": 4242, "since": "2026-12-06 02:30:14 UTC", "heartbeat": 1796531414,
     "token": "9f2c41d07a55e3b1", "space": "node17 <boot id> pid:[4026531836]", "pid_start": 51234,
     "job": "slurm:991", "launch": "SLURM_JOB_ID=991 SLURM_STEP_ID=0"}

A daemon thread of the holder rewrites `heartbeat` (Unix seconds) in place every HEARTBEAT_S, after checking that
the token is still its own. A holder is alive, seen from its own process space (same host, boot and pid namespace,
where its pid means that process), while its pid exists with the same start time; seen from anywhere else, while its
heartbeat is at most STALE_S old. A dead holder's lock is taken over; a live one's is refused with one line naming
it, except that an earlier attempt of the same SLURM job on another node (a requeue after a node failure) is waited
for until it has a heartbeat again or is stale. docs/training.md, "One writer per run directory", says why.

No torch or Lightning here; the ranks of a multi-device run agree on the lock in training/sole_writer.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path

from xsa_exp.errors import UserError

LOCK = "run.lock"
HEARTBEAT_S = 10  # how often the holder rewrites its heartbeat
HOLD_S = 60       # a holder that could not rewrite it for this long stops: a contender may soon judge it dead
STALE_S = 120     # a heartbeat older than this, seen from another host, is a dead holder's (clocks agree within HOLD_S)
CONFIRM_S = 0.5   # a lock judged dead is read again after this: one that changed was being refreshed, not dead
TOKEN_VARIABLE = "XSA_EXP_RUN_LOCK_TOKEN"  # the hold's token, passed to the ranks Lightning starts from rank 0
# What every rank of one launch shares in its environment (the ranks of an external launcher wait for their
# launch's lock); SLURM requeues a job under its id with a new restart count.
LAUNCH_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "SUBMITIT_LOCAL_JOB_ID",
                    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT")


class RunDirInUse(UserError):
    """Another live process holds the run directory's lock; the message names it and what to do."""


class LockLost(UserError):
    """This run no longer holds its run directory's lock; it stops without writing more."""


# -----------------------------------------------------------------------------
# Who and where


def process_space() -> str:
    """Host, boot and pid namespace: the processes that see the same pids (the host name alone where /proc is not
    Linux's)."""
    try:
        boot, namespace = Path("/proc/sys/kernel/random/boot_id").read_text().strip(), os.readlink("/proc/self/ns/pid")
    except OSError:
        boot = namespace = ""
    return " ".join((socket.gethostname(), boot, namespace))


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks after boot, which tells it from a later process given its pid."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int, start: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    return start is None or process_start(pid) in (None, start)


def launch_id() -> str:
    return " ".join(f"{name}={os.environ[name]}" for name in LAUNCH_VARIABLES if name in os.environ)


def job_id() -> str | None:
    return f"slurm:{os.environ['SLURM_JOB_ID']}" if "SLURM_JOB_ID" in os.environ else None


def new_record() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "heartbeat": int(time.time()),
            "token": secrets.token_hex(8), "space": process_space(), "pid_start": process_start(os.getpid()),
            "job": job_id(), "launch": launch_id()}


def encode(record: dict) -> bytes:
    return (json.dumps(record) + "\n").encode()


def parse(raw: bytes) -> dict | None:
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    keys = {"host", "pid", "since", "heartbeat", "token", "space"}
    return record if isinstance(record, dict) and keys <= record.keys() else None


def read_lock(path: Path) -> tuple[dict | None, bytes] | None:
    """(the record, or None where the file holds none, and its bytes); None without a lock file. A file being
    created is empty for a moment, so one without a record is read again a few times first."""
    for attempt in range(5):
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        if parse(raw) is not None:
            return parse(raw), raw
        time.sleep(0.1 * (attempt + 1))
    return None, raw


def heartbeat_of(path: Path, record: dict | None) -> float:
    """A lock file without a record (its writer killed as it created it) beats with its modification time."""
    if record is not None:
        return record["heartbeat"]
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return time.time()


def alive(path: Path, record: dict | None) -> bool:
    if record is not None and record["space"] == process_space():
        return pid_alive(record["pid"], record.get("pid_start"))
    return time.time() - heartbeat_of(path, record) <= STALE_S


def describe(record: dict | None) -> str:
    if record is None:
        return "an unreadable lock file"
    where = "this host" if record["space"] == process_space() else f"host {record['host']}"
    return f"process {record['pid']} on {where} (since {record['since']})"


def busy_message(run_dir: Path, record: dict | None) -> str:
    """The one line of a launch refused: who holds the run directory, and what to do."""
    beat = heartbeat_of(Path(run_dir) / LOCK, record)
    holder = f"{describe(record)}, last heartbeat {max(0, time.time() - beat):.0f} s ago"
    if record is not None and record["space"] == process_space():
        fix = f"wait for it to end or stop it (kill {record['pid']}), then relaunch with resume=auto"
    else:
        stale_at = time.strftime("%H:%M:%S UTC", time.gmtime(beat + STALE_S))  # as `since`, whatever the TZ
        fix = (f"wait for it to end or stop it, then relaunch with resume=auto (if it is gone, its lock is taken over "
               f"once its heartbeat is {STALE_S} s old, from {stale_at} on)")
    return f"run directory {run_dir} is in use by {holder}; {fix}; or choose another hydra.run.dir"


# -----------------------------------------------------------------------------
# Taking the lock


def create(path: Path, record: dict) -> bool:
    """Create the lock file holding record; False if there is one."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(descriptor, "wb") as f:
            f.write(encode(record))
            f.flush()
            os.fsync(f.fileno())
    except BaseException:  # a full disk: no empty lock file left to block the directory
        path.unlink(missing_ok=True)
        raise
    return True


def take_over(path: Path, raw: bytes) -> None:
    """Remove the dead holder's lock, whose bytes were `raw`, so that create() can be tried again. Renaming it to a
    name of our own is atomic: of two contenders one moves it, the other finds nothing to move (and then loses the
    race to create). A file that turns out not to be that lock (a contender took it over and created its own just
    before) is put back at once."""
    moved = path.with_name(f"{path.name}.stale-{secrets.token_hex(4)}")
    try:
        os.rename(path, moved)
    except FileNotFoundError:
        return
    if moved.read_bytes() != raw:
        try:
            os.link(moved, path)
        except OSError:  # a third process created one since (or no hard links here): the displaced holder stops
            pass             # at its next heartbeat (RunLock.refresh)
    moved.unlink()


def earlier_attempt(record: dict | None) -> bool:
    """A lock left on another node by an earlier attempt of this SLURM job (a requeue after a node failure): SLURM
    runs one attempt at a time, so it is waited for (dead unless its heartbeat moves) rather than refused."""
    return (record is not None and record.get("job") is not None and record["job"] == job_id()
            and record.get("launch") != launch_id() and record["space"] != process_space())


def acquire(run_dir: Path, announce=print) -> RunLock:
    """Take the run directory's lock, taking over a dead holder's; RunDirInUse if a live process holds it."""
    path, waited_on = Path(run_dir) / LOCK, None
    deadline = time.monotonic() + STALE_S + 30
    while time.monotonic() < deadline:
        record = new_record()  # its heartbeat now, not when the wait began
        if create(path, record):
            return RunLock(path, record)
        found = read_lock(path)
        if found is None:  # released meanwhile
            continue
        holder, raw = found
        if alive(path, holder):
            if not earlier_attempt(holder) or (waited_on is not None and waited_on != holder):
                raise RunDirInUse(busy_message(run_dir, holder))
            if waited_on is None:
                announce(f"waiting up to {STALE_S} s for the lock of {describe(holder)}, an earlier attempt of "
                         "this job, to go stale")
            waited_on = holder
            time.sleep(2 * CONFIRM_S)
        else:
            time.sleep(CONFIRM_S)
            if read_lock(path) == found:  # unchanged: dead, not a holder caught refreshing it
                take_over(path, raw)
    found = read_lock(path)
    raise RunDirInUse(busy_message(run_dir, found[0] if found else None))


# -----------------------------------------------------------------------------
# Holding it


class RunLock:
    """A held lock. A daemon thread rewrites the heartbeat every HEARTBEAT_S and checks the lock is still ours;
    `problem()` says why it is not (taken over, removed, or not refreshed for HOLD_S), and the run checks it before
    it writes. A lost lock is never released: it may be someone else's by then."""

    def __init__(self, path: Path, record: dict):
        self.path, self.record = path, record
        self.refreshed, self.missing = time.monotonic(), 0
        self.lost: str | None = None
        self.last_error = ""
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
        self.thread.start()

    @property
    def token(self) -> str:
        return self.record["token"]

    def problem(self) -> str | None:
        if self.lost is None and time.monotonic() - self.refreshed > HOLD_S:
            self.lost = (f"its heartbeat could not be written for {HOLD_S} s "
                         f"({self.last_error or 'the process was paused, or the file system hung'})")
        return self.lost

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_S) and self.problem() is None:
            self.refresh()

    def refresh(self) -> None:
        """Rewrite the heartbeat in place, in the file just read and found ours: a contender replaces the lock file,
        never edits it, so this never writes into another's lock (and in place, it needs no free space)."""
        try:
            with open(self.path, "r+b") as f:
                found = parse(f.read())
                if found is None or found["token"] != self.token:
                    if found is None:  # a contender's new lock file, empty for a moment: stop writing at once,
                        self.lost = "its lock file was overwritten"  # then name the holder once it is written
                        reread = read_lock(self.path)  # waits a moment for a record
                        found = reread[0] if reread else None
                    if found is not None:
                        self.lost = f"it was taken over by {describe(found)}"
                    return
                self.record["heartbeat"] = int(time.time())
                f.seek(0)
                f.write(encode(self.record))
                f.truncate()
                f.flush()
                os.fsync(f.fileno())
            self.refreshed, self.missing = time.monotonic(), 0
        except FileNotFoundError:
            self.missing += 1  # once may be a contender putting it back (take_over)
            if self.missing >= 2:
                self.lost = "its lock file was removed"
        except OSError as e:  # transient, or problem() says so once HOLD_S have passed
            self.last_error = f"{e.strerror or e}"

    def release(self) -> None:
        self.stop.set()
        self.thread.join()
        with contextlib.suppress(OSError):  # a file system that is gone: its failure is the message
            found = read_lock(self.path)
            if self.problem() is None and found and found[0] and found[0]["token"] == self.token:
                self.path.unlink()


# -----------------------------------------------------------------------------
# The other ranks


def await_rank_zero(run_dir: Path, rank: int, timeout_s: float = STALE_S + 60) -> None:
    """A rank other than 0 writes nothing, and goes on once rank 0 holds the lock: the lock of its launch (under an
    external launcher: torchrun, srun, submitit's tasks), or the one whose token rank 0 passed on (the ranks Lightning
    starts from rank 0 once it holds it). If another launch holds it and its heartbeat moves, rank 0 was refused: this
    rank stops with the same line instead of waiting in a collective for a rank 0 that has left."""
    path, token = Path(run_dir) / LOCK, os.environ.get(TOKEN_VARIABLE)
    deadline, seen = time.monotonic() + timeout_s, None
    while True:
        found = read_lock(path)
        record = found[0] if found else None
        if record is not None and (record["token"] == token if token else record.get("launch") == launch_id()):
            return
        if token:
            raise LockLost(f"rank {rank}: run directory {run_dir} is no longer locked by rank 0 (it is held by "
                           f"{describe(record) if found else 'nobody'}); stopped before writing anything")
        if record is not None and seen is not None and record["token"] == seen["token"]:
            if record["heartbeat"] != seen["heartbeat"]:
                raise RunDirInUse(busy_message(run_dir, record))
        else:
            seen = record
        if time.monotonic() > deadline:
            raise RunDirInUse(f"rank {rank} waited {timeout_s:.0f} s for rank 0 to lock run directory {run_dir} "
                              f"(held by {describe(record) if found else 'nobody'}); rank 0's output says why")
        time.sleep(0.2)
