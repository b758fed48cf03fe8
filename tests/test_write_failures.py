"""A full disk, or a file system that is gone, ends a run with one line and nothing lost: the newest complete
checkpoint stays intact and a relaunch with resume=auto ends where an uninterrupted run ends."""

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, SMALL
from tests.small_disk import limited_writes, small_disk, used
from tests.test_resume import final_weights, rows
from xsa_exp.training import metrics_log
from xsa_exp.training.run import train
from xsa_exp.write_failures import WriteFailed, failure_line, write_failure, writing

ARGS = [*SMALL, "train.max_steps=6", "train.checkpoint_every=2", "train.cpu_threads=1", "resume=auto"]


def mount_point(path: Path) -> Path:
    while not os.path.ismount(path):
        path = path.parent
    return path


def final_bpb(run_dir: Path) -> str:
    return [r["val/bpb"] for r in rows(run_dir) if r["val/bpb"]][-1]


@pytest.mark.slow
def test_a_full_disk_ends_the_run_in_one_line_and_a_relaunch_finishes_it_bit_identical(tmp_path, small_cfg):
    """On a 3 MiB disk the first checkpoint (2 MiB) fits and the second does not."""
    reference = train(small_cfg(*ARGS[len(SMALL):]), tmp_path / "reference")
    with small_disk(tmp_path / "disk", mib=3) as disk:
        run_dir = disk.folder / "run"
        failed = subprocess.run(disk.command(*ARGS, f"hydra.run.dir={run_dir}"), cwd=REPO, capture_output=True,
                                text=True, timeout=300)
        checkpoints = run_dir / "checkpoints"
        line = (f"no space left on {mount_point(run_dir)} while writing {checkpoints / 'step000004.ckpt'}; the newest "
                f"complete checkpoint is {checkpoints / 'step000002.ckpt'}; free space and relaunch with resume=auto")
        assert failed.returncode == 2, failed.stderr[-3000:]
        assert failed.stderr.splitlines()[-1] == f"error: {line}" and "Traceback" not in failed.stderr
        assert sorted(p.name for p in checkpoints.iterdir()) == ["step000002.ckpt"]  # no part of step 4's
        assert torch.load(checkpoints / "step000002.ckpt", weights_only=False)["global_step"] == 2
        assert json.loads((run_dir / "status.json").read_text()) == {"status": "failed", "step": 4, "error": line}
        assert not (run_dir / "run.lock").exists()

        disk.grow(mib=64)
        resumed = subprocess.run(disk.command(*ARGS, f"hydra.run.dir={run_dir}"), cwd=REPO, capture_output=True,
                                 text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "resuming from" in resumed.stderr + resumed.stdout
        assert final_bpb(run_dir) == final_bpb(reference)
        ours, theirs = final_weights(run_dir), final_weights(reference)
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
        assert rows(run_dir) == rows(reference)  # every row once, none lost


def test_a_run_directory_that_vanishes_ends_the_run_in_one_line(tmp_path, small_cfg, monkeypatch):
    """A lost mount (or a deleted folder): the next write names what happened, and nothing makes the folder again."""
    run_dir = tmp_path / "run"
    flush = metrics_log.TrainMetrics.flush

    def vanish_at_step_3(self, trainer, pl_module):
        flush(self, trainer, pl_module)
        if trainer.global_step == 3:
            shutil.rmtree(run_dir)

    monkeypatch.setattr(metrics_log.TrainMetrics, "flush", vanish_at_step_3)
    with pytest.raises(WriteFailed) as e:
        train(small_cfg("train.max_steps=6", "train.checkpoint_every=2"), run_dir)
    assert str(e.value) == (f"the run directory vanished from {mount_point(tmp_path)} (ENOENT: a lost mount, or it was "
                            f"deleted) while writing {run_dir}/metrics.csv; its checkpoints cannot be listed now; "
                            "restore it and relaunch with resume=auto")
    assert not run_dir.exists()


def test_a_checkpoint_of_a_run_directory_that_is_gone_is_not_written_elsewhere(tmp_path):
    """Making its parents again would put it on the file system under a lost mount, where no relaunch looks."""
    from xsa_exp.training.checkpoints import RunDirCheckpointIO

    final = tmp_path / "gone" / "checkpoints" / "final.ckpt"
    with pytest.raises(FileNotFoundError) as e:
        RunDirCheckpointIO().save_checkpoint({"global_step": 6}, final)
    assert write_failure(e.value, tmp_path / "gone").written_file == final and not (tmp_path / "gone").exists()


@pytest.mark.parametrize("code,expected", [
    (errno.ENOSPC, "no space left on {fs} while writing {file}; the newest complete checkpoint is {ckpt}; free space "
                   "and relaunch with resume=auto"),
    (errno.EDQUOT, "disk quota exceeded on {fs} (EDQUOT) while writing {file}; the newest complete checkpoint is "
                   "{ckpt}; free space or raise the quota and relaunch with resume=auto"),
    (errno.EROFS, "{fs} became read-only (EROFS; a file system is remounted read-only after an error) while writing "
                  "{file}; the newest complete checkpoint is {ckpt}; check it, remount it read-write and relaunch with "
                  "resume=auto"),
    (errno.ESTALE, "the network file system {fs} was lost (ESTALE) while writing {file}; the newest complete "
                   "checkpoint is {ckpt}; remount it and relaunch with resume=auto"),
    (errno.EIO, "an I/O error on {fs} (EIO: a failing disk or a lost network mount) while writing {file}; the newest "
                "complete checkpoint is {ckpt}; check the file system and relaunch with resume=auto")])
def test_each_cause_of_a_failed_write_is_one_line(tmp_path, code, expected):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for step in (2, 4):
        (run_dir / "checkpoints" / f"step00000{step}.ckpt").write_bytes(b"")
    (run_dir / "checkpoints" / "step000006.ckpt.partial").write_bytes(b"")  # never a complete one
    file = run_dir / "status.json"
    with pytest.raises(RuntimeError) as e, writing(file):
        try:
            raise OSError(code, os.strerror(code))
        except OSError:
            raise RuntimeError("a writer wrapping the OSError, as torch's does")
    failure = write_failure(e.value, run_dir)
    assert failure_line(failure, run_dir) == expected.format(fs=mount_point(tmp_path), file=file,
                                                             ckpt=run_dir / "checkpoints" / "step000004.ckpt")


def test_only_failed_writes_of_a_named_file_are_one_line(tmp_path):
    """A missing file is a failed write only where the run directory is gone; an unnamed OSError (not one of the run's
    writes) and other errors keep their traceback."""
    with pytest.raises(OSError) as missing, writing(tmp_path / "status.json"):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")
    assert write_failure(missing.value, tmp_path) is None  # the directory is there: a bug, not a lost mount
    assert write_failure(missing.value, tmp_path / "gone") is missing.value
    assert write_failure(OSError(errno.ENOSPC, "No space left on device"), tmp_path) is None
    with pytest.raises(OSError) as denied, writing(tmp_path / "status.json"):
        raise PermissionError(errno.EACCES, "Permission denied")
    assert write_failure(denied.value, tmp_path) is None
    with pytest.raises(OSError) as full, writing(tmp_path / "checkpoints" / "step000002.ckpt"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert failure_line(full.value, tmp_path).endswith("; there is no complete checkpoint yet (a relaunch starts "
                                                       "from step 0); free space and relaunch with resume=auto")


def test_a_full_disk_at_a_relaunch_says_free_space_and_resume_not_choose_another_directory(tmp_path):
    """Taking the lock is a relaunch's first write: a full disk there is the file system's failure, whose fix is space
    and resume=auto (the run there is kept), not another hydra.run.dir on the same disk."""
    from xsa_exp.training.sole_writer import take_lock

    checkpoint = tmp_path / "run" / "checkpoints" / "step000002.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"")
    with pytest.raises(WriteFailed) as e, limited_writes(tmp_path, used(tmp_path)):
        take_lock(tmp_path / "run")
    assert str(e.value) == (f"no space left on {mount_point(tmp_path)} while writing {tmp_path / 'run' / 'run.lock'}; "
                            f"the newest complete checkpoint is {checkpoint}; free space and relaunch with resume=auto")
    assert not (tmp_path / "run" / "run.lock").exists()
