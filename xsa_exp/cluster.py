"""How a run meets the machine it was launched on: its ranks, its requeue path and its CPUs.

- SLURM (plain `sbatch`/`srun`, or hydra-submitit-launcher's `hydra/launcher=slurm`): Lightning's
  SLURMEnvironment gives the ranks, with its auto-requeue off. Preemption is PreemptionCheckpoint's
  (callbacks.py) alone: at the signal it finishes the update, saves a checkpoint, then hands the
  requeue to submitit (its checkpoint hook resubmits the same job). Lightning's auto-requeue would
  write a second, `hpc_ckpt_*` checkpoint mid-accumulation and requeue on SIGUSR1 by itself.
- submitit's local executor with several tasks (`hydra/launcher=submitit_local
  hydra.launcher.tasks_per_node=N`): it starts one process per task but tells them their rank only in
  SUBMITIT_LOCAL_* variables, so they are exported as torch's (LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...),
  which Lightning reads.
- The CPUs a process may use are its affinity (what SLURM's cpus_per_task or taskset gave it), not
  every core of the node.
"""

from __future__ import annotations

import os


def cluster_plugins() -> list:
    """The Trainer's cluster environment: SLURM's without its auto-requeue where SLURM launched the run."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def export_submitit_local_ranks() -> None:
    """Under submitit's local executor with more than one task, set torch's rank variables from submitit's."""
    if "SUBMITIT_LOCAL_JOB_ID" not in os.environ or int(os.environ.get("SUBMITIT_LOCAL_NTASKS", "1")) < 2:
        return
    import submitit  # only under submitit, which installed it

    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
