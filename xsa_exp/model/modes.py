"""Evaluation mode for the length of a block, whatever mode the model was in before."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """model.eval() inside the block; the model's previous train/eval mode is restored on leaving it,
    also when the block raises."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
