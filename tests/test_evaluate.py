"""evaluate.py end to end on a short trained run."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, SMALL, compose_config
from xsa_exp.errors import UserError
from xsa_exp.evaluate_run import evaluate
from xsa_exp.run_dir import RunError, load_trained
from xsa_exp.training.run import train

pytestmark = pytest.mark.slow
BUNDLE = Path(os.environ.get("XSA_EXP_EVAL_BUNDLE", REPO.parent / "shared" / "eval_bundle"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train(compose_config(*SMALL, "train.max_steps=4", "eval.every=2"), tmp_path_factory.mktemp("ev") / "run")


def eval_cfg(run, *overrides):
    from hydra import compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="evaluate", overrides=[f"run={run}", *overrides])


def last_val_bpb(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return [float(r["val/bpb"]) for r in csv.DictReader(f) if r["val/bpb"]][-1]


def test_bpb_equals_the_training_log_for_the_same_checkpoint(run_dir):
    out = evaluate(eval_cfg(run_dir, "eval.metrics=[bpb]"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 4
    assert summary["metrics"]["val/bpb"] == pytest.approx(last_val_bpb(run_dir), rel=1e-9)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-compute"])
def test_full_split_bpb_equals_the_training_log_in_the_run_precision(tmp_path, precision):
    fused = precision == "bf16-compute"  # as the GPU presets run it, through the fused loss head
    trained = train(compose_config(*SMALL, "eval.val_tokens=null", "train.max_steps=2", "eval.every=2",
                                   f"trainer.precision={precision}", f"model.fused_loss_head={fused}"),
                    tmp_path / "run")
    summary = json.loads((evaluate(eval_cfg(trained, "eval.metrics=[bpb]", "eval.val_tokens=100000000")) /
                          "summary.json").read_text())
    assert summary["precision"] == precision and summary["val_scope"]["whole"]
    assert summary["metrics"]["val/bpb"] == last_val_bpb(trained)  # exactly: same rows, batches and autocast
    if precision != "32-true":  # evaluating it in fp32 is a different measurement
        fp32 = json.loads((evaluate(eval_cfg(trained, "eval.metrics=[bpb]", "eval.precision=32-true")) /
                           "summary.json").read_text())
        assert fp32["precision"] == "32-true" and fp32["metrics"]["val/bpb"] != last_val_bpb(trained)


def test_diagnostics_per_layer_and_head(run_dir):
    out = evaluate(eval_cfg(run_dir, "eval.metrics=[diagnostics]"))
    with open(out / "diagnostics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["layer"], r["head"]) for r in rows] == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert all(abs(float(r["out_self_cos"])) < 1e-4 for r in rows)  # alpha = 1 in every layer


@pytest.mark.skipif(not (BUNDLE / "core.yaml").is_file(),
                    reason=f"eval bundle not found at {BUNDLE}; CORE tests need ../shared/eval_bundle")
def test_core_on_the_real_bundle_writes_per_task_and_per_example_results(run_dir):
    out = evaluate(eval_cfg(run_dir, "eval.metrics=[core]", f"eval.bundle_dir={BUNDLE}", "eval.core_max_per_task=2"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["core"]["name"] == "CORE 18/22" and "CORE 18/22" in summary["metrics"]
    with open(out / "core_tasks.csv") as f:
        assert len(list(csv.DictReader(f))) == 18
    examples = [json.loads(line) for line in (out / "core_examples.jsonl").read_text().splitlines()]
    assert len(examples) == 36 and {"task", "index", "correct", "losses"} <= set(examples[0])


@pytest.mark.skipif(not (BUNDLE / "core.yaml").is_file(),
                    reason=f"eval bundle not found at {BUNDLE}; CORE tests need ../shared/eval_bundle")
def test_core_and_chatcore_run_in_the_evaluation_precision(run_dir, monkeypatch):
    """summary.json's precision is the one every metric was computed in, CORE and ChatCORE included."""
    from xsa_exp import evaluate_run

    class Called(Exception):
        pass

    seen = {}

    def recording(metric):
        def evaluate_metric(*args, **kwargs):
            seen[metric] = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
            raise Called
        return evaluate_metric

    for metric, function in (("core", "evaluate_core"), ("chatcore", "evaluate_chat")):
        monkeypatch.setattr(evaluate_run, function, recording(metric))
        with pytest.raises(Called):
            evaluate(eval_cfg(run_dir, f"eval.metrics=[{metric}]", "eval.precision=bf16-mixed",
                              f"eval.bundle_dir={BUNDLE}"))
    assert seen == {"core": torch.bfloat16, "chatcore": torch.bfloat16}


@pytest.mark.skipif(not (BUNDLE / "core.yaml").is_file(),
                    reason=f"eval bundle not found at {BUNDLE}; CORE tests need ../shared/eval_bundle")
