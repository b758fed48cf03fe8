"""Run a function in two (or more) CPU processes joined by a gloo process group, as the tests of sharded code need,
with NCCL's rule that a gathered tensor be contiguous.

Each rank leaves with os._exit after its group is destroyed, skipping the interpreter's finalization: gloo's
worker threads outlive destroy_process_group, and one that drops a finished async work (holding tensors with Python
objects) only after finalization has begun is killed taking the GIL, which aborts the process ("terminate called
without an active exception": once in CI, and in 1 of 40 and 1 of 150 runs of the sharded-Muon test's processes on
a loaded 2-core machine, whose core dump had a gloo worker thread in ~AsyncWork taking the GIL).
"""
import os
import socket
import sys

import torch.distributed as dist
import torch.multiprocessing as mp


def spawn(fn, *args, world: int = 2) -> None:
    """Call fn(rank, world, *args) in `world` processes; raises if any of them fails."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_main, args=(world, port, fn, args), nprocs=world)


def _rank_main(rank: int, world: int, port: int, fn, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dist.all_gather_into_tensor = as_nccl_requires(dist.all_gather_into_tensor)
    fn(rank, world, *args)
    dist.barrier()  # every rank has finished every collective before any leaves
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def as_nccl_requires(collective):
    """gloo gathers a non-contiguous tensor (it copies it) where NCCL refuses it: these ranks hold the code to NCCL's
    rule, which GPU runs meet."""
    def checked(output, input, *args, **kwargs):
        if not (output.is_contiguous() and input.is_contiguous()):
            raise ValueError("Tensors must be contiguous (NCCL's rule for all_gather_into_tensor)")
        return collective(output, input, *args, **kwargs)
    return checked
