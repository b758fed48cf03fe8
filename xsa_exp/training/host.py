"""What the training process does so that its host never stalls the device: the allocator's setting (CUDA's on a GPU,
glibc's on a CPU), and the garbage collector out of the way of the updates. (The rest lives where it acts: pinned
batches in the data module, the rank's share of the CPUs in cluster.py.)"""

from __future__ import annotations

import ctypes
import gc
import os

import lightning as L

ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def use_expandable_segments() -> None:
    """CUDA's caching allocator with expandable segments, unless the user configured the allocator: a segment grows
    instead of a new one being reserved beside it, so memory freed between the forward's activations and the
    optimizer's stacks is reused rather than left reserved in fragments. The variable is read when CUDA initialises,
    so this runs before anything touches the device (Lightning's DDP ranks inherit it)."""
    if not any(name in os.environ for name in ALLOCATOR_VARIABLES):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters (glibc's malloc.h)


def keep_freed_host_memory() -> None:
    """glibc's malloc keeps the memory freed tensors leave for the next ones, unless the user tuned malloc (a MALLOC_*
    variable or GLIBC_TUNABLES). By default it maps each block of 32 MiB or more (the tiny preset's logits) afresh,
    unmaps it when freed and trims its heap's free top, so every CPU training step faults its largest tensors in again
    (BENCHMARKS.md, "The host allocator on CPU"). The process keeps its peak memory instead. Nothing happens where
    the C library has no mallopt (macOS)."""
    if "GLIBC_TUNABLES" in os.environ or any(name.startswith("MALLOC_") for name in os.environ):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_MAX, 0)
        mallopt(M_TRIM_THRESHOLD, 1 << 30)


class FrozenGC(L.Callback):
    """After the first update (setup done, the compiled graphs built), every object alive moves to the collector's
    permanent generation: the collections that training's own allocations trigger then scan what training creates,
    not the modules, graphs, Lightning's and the libraries' long-lived objects, whose full collection holds up the
    next launches. Unfrozen when training ends or fails, so that a sweep's next run in this process can collect them."""

    def __init__(self):
        self.first_step: int | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.first_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.first_step is not None and trainer.global_step > self.first_step:
            self.first_step = None
            gc.collect()
            gc.freeze()

    def on_train_end(self, trainer, pl_module) -> None:
        gc.unfreeze()

    def on_exception(self, trainer, pl_module, exception) -> None:
        gc.unfreeze()
