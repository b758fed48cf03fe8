"""How a run meets the machine it was launched on: its ranks, its requeue path and its CPUs.

- SLURM (plain `sbatch`/`srun`, or hydra-submitit-launcher's `hydra/launcher=slurm`): Lightning's
  SLURMEnvironment gives the ranks, with its auto-requeue off. Preemption is PreemptionCheckpoint's
  (training/preemption.py) alone: at the signal it finishes the update, saves a checkpoint, then hands the
  requeue to submitit (its checkpoint hook resubmits the same job). Lightning's auto-requeue would
  write a second, `hpc_ckpt_*` checkpoint mid-accumulation and requeue on SIGUSR1 by itself.
- submitit's local executor with several tasks (`hydra/launcher=submitit_local
  hydra.launcher.tasks_per_node=N`): it starts one process per task but tells them their rank only in
  SUBMITIT_LOCAL_* variables, so they are exported as torch's (LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...),
  which Lightning reads.
- The CPUs a process may use are its affinity (what SLURM's cpus_per_task, taskset or a container gave it), not
  every core of the node; ranks share it equally unless SLURM bound each to its own (rank_cpus).
- What a device can do and has used, for MFU and memory in the training log: its dense bf16 peak by
  name, its peak memory.
"""

from __future__ import annotations

import os
import resource
import time

import torch

# Dense bf16 tensor-core peak FLOP/s of one GPU (the vendors' data sheets, without sparsity). The first name found
# in torch.cuda.get_device_name() counts, so the variants of a name come before it.
PEAK_BF16_FLOPS = (("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12),
                   ("B200", 2250e12), ("A100", 312e12))


def cluster_plugins() -> list:
    """The Trainer's cluster environment: SLURM's without its auto-requeue where SLURM launched the run. torchrun
    inside a SLURM job gives the ranks itself (Lightning's own order tries it before SLURM): SLURM's would make each of
    its processes rank 0 of the job's tasks."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if slurm_gives_the_ranks() else []


def slurm_gives_the_ranks() -> bool:
    """Whether SLURM's tasks are the run's ranks (srun, submitit's SLURM executor), as Lightning detects them."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    return SLURMEnvironment.detect() and not TorchElasticEnvironment.detect()


def export_submitit_local_ranks() -> None:
    """Under submitit's local executor with more than one task, set torch's rank variables from submitit's."""
    if "SUBMITIT_LOCAL_JOB_ID" not in os.environ or int(os.environ.get("SUBMITIT_LOCAL_NTASKS", "1")) < 2:
        return
    import submitit  # only under submitit, which installed it
    from lightning.pytorch.utilities import rank_zero_only

    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    # Lightning read the rank variables when it was imported, before these were set: without this every task would
    # take itself for rank 0 until the Trainer starts (each writing the run's files, each printing the banner).
    rank_zero_only.rank = int(os.environ["RANK"])


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_cpus(local_ranks: int) -> int:
    """CPUs for one of this node's `local_ranks` training processes, so that ranks do not each tokenize with a thread
    per CPU they share: the rank's affinity where SLURM's tasks are the ranks and it bound each to its own
    `cpus_per_task`; else an equal share of the affinity, which the ranks of Lightning's launcher, torchrun or
    submitit's local executor, and those in a container's CPU set, all have in common."""
    cpus = available_cpus()
    per_task = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm_gives_the_ranks() and per_task and cpus <= int(per_task):
        return cpus
    return max(1, cpus // local_ranks)


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named like torch.cuda.get_device_name() says, if the table knows it."""
    return next((flops for name, flops in PEAK_BF16_FLOPS if name in device_name), None)


def device_peak_flops(device: torch.device, configured: float | None) -> float | None:
    """train.peak_flops if set, else the table's figure for a CUDA device; None (no MFU) otherwise."""
    if configured is not None:
        return float(configured)
    return peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def peak_memory_gb(device: torch.device) -> float:
    """CUDA: the most memory tensors have held on the device; CPU: the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux reports KiB


def synchronized_time(device: torch.device) -> float:
    """perf_counter once the device has finished the work queued so far (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
