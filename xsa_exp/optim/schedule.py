"""Step-interval schedule: linear warmup, constant, linear warmdown to a final fraction of the lr.
Muon's momentum warms up linearly over the first steps (nanochat's 0.85 -> 0.95 over 300) and, optionally,
down over the lr warmdown; Muon's weight decay is constant or decays as a cosine to zero over the run."""

from __future__ import annotations

import math

import torch

from xsa_exp.config.arithmetic import check_schedule


class OptimizerSchedule(torch.optim.lr_scheduler.LRScheduler):
    """`last_epoch` counts optimizer updates done, so update s + 1 runs with lr_factor(s)."""

    def __init__(self, optimizer, total_steps: int, warmup_steps: int, warmdown_frac: float, final_lr_frac: float,
                 momentum_start: float, momentum_end: float, momentum_warmup_steps: int,
                 momentum_warmdown: float | None, weight_decay_schedule: str):
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.warmdown_steps = check_schedule(total_steps, warmup_steps, warmdown_frac)
        self.final_lr_frac = final_lr_frac
        self.momentum_start, self.momentum_end = momentum_start, momentum_end
        self.momentum_warmup_steps = momentum_warmup_steps
        self.momentum_warmdown = momentum_warmdown
        self.weight_decay_schedule = weight_decay_schedule
        for group in optimizer.param_groups:
            group.setdefault("initial_weight_decay", group["weight_decay"])
        super().__init__(optimizer)

    def lr_factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if step <= self.total_steps - self.warmdown_steps:
            return 1.0
        progress = (self.total_steps - step) / self.warmdown_steps
        return progress + (1 - progress) * self.final_lr_frac

    def momentum(self, step: int) -> float:
        if step < self.momentum_warmup_steps:
            frac = step / self.momentum_warmup_steps
            return (1 - frac) * self.momentum_start + frac * self.momentum_end
        warmdown_start = self.total_steps - self.warmdown_steps
        if self.momentum_warmdown is not None and step >= warmdown_start:
            progress = (step - warmdown_start) / self.warmdown_steps
            return self.momentum_end * (1 - progress) + self.momentum_warmdown * progress
        return self.momentum_end

    def weight_decay_factor(self, step: int) -> float:
        if self.weight_decay_schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * step / self.total_steps))
        return 1.0

    def get_lr(self) -> list[float]:
        # Momentum and weight decay follow the same step counter, so they are set here to stay in lockstep (and
        # resume with it).
        for group in self.optimizer.param_groups:
            if group["algorithm"] == "muon":
                group["momentum"] = self.momentum(self.last_epoch)
                group["weight_decay"] = group["initial_weight_decay"] * self.weight_decay_factor(self.last_epoch)
        factor = self.lr_factor(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]
