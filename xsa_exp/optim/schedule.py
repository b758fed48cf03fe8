"""Step-interval schedule: linear warmup, constant, linear warmdown to a final fraction of the lr;
Muon momentum warms up linearly over the first steps (nanochat's 0.85 -> 0.95 over 300)."""

from __future__ import annotations

import torch


class WarmupConstantWarmdown(torch.optim.lr_scheduler.LRScheduler):
    """`last_epoch` counts optimizer updates done, so update s + 1 runs with lr_factor(s)."""

    def __init__(self, optimizer, total_steps: int, warmup_frac: float, warmdown_frac: float, final_lr_frac: float,
                 momentum_start: float, momentum_end: float, momentum_warmup_steps: int):
        self.total_steps = total_steps
        self.warmup_steps = round(warmup_frac * total_steps)
        self.warmdown_steps = round(warmdown_frac * total_steps)
        self.final_lr_frac = final_lr_frac
        self.momentum_start, self.momentum_end = momentum_start, momentum_end
        self.momentum_warmup_steps = momentum_warmup_steps
        super().__init__(optimizer)

    def lr_factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if step <= self.total_steps - self.warmdown_steps:
            return 1.0
        progress = (self.total_steps - step) / self.warmdown_steps
        return progress + (1 - progress) * self.final_lr_frac

    def momentum(self, step: int) -> float:
        frac = min(step / self.momentum_warmup_steps, 1.0) if self.momentum_warmup_steps > 0 else 1.0
        return (1 - frac) * self.momentum_start + frac * self.momentum_end

    def get_lr(self) -> list[float]:
        # Momentum follows the same step counter, so it is set here to stay in lockstep (and resumes with it).
        for group in self.optimizer.param_groups:
            if group["algorithm"] == "muon":
                group["momentum"] = self.momentum(self.last_epoch)
        factor = self.lr_factor(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]
