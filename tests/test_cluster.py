"""A signalled job through the real launcher: hydra-submitit-launcher's local executor runs it, the test sends its
tasks SIGUSR2 (what submitit sends before a time limit, or at preemption) once training is under way, the run
checkpoints, submitit requeues it, and the requeued job resumes and completes with every logged row and weight of an
uninterrupted run."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment

from tests.conftest import REPO
from tests.test_resume import final_weights, rows
from xsa_exp.cluster import available_cpus, cluster_plugins, rank_cpus
from xsa_exp.errors import ConfigError
from xsa_exp.run_dir import read_status

# Two DDP ranks of the tiny preset at one thread each train an update in 0.5-2.5 s (by the machine and its load), so
# the signal, sent at the console line of update 2, comes with 10 updates left on any machine. The test sends it
# rather than waiting for the executor's time limit: how far an attempt gets before a time limit depends on the
# machine's speed, and the local executor restarts a job at most 6 times whatever max_num_timeout says. One task
# per device as on SLURM; a one-task job takes the same path as rank 0 here, without the broadcast.
STEPS = 12
ARGS = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "train.device_batch_size=4",
        f"train.max_steps={STEPS}", "eval.every=6", "eval.val_tokens=4096", "eval.diag_every=3", "log.print_every=2",
        "train.cpu_threads=1", "logger=csv", "resume=auto"]


def job_tasks(sweep: Path) -> list[int]:
    """The process ids of the tasks of the submitit job in `sweep` (each runs `submitit.core._submit <folder>`)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or one that has exited
            continue
        if b"submitit.core._submit" in argv and any(str(sweep).encode() in a for a in argv):
            pids.append(int(proc.name))
    return pids


def signal_when_training(job: subprocess.Popen, sweep: Path, launcher_log: Path, at_step: int) -> None:
    """Send SIGUSR2 to both tasks once the job's console (submitit's log files) shows update `at_step`."""
    pattern = re.compile(rf"step +(\d+)/{STEPS} \| loss")
    deadline, logs = time.monotonic() + 300, ""
    while time.monotonic() < deadline and job.poll() is None:
        logs = "".join(p.read_text() for p in sweep.glob(".submitit/*/*_0_log.*"))
        if any(int(step) >= at_step for step in pattern.findall(logs)):
            pids = job_tasks(sweep)
            assert len(pids) == 2, f"expected 2 task processes, found {pids}"
            for pid in pids:
                os.kill(pid, signal.SIGUSR2)
            return
        time.sleep(0.1)
    # A job that failed before submitit started its tasks says why in the launcher's output, not in submitit's logs.
    pytest.fail(f"the job never logged update {at_step}:\n{launcher_log.read_text()[-2000:]}\n{logs[-3000:]}")