def test_core_in_training_and_in_evaluate_py_scores_prompts_past_the_training_length_whole(tmp_path):
    """CORE's few-shot prompts pass the small runs' 64-token training length. nanochat scores them whole (its model
    takes 10x its training length), and so do training's scheduled CORE and evaluate.py, to the same number."""
    from xsa_exp.model import GPT

    widths = []
    record = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: widths.append(args[0].size(1)) if isinstance(module, GPT) else None)
    try:
        trained = train(compose_config(*SMALL, "train.max_steps=2", "eval.every=2", "eval.core_every=2",
                                       "eval.core_max_per_task=1", f"eval.bundle_dir={BUNDLE}"), tmp_path / "run")
        training_widths, widths[:] = widths[:], []
        out = evaluate(eval_cfg(trained, "eval.metrics=[core]", f"eval.bundle_dir={BUNDLE}",
                                "eval.core_max_per_task=1"))
    finally:
        record.remove()
    assert 64 < max(training_widths) <= 640 and 64 < max(widths) <= 640
    with open(trained / "metrics.csv") as f:
        logged = [(r["step"], float(r["core/CORE_18of22"])) for r in csv.DictReader(f) if r.get("core/CORE_18of22")]
    assert [step for step, _ in logged] == ["0", "2"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["CORE 18/22"] == pytest.approx(logged[-1][1], abs=1e-9)


def test_results_never_overwrite_earlier_ones(run_dir):
    first = evaluate(eval_cfg(run_dir, "eval.metrics=[bpb]"))
    before = {p: p.read_bytes() for p in first.iterdir()}
    metrics_before = (run_dir / "metrics.csv").read_bytes()
    second = evaluate(eval_cfg(run_dir, "eval.metrics=[bpb]"))
    assert second != first and {p: p.read_bytes() for p in first.iterdir()} == before
    assert (run_dir / "metrics.csv").read_bytes() == metrics_before


def test_a_full_disk_keeps_no_half_written_results_and_says_so_in_one_line(run_dir, tmp_path, capsys):
    """The results are written in a hidden folder and renamed into place: a full disk leaves no folder, and the
    numbers stay on the console."""
    from tests.small_disk import limited_writes
    from xsa_exp.write_failures import WriteFailed, mount_point

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("eval"))
    with limited_writes(run / "eval", 0), pytest.raises(WriteFailed) as e:
        evaluate(eval_cfg(run, "eval.metrics=[bpb]"))
    assert re.fullmatch(rf"no space left on {re.escape(str(mount_point(run)))} while writing "
                        rf"{re.escape(str(run / 'eval'))}/\.writing-\w+/[\w.]+; the results printed above were not "
                        r"kept; free space and evaluate again", str(e.value)), str(e.value)
    assert "val/bpb" in capsys.readouterr().out
    assert list((run / "eval").iterdir()) == []


