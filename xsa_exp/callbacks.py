"""Logging on the project's step convention.

step = optimizer updates completed. The train row for update s (mean loss over its micro-batches)
is logged at step s; validation runs at step 0 (before any update), every `eval.every` steps and
at the last step. Every row carries tokens_seen = step x total_batch_tokens.
"""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

from xsa_exp import run_dir as rd
from xsa_exp.cluster import peak_memory_gb, synchronized_time
from xsa_exp.eval.bpb import evaluate_bpb
from xsa_exp.eval.core import evaluate_core
from xsa_exp.eval.diagnostics import attention_diagnostics, flatten_diagnostics


def log_row(trainer: L.Trainer, metrics: dict[str, float], step: int, tokens_per_step: int) -> None:
    for logger in trainer.loggers:
        logger.log_metrics({**metrics, "tokens_seen": step * tokens_per_step}, step=step)


class BiasCorrectedEMA:
    """s_n = beta * s_{n-1} + (1 - beta) * x_n with s_0 = 0, reported as s_n / (1 - beta^n)."""

    def __init__(self, beta: float):
        self.beta, self.value, self.count = beta, 0.0, 0

    def update(self, x: float) -> float:
        self.count += 1
        self.value = self.beta * self.value + (1 - self.beta) * x
        return self.current()

    def current(self) -> float:
        return self.value / (1 - self.beta**self.count) if self.count else float("nan")


def format_duration(seconds: float) -> str:
    """1h02m, 3m07s, 42s."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class HostSync:
    """The updates after which the host reads the device: console lines, evaluations, checkpoints (every N steps for
    each N given) and the last step. In between, an update only queues its work: the train rows and the update clock
    wait for the next of these, so a steady-state update on one device has no device-to-host read."""

    def __init__(self, intervals: list[int]):
        self.intervals = [k for k in intervals if k > 0]

    def due(self, step: int, max_steps: int) -> bool:
        return step == max_steps or any(step % k == 0 for k in self.intervals)


class UpdateClock(L.Callback):
    """When the last host-sync update's hooks (evaluations, checkpoints) ended, on a synchronized clock; it goes after
    every other callback. The updates since then took `elapsed` seconds: their data waits, forwards, backwards and
    the optimizer's queued kernels, and nothing that runs between updates (which only host-sync updates have)."""

    def __init__(self, sync: HostSync):
        self.sync = sync
        self.boundary, self.last_step = 0.0, 0

    def elapsed(self, device) -> float:
        return synchronized_time(device) - self.boundary

    def on_train_start(self, trainer, pl_module) -> None:
        self.last_step, self.boundary = trainer.global_step, synchronized_time(pl_module.device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step != self.last_step and self.sync.due(step, trainer.max_steps):
            self.last_step, self.boundary = step, synchronized_time(pl_module.device)

    def restart(self, device) -> None:
        """After a hook that Lightning runs after this callback (a periodic checkpoint): its time is not an update's."""
        self.boundary = synchronized_time(device)


class TrainMetrics(L.Callback):
    """One CSV/wandb row per optimizer update, written at the next host-sync update: loss, smoothed loss, lrs, Muon
    momentum, grad norm, tokens/sec (over the updates since the last host sync, by the UpdateClock), MFU (where the
    device's peak FLOP/s is known) and peak memory; the console line adds the time left (wall time so far per update,
    evaluations included, x updates left)."""

    def __init__(self, tokens_per_step: int, ema_beta: float, print_every: int, clock: UpdateClock,
                 flops_per_token: int, peak_flops: float | None):
        self.tokens_per_step, self.print_every, self.clock = tokens_per_step, print_every, clock
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.ema = BiasCorrectedEMA(ema_beta)
        self.last_step = 0
        self.first_step, self.started = 0, 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        self.last_step = self.first_step = trainer.global_step
        self.started = time.perf_counter()

    def eta(self, step: int, max_steps: int) -> str:
        done = step - self.first_step
        if done <= 0:
            return "?"
        return format_duration((time.perf_counter() - self.started) / done * (max_steps - step))

    def state_dict(self) -> dict:
        # Saved in checkpoints so a resumed run continues the same smoothed curve.
        return {"ema_value": self.ema.value, "ema_count": self.ema.count}

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        # Rows of the checkpointed steps reach the disk with it (periodic checkpoints are host-sync steps and a
        # preemption checkpoint flushes first, so all are logged by now); a resumed run keeps exactly those.
        for logger in trainer.loggers:
            logger.save()

    def load_state_dict(self, state: dict) -> None:
        self.ema.value, self.ema.count = state["ema_value"], state["ema_count"]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step != self.last_step and self.clock.sync.due(step, trainer.max_steps):
            self.flush(trainer, pl_module)  # else mid-accumulation, or an update whose row waits for the next host sync

    def flush(self, trainer, pl_module) -> None:
        """Log the rows of the updates since the last flush (and print the console line on a printing step). Called
        at host-sync steps, and before a preemption checkpoint, whose state and log must hold every finished update."""
        step = trainer.global_step
        tokens_per_sec = self.tokens_per_step * (step - self.clock.last_step) / self.clock.elapsed(pl_module.device)
        machine = {"train/tokens_per_sec": tokens_per_sec, "train/peak_memory_gb": peak_memory_gb(pl_module.device)}
        if self.peak_flops:  # per device: the global token rate is shared by world_size devices
            machine["train/mfu"] = tokens_per_sec * self.flops_per_token / (self.peak_flops * trainer.world_size)
        for stats in pl_module.pop_update_stats():
            loss = stats.pop("loss")
            # A skipped non-finite step would poison the average for good; it keeps its last value instead.
            row = {"train/loss": loss,
                   "train/loss_smooth": self.ema.update(loss) if math.isfinite(loss) else self.ema.current(), **machine}
            row.update({f"train/{k}": v for k, v in stats.items() if k != "step"})
            log_row(trainer, row, stats["step"], self.tokens_per_step)
        if step % self.print_every == 0 or step == trainer.max_steps:
            mfu = f" | mfu {row['train/mfu']:.1%}" if "train/mfu" in row else ""
            rank_zero_info(f"step {step:>6}/{trainer.max_steps} | loss {row['train/loss']:.4f} "
                           f"(smooth {row['train/loss_smooth']:.4f}) | grad norm {row['train/grad_norm']:.3f} "
                           f"| {row['train/tokens_per_sec']:,.0f} tok/s{mfu} "
                           f"| mem {row['train/peak_memory_gb']:.1f} GB | eta {self.eta(step, trainer.max_steps)}")
        self.last_step = step


class ScheduledEvaluation(L.Callback):
    """Runs `measure` at step 0 (before any update), every `every` steps and at the last step; every <= 0 turns it
    off."""

    def __init__(self, every: int, tokens_per_step: int):
        self.every, self.tokens_per_step = every, tokens_per_step
        self.last_step = -1

    def measure(self, trainer, pl_module) -> dict[str, float]:
        raise NotImplementedError

    def run(self, trainer, pl_module) -> None:
        step = trainer.global_step
        row = self.measure(trainer, pl_module)
        log_row(trainer, row, step, self.tokens_per_step)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in row.items() if self.headline(k))
        rank_zero_info(f"step {step:>6}/{trainer.max_steps} | {shown}{self.console_note(trainer)}")
        self.last_step = step

    def headline(self, key: str) -> bool:
        """Whether a metric goes on the console line (all go to the loggers)."""
        return True

    def console_note(self, trainer) -> str:
        """Text after the console line's numbers, e.g. how much of the split they cover."""
        return ""

    def on_train_start(self, trainer, pl_module) -> None:
        if self.every > 0 and trainer.global_step == 0:
            self.run(trainer, pl_module)
        self.last_step = trainer.global_step  # a resumed run logged this step's rows before its checkpoint

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every > 0 and step != self.last_step and (step % self.every == 0 or step == trainer.max_steps):
            self.run(trainer, pl_module)