@pytest.mark.slow
def test_signalled_two_rank_submitit_job_requeues_and_finishes_bit_identical(tmp_path):
    sweep = tmp_path / "sweep"
    reference = subprocess.run([sys.executable, "train.py", f"hydra.run.dir={tmp_path / 'reference'}", *ARGS],
                               cwd=REPO, capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr[-3000:]
    launcher_log = tmp_path / "launcher.log"  # a file, not a pipe: nothing reads the launcher while the test waits
    with open(launcher_log, "w") as log:
        job = subprocess.Popen([sys.executable, "train.py", "-m", "hydra/launcher=submitit_local",
                                "hydra.launcher.tasks_per_node=2",
                                f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=job", *ARGS],
                               cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        signal_when_training(job, sweep, launcher_log, at_step=2)
        job.wait(timeout=600)
    finally:
        if job.poll() is None:  # a failed test leaves no launcher, controller or task behind
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0, launcher_log.read_text()[-3000:]

    run_dir = sweep / "job"
    logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_0_log.*"))
    assert "Caught signal SIGUSR2" in logs and "Requeued job" in logs, logs[-3000:]
    assert "SIGUSR2 received: checkpoint" in logs and "resuming from" in logs
    second_task = "".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_1_log.*"))
    assert second_task and "run directory:" not in second_task, second_task[-3000:]  # rank 1 knows it is not rank 0
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
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "a1")  # torchrun in a SLURM job: its ranks, not SLURM's tasks
    assert cluster_plugins() == []


SLURM_TASKS = {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NAME": "train"}
ONE_TASK = {"SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NAME": "train"}


@pytest.mark.parametrize("slurm, affinity, local_ranks, expected", [
    ({}, 16, 4, 4), ({}, 16, 32, 1), ({}, 16, 1, 16),
    ({}, 8, 4, 2),  # a container's CPU set, narrower than the node, which its ranks share
    ({**SLURM_TASKS, "SLURM_CPUS_PER_TASK": "4"}, 4, 4, 4),  # SLURM bound each task (rank) to its own CPUs
    ({**SLURM_TASKS, "SLURM_CPUS_PER_TASK": "4"}, 16, 4, 4),  # a site that does not bind: the job's CPUs
    ({**ONE_TASK, "SLURM_CPUS_PER_TASK": "16", "TORCHELASTIC_RUN_ID": "a1"}, 16, 4, 4),  # torchrun's ranks in a task
    ({**ONE_TASK, "SLURM_CPUS_PER_TASK": "16", "SLURM_JOB_NAME": "interactive"}, 16, 4, 4),  # Lightning's, in salloc
])
def test_a_rank_takes_its_own_cpus_where_slurm_bound_it_else_an_equal_share(monkeypatch, slurm, affinity,
                                                                            local_ranks, expected):
    """Ranks that share an affinity (all 16 CPUs of the node, a container's 8) split it; a SLURM task bound to its
    cpus_per_task keeps them."""
    for name in (*SLURM_TASKS, "SLURM_CPUS_PER_TASK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)))
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert rank_cpus(local_ranks) == expected


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
         "job must continue its run; add resume=auto"),
    (["resume=auto", "trainer=ddp"],  # devices: auto
     "config error: trainer.devices=auto: submitit starts one process per device and must know how many before the "
     "job starts; set trainer.devices=<devices per node> (hydra/launcher=slurm takes its tasks and GPUs per node from "
     "it)"),
    (["resume=auto", "trainer=gpu", "trainer.devices=2", "train.device_batch_size=4",
      "hydra.launcher.tasks_per_node=2"],
     "config error: hydra/launcher=submitit_local shows each job hydra.launcher.gpus_per_node=None GPUs, and "
     "trainer.devices=2 GPUs are needed (trainer.accelerator=gpu); add hydra.launcher.gpus_per_node=2, or "
     "trainer.accelerator=cpu to train on the CPU")])
def test_a_submitit_sweep_is_checked_before_anything_is_submitted(tmp_path, overrides, message):
    sweep = tmp_path / "sweep"
    result = subprocess.run([sys.executable, "train.py", "-m", "hydra/launcher=submitit_local", *overrides,
                             f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not sweep.exists()
    assert result.stderr.strip().splitlines() == [message]


def test_a_one_task_cpu_job_under_submitit_local_needs_no_device_count(tmp_path):
    from tests.hydra_app import preflight

    preflight("train", ["-m", "hydra/launcher=submitit_local", "trainer=ddp", "trainer.accelerator=cpu", "resume=auto",
                        f"hydra.sweep.dir={tmp_path / 'sweep'}"])


def test_submitit_local_with_accelerator_auto_on_a_gpu_machine_needs_its_gpus_shown(tmp_path, monkeypatch):
    """Without gpus_per_node submitit hides the GPUs (CUDA_VISIBLE_DEVICES=""), and auto would train on the CPU."""
    from tests.hydra_app import preflight
    from xsa_exp.config import preflight as checks

    args = ["-m", "hydra/launcher=submitit_local", "resume=auto", "trainer.devices=2",
            "hydra.launcher.tasks_per_node=2", "train.device_batch_size=4", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    monkeypatch.setattr(checks, "cuda_here", lambda: True)
    with pytest.raises(ConfigError, match=r"trainer.devices=2 GPUs are needed \(trainer.accelerator=auto\); add "
                                          r"hydra.launcher.gpus_per_node=2, or trainer.accelerator=cpu"):
        preflight("train", args)
    preflight("train", [*args, "hydra.launcher.gpus_per_node=2"])
    monkeypatch.setattr(checks, "cuda_here", lambda: False)
    preflight("train", args)  # no GPU here: auto is the CPU, as intended


def test_a_submitit_sweep_over_device_counts_is_refused_as_one_array_has_one_set_of_resources(tmp_path):
    """submitit submits the array with the base config's resources: jobs needing one node and two cannot share it."""
    from tests.hydra_app import preflight

    args = ["-m", "hydra/launcher=slurm", "trainer=gpu", "resume=auto", "train.device_batch_size=1",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    with pytest.raises(ConfigError, match=r"^hydra/launcher=slurm submits a sweep as one job array with one set of "
                                          r"resources, hydra.launcher.nodes=1 from the command line's fixed values, "
                                          r"but job 1 \(.*trainer.num_nodes=2.*\) needs hydra.launcher.nodes=2; "
                                          r"sweep trainer.devices and trainer.num_nodes in separate sweeps"):
        preflight("train", [*args, "trainer.devices=2", "trainer.num_nodes=1,2"])
    assert len(preflight("train", [*args, "trainer.devices=2", "trainer.num_nodes=2", "seed=1,2"])) == 2


def test_a_slurm_sweep_without_a_device_count_is_refused_before_submission(tmp_path):
    """hydra/launcher=slurm takes its tasks and GPUs per node from trainer.devices: `auto` cannot be submitted."""
    sweep = tmp_path / "sweep"
    result = subprocess.run([sys.executable, "train.py", "-m", "hydra/launcher=slurm", "trainer=ddp", "resume=auto",
                             f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not sweep.exists()
    assert result.stderr.startswith("config error: trainer.devices=auto: submitit starts one process per device")


def test_the_slurm_launcher_writes_one_task_per_gpu_and_ends_the_job_at_a_failed_rank(tmp_path, monkeypatch):
    """hydra/launcher=slurm's settings through submitit's own sbatch writer, mapped as hydra-submitit-launcher maps
    them: the tasks SLURM starts are the run's ranks, and a rank that fails ends the others (srun's
    --kill-on-bad-exit), which NCCL would otherwise keep waiting for 30 minutes."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    from tests.hydra_app import compose_base

    bin_dir = tmp_path / "bin"  # submitit looks for SLURM's srun before it writes anything
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    cfg, _ = compose_base("train", ["-m", "hydra/launcher=slurm", "trainer=gpu", "trainer.devices=8",
                                    "trainer.num_nodes=2", "hydra.launcher.partition=gpu", "resume=auto",
                                    f"hydra.sweep.dir={tmp_path}"])
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    executor = submitit.AutoExecutor(cluster="slurm", folder=tmp_path, slurm_max_num_timeout=params["max_num_timeout"])
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()
                                  if k not in ("_target_", "submitit_folder", "max_num_timeout")})
    script = executor._executor._make_submission_file_text("python -u -m submitit.core._submit x", "uid")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --signal=USR2@120", "#SBATCH --requeue", "export SLURM_KILL_BAD_EXIT=1"):
        assert line in script.splitlines(), script
    assert script.index("export SLURM_KILL_BAD_EXIT=1") < script.index("srun ")
