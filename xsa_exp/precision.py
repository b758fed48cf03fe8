"""trainer.precision beyond Lightning's own: bf16-compute, how nanochat trains in bf16 (since March 2026, replacing
autocast). The token and value embeddings are stored in bf16, so the residual stream, its mixes and adds, the norms,
gates and attention all run in bf16; each matrix keeps an fp32 master weight and fp32 optimizer state and is cast to
bf16 inside its matmul; the logits are cast to fp32 for the soft-cap and the loss. Under bf16-mixed (autocast) the
weights and the residual stream stay fp32, and so do the ops autocast leaves alone (norms, adds, gates).
"""

from __future__ import annotations

import torch

BF16_COMPUTE = "bf16-compute"


def lightning_precision(precision: str) -> str:
    """The Trainer's precision: bf16-compute is Lightning's 32-true (no autocast), the model computing in bf16."""
    return "32-true" if precision == BF16_COMPUTE else precision


def prepare(model, precision: str) -> None:
    """Under bf16-compute, the model computes in bf16 (GPT.compute_in); under any other precision it stays as built."""
    if precision == BF16_COMPUTE:
        model.compute_in(torch.bfloat16)
