"""xsa_exp.run_dir: the newest-checkpoint rule, the status and run.json writers, metrics.csv, eval folders."""

from __future__ import annotations

import os
import struct
import warnings
import zipfile

import pytest
import torch

from tests.small_disk import limited_writes, used
from xsa_exp import run_dir as rd
from xsa_exp.arm import Arm
from xsa_exp.training.metrics_log import MetricsWriter


def save(path, step):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step}, path)


def test_newest_checkpoint_is_final_then_the_highest_step_by_number(tmp_path):
    assert rd.newest_checkpoint(tmp_path) is None
    for step in (999_999, 1_000_000, 5):  # by name, step999999 would sort after step1000000
        save(rd.step_checkpoint(tmp_path, step), step)
    (rd.checkpoints_dir(tmp_path) / "other.ckpt").write_bytes(b"not a run's checkpoint")
    assert rd.newest_checkpoint(tmp_path).name == "step1000000.ckpt"
    save(rd.final_checkpoint(tmp_path), 1_000_001)
    assert rd.newest_checkpoint(tmp_path) == rd.final_checkpoint(tmp_path)
    assert [rd.checkpoint_step(p) for p in rd.checkpoints_newest_first(tmp_path)] == [None, 1_000_000, 999_999, 5]


def test_unreadable_newest_checkpoint_falls_back_with_a_warning(tmp_path):
    save(rd.step_checkpoint(tmp_path, 2), 2)
    rd.step_checkpoint(tmp_path, 4).write_bytes(b"cut short")
    with pytest.warns(UserWarning, match=r"step000004.ckpt \(RuntimeError\) is unreadable; falling back to "
                                         r"step000002.ckpt$"):
        assert rd.newest_checkpoint(tmp_path) == rd.step_checkpoint(tmp_path, 2)
    with pytest.warns(UserWarning):
        assert rd.find_checkpoint(tmp_path) == rd.step_checkpoint(tmp_path, 2)
    save(rd.step_checkpoint(tmp_path, 1), 1)
    rd.step_checkpoint(tmp_path, 2).write_bytes(b"")
    with pytest.warns(UserWarning, match=r"step000004.ckpt \(RuntimeError\) and .*step000002.ckpt \(\w+\) are "
                                         r"unreadable; falling back to step000001.ckpt$"):
        assert rd.newest_checkpoint(tmp_path) == rd.step_checkpoint(tmp_path, 1)
    rd.step_checkpoint(tmp_path, 1).write_bytes(b"")
    for look_up in (rd.find_checkpoint, rd.newest_checkpoint):  # loading a run, and resuming it
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback to name: none loads
            with pytest.raises(rd.RunError, match=r"has no checkpoint that loads \(step000004.ckpt, step000002.ckpt, "
                                                  r"step000001.ckpt: truncated, corrupt or unreadable\); restore"):
                look_up(tmp_path)
    for path in rd.checkpoints_newest_first(tmp_path):
        path.unlink()
    with pytest.raises(rd.RunError, match=r"has no checkpoints/\*.ckpt; was the run finished\?"):
        rd.find_checkpoint(tmp_path)
    save(rd.final_checkpoint(tmp_path), 9)
    (tmp_path / rd.CONFIG).write_text("seed: 1\n")
    with pytest.raises(rd.RunError, match=rf"checkpoints is a run's checkpoints folder; give the run directory "
                                          rf"{tmp_path}, or one checkpoint in it$"):
        rd.find_checkpoint(rd.checkpoints_dir(tmp_path))
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "multirun.yaml").write_text("hydra: {}\n")
    with pytest.raises(rd.RunError, match=r"sweep is a sweep's folder \(multirun.yaml\); give one of its runs' "
                                          r"directories, e.g. .*sweep/0$"):
        rd.find_checkpoint(tmp_path / "sweep")


def test_our_warnings_print_as_one_line_and_the_libraries_keep_their_form(tmp_path, monkeypatch):
    """Python prints a warning as the message and then the source line that raised it; ours are one line."""
    from xsa_exp.console import set_up_console

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # restored after the test
    set_up_console()
    set_up_console()  # once more, as a sweep's next job does: still one formatter, not one wrapping itself
    save(rd.step_checkpoint(tmp_path, 2), 2)
    rd.step_checkpoint(tmp_path, 4).write_bytes(b"cut short")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rd.newest_checkpoint(tmp_path)
        warnings.warn_explicit("a library's warning", UserWarning, torch.__file__, 1)
    ours, library = (warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught)
    assert ours == (f"warning: checkpoint {rd.step_checkpoint(tmp_path, 4)} (RuntimeError) is unreadable; falling "
                    "back to step000002.ckpt\n")
    assert library.startswith(f"{torch.__file__}:1: UserWarning: a library's warning\n")


