"""Validation bits-per-byte: tokenizer-independent, so runs with different vocabularies compare."""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
from torchmetrics import Metric

from xsa_exp.data.packing import inputs_and_targets
from xsa_exp.model import evaluating


class BitsPerByte(Metric):
    """Sum of cross-entropy nats over targets whose token has bytes > 0, over ln 2 x their bytes.

    Special tokens (0 bytes, e.g. BOS) and ignored targets (-1) count for neither; states are sums,
    so they add up across ranks."""

    full_state_update = False

    def __init__(self, token_bytes: torch.Tensor):
        super().__init__()
        self.register_buffer("token_bytes", token_bytes.long().clone())
        self.add_state("nats", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("bytes", torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, losses: torch.Tensor, targets: torch.Tensor) -> None:
        losses, targets = losses.reshape(-1), targets.reshape(-1)
        nbytes = torch.where(targets >= 0, self.token_bytes[targets.clamp_min(0)], 0)
        counted = nbytes > 0
        self.nats += losses[counted].double().sum()
        self.bytes += nbytes[counted].sum()

    def compute(self) -> torch.Tensor:
        return self.nats / (math.log(2) * self.bytes)


@torch.no_grad()
def evaluate_bpb(model, batches, token_bytes: torch.Tensor, autocast=nullcontext) -> float:
    """bpb of model over batches of packed rows (B, T + 1), masked targets not counted; leaves the model's train/eval
    mode as it was."""
    device = next(model.parameters()).device
    metric = BitsPerByte(token_bytes).to(device)
    with evaluating(model):
        for rows in batches:
            rows = rows.to(device)
            inputs, targets = inputs_and_targets(rows)
            with autocast():
                losses = model(inputs, targets, loss_reduction="none")
            metric.update(losses, targets)
    return float(metric.compute())
