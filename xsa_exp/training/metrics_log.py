"""What a run logs and prints on the project's step convention.

step = optimizer updates completed. The train row for update s (mean loss over its micro-batches) is logged at step
s; evaluations run at step 0 (before any update), every N steps and at the last step (evaluations.py). Every row
carries tokens_seen = step x total_batch_tokens. Rows are written at host-sync steps only (HostSync), so the updates
in between never wait for the device.
"""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info

from xsa_exp import run_dir as rd
from xsa_exp.cluster import peak_memory_gb, synchronized_time
from xsa_exp.write_failures import writing


def log_row(trainer: L.Trainer, metrics: dict[str, float], step: int, tokens_per_step: int) -> None:
    for logger in trainer.loggers:
        logger.log_metrics({**metrics, "tokens_seen": step * tokens_per_step}, step=step)


class MetricsWriter:
    """metrics.csv laid out as Lightning's CSV writer does (a header of every key logged so far, sorted; a row per
    logger call), without its two ways of losing rows: it never deletes the file it finds (a resumed run's, cut to
    the checkpoint's step by run_dir.keep_metric_rows), and a header grown by a new key replaces the file whole, so
    that a kill or a full disk at any moment leaves the old file or the new one. A failed write names the file
    (write_failures.py)."""

    def __init__(self, path: Path):
        self.metrics_file_path = str(path)
        self.metrics: list[dict] = []  # the rows logged since the last save
        self.header: list[str] | None = None  # the file's, read at the first save

    def log_metrics(self, metrics_dict: dict, step: int) -> None:
        self.metrics.append({**{k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics_dict.items()},
                             "step": step})

    def save(self) -> None:
        if not self.metrics:
            return
        path = Path(self.metrics_file_path)
        with writing(path):
            if self.header is None:
                self.header = rd.metrics_header(path)
            header = sorted(set(self.header).union(*self.metrics))
            if header != self.header:
                rd.write_metric_rows(path, header, [*rd.read_metric_rows(path.parent), *self.metrics]
                                     if self.header else self.metrics)
                self.header = header
            else:
                with open(path, "a", newline="") as f:
                    csv.DictWriter(f, fieldnames=header).writerows(self.metrics)
        self.metrics = []


class RunCSVLogger(CSVLogger):
    """Lightning's CSVLogger, writing metrics.csv through MetricsWriter."""

    @property
    @rank_zero_experiment
    def experiment(self) -> MetricsWriter:
        if self._experiment is None:
            self._experiment = MetricsWriter(Path(self.log_dir) / rd.METRICS)
        return self._experiment


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