def flip_a_weight_bit(path):
    """One bit of a tensor's bytes flipped, the zip around it intact: what a failing disk does."""
    with zipfile.ZipFile(path) as archive:
        record = next(info for info in archive.infolist() if "/data/" in info.filename)
    with open(path, "r+b") as f:
        f.seek(record.header_offset + 26)  # the local header: the name's and the extra field's lengths, then the bytes
        name_length, extra_length = struct.unpack("<HH", f.read(4))
        f.seek(record.header_offset + 30 + name_length + extra_length)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 1]))


def test_a_checkpoint_whose_bytes_fail_their_crc_is_skipped_and_refused(tmp_path):
    """torch.load reads such a checkpoint without a word; resuming skips it, loading it for evaluation stops."""
    good, flipped = rd.step_checkpoint(tmp_path, 2), rd.step_checkpoint(tmp_path, 4)
    for path in (good, flipped):
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"global_step": 2, "w": torch.arange(1000.0)}, path)
    flip_a_weight_bit(flipped)
    assert not torch.equal(torch.load(flipped)["w"], torch.arange(1000.0))  # it loads, wrong
    with pytest.warns(UserWarning, match=r"step000004.ckpt \(BadZipFile\) is unreadable; falling back to "
                                         r"step000002.ckpt$"):
        assert rd.newest_checkpoint(tmp_path) == good
    with pytest.raises(rd.RunError, match=r"step000004.ckpt is truncated, corrupt or unreadable \(BadZipFile: "
                                          r"step000004/data/0 does not match its CRC\); use another checkpoint"):
        rd.load_trained(flipped)


def test_the_precision_a_run_trained_in_comes_from_run_json_or_is_asked_for(tmp_path):
    assert rd.trained_precision(tmp_path) == "32-true"  # a run from before run.json recorded it
    (tmp_path / rd.RUN).write_text('{"seed": 1}')  # valid JSON without it: edited by hand
    with pytest.raises(rd.RunError, match=r"run.json records no precision; give the evaluation's with "
                                          r"eval.precision=...$"):
        rd.trained_precision(tmp_path)
    (tmp_path / rd.RUN).write_text('{"precis')  # a lost write
    with pytest.raises(rd.RunError, match=r"run.json is damaged \(JSONDecodeError: .*\); it records the precision the "
                                          r"run trained in: restore it from a copy, or give the evaluation's with "
                                          r"eval.precision=...$"):
        rd.trained_precision(tmp_path)
    (tmp_path / rd.RUN).write_text('{"precision": "bf16-mixed"}')
    assert rd.trained_precision(tmp_path) == "bf16-mixed"


def test_status_and_run_info_round_trip(tmp_path):
    assert rd.read_status(tmp_path) == {}
    rd.write_status(tmp_path, "failed", 7, "FloatingPointError: x")
    assert rd.read_status(tmp_path) == {"status": "failed", "step": 7, "error": "FloatingPointError: x"}
    with pytest.raises(ValueError):
        rd.write_status(tmp_path, "done", 7)
    arm = Arm.run_keys(stage="base", depth="d2", alpha=1.0, learnable=False, layers="all", value_source="mixed",
                       optim="muon", lr_scale=1.0, seed=3)
    info = rd.run_info(run_dir=tmp_path, max_steps=10, tokens_per_step=512, grad_accumulation=1, precision="32-true",
                       precision_reason="test", ns_dtype="float32", ns_dtype_reason="test",
                       float32_matmul_precision="highest", xsa_layers=[0, 1],
                       param_counts={"total": 5}, flops_per_token=600, arm=arm,
                       nanochat_transfer=None)
    rd.write_run_files(tmp_path, "seed: 3\n", info)
    rd.update_run_info(tmp_path, val_scope={"whole": True})
    assert rd.read_run_info(tmp_path) == {**info, "val_scope": {"whole": True}}
    assert rd.trained_precision(tmp_path) == "32-true" and rd.trained_precision(tmp_path / "none") == "32-true"
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind by the atomic writes


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_files_written_whole_get_the_permissions_open_gives_and_are_synced(tmp_path, umask, monkeypatch):
    """Readable by the group under the usual umask on a shared cluster, as the checkpoints beside them are; and on
    disk before the rename, so a node that crashes leaves the old file or the new one, not an empty one."""
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
    old = os.umask(umask)
    try:
        rd.write_status(tmp_path, "completed", 3)
        (tmp_path / "checkpoint").write_bytes(b"")  # as open() makes the checkpoints
    finally:
        os.umask(old)
    assert [os.stat(tmp_path / name).st_mode & 0o777 for name in ("status.json", "checkpoint")] == [0o666 & ~umask] * 2
    assert len(synced) == 1 and synced[0].startswith(f"{tmp_path}/.status.json-")


