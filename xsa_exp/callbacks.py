"""Logging on the project's step convention.

step = optimizer updates completed. The train row for update s (mean loss over its micro-batches)
is logged at step s; validation runs at step 0 (before any update), every `eval.every` steps and
at the last step. Every row carries tokens_seen = step x total_batch_tokens.
"""

from __future__ import annotations

import time

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from xsa_exp.eval.bpb import evaluate_bpb


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
        return self.value / (1 - self.beta**self.count)


class TrainMetrics(L.Callback):
    """One CSV/wandb row per optimizer update: loss, smoothed loss, lrs, Muon momentum, grad norm, tokens/sec."""

    def __init__(self, tokens_per_step: int, ema_beta: float, print_every: int):
        self.tokens_per_step, self.print_every = tokens_per_step, print_every
        self.ema = BiasCorrectedEMA(ema_beta)
        self.last_step = 0
        self.update_started = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.last_step = trainer.global_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # Timed from the first micro-batch of an update, so validation between updates is not counted.
        if self.update_started is None:
            self.update_started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self.last_step:  # still accumulating gradients for this update
            return
        elapsed = time.perf_counter() - self.update_started
        stats = pl_module.pop_update_stats()
        row = {"train/loss": stats.pop("loss"), "train/loss_smooth": 0.0,
               "train/tokens_per_sec": self.tokens_per_step / elapsed}
        row["train/loss_smooth"] = self.ema.update(row["train/loss"])
        row.update({f"train/{k}": v for k, v in stats.items()})
        log_row(trainer, row, step, self.tokens_per_step)
        if step % self.print_every == 0 or step == trainer.max_steps:
            rank_zero_info(f"step {step:>6}/{trainer.max_steps} | loss {row['train/loss']:.4f} "
                           f"(smooth {row['train/loss_smooth']:.4f}) | grad norm {row['train/grad_norm']:.3f} "
                           f"| {row['train/tokens_per_sec']:,.0f} tok/s")
        self.last_step, self.update_started = step, None


class ValidationBPB(L.Callback):
    """Validation bits-per-byte at step 0, every `every` steps and at the last step."""

    def __init__(self, every: int, val_tokens: int, tokens_per_step: int):
        self.every, self.val_tokens, self.tokens_per_step = every, val_tokens, tokens_per_step
        self.last_step = -1

    def evaluate(self, trainer, pl_module) -> None:
        step = trainer.global_step
        datamodule = trainer.datamodule
        batches = datamodule.val_batches(self.val_tokens, trainer.global_rank, trainer.world_size)
        # Same autocast as training (bf16-mixed on CUDA), so the numbers match evaluate.py's.
        bpb = evaluate_bpb(pl_module.model, batches, datamodule.token_bytes, trainer.precision_plugin.forward_context)
        log_row(trainer, {"val/bpb": bpb}, step, self.tokens_per_step)
        rank_zero_info(f"step {step:>6}/{trainer.max_steps} | val bpb {bpb:.4f}")
        self.last_step = step

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_step == 0:
            self.evaluate(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step != self.last_step and (step % self.every == 0 or step == trainer.max_steps):
            self.evaluate(trainer, pl_module)