def test_a_results_folder_that_cannot_be_written_stops_before_the_work(run_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("eval"))
    (run / "eval").write_text("")  # a file where the results folder goes
    monkeypatch.setattr("xsa_exp.evaluate_run.evaluate_bpb", lambda *args: pytest.fail("evaluated anyway"))
    with pytest.raises(RunError, match=rf"^{re.escape(str(run / 'eval'))} is a file, where evaluate.py keeps its "
                                       r"results in a folder; move it away, or evaluate a copy of the run$"):
        evaluate(eval_cfg(run, "eval.metrics=[bpb]"))
    (run / "eval").unlink()  # a folder that takes no file: full, read-only, not permitted (root writes anyway)
    monkeypatch.setattr("tempfile.TemporaryFile", lambda **kw: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(RunError, match=rf"^cannot write into {re.escape(str(run / 'eval'))} \(No space left\), where "
                                       r"evaluate.py keeps its results; make it writable or free space there, or "
                                       r"evaluate a copy of the run$"):
        evaluate(eval_cfg(run, "eval.metrics=[bpb]"))


def test_missing_bundle_is_one_clear_error(run_dir, tmp_path):
    with pytest.raises(UserError, match="CORE needs the eval bundle, not found at"):
        evaluate(eval_cfg(run_dir, "eval.metrics=[core]", f"eval.bundle_dir={tmp_path / 'absent'}"))


def test_truncated_and_mismatched_checkpoints(run_dir, tmp_path):
    good = run_dir / "checkpoints" / "final.ckpt"
    with pytest.raises(RunError, match="no such run directory or checkpoint"):
        load_trained(tmp_path / "nothing")
    truncated = tmp_path / "run" / "checkpoints" / "cut.ckpt"
    truncated.parent.mkdir(parents=True)
    truncated.write_bytes(good.read_bytes()[:5000])
    with pytest.raises(RunError, match="is truncated, corrupt or unreadable"):
        load_trained(truncated)
    ckpt = torch.load(good, weights_only=False)
    ckpt["xsa_exp"]["config"]["model"]["n_layer"] = 3
    mismatched = tmp_path / "run" / "checkpoints" / "other.ckpt"
    torch.save(ckpt, mismatched)
    with pytest.raises(RunError, match="does not match its config"):
        load_trained(mismatched)
    ckpt["xsa_exp"]["config"]["model"]["future_key"] = 1  # a key of another version of xsa-exp
    torch.save(ckpt, mismatched)
    with pytest.raises(RunError, match=r"^checkpoint .*other.ckpt holds a config this version of xsa-exp cannot read "
                                       r"\(ConfigKeyError: Key 'future_key' not in 'ModelConfig'\); use the version "
                                       "that trained it$"):
        load_trained(mismatched)
    for meta in (5, {"skipped_steps": 0}):  # not a dict; no config
        torch.save({**ckpt, "xsa_exp": meta}, mismatched)
        with pytest.raises(RunError, match=r"other.ckpt is not an xsa-exp checkpoint \(no xsa_exp metadata with its "
                                           r"config, or no state_dict\)$"):
            load_trained(mismatched)
    other = tmp_path / "other"  # another run's tokenizer of another size in the run's folder
    shutil.copytree(run_dir, other, ignore=shutil.ignore_patterns("eval"))
    ckpt = torch.load(good, weights_only=False)
    ckpt["xsa_exp"]["config"]["model"]["vocab_size"] = 600  # as if the run had 600 tokens
    ckpt["state_dict"] = {k: (torch.zeros(600, *v.shape[1:]) if v.shape[:1] == (512,) else v)
                          for k, v in ckpt["state_dict"].items()}
    torch.save(ckpt, other / "checkpoints" / "final.ckpt")
    config = (run_dir / "config.yaml").read_text()
    (other / "config.yaml").write_text(config.replace("vocab_size: 512", "vocab_size: 600"))
    with pytest.raises(RunError, match=rf"^the tokenizer at {re.escape(str(other / 'tokenizer'))} has 512 tokens and "
                                       r"the run's model 600: it is not the one the run trained with"):
        load_trained(other)
    # Another run's checkpoint among the run's own: its results would go into the run's eval/ as the run's.
    (other / "config.yaml").write_text(config)
    for path in (other, other / "checkpoints" / "final.ckpt"):
        with pytest.raises(RunError, match=rf"^checkpoint {re.escape(str(other / 'checkpoints' / 'final.ckpt'))} was "
                                           rf"saved by a different run \(sections model differ from "
                                           rf"{re.escape(str(other / 'config.yaml'))}\), so its results would be "
                                           rf"filed under {re.escape(str(other))}; move it out of the run's "
                                           r"checkpoints/, or evaluate it in the run it came from$"):
            load_trained(path)


def test_a_damaged_run_json_stops_before_an_eval_folder_is_made(run_dir, tmp_path):
    """run.json records the precision the evaluation uses unless eval.precision gives one."""
    other = tmp_path / "run"
    shutil.copytree(run_dir, other, ignore=shutil.ignore_patterns("eval"))
    (other / "run.json").write_text('{"precis')
    with pytest.raises(RunError, match=r"run.json is damaged .*; it records the precision the run trained in: restore "
                                       r"it from a copy, or give the evaluation's with eval.precision=...$"):
        evaluate(eval_cfg(other, "eval.metrics=[bpb]"))
    assert not (other / "eval").exists()
    assert evaluate(eval_cfg(other, "eval.metrics=[bpb]", "eval.precision=32-true")).is_dir()


def test_evaluate_py_command(run_dir, tmp_path):
    # from a folder where nothing can be made (/proc): the results go into the run, nothing into the current folder
    ok = subprocess.run([sys.executable, REPO / "evaluate.py", f"run={run_dir}", "eval.metrics=[bpb]"], cwd="/proc",
                        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "val/bpb" in ok.stdout and "results:" in ok.stdout
    assert "(over 1,024 of " in ok.stdout  # the run's eval.val_tokens covers part of the split, and says so
    assert (ok.stdout + ok.stderr).count("data: ") == 1  # Lightning's own console handler only, not a root one too
    bad = subprocess.run([sys.executable, "evaluate.py", f"run={tmp_path / 'missing'}"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"config error: run={tmp_path / 'missing'}: no such run directory or "
                                               "checkpoint; pass a run's directory or one of its checkpoints/*.ckpt"]


def test_one_process_on_another_gpu_makes_it_the_current_device(monkeypatch):
    """evaluate.py device=cuda:1: Triton's kernels (Liger's fused loss head) launch on the current device, not the
    tensors' one, so it must be cuda:1 too."""
    from xsa_exp.evaluate_run import join_process_group

    current = []
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    assert join_process_group("cuda:1") == (0, 1, torch.device("cuda:1")) and current == [torch.device("cuda:1")]
    assert join_process_group("cpu") == (0, 1, torch.device("cpu")) and len(current) == 1
