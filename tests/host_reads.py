"""Counting what makes the host wait for the device during training: a tensor turned into a Python value (on a GPU
each waits for the kernels queued before it) and a collective that returns to the host (Lightning's
strategy.broadcast and barrier, torch's *_object collectives)."""

import lightning as L
import torch
import torch.distributed as dist

HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
              torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu}
HOST_COLLECTIVES = ("broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list", "barrier",
                    "monitored_barrier")


class CountHostReads(torch.overrides.TorchFunctionMode):
    """Counts the conversions of a tensor to Python values (and, through UpdateReads, host collectives)."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


class UpdateReads(L.Callback):
    """The host reads of each update, from the end of the previous update's hooks to the end of its own
    (counts[s] for update s); last among the callbacks, it sees everything the others do at the end of an update."""

    def __init__(self):
        self.counts: dict[int, list[str]] = {}
        self.mode = None
        for name in HOST_COLLECTIVES:
            setattr(dist, name, self._counted(getattr(dist, name), name))

    def _counted(self, collective, name):
        def counted(*args, **kwargs):
            if self.mode is not None:
                self.mode.reads.append(f"dist.{name}")
            return collective(*args, **kwargs)
        return counted

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.mode is not None and step != self.step:
            self.mode.__exit__(None, None, None)
            self.counts[self.step + 1] = self.mode.reads
            self.mode = None
        if self.mode is None and not trainer.max_steps == step:
            self.step, self.mode = step, CountHostReads()
            self.mode.__enter__()
