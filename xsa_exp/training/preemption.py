"""Stopping at a preemption or time-limit signal with a checkpoint, and handing the signal back to the launcher
(submitit requeues the job; the requeued run continues with resume=auto)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.utilities import rank_zero_info

from xsa_exp import run_dir as rd
from xsa_exp.training.checkpoints import remove_untracked_step_checkpoints
from xsa_exp.training.metrics_log import HostSync, TrainMetrics


def preemption_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM (scancel, torchrun, a plain kill), SIGUSR1 (`sbatch --signal=USR1@<s>`) and the signal
    submitit sends before a time limit or preemption (SIGUSR2, or what SUBMITIT_PREEMPT_SIGNAL names)."""
    submitit_signal = signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]
    return tuple(dict.fromkeys((signal.SIGTERM, signal.SIGUSR1, submitit_signal)))


def continue_with(run_dir) -> str:
    """What a relaunch adds to continue a run: resume=auto and its directory, since Hydra's default one is new at
    each launch (for a sweep's job, the sweep's directory, which holds its other jobs too)."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        depth = len(Path(str(HydraConfig.get().sweep.subdir)).parts)
        return f"resume=auto hydra.sweep.dir={Path(run_dir).parents[depth - 1]}"
    return f"resume=auto hydra.run.dir={run_dir}"


class PreemptionCheckpoint(L.Callback):
    """At a preemption signal: finish the update in progress, save checkpoints/stepNNNNNN.ckpt and stop;
    then `hand_over()` passes the signal to the handler that was there before the run (submitit's, which
    requeues the job and exits; none under plain sbatch or torchrun, where the run exits with status 0).
    The requeued or relaunched run continues with resume=auto.

    The handlers are ours from the start of training (replacing Lightning's SIGTERM handler, which would
    broadcast from inside a signal handler); before that the previous ones act at once, since there is
    no progress to save yet. On one device the flag, a Python value, is read after every update. Under DDP rank 0's
    flag is broadcast at host-sync steps only (HostSync: console lines, evaluations, checkpoints), which read the
    device anyway, so every rank stops after the same update, none is left waiting in a collective, and the updates
    in between never wait for the host; the signal reaches the checkpoint up to log.print_every updates later (and
    Lightning's own SIGTERM broadcast before every micro-batch, whose flag our handlers never set, is turned off).
    """

    def __init__(self, run_dir, metrics: TrainMetrics, sync: HostSync, checkpoint_every: int):
        self.run_dir, self.metrics, self.sync, self.checkpoint_every = run_dir, metrics, sync, checkpoint_every
        self.received: signal.Signals | None = None
        self.stopped_at: int | None = None
        # Made before the Trainer, so these are the launcher's handlers (submitit's), not Lightning's.
        self.previous = {signum: signal.getsignal(signum) for signum in preemption_signals()}

    def _request(self, signum, frame) -> None:
        self.received = self.received or signal.Signals(signum)

    def on_train_start(self, trainer, pl_module) -> None:
        self.last_step = trainer.global_step
        for signum in self.previous:
            signal.signal(signum, self._request)
        # Lightning (since its PR #20825) broadcasts its SIGTERM flag and reads it back before every micro-batch under
        # DDP: a host sync each time, for a flag that our handlers, which replaced Lightning's, never set.
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self.last_step:  # mid-accumulation: the update is not finished
            return
        self.last_step = step
        received = self.received.value if self.received else 0
        if trainer.world_size > 1:
            if not self.sync.due(step, trainer.max_steps):
                return
            received = trainer.strategy.broadcast(received, src=0)
        if received and step < trainer.max_steps:
            self.received = signal.Signals(received)
            path = rd.step_checkpoint(self.run_dir, step)
            if self.metrics.last_step != step:
                self.metrics.flush(trainer, pl_module)
            # At a periodic checkpoint's step that callback, which Lightning runs after this one, writes the same file.
            if not (self.checkpoint_every and step % self.checkpoint_every == 0):
                trainer.save_checkpoint(path)
                remove_untracked_step_checkpoints(trainer, self.run_dir, keep=path)
            rank_zero_info(f"{self.received.name} received: checkpoint {path}, then stopping; "
                           f"continue with {continue_with(self.run_dir)}")
            self.stopped_at = step
            trainer.should_stop = True

    def teardown(self, trainer, pl_module, stage) -> None:
        """The handlers from before the run back, however it ended: a sweep's next job in this process (Hydra's basic
        launcher) must find the launcher's, not this run's."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def hand_over(self) -> None:
        """If a signal stopped the run, call the handler of that signal from before the run (submitit's: requeue on
        rank 0, and exit); where there was none, exit with status 0, so that a sweep in this process starts no next
        job for the time limit to cut short."""
        if self.stopped_at is None:
            return
        handler = self.previous.get(self.received)
        if not callable(handler):
            raise SystemExit(0)
        handler(self.received, None)