class ValidationBPB(ScheduledEvaluation):
    """Validation bits-per-byte over the whole validation split, or its first `val_tokens` (then the console says
    so)."""

    def __init__(self, every: int, val_tokens: int | None, tokens_per_step: int):
        super().__init__(every, tokens_per_step)
        self.val_tokens = val_tokens

    def measure(self, trainer, pl_module) -> dict[str, float]:
        datamodule = trainer.datamodule
        batches = datamodule.val_batches(self.val_tokens, trainer.global_rank, trainer.world_size)
        # Same autocast as training (bf16-mixed on CUDA), so the numbers match evaluate.py's.
        bpb = evaluate_bpb(pl_module.model, batches, datamodule.token_bytes, trainer.precision_plugin.forward_context)
        return {"val/bpb": bpb}

    def console_note(self, trainer) -> str:
        scope = rd.describe_val_scope(trainer.datamodule.val_scope(self.val_tokens))
        return f" ({scope})" if scope else ""


class CoreEvaluation(ScheduledEvaluation):
    """CORE on the eval bundle, capped at max_per_task examples per task (nanochat uses 500 in training)."""

    def __init__(self, every: int, tokens_per_step: int, bundle_dir, max_per_task: int | None):
        super().__init__(every, tokens_per_step)
        self.bundle_dir, self.max_per_task = bundle_dir, max_per_task

    def measure(self, trainer, pl_module) -> dict[str, float]:
        model = pl_module.model
        with trainer.precision_plugin.forward_context():  # the ranks share the examples; each gets the whole result
            result = evaluate_core(model, trainer.datamodule.tokenizer, self.bundle_dir, model.config.sequence_len,
                                   self.max_per_task, rank=trainer.global_rank, world_size=trainer.world_size)
        # The key says how many of the 22 tasks it covers, so a partial CORE is never read as the full one.
        key = "core/CORE" if result.n_tasks == result.n_total else f"core/CORE_{result.n_tasks}of{result.n_total}"
        return {key: result.core, **{f"core/{label}": t.centered for label, t in result.tasks.items()}}

    def headline(self, key: str) -> bool:
        return key.startswith("core/CORE")


