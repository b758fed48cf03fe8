"""Exact resume: a run killed with SIGKILL and resumed ends where an uninterrupted run ends."""

import csv
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import REPO, SMALL
from xsa_exp.errors import ConfigError
from xsa_exp.run_dir import RunError, load_trained
from xsa_exp.training.run import train
from xsa_exp.write_failures import WriteFailed

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("resume")]  # one worker trains each reference run once
STEPS = ["train.max_steps=9", "eval.every=2", "eval.diag_every=4"]  # the runs compared with an uninterrupted one
KILLED = [*STEPS, "train.checkpoint_every=3", "resume=auto"]


MACHINE_COLUMNS = {"train/tokens_per_sec", "train/mfu", "train/peak_memory_gb"}  # how fast and how big, not what


def rows(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return [{k: v for k, v in r.items() if k not in MACHINE_COLUMNS} for r in csv.DictReader(f)]


def final_weights(run_dir):
    return torch.load(run_dir / "checkpoints" / "final.ckpt", weights_only=False)["state_dict"]


def command(run_dir, *extra):
    return [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *SMALL, *KILLED, *extra]


references = {}  # the uninterrupted runs, by precision switches: trained once per worker, for every test here


def reference(tmp_path_factory, small_cfg, switches=()):
    if tuple(switches) not in references:
        references[tuple(switches)] = train(small_cfg(*STEPS, *switches), tmp_path_factory.mktemp("ref"))
    return references[tuple(switches)]


@pytest.mark.parametrize("switches", [["trainer.precision=32-true"], ["trainer.precision=bf16-mixed"],
                                      ["trainer.precision=bf16-compute", "model.fused_loss_head=true"]])
def test_sigkill_then_resume_is_bit_identical(tmp_path, tmp_path_factory, small_cfg, switches, caplog):
    """Killed by `python train.py`'s process, resumed by the same config in this one (the command line's resume is
    the preemption test's below)."""
    uninterrupted = reference(tmp_path_factory, small_cfg, switches)
    run_dir = tmp_path / "killed"
    process = subprocess.Popen(command(run_dir, *switches), cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while (not (run_dir / "checkpoints" / "step000006.ckpt").exists() and process.poll() is None
           and time.time() < deadline):
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (run_dir / "checkpoints" / "final.ckpt").exists(), "the run finished before it could be killed"
    with caplog.at_level(logging.INFO):
        train(small_cfg(*KILLED, *switches), run_dir)
    assert "resuming from" in caplog.text
    assert rows(run_dir) == rows(uninterrupted)  # same losses, bpb, lrs; no duplicated or missing steps
    assert (run_dir / "diagnostics.jsonl").read_text() == (uninterrupted / "diagnostics.jsonl").read_text()
    ours, theirs = final_weights(run_dir), final_weights(uninterrupted)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    assert (sorted(p.name for p in (run_dir / "checkpoints").glob("step*.ckpt"))
            == ["step000006.ckpt", "step000009.ckpt"])


def test_a_periodic_checkpoints_save_is_not_counted_as_training_time(tmp_path, small_cfg, monkeypatch):
    """Lightning runs checkpoint callbacks after all others, the update clock included: the clock restarts after the
    save. A clock that moves 1 s per reading, and 1,000 s while a checkpoint is written, shows where the time went."""
    from xsa_exp.training import checkpoints, metrics_log

    now = [0.0]

    def clock(device):
        now[0] += 1.0
        return now[0]

    real_save = checkpoints.RunDirCheckpointIO.save_checkpoint

    def slow_save(self, checkpoint, path, storage_options=None):
        now[0] += 1000.0
        real_save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(metrics_log, "synchronized_time", clock)
    monkeypatch.setattr(checkpoints.RunDirCheckpointIO, "save_checkpoint", slow_save)
    run_dir = train(small_cfg("train.max_steps=6", "train.checkpoint_every=2"), tmp_path / "run")
    with open(run_dir / "metrics.csv") as f:
        speeds = [float(r["train/tokens_per_sec"]) for r in csv.DictReader(f) if r["train/tokens_per_sec"]]
    assert len(speeds) == 6 and min(speeds) > 512 / 10, speeds  # 512 tokens per update, a few readings each


def test_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path, small_cfg):
    cfg = small_cfg("train.max_steps=6", "train.checkpoint_every=2", "train.keep_checkpoints=3", "resume=auto")
    run_dir = train(cfg, tmp_path / "run")
    (run_dir / "checkpoints" / "final.ckpt").unlink()
    (run_dir / "status.json").write_text(json.dumps({"status": "failed", "step": 6, "error": "preempted"}))
    newest = run_dir / "checkpoints" / "step000006.ckpt"
    newest.write_bytes(newest.read_bytes()[:1000])
    before = rows(run_dir)
    with pytest.warns(UserWarning, match=r"step000006.ckpt \(RuntimeError\) is unreadable; falling back to "
                                         r"step000004.ckpt$"):
        train(cfg, run_dir)
    steps = [int(r["step"]) for r in rows(run_dir) if r["train/loss"]]
    assert steps == [1, 2, 3, 4, 5, 6]
    # Resumed from step 4, not restarted: a restart sets the earlier log aside and redoes steps 1-4.
    assert not list(run_dir.glob("metrics.unfinished-*"))
    assert [r for r in rows(run_dir) if int(r["step"]) <= 4] == [r for r in before if int(r["step"]) <= 4]


def test_a_resumed_run_logs_to_the_same_wandb_run(tmp_path, small_cfg, monkeypatch):
    """A requeued or resumed run continues its wandb run (the id is kept in run.json), not a new one per attempt."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # offline: the run's files show the id
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = small_cfg("logger=wandb", "train.max_steps=4", "train.checkpoint_every=2", "resume=auto")
    run_dir = train(cfg, tmp_path / "run")
    wandb_id = json.loads((run_dir / "run.json").read_text())["wandb_id"]
    (run_dir / "checkpoints" / "final.ckpt").unlink()  # as if stopped after its last periodic checkpoint
    (run_dir / "status.json").write_text(json.dumps({"status": "interrupted", "step": 4, "error": None}))
    time.sleep(1.1)  # wandb names an offline run's folder by the second it started
    train(cfg, run_dir)
    attempts = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2 and all(name.endswith(f"-{wandb_id}") for name in attempts), attempts
    info = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({k: v for k, v in info.items() if k != "wandb_id"}))
    (run_dir / "checkpoints" / "final.ckpt").unlink()
    (run_dir / "status.json").write_text(json.dumps({"status": "interrupted", "step": 4, "error": None}))
    with pytest.raises(RunError, match="has no wandb_id .* start the run again in a new directory"):
        train(cfg, run_dir)
    # The next run in this process (a sweep's next job under Hydra's basic or joblib launcher) gets its own wandb run.
    other = train(cfg, tmp_path / "other")
    other_id = json.loads((other / "run.json").read_text())["wandb_id"]
    assert other_id != wandb_id and [p.name[-8:] for p in (other / "wandb").glob("offline-run-*")] == [other_id]


def test_resume_refuses_a_different_config_damaged_run_files_and_foreign_checkpoints_in_one_line(tmp_path, small_cfg):
    """A run file that a lost disk write left empty or cut short, a deleted metrics.csv, or another run's checkpoint
    stops resume=auto in one line naming it and the fix, before anything is written; each file stays as found."""
    cfg = small_cfg("train.max_steps=2", "train.checkpoint_every=1", "train.keep_checkpoints=2", "resume=auto")
    run_dir = train(cfg, tmp_path / "run")
    with pytest.raises(ConfigError, match="was started with a different config"):
        train(small_cfg("train.max_steps=2", "train.checkpoint_every=1", "train.keep_checkpoints=2", "resume=auto",
                        "xsa.alpha=0.5"), run_dir)
    (run_dir / "checkpoints" / "final.ckpt").unlink()  # as if preempted after its last periodic checkpoint
    (run_dir / "status.json").write_text(json.dumps({"status": "interrupted", "step": 2, "error": None}))
    for name, damage, message in [
        ("status.json", "", r"is damaged \(JSONDecodeError: Expecting value: .*\); delete it, and resume=auto "
                            r"continues from the newest checkpoint as after a kill$"),
        ("run.json", '{"seed": 0, "prec', r"is damaged \(JSONDecodeError: Unterminated string .*\); it "
                                          r"records the run \(its precision, counts, wandb id\): restore it from a "
                                          r"copy, or train the run again in a new hydra.run.dir$"),
        ("config.yaml", "model:\n  n_embd: [64", r"is damaged \(ParserError: .*\); resume=auto checks "
                                                  r"the command against it: restore it from a copy, or train the run "
                                                  r"again in a new hydra.run.dir$"),
        ("metrics.csv", None, r"is missing, so the run's rows up to step000002.ckpt cannot be kept; "
                              r"restore it from a copy, or train the run again in a new hydra.run.dir$"),
    ]:
        path, saved = run_dir / name, (run_dir / name).read_bytes()
        path.unlink() if damage is None else path.write_text(damage)
        found = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "run.lock"}
        with pytest.raises(RunError, match=f"^{re.escape(str(path))} {message}"):
            train(cfg, run_dir)
        assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "run.lock"} == found
        path.write_bytes(saved)
    # A checkpoint copied in from another run, of another size, or one that xsa-exp did not write, where resume=auto
    # would take it as the newest: Lightning's load_state_dict would fail with a traceback, or resume from it.
    other = train(small_cfg("train.max_steps=1", "model.n_embd=32"), tmp_path / "other")
    foreign = run_dir / "checkpoints" / "step000003.ckpt"
    for copy, origin in [(lambda: shutil.copy(other / "checkpoints" / "final.ckpt", foreign),
                          r"was saved by a different run \(sections model, train differ from config.yaml\)"),
                         (lambda: torch.save({"state_dict": {}}, foreign),
                          r"was not written by xsa-exp \(it records no run config\)")]:
        copy()
        found = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "run.lock"}
        with pytest.raises(RunError, match=f"^checkpoint {re.escape(str(foreign))} {origin}, so the run cannot resume "
                                           f"from it; move it out of {re.escape(str(foreign.parent))} and "
                                           "resume=auto continues from the run's own checkpoints$"):
            train(cfg, run_dir)
        assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "run.lock"} == found
    foreign.unlink()
    (run_dir / "status.json").unlink()  # the fix the first line names
    train(cfg, run_dir)
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    assert train(cfg, run_dir) == run_dir  # complete: left alone ...
    final = run_dir / "checkpoints" / "final.ckpt"
    final.write_bytes(final.read_bytes()[:4000])  # ... unless the checkpoint its results come from is damaged
    with pytest.raises(RunError, match=rf"^run {re.escape(str(run_dir))} is complete, but its final.ckpt does not "
                                       r"load \(RuntimeError\); restore it from a copy, or train the run again in a "
                                       "new hydra.run.dir$"):
        train(cfg, run_dir)


def test_every_preemption_signal_gets_the_same_handler_for_the_run_and_the_old_one_back():
    from types import SimpleNamespace

    from xsa_exp.training.preemption import PreemptionCheckpoint

    signums = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    before = {s: signal.getsignal(s) for s in signums}
    callback = PreemptionCheckpoint("unused", None, None, 0)
    trainer = SimpleNamespace(global_step=0, fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace()))
    callback.on_train_start(trainer, None)
    assert all(signal.getsignal(s) == callback._request for s in signums)
    callback.hand_over()  # not stopped: nothing to hand over
    assert all(signal.getsignal(s) == callback._request for s in signums)
    callback.teardown(trainer, None, "fit")  # however the run ended
    assert {s: signal.getsignal(s) for s in signums} == before


def test_a_signal_to_a_sweep_in_one_process_stops_it_after_the_job_it_interrupts(tmp_path):
    """Under Hydra's basic launcher the jobs run one after another in the signalled process: the job under way (the
    second; the first finished and gave the handlers back) saves its checkpoint, then the process exits with status 0
    instead of starting the third, which a time limit's SIGKILL would cut short."""
    sweep = tmp_path / "sweep"
    process = subprocess.Popen([sys.executable, "train.py", "-m", f"hydra.sweep.dir={sweep}", *SMALL, *STEPS,
                                "seed=1,2,3"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = 0
    for line in process.stdout:
        seen += "step      2/9 | loss" in line
        if seen == 2:  # the second job's update 2
            process.send_signal(signal.SIGTERM)
            break
    output = process.stdout.read()
    assert process.wait(timeout=300) == 0, output[-3000:]
    assert f"then stopping; continue with resume=auto hydra.sweep.dir={sweep}\n" in output  # what a relaunch needs
    assert [json.loads((sweep / job / "status.json").read_text())["status"] for job in ("0", "1")] == [
        "completed", "interrupted"]
    assert not (sweep / "2").exists()


# SIGUSR1 and SIGUSR2 have the same handler (test above). With a periodic checkpoint at every step, the signal's
# step is one the periodic checkpoint saves: it must be written once, not again as a -v1 copy.
@pytest.mark.parametrize("signum,checkpoint_every", [(signal.SIGTERM, 0), (signal.SIGTERM, 1)])
def test_preemption_signal_saves_at_the_next_update_and_exits_cleanly(tmp_path, tmp_path_factory, small_cfg, signum,
                                                                      checkpoint_every):
    uninterrupted = reference(tmp_path_factory, small_cfg)
    run_dir = tmp_path / "preempted"
    args = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", "resume=auto", *SMALL, *STEPS,
            f"train.checkpoint_every={checkpoint_every}"]
    process = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:  # signal as soon as step 2 has been logged
        if "step      2/9 | loss" in line:
            process.send_signal(signum)
            break
    assert f"then stopping; continue with resume=auto hydra.run.dir={run_dir}\n" in process.stdout.read()
    assert process.wait(timeout=300) == 0
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "interrupted" and 2 <= status["step"] < 9
    assert (run_dir / "checkpoints" / f"step{status['step']:06d}.ckpt").is_file()
    assert not list((run_dir / "checkpoints").glob("*-v*.ckpt"))
    assert load_trained(run_dir).step == status["step"]  # an interrupted run's checkpoint evaluates: its tokenizer
    resumed = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    kept = ["final.ckpt"] + (["step000008.ckpt", "step000009.ckpt"] if checkpoint_every else [])  # not the signal's
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == kept
    assert rows(run_dir) == rows(uninterrupted)
    ours, theirs = final_weights(run_dir), final_weights(uninterrupted)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_a_folder_holding_checkpoints_but_no_config_is_refused_not_overwritten(tmp_path, small_cfg):
    """Not this project's partial start (config.yaml comes before any checkpoint): nothing to resume or check."""
    checkpoint = tmp_path / "run" / "checkpoints" / "final.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"someone's weights")
    for resume in ("never", "auto"):
        with pytest.raises(ConfigError, match=r"holds checkpoints \(final.ckpt\) but no config.yaml.*nothing was "
                                              r"overwritten — choose a new hydra.run.dir"):
            train(small_cfg(f"resume={resume}"), tmp_path / "run")
    assert checkpoint.read_bytes() == b"someone's weights"


def test_unwritable_run_directory_is_one_clear_error(tmp_path, small_cfg):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="is not writable"):
        train(small_cfg(), blocker / "run")


def test_disk_full_while_checkpointing_keeps_the_good_checkpoints(tmp_path, small_cfg, monkeypatch):
    """A checkpoint is written beside its final name (not in the system's temporary folder, a small node-local
    disk on many clusters) and renamed into place: a full disk mid-write leaves the earlier ones and no part."""
    import errno
    import tempfile

    real_save = torch.save

    def full_disk(obj, file, *args, **kwargs):  # the checkpoint's file, opened beside its final name
        if "step000004" in file.name:
            file.write(b"half a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    run_dir = tmp_path / "run"
    with pytest.raises(WriteFailed, match="no space left on .* while writing .*step000004.ckpt; the newest complete "
                       "checkpoint is .*step000002.ckpt; free space and relaunch with resume=auto"):
        train(small_cfg("train.max_steps=6", "train.checkpoint_every=2"), run_dir)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step000002.ckpt"]
    assert not list(system_tmp.iterdir())  # nothing staged there
    assert torch.load(run_dir / "checkpoints" / "step000002.ckpt", weights_only=False)["global_step"] == 2
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