def test_a_metrics_row_cut_short_by_a_full_disk_is_left_out(tmp_path):
    """Its step may be cut short too ("1" of "12"), which would keep it among the rows a resume keeps."""
    (tmp_path / rd.METRICS).write_text("step,train/loss\r\n1,5.0\r\n2,4.5\r\n1")
    assert rd.read_metric_rows(tmp_path, up_to_step=2) == [{"step": "1", "train/loss": "5.0"},
                                                           {"step": "2", "train/loss": "4.5"}]


def test_metrics_csv_is_replaced_whole_so_a_failed_rewrite_keeps_every_row(tmp_path):
    """A new column rewrites metrics.csv, and a resume cuts it to its checkpoint's step: a full disk (or a kill) in
    either leaves the file as it was, where Lightning's writer deleted or truncated it first and lost the run's log."""
    path = tmp_path / rd.METRICS
    writer = MetricsWriter(path)
    for step in range(3):
        writer.log_metrics({"train/loss": torch.tensor(5.0 - step)}, step)
    writer.save()
    writer.log_metrics({"train/loss": 2.0}, 3)
    writer.save()  # appended
    before = path.read_bytes()
    assert before == b"step,train/loss\r\n0,5.0\r\n1,4.0\r\n2,3.0\r\n3,2.0\r\n"  # Lightning's layout
    writer.log_metrics({"val/bpb": 1.5}, 3)  # a new column
    with pytest.raises(OSError, match="No space left"), limited_writes(tmp_path, used(tmp_path)):
        writer.save()
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [rd.METRICS]
    with pytest.raises(OSError, match="No space left"), limited_writes(tmp_path, used(tmp_path)):
        rd.keep_metric_rows(tmp_path, step=1)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [rd.METRICS]
    writer.save()  # space again: the held row, under its new header
    rd.keep_metric_rows(tmp_path, step=1)
    assert path.read_bytes() == b"step,train/loss,val/bpb\r\n0,5.0,\r\n1,4.0,\r\n"


def test_eval_folders_never_reuse_one_and_are_read_oldest_first(tmp_path):
    first = rd.new_eval_dir(tmp_path, "checkpoints/final.ckpt", 10, "20260101-120000")
    again = rd.new_eval_dir(tmp_path, "checkpoints/final.ckpt", 10, "20260101-120000")
    earlier = rd.new_eval_dir(tmp_path, "step000005.ckpt", 5, "20260102-000000")
    assert first.name == "final-step10-20260101-120000" and again.name == first.name + "-2"
    for folder, step in ((first, 10), (again, 10), (earlier, 5)):
        rd.write_summary(folder, rd.eval_summary(run=tmp_path, checkpoint=folder.name, step=step, metrics={"x": 1.0}))
    (rd.new_eval_dir(tmp_path, "final.ckpt", 10) / rd.SUMMARY).write_text("{cut")
    for edited in ('{"metrics": {"x": 1.0}}', '{"step": 10}', "[10]"):  # valid JSON, not a summary
        (rd.new_eval_dir(tmp_path, "final.ckpt", 10) / rd.SUMMARY).write_text(edited)
    staging = tmp_path / rd.EVAL / ".writing-x"  # a killed evaluate.py's, before its rename
    staging.mkdir()
    rd.write_summary(staging, rd.eval_summary(run=tmp_path, checkpoint="final.ckpt", step=10, metrics={"x": 2.0}))
    assert [f for f, _ in rd.evaluations(tmp_path)] == [earlier, first, again]
    written = rd.write_evaluation(tmp_path, "checkpoints/final.ckpt", 12, {rd.CORE_TASKS: [{"task": "a", "acc": 0.5}]},
                                  rd.eval_summary(run=tmp_path, checkpoint="final.ckpt", step=12, metrics={"x": 3.0}))
    assert sorted(p.name for p in written.iterdir()) == [rd.CORE_TASKS, rd.SUMMARY]
    umask = os.umask(0)
    os.umask(umask)
    assert written.stat().st_mode & 0o777 == 0o777 & ~umask  # as any folder the user makes: others may read it
    assert [f for f, _ in rd.evaluations(tmp_path)] == [earlier, first, again, written]