class AttentionDiagnostics(ScheduledEvaluation):
    """attn_self_cos, out_self_cos, diag_attn, value_sim, attn_entropy on a fixed validation batch:
    per layer (head mean) and overall in the metrics; every head in diagnostics.jsonl, with the alpha
    each head applies ("alpha"; learnable runs also log xsa/alpha and xsa/alpha/L{layer}). With the model's
    residual scalars, also their values per layer (lambda/resid/L{layer}, lambda/x0/L{layer}): how much of
    the token's own embedding each block is given back, which XSA's removal of the self direction may change."""

    def __init__(self, every: int, tokens_per_step: int, rows: int, run_dir):
        super().__init__(every, tokens_per_step)
        self.rows, self.run_dir = rows, run_dir

    def measure(self, trainer, pl_module) -> dict[str, float]:
        idx = trainer.datamodule.diagnostics_inputs(self.rows).to(pl_module.device)
        model = pl_module.model
        diag = attention_diagnostics(model, idx, trainer.precision_plugin.forward_context)
        alphas = model.xsa_alphas()
        if trainer.is_global_zero:
            rd.append_diagnostics(self.run_dir, {"step": trainer.global_step,
                                                 **{k: v.tolist() for k, v in diag.items()},
                                                 "alpha": alphas.tolist()})
        row = {k: v for k, v in flatten_diagnostics(diag).items() if "/H" not in k}
        if model.config.xsa.learnable:  # what the model has learned, per layer (mean over heads; 0 where XSA is off)
            row["xsa/alpha"] = alphas.mean().item()
            row.update({f"xsa/alpha/L{layer}": heads.mean().item() for layer, heads in enumerate(alphas)})
        for name, values in model.residual_scalars().items():
            row.update({f"lambda/{name}/L{layer}": value for layer, value in enumerate(values.tolist())})
        return row

    def headline(self, key: str) -> bool:
        return "/L" not in key


class RunDirCheckpointIO(TorchCheckpointIO):
    """Every checkpoint written beside its final name, synced, then renamed into place: a kill or a full disk
    leaves the earlier checkpoints and no half-written one. (Lightning's own save stages the file in the system's
    temporary folder, often a small node-local disk on a cluster, and across file systems its move is a copy.)"""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(path.name + ".partial")
        try:
            torch.save(checkpoint, staging)
            descriptor = os.open(staging, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
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


def remove_untracked_step_checkpoints(trainer, run_dir, keep: Path | None = None) -> None:
    """Delete the step checkpoints no periodic checkpoint keeps (earlier preemptions' and the one this attempt
    resumed from), once a newer checkpoint (`keep`, or the final one) is written: each requeue would leave one."""
    if not trainer.is_global_zero:
        return
    kept = {Path(p).resolve() for callback in trainer.checkpoint_callbacks for p in callback.best_k_models}
    for path in rd.checkpoints_dir(run_dir).glob("step*.ckpt"):
        if path.resolve() not in kept and path != keep:
            path.unlink(missing_ok=True)


def preemption_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM (scancel, torchrun, a plain kill), SIGUSR1 (`sbatch --signal=USR1@<s>`) and the signal
    submitit sends before a time limit or preemption (SIGUSR2, or what SUBMITIT_PREEMPT_SIGNAL names)."""
    submitit_signal = signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]
    return tuple(dict.fromkeys((signal.SIGTERM, signal.SIGUSR1, submitit_signal)))


class PreemptionCheckpoint(L.Callback):
    """At a preemption signal: finish the update in progress, save checkpoints/stepNNNNNN.ckpt and stop;
    then `hand_over()` passes the signal to the handler that was there before the run (submitit's, which
    requeues the job and exits; none under plain sbatch or torchrun, where the run exits with status 0).
    The requeued or relaunched run continues with resume=auto.

    The handlers are ours from the start of training (replacing Lightning's SIGTERM handler, which would
    broadcast from inside a signal handler); before that the previous ones act at once, since there is
    no progress to save yet. Under DDP rank 0's signal is broadcast at every update, so every rank stops
    after the same update and none is left waiting in a collective. On one device the check reads only a Python
    flag; under DDP the broadcast is a host sync at every update (as is Lightning's own SIGTERM broadcast there),
    which keeps the time from the signal to the checkpoint at one update: a time limit gives a fixed warning time.
    """

    def __init__(self, run_dir, metrics: TrainMetrics, checkpoint_every: int = 0):
        self.run_dir, self.metrics, self.checkpoint_every = run_dir, metrics, checkpoint_every
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

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self.last_step:  # mid-accumulation: the update is not finished
            return
        self.last_step = step
        received = self.received.value if self.received else 0
        if trainer.world_size > 1:
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
                           "continue with resume=auto")
            self.stopped_at = step
            trainer.should_stop = True

    def hand_over(self) -> None:
        """Restore the handlers from before the run; if a signal stopped it, call the one of that signal."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        handler = self.previous.get(self.received) if self.stopped_at is not None else None
        if callable(handler):
            handler(self.received, None)  # submitit's: requeue (on rank 0) and exit
