"""The run directory's one writer, in a training run.

Rank 0 takes the directory's lock (xsa_exp/run_lock.py) before anything is written and holds it until the run ends;
the other ranks, which write nothing (not even a log file there), go on once rank 0 holds it. Before the run writes,
every rank agrees that rank 0 still holds it (LockCheck), and all stop together, without writing more, if it does
not. A write that fails for want of space or of the file system ends the run in one line
(xsa_exp/write_failures.py), recorded in status.json when that can still be written.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from xsa_exp import run_dir as rd
from xsa_exp.errors import ConfigError
from xsa_exp.run_lock import LOCK, TOKEN_VARIABLE, LockLost, RunLock, acquire, await_rank_zero
from xsa_exp.training.metrics_log import HostSync
from xsa_exp.write_failures import WriteFailed, failure_line, write_failure, writing

# Failures of the file system, not of the directory chosen: a relaunch into the same directory is the fix.
FILE_SYSTEM_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.ESTALE, errno.EIO)


def take_lock(run_dir: Path) -> RunLock:
    """Rank 0's lock; creating it is the first write, so it is also the check that the directory is writable."""
    try:
        with writing(run_dir / LOCK):
            run_dir.mkdir(parents=True, exist_ok=True)
            return acquire(run_dir, announce=rank_zero_info)
    except OSError as e:
        if e.errno in FILE_SYSTEM_FAILURES:  # a full disk at a relaunch: the run there is kept, and resumes
            raise WriteFailed(failure_line(e, run_dir)) from None
        raise ConfigError(f"run directory {run_dir} is not writable ({e.strerror or e}); "
                          "choose another hydra.run.dir") from None


def close_log_files() -> None:
    """Hydra gives every process a log file in the run directory: under torchrun or srun each rank appends to
    train.log, under Lightning's launcher rank N writes train_ddp_process_N.log. A rank other than 0 keeps its console
    (the launcher's log) and drops its file."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()


class RunDirWriter:
    """`with RunDirWriter(run_dir) as writer:` around a run: the lock held (rank 0) or awaited (the others), failed
    writes turned into WriteFailed's one line, the lock released at the end unless lost."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.lock: RunLock | None = None
        self.trainer: L.Trainer | None = None  # set by LockCheck: the step status.json records

    def __enter__(self) -> RunDirWriter:
        if rank_zero_only.rank == 0:
            self.lock = take_lock(self.run_dir)
            os.environ[TOKEN_VARIABLE] = self.lock.token  # for the ranks Lightning starts (await_rank_zero)
        else:
            close_log_files()
            await_rank_zero(self.run_dir, rank_zero_only.rank)
        return self

    def __exit__(self, kind, error, traceback) -> None:
        try:
            failure = write_failure(error, self.run_dir) if error is not None else None
            if failure is not None:
                line = failure_line(failure, self.run_dir)
                self.record_failure(line)
                raise WriteFailed(line) from None
        finally:
            if self.lock is not None:
                os.environ.pop(TOKEN_VARIABLE, None)
                self.lock.release()

    def record_failure(self, line: str) -> None:
        if self.lock is not None and self.lock.problem() is None:
            with contextlib.suppress(OSError):  # the disk may still be full, the file system still gone
                rd.write_status(self.run_dir, "failed", self.trainer and self.trainer.global_step, line)

    def agree(self, trainer: L.Trainer) -> None:
        """LockLost on every rank if rank 0's lock is lost. Under DDP a collective: every rank calls it at the same
        point."""
        problem = self.lock.problem() if self.lock is not None else None
        if trainer.world_size > 1:
            problem = trainer.strategy.broadcast(problem)
        if problem:
            raise LockLost(f"run directory {self.run_dir} is no longer this run's to write: {problem}; stopped at "
                           f"step {trainer.global_step} without writing more; once a single process writes it, "
                           "relaunch with resume=auto")


class LockCheck(L.Callback):
    """The writer's agreement before the run writes: after every update on one device; under DDP after every
    host-sync update, which are those that write (rows, evaluations, periodic checkpoints), so that the others keep
    their single sync; and before every checkpoint (with the rows it flushes). First of the callbacks, so that it
    runs before any that write."""

    def __init__(self, writer: RunDirWriter, sync: HostSync):
        self.writer, self.sync, self.last_step = writer, sync, 0

    def setup(self, trainer, pl_module, stage) -> None:
        self.writer.trainer = trainer

    def on_train_start(self, trainer, pl_module) -> None:
        self.last_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self.last_step:  # mid-accumulation
            return
        self.last_step = step
        if trainer.world_size == 1 or self.sync.due(step, trainer.max_steps):
            self.writer.agree(trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.writer.agree(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        if isinstance(exception, LockLost):  # Lightning's teardown would still write the rows held for metrics.csv
            for logger in trainer.loggers:
                if isinstance(logger, CSVLogger):
                    logger.experiment.metrics.clear()
