"""A time-limited job through the real launcher: hydra-submitit-launcher's local executor signals it
(SIGUSR2, 30 s before its 1-minute limit), the run checkpoints, submitit requeues it, and the requeued
job resumes and completes with every logged row and weight of an uninterrupted run."""

import os
import subprocess
import sys

import pytest
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment

from tests.conftest import REPO
from tests.test_resume import final_weights, rows
from xsa_exp.cluster import available_cpus, cluster_plugins
from xsa_exp.run_dir import read_status

# The tiny preset at one thread: an attempt starts in about 8 s here and trains about an update a second until the
# signal at 30 s (the local executor's fixed signal_delay_s before the 1-minute limit), so 32 updates span one
# signal with a margin for a faster machine and finish in two attempts; one more process on the machine
# (pytest-xdist's other worker) makes it three or four. Two DDP ranks start slower: on a Zen 3 VM with the other
# worker busy an attempt trained 2-5 updates, and 32 needed 8 attempts.
TASKS = {1: ["train.max_steps=32", "eval.every=16"],
         2: ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "train.device_batch_size=4",
             "train.max_steps=32", "eval.every=16"]}
COMMON = ["train.cpu_threads=1", "logger=csv", "eval.diag_every=8", "resume=auto"]


@pytest.mark.slow
@pytest.mark.xdist_group("submitit")  # one at a time: each attempt's progress depends on the machine's load
@pytest.mark.parametrize("tasks", [1, 2])
def test_time_limited_submitit_job_requeues_and_finishes_bit_identical(tmp_path, tasks):
    sweep = tmp_path / "sweep"
    args = [*TASKS[tasks], *COMMON]
    # First, so that it does not slow the job's attempts: the uninterrupted run.
    reference = subprocess.run([sys.executable, "train.py", f"hydra.run.dir={tmp_path / 'reference'}", *args],
                               cwd=REPO, capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr[-3000:]
    # max_num_timeout: requeues allowed for time limits (the local executor's default is 3), so that a slow or busy
    # machine needs more attempts (about 36 s each), never a different result.
    job = subprocess.Popen([sys.executable, "train.py", "-m", "hydra/launcher=submitit_local",
                            "hydra.launcher.timeout_min=1", "+hydra.launcher.max_num_timeout=12",
                            f"hydra.launcher.tasks_per_node={tasks}",
                            f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=job", *args],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = job.communicate(timeout=600)[0]
    assert job.returncode == 0, output[-3000:]

    run_dir = sweep / "job"
    logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_0_log.*"))
    assert "Caught signal SIGUSR2" in logs and "Requeued job" in logs, logs[-3000:]
    assert "SIGUSR2 received: saved" in logs and "resuming from" in logs
    assert read_status(run_dir)["status"] == "completed"
    assert not list(run_dir.glob("*.unfinished-*")), "a requeued attempt restarted from step 0"
    assert rows(run_dir) == rows(tmp_path / "reference")
    assert (run_dir / "diagnostics.jsonl").read_text() == (tmp_path / "reference" / "diagnostics.jsonl").read_text()
    ours, theirs = final_weights(run_dir), final_weights(tmp_path / "reference")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_lightning_slurm_auto_requeue_is_off_under_slurm(monkeypatch):
    """Lightning's own requeue on SIGUSR1 would compete with submitit's; the ranks still come from SLURM."""
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    assert cluster_plugins() == []  # not under SLURM: Lightning's default environment
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    (plugin,) = cluster_plugins()
    assert isinstance(plugin, SLURMEnvironment) and plugin.auto_requeue is False


def test_available_cpus_follow_the_affinity():
    assert available_cpus() == len(os.sched_getaffinity(0))
    child = subprocess.run(["taskset", "-c", "0", sys.executable, "-c",
                            "from xsa_exp.cluster import available_cpus; print(available_cpus())"],
                           capture_output=True, text=True, cwd=REPO)
    assert child.stdout.strip() == "1", child.stderr


@pytest.mark.parametrize("overrides,message", [
    (["resume=auto", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "train.device_batch_size=4"],
     "config error: trainer.devices x trainer.num_nodes = 2 devices, but hydra.launcher.tasks_per_node=1 x "
     "hydra.launcher.nodes=1 tasks; submitit starts one process per device, so set hydra.launcher.tasks_per_node=2 "
     "and hydra.launcher.nodes=1 (hydra/launcher=slurm sets both)"),
    ([], "config error: hydra/launcher=submitit_* requeues a job at its time limit or preemption, and the requeued "
         "job must continue its run; add resume=auto")])
def test_a_submitit_sweep_is_checked_before_anything_is_submitted(tmp_path, overrides, message):
    sweep = tmp_path / "sweep"
    result = subprocess.run([sys.executable, "train.py", "-m", "hydra/launcher=submitit_local", *overrides,
                             f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not sweep.exists()
    assert result.stderr.strip().splitlines() == [message]
