"""Lightning DDP with the combined optimizer: 2 CPU processes (gloo) vs 1 process, same global batch; the updates
between host-sync steps under DDP."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import gloo
from tests.conftest import REPO, SMALL

pytestmark = pytest.mark.slow


def run(tmp_path, name, devices):
    """The 2-device run by `python train.py` (Lightning starts the second rank as a copy of the command), the
    1-device one in this process."""
    run_dir = tmp_path / name
    # fp32 Newton-Schulz: the two set-ups sum the same gradients in a different order, and bf16 would
    # turn those last-bit differences into visible ones.
    args = [*SMALL, "trainer=ddp" if devices > 1 else "trainer=cpu", "trainer.accelerator=cpu",
            f"trainer.devices={devices}", "train.max_steps=5", "eval.every=5", "optim.muon.ns_dtype=float32"]
    if devices > 1:
        result = subprocess.run([sys.executable, "train.py", *args, f"hydra.run.dir={run_dir}"], cwd=REPO,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        from tests.conftest import compose_config
        from xsa_exp.training.run import train  # here: Lightning reads a process's rank once, when imported

        train(compose_config(*args), run_dir)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    weights = torch.load(run_dir / "checkpoints" / "final.ckpt", weights_only=False)["state_dict"]
    return run_dir, rows, weights


def test_two_gloo_processes_match_one_process(tmp_path):
    single_dir, single, single_w = run(tmp_path, "one", 1)   # 2 micro-batches of 4 rows per step
    ddp_dir, ddp, ddp_w = run(tmp_path, "two", 2)            # 2 ranks x 4 rows per step
    losses = lambda rows: [float(r["train/loss"]) for r in rows if r["train/loss"]]  # noqa: E731
    assert len(losses(ddp)) == 5
    assert losses(ddp) == pytest.approx(losses(single), rel=1e-5)
    bpb = lambda rows: [float(r["val/bpb"]) for r in rows if r["val/bpb"]]  # noqa: E731
    assert bpb(ddp) == pytest.approx(bpb(single), rel=1e-5)
    # Weights agree as whole tensors; single elements may not: AdamW's first steps are close to sign(g), so a
    # near-zero gradient entry whose last bits differ (summation order) can move by a full step.
    for key in single_w:
        assert (ddp_w[key] - single_w[key]).norm() <= 1e-3 * single_w[key].norm() + 1e-6, key
    # Rank 0 alone writes the run's files: rank 1 (which Hydra would give train_ddp_process_1.log) no log either.
    assert sorted(p.name for p in ddp_dir.glob("*.csv")) == ["metrics.csv"]
    assert sorted(p.name for p in ddp_dir.glob("*.log")) == ["train.log"]
    assert "GLOBAL_RANK: 0" in (ddp_dir / "train.log").read_text()
    assert "GLOBAL_RANK: 1" not in (ddp_dir / "train.log").read_text()


def _rank_of_a_ddp_run(rank: int, world: int, run_dir: str, out: str) -> None:
    """One rank of a DDP run in a process group that gloo.spawn made (Lightning joins it, as under torchrun), counting
    each update's host reads."""
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world))
    from tests.conftest import compose_config
    from tests.host_reads import UpdateReads
    from xsa_exp.training import run as training

    counter = UpdateReads()
    real_build = training.build_callbacks
    training.build_callbacks = lambda *a: real_build(*a) + [counter]
    cfg = compose_config(*SMALL, "trainer=ddp", "trainer.accelerator=cpu", f"trainer.devices={world}",
                         "train.max_steps=8", "log.print_every=4", "eval.every=6", "eval.diag_every=0",
                         "train.grad_clip=1.0")
    training.train(cfg, Path(run_dir))
    Path(f"{out}.{rank}").write_text(json.dumps(counter.counts))


def test_an_update_between_host_sync_steps_reads_nothing_under_ddp(tmp_path):
    """2 gloo processes: on every update that is not a host-sync step (console line, evaluation, last step), neither
    rank turns a tensor into a Python value (.item(), .tolist(), .cpu(), bool(t), ...) nor runs a collective that
    returns to the host (the preemption flag's broadcast, Lightning's SIGTERM broadcast, a barrier), in our code or
    Lightning's; the host-sync steps do (the counter sees them)."""
    out = tmp_path / "reads"
    gloo.spawn(_rank_of_a_ddp_run, str(tmp_path / "run"), str(out))
    for rank in range(2):
        counts = {int(s): reads for s, reads in json.loads(Path(f"{out}.{rank}").read_text()).items()}
        assert counts[4] and counts[6], counts  # the host-sync steps: the metrics' reduce and read, the broadcast
        quiet = {s: reads for s, reads in counts.items() if s not in (4, 6, 8)}  # from the end of update 1 on
        assert sorted(quiet) == [2, 3, 5, 7] and all(not reads for reads in quiet.values()), (rank, quiet)


def _rank_resuming_from_its_own_choice(rank: int, world: int, run_dir: str, out: str) -> None:
    """One rank of a 2-rank run that trains 6 updates, is left as a preempted run (its final checkpoint gone), then
    resumes; rank 1 finds step 4's checkpoint, as a node that cannot read step 6's yet would."""
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world))
    import torch.distributed as dist

    from tests.conftest import compose_config
    from xsa_exp import run_dir as rd
    from xsa_exp.run_dir import RunError
    from xsa_exp.training import run as training

    cfg = compose_config(*SMALL, "trainer=ddp", "trainer.accelerator=cpu", f"trainer.devices={world}",
                         "train.checkpoint_every=2", "train.keep_checkpoints=3", "eval.diag_every=0", "resume=auto")
    run_dir = Path(run_dir)
    training.train(cfg, run_dir)
    dist.barrier()
    if rank == 0:
        (run_dir / "checkpoints" / "final.ckpt").unlink()
        (run_dir / "status.json").write_text(json.dumps({"status": "failed", "step": 6, "error": "preempted"}))
    dist.barrier()
    if rank == 1:
        training.rd.newest_checkpoint = lambda path: rd.checkpoints_dir(path) / "step000004.ckpt"
    try:
        training.train(cfg, run_dir)
        Path(f"{out}.{rank}").write_text("resumed")
    except RunError as e:
        Path(f"{out}.{rank}").write_text(str(e))


def test_ranks_that_find_different_checkpoints_to_resume_from_all_stop_in_one_line(tmp_path):
    out = tmp_path / "outcome"
    gloo.spawn(_rank_resuming_from_its_own_choice, str(tmp_path / "run"), str(out))
    for rank in range(2):
        line = Path(f"{out}.{rank}").read_text()
        assert line.startswith("the ranks found different checkpoints to resume from") and "\n" not in line, line
        assert "(rank 0: step000006.ckpt, rank 1: step000004.ckpt)" in line and "relaunch with resume=auto" in line
