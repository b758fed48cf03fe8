"""Checkpoints in the run directory: every file written beside its final name and renamed into place, periodic ones
kept to the newest few, stale step checkpoints removed once a newer one exists, under DDP one checkpoint that every
rank resumes from, and the run's tokenizer beside them from the first update on."""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

from xsa_exp import run_dir as rd
from xsa_exp.run_dir import RunError
from xsa_exp.training.metrics_log import UpdateClock
from xsa_exp.write_failures import writing


class RunDirCheckpointIO(TorchCheckpointIO):
    """Every checkpoint written beside its final name, synced, then renamed into place: a kill or a full disk
    leaves the earlier checkpoints and no half-written one. (Lightning's own save stages the file in the system's
    temporary folder, often a small node-local disk on a cluster, and across file systems its move is a copy.)
    torch.save writes into a file we open, not to a path: its own file would stay open, holding the space of the
    deleted part, until the exception is gone, and it reports a full disk without the OSError."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        staging = path.with_name(path.name + ".partial")
        with writing(path):
            path.parent.mkdir(exist_ok=True)  # not its parents: a run directory that is gone is not made again
            try:
                with open(staging, "wb") as f:
                    torch.save(checkpoint, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(staging, path)
            except BaseException:
                staging.unlink(missing_ok=True)
                raise


class PeriodicCheckpoint(ModelCheckpoint):
    """Resumable checkpoint every N steps, named as run_dir.step_checkpoint names it, keeping the newest few.

    Written by RunDirCheckpointIO. A resumed run starts right after its checkpoint, so that step is not saved
    again (plain ModelCheckpoint would write a -v1 copy). Lightning runs checkpoint callbacks after all others,
    the update clock included, so the clock is restarted after each save: saving is not an update's time."""

    def __init__(self, run_dir, every: int, keep: int, clock: UpdateClock):
        super().__init__(dirpath=rd.checkpoints_dir(run_dir), filename=rd.STEP_CHECKPOINT,
                         auto_insert_metric_name=False, every_n_train_steps=every, save_top_k=keep, monitor="step",
                         mode="max")
        self.every, self.clock, self.clock_restarted_at = every, clock, 0

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._last_global_step_saved = self.clock_restarted_at = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        step = trainer.global_step
        if step % self.every == 0 and step != self.clock_restarted_at:  # once per saving step, not per micro-batch
            self.clock.restart(pl_module.device)
            self.clock_restarted_at = step


class RunTokenizer(L.Callback):
    """The run's tokenizer copied into it before its first update, so that each of its checkpoints can be loaded,
    evaluated and generated from (xsa_exp/run_dir.py, load_trained) while it trains, or after it was interrupted or
    failed, and after the tokenizer cache is cleared. Copied on every attempt, so that a copy a kill cut short is
    made whole by the next."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    @rank_zero_only
    def on_train_start(self, trainer, pl_module) -> None:
        rd.copy_tokenizer(trainer.datamodule.tokenizer_dir, self.run_dir)


class SameResumeCheckpoint(L.Callback):
    """Each rank finds the checkpoint it resumes from itself (run.previous_attempt), in a directory that a cluster's
    nodes may see differently (a newest checkpoint one node cannot read yet): ranks resumed from different steps
    would train on as if they were one model. Before anything is loaded, the ranks compare their choices and all
    stop in one line if they differ."""

    def __init__(self, run_dir: Path, resume_from: str | None):
        # its name: a node may mount the run directory under another path
        self.run_dir, self.resume_from = run_dir, resume_from and Path(resume_from).name

    def setup(self, trainer, pl_module, stage) -> None:
        if trainer.world_size == 1:
            return
        choices = [None] * trainer.world_size
        dist.all_gather_object(choices, self.resume_from)  # every rank sees every choice, so all stop together
        if len(set(choices)) > 1:
            found = ", ".join(f"rank {rank}: {name or 'none'}" for rank, name in enumerate(choices))
            where = rd.checkpoints_dir(self.run_dir)
            raise RunError(f"the ranks found different checkpoints to resume from in {where} ({found}), so their "
                           "nodes see that directory differently; nothing was loaded — once "
                           "every node sees the same files there, relaunch with resume=auto")


def remove_untracked_step_checkpoints(trainer, run_dir, keep: Path | None = None) -> None:
    """Delete the step checkpoints no periodic checkpoint keeps (earlier preemptions' and the one this attempt
    resumed from), once a newer checkpoint (`keep`, or the final one) is written: each requeue would leave one."""
    if not trainer.is_global_zero:
        return
    kept = {Path(p).resolve() for callback in trainer.checkpoint_callbacks for p in callback.best_k_models}
    for path in rd.checkpoints_dir(run_dir).glob("step*.ckpt"):
        if path.resolve() not in kept and path != keep:
            path.unlink(missing_ok=True)
