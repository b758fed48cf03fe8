"""End-to-end training runs on the embedded corpus (small model, a few steps)."""

import csv
import json
import math
import re
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import REPO
from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
from xsa_exp.errors import ConfigError
from xsa_exp.model import GPT, GPTConfig
from xsa_exp.precision import newton_schulz_dtype
from xsa_exp.training.run import train

pytestmark = pytest.mark.slow


def read_rows(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def xsa_run(tmp_path_factory):
    from tests.conftest import SMALL, compose_config
    run_dir = tmp_path_factory.mktemp("xsa") / "run"
    return train(compose_config(*SMALL, "train.max_steps=8", "eval.every=3"), run_dir)


def test_log_has_one_train_row_per_update_and_val_rows_on_schedule(xsa_run):
    rows = read_rows(xsa_run)
    train_rows = [r for r in rows if r["train/loss"]]
    val_rows = [r for r in rows if r["val/bpb"]]
    assert [int(r["step"]) for r in train_rows] == list(range(1, 9))
    assert [int(r["step"]) for r in val_rows] == [0, 3, 6, 8]
    assert all(int(r["tokens_seen"]) == 512 * int(r["step"]) for r in rows)
    for key in ("train/lr/matrix", "train/muon_momentum", "train/grad_norm", "train/tokens_per_sec"):
        assert all(float(r[key]) > 0 for r in train_rows), key
    assert float(train_rows[1]["train/muon_momentum"]) > float(train_rows[0]["train/muon_momentum"])


def test_smoothed_loss_is_bias_corrected_ema(xsa_run):
    losses = [float(r["train/loss"]) for r in read_rows(xsa_run) if r["train/loss"]]
    smooth = [float(r["train/loss_smooth"]) for r in read_rows(xsa_run) if r["train/loss"]]
    ema = 0.0
    for n, (loss, logged) in enumerate(zip(losses, smooth), start=1):
        ema = 0.9 * ema + 0.1 * loss
        assert logged == pytest.approx(ema / (1 - 0.9**n), rel=1e-6)
    assert smooth[0] == pytest.approx(losses[0])


def test_run_directory_holds_config_checkpoint_and_tokenizer(xsa_run):
    assert (xsa_run / "config.yaml").is_file() and (xsa_run / "run.json").is_file()
    assert (xsa_run / "tokenizer" / "token_bytes.pt").is_file()
    ckpt = torch.load(xsa_run / "checkpoints" / "final.ckpt", weights_only=False)
    assert ckpt["global_step"] == 8
    assert ckpt["xsa_exp"]["config"]["xsa"]["alpha"] == 1.0
    assert "optimizer_states" in ckpt and any(k.endswith("c_q.weight") for k in ckpt["state_dict"])


def test_existing_run_directory_is_never_overwritten(xsa_run, small_cfg):
    before = (xsa_run / "metrics.csv").read_bytes()
    with pytest.raises(ConfigError, match="already holds a run"):
        train(small_cfg(), xsa_run)
    assert (xsa_run / "metrics.csv").read_bytes() == before


def test_training_lowers_the_loss(small_cfg, tmp_path):
    run_dir = train(small_cfg("train.max_steps=30", "eval.every=30", "optim.muon.momentum_warmup_steps=10"),
                    tmp_path / "run")
    rows = read_rows(run_dir)
    losses = [float(r["train/loss"]) for r in rows if r["train/loss"]]
    bpb = [float(r["val/bpb"]) for r in rows if r["val/bpb"]]
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0
    assert bpb[-1] < bpb[0] - 0.5


def test_alpha_zero_and_no_xsa_layers_give_identical_curves(small_cfg, tmp_path, monkeypatch):
    """alpha = 0 takes the standard-attention path (the op is never called) and so trains exactly as no XSA
    layers; that the op itself is the identity at alpha = 0 is test_xsa_op_executed_at_alpha_zero_...'s."""
    from xsa_exp.model import gpt

    calls = []
    real_op = gpt.exclusive_self_attention
    monkeypatch.setattr(gpt, "exclusive_self_attention", lambda *a, **k: calls.append(1) or real_op(*a, **k))
    curves = []
    for name, override in (("alpha0", "xsa.alpha=0"), ("none", "xsa.layers=none")):
        rows = read_rows(train(small_cfg(override), tmp_path / name))
        curves.append([(r["step"], r["train/loss"], r["val/bpb"]) for r in rows])
    assert calls == []
    assert curves[0] == curves[1]
    assert len(curves[0]) == 6 + 3 + 2  # 6 train rows, val at 0, 3, 6, diagnostics at 0 and 6


def test_xsa_changes_training(small_cfg, tmp_path):
    losses = []
    for name, alpha in (("a0", 0.0), ("a1", 1.0)):
        rows = read_rows(train(small_cfg(f"xsa.alpha={alpha}"), tmp_path / name))
        losses.append([r["train/loss"] for r in rows if r["train/loss"]])
    # Zero-initialised output projections hide the attention output at step 1, so the first loss is the same;
    # step 1's gradient of those projections comes from the (XSA-changed) output, so every later loss differs.
    assert len(losses[0]) == len(losses[1]) == 6
    assert losses[0][0] == losses[1][0]
    assert all(a != b for a, b in zip(losses[0][1:], losses[1][1:]))


def test_train_py_runs_as_a_command(tmp_path):
    from tests.conftest import SMALL
    run_dir = tmp_path / "cli"
    result = subprocess.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", *SMALL, "train.max_steps=2",
                             "eval.every=1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stderr + result.stdout
    assert "val/bpb" in output
    assert [r["step"] for r in read_rows(run_dir) if r["train/loss"] or r["val/bpb"]] == ["0", "1", "1", "2", "2"]
    info = json.loads((run_dir / "run.json").read_text())
    split = info["val_scope"]["split_tokens"]
    assert f"(over 1,024 of {split:,} tokens)" in output  # SMALL evaluates eval.val_tokens=1024 of the split
    rows = int(re.search(r"data: [\d,]+ train tokens \(([\d,]+) rows\)", output).group(1).replace(",", ""))
    assert info["epoch_tokens"] == rows * 64  # one pass over the training rows, in tokens (sequence_len 64)
    assert "precision 32-true (auto: " in output  # which precision auto picked, and why
    assert (info["ns_dtype"], info["ns_dtype_reason"]) == newton_schulz_dtype("auto", cuda=False)
    assert f"(Newton-Schulz in {info['ns_dtype']}, {info['ns_dtype_reason']})" in output


def test_xsa_op_executed_at_alpha_zero_matches_standard_attention(small_cfg, tmp_path, monkeypatch):
    """The correctness run: the XSA code path run with alpha = 0 vs standard attention, same seed."""
    from xsa_exp.model import gpt

    standard = read_rows(train(small_cfg("xsa.layers=none"), tmp_path / "standard"))
    original_init = gpt.CausalSelfAttention.__init__

    def forced(self, config, layer_idx):
        original_init(self, config, layer_idx)
        self.xsa_on = True  # run the op even though alpha = 0 would skip it

    monkeypatch.setattr(gpt.CausalSelfAttention, "__init__", forced)
    calls = []
    real_op = gpt.exclusive_self_attention
    monkeypatch.setattr(gpt, "exclusive_self_attention", lambda *a, **k: calls.append(1) or real_op(*a, **k))
    xsa_path = read_rows(train(small_cfg("xsa.alpha=0"), tmp_path / "xsa0"))
    assert calls
    keys = ("step", "train/loss", "val/bpb")
    assert [[r[k] for k in keys] for r in standard] == [[r[k] for k in keys] for r in xsa_path]


def test_alpha_one_run_logs_out_self_cos_near_zero(xsa_run):
    rows = [r for r in read_rows(xsa_run) if r.get("diag/out_self_cos")]
    assert [int(r["step"]) for r in rows] == [0, 8]
    for r in rows:
        assert abs(float(r["diag/out_self_cos"])) < 1e-4
        assert all(abs(float(r[f"diag/out_self_cos/L{i}"])) < 1e-4 for i in range(2))
    assert abs(float(rows[-1]["diag/attn_self_cos"])) > 0.05
    lines = (xsa_run / "diagnostics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and len(json.loads(lines[0])["diag_attn"]) == 2


def poison_training_micro_batches(monkeypatch, poisoned_calls: set[int]) -> list:
    """Make the training forward return NaN on the given micro-batches (1-based; 2 per step here)."""
    from xsa_exp.model import gpt

    real_forward = gpt.GPT.forward
    calls = []

    def poisoned(self, idx, targets=None, **kw):
        out = real_forward(self, idx, targets, **kw)
        if self.training:
            calls.append(1)
        return out * float("nan") if self.training and len(calls) in poisoned_calls else out

    monkeypatch.setattr(gpt.GPT, "forward", poisoned)
    return calls


def test_non_finite_loss_stops_the_run_naming_the_step(small_cfg, tmp_path, monkeypatch):
    poison_training_micro_batches(monkeypatch, {5})  # the first micro-batch of step 3
    with pytest.raises(FloatingPointError, match="non-finite loss at step 3"):
        train(small_cfg(), tmp_path / "run")
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["status"] == "failed" and status["step"] == 3 and "non-finite loss" in status["error"]


def test_a_non_finite_update_never_reaches_the_weights_and_is_reported_at_the_next_host_sync(small_cfg, tmp_path,
                                                                                         monkeypatch):
    """The skip is decided on the device: step 3's update is a no-op, steps 4 and 5 train on, and the run stops at
    step 5, its first host-sync step (console line), naming step 3, with finite weights."""
    from xsa_exp.training.module import LanguageModel

    seen = {}
    real_pop = LanguageModel.pop_update_stats

    def pop(self):
        seen.setdefault("weights", {})[self.trainer.global_step] = [p.detach().clone() for p in self.parameters()]
        return real_pop(self)

    monkeypatch.setattr(LanguageModel, "pop_update_stats", pop)
    poison_training_micro_batches(monkeypatch, {5})  # step 3
    with pytest.raises(FloatingPointError, match="non-finite loss at step 3"):
        train(small_cfg("log.print_every=5", "eval.every=0", "eval.diag_every=0"), tmp_path / "run")
    assert sorted(seen["weights"]) == [5]
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["status"] == "failed" and status["step"] == 5
    assert all(torch.isfinite(w).all() for w in seen["weights"][5])


def test_non_finite_steps_can_be_skipped_up_to_a_limit(small_cfg, tmp_path, monkeypatch):
    calls = poison_training_micro_batches(monkeypatch, {3, 7})  # steps 2 and 4
    with pytest.warns(UserWarning, match="non-finite loss at step 2: update skipped"):
        with pytest.raises(FloatingPointError, match="non-finite loss at step 4"):
            train(small_cfg("train.skip_nonfinite_steps=1"), tmp_path / "one")
    calls.clear()
    with pytest.warns(UserWarning) as warned:
        run_dir = train(small_cfg("train.skip_nonfinite_steps=2"), tmp_path / "two")
    assert [str(w.message) for w in warned if "non-finite" in str(w.message)] == [
        "non-finite loss at step 2: update skipped (1 of train.skip_nonfinite_steps=2)",
        "non-finite loss at step 4: update skipped (2 of train.skip_nonfinite_steps=2)"]
    rows = [r for r in read_rows(run_dir) if r["train/loss"]]
    assert [r["step"] for r in rows] == ["1", "2", "3", "4", "5", "6"]
    assert rows[1]["train/loss"] == "nan" and rows[1]["train/loss_smooth"] == rows[0]["train/loss_smooth"]
    assert float(rows[-1]["train/skipped_steps"]) == 2 and all(r["train/loss_smooth"] != "nan" for r in rows)


@pytest.mark.parametrize("switches", [["trainer.precision=bf16-mixed"],
                                      ["trainer.precision=bf16-compute", "model.fused_loss_head=true"]])
def test_bf16_on_cpu_lowers_the_loss_and_keeps_xsa_orthogonal(small_cfg, tmp_path, switches):
    run_dir = train(small_cfg(*switches, "train.max_steps=30", "eval.every=30", "eval.diag_every=10",
                              "optim.muon.momentum_warmup_steps=10"), tmp_path / "run")
    precision = switches[0].split("=")[1]
    assert json.loads((run_dir / "run.json").read_text())["precision"] == precision
    weights = torch.load(run_dir / "checkpoints" / "final.ckpt", weights_only=False)["state_dict"]
    bf16 = {name for name, w in weights.items() if w.dtype == torch.bfloat16}
    assert bf16 == (set() if precision == "bf16-mixed" else {"model.wte.weight", "model.value_embeds.1.weight"})
    losses = [float(r["train/loss"]) for r in read_rows(run_dir) if r["train/loss"]]
    assert all(map(math.isfinite, losses)) and sum(losses[-5:]) / 5 < losses[0] - 1.0
    lines = [json.loads(line) for line in (run_dir / "diagnostics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 10, 20, 30]
    for line in lines:  # every layer and head, at every diagnostics step
        assert max(abs(c) for heads in line["out_self_cos"] for c in heads) <= 1e-2
        assert max(abs(c) for heads in line["attn_self_cos"] for c in heads) > 0.05


def test_learnable_alpha_is_logged_as_the_model_has_it(small_cfg, tmp_path):
    from xsa_exp.run_dir import load_trained

    run_dir = train(small_cfg("xsa=learnable", "optim.lr.xsa_theta=0.5", "eval.diag_every=3"), tmp_path / "run")
    alphas = load_trained(run_dir).model.xsa_alphas()
    assert ((alphas > 0) & (alphas < 1)).all() and not torch.allclose(alphas, torch.full_like(alphas, 0.5))
    last = json.loads((run_dir / "diagnostics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 6
    torch.testing.assert_close(torch.tensor(last["alpha"]), alphas)
    row = [r for r in read_rows(run_dir) if r.get("xsa/alpha/L0")][-1]
    assert int(row["step"]) == 6
    for layer, heads in enumerate(alphas):
        assert float(row[f"xsa/alpha/L{layer}"]) == pytest.approx(heads.mean().item(), rel=1e-6)
    assert float(row["xsa/alpha"]) == pytest.approx(alphas.mean().item(), rel=1e-6)


def test_a_schedule_longer_than_the_run_fails_before_the_run_is_written(small_cfg, tmp_path):
    """With the run's length known only once its data is (train.target_tokens), the warmup is checked before the
    run's files are written, so the corrected run can take the same directory."""
    from xsa_exp import run_dir as rd

    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"optim.schedule.warmup_steps=40 \+ the warmdown \(\d+ steps\) exceed the "
                                          r"run's 4 steps"):
        train(small_cfg("train.max_steps=null", "train.target_tokens=2048", "optim.schedule.warmup_steps=40"), run)
    assert not (run / rd.CONFIG).exists()
    train(small_cfg("train.max_steps=null", "train.target_tokens=2048", "optim.schedule.warmup_steps=0"), run)
    assert rd.read_status(run)["status"] == "completed"


def test_residual_scalars_are_logged_as_the_model_has_them(small_cfg, tmp_path):
    from xsa_exp.run_dir import load_trained

    run_dir = train(small_cfg("eval.diag_every=3"), tmp_path / "run")
    scalars = load_trained(run_dir).model.residual_scalars()
    assert not torch.allclose(scalars["x0"], torch.full_like(scalars["x0"], 0.1))  # learned, not the init
    row = [r for r in read_rows(run_dir) if r.get("lambda/x0/L0")][-1]
    assert int(row["step"]) == 6
    for name in ("resid", "x0"):
        for layer, value in enumerate(scalars[name].tolist()):
            assert float(row[f"lambda/{name}/L{layer}"]) == pytest.approx(value, rel=1e-6)


def test_fixed_alpha_runs_log_no_learned_alpha(xsa_run):
    assert not any(key.startswith("xsa/") for key in read_rows(xsa_run)[0])
    last = json.loads((xsa_run / "diagnostics.jsonl").read_text().splitlines()[-1])
    assert last["alpha"] == [[1.0, 1.0], [1.0, 1.0]]


def test_validation_covers_the_whole_split_unless_told_otherwise(small_cfg, tmp_path):
    whole = train(small_cfg("eval.val_tokens=null", "train.max_steps=2", "eval.every=2"), tmp_path / "whole")
    scope = json.loads((whole / "run.json").read_text())["val_scope"]
    assert scope["whole"] and scope["tokens"] == scope["split_tokens"] > 1024
    huge = train(small_cfg("eval.val_tokens=100000000", "train.max_steps=2", "eval.every=2"), tmp_path / "huge")
    assert json.loads((huge / "run.json").read_text())["val_scope"] == scope
    assert [r["val/bpb"] for r in read_rows(huge)] == [r["val/bpb"] for r in read_rows(whole)]
    part = train(small_cfg("train.max_steps=2", "eval.every=2"), tmp_path / "part")  # SMALL: eval.val_tokens=1024
    assert json.loads((part / "run.json").read_text())["val_scope"] == {
        "tokens": 1024, "split_tokens": scope["split_tokens"], "whole": False}


def test_logged_tokens_per_sec_is_wall_time_between_step_lines_and_the_log_has_mfu_and_memory(tmp_path, monkeypatch):
    """train/tokens_per_sec runs from one update's end to the next (data wait included, evaluations between
    updates left out): over steps with nothing else between them, the logged rates give the wall time of the
    console lines to 10%."""
    from tests.conftest import SMALL, compose_config
    from xsa_exp.training import metrics_log

    lines = []
    monkeypatch.setattr(metrics_log, "rank_zero_info", lambda message: lines.append((time.perf_counter(), message)))
    cfg = compose_config(*SMALL, "train.max_steps=40", "eval.every=40", "eval.diag_every=0", "log.print_every=10",
                         "train.peak_flops=1e12")
    rows = [r for r in read_rows(train(cfg, tmp_path / "run")) if r["train/loss"]]
    printed = {int(m.split("/")[0].split()[-1]): t for t, m in lines if " tok/s" in m}
    assert sorted(printed) == [10, 20, 30, 40]
    logged = sum(512 / float(r["train/tokens_per_sec"]) for r in rows if 10 < int(r["step"]) <= 30)
    assert logged == pytest.approx(printed[30] - printed[10], rel=0.1)
    model_flops = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig))).flops_per_token()
    for r in rows:  # MFU = tokens/s x FLOPs per token / the configured peak; memory: this process's peak RSS on CPU
        assert float(r["train/mfu"]) == pytest.approx(float(r["train/tokens_per_sec"]) * model_flops / 1e12, rel=1e-9)
        assert float(r["train/peak_memory_gb"]) > 0.05
    assert any("| mfu " in m and "| mem " in m for _, m in lines)


def test_compiled_training_matches_eager_and_evaluates_eagerly(tmp_path):
    """train.compile=true compiles the training forward only, and the evaluations (bpb, diagnostics) run on the
    eager model. The first loss is the eager one; then compile's reordered fp32 sums, which Muon's bf16
    Newton-Schulz turns into differences of a few 1e-4, separate the two slightly."""
    from tests.conftest import SMALL, compose_config

    runs = {}
    for compiled in (False, True):
        cfg = compose_config(*SMALL, "train.max_steps=4", "eval.every=2", "eval.diag_every=2",
                             f"train.compile={compiled}")
        runs[compiled] = read_rows(train(cfg, tmp_path / f"compile_{compiled}"))
    for key in ("train/loss", "val/bpb"):
        eager, compiled = ([float(r[key]) for r in runs[c] if r[key]] for c in (False, True))
        assert len(eager) == len(compiled) > 0 and compiled == pytest.approx(eager, rel=2e-3), key
        assert key != "train/loss" or compiled[0] == pytest.approx(eager[0], rel=1e-6)


def test_an_update_between_host_sync_steps_reads_nothing_from_the_device(tmp_path, monkeypatch):
    """From the end of one update's hooks to the end of the next one's, for every update that is not a host-sync
    step (console line, evaluation, checkpoint, last step): no tensor becomes a Python value, in our code or
    Lightning's. The host-sync steps do read (the test would see them), and the log still has every row."""
    from tests.conftest import SMALL, compose_config
    from tests.host_reads import HOST_COLLECTIVES, UpdateReads
    from xsa_exp.training import run as training

    for name in HOST_COLLECTIVES:  # UpdateReads wraps them; the originals come back after the test
        monkeypatch.setattr(torch.distributed, name, getattr(torch.distributed, name))
    counter = UpdateReads()
    real_build = training.build_callbacks
    monkeypatch.setattr(training, "build_callbacks", lambda *a: real_build(*a) + [counter])
    cfg = compose_config(*SMALL, "train.max_steps=12", "log.print_every=4", "eval.every=6", "eval.diag_every=0",
                         "train.grad_clip=1.0", "train.skip_nonfinite_steps=1")
    rows = [r for r in read_rows(train(cfg, tmp_path / "run")) if r["train/loss"]]
    assert [int(r["step"]) for r in rows] == list(range(1, 13))
    sync_steps = {4, 6, 8, 12}
    counts = counter.counts
    assert all(counts[s] for s in sync_steps if s in counts)  # the counter sees the reads where there are some
    quiet = {s: reads for s, reads in counts.items() if s not in sync_steps}
    assert sorted(quiet) == [1, 2, 3, 5, 7, 9, 10, 11] and all(not reads for reads in quiet.values()), quiet


def test_a_process_compiles_more_models_than_the_recompile_limit(monkeypatch):
    """A sweep's jobs in one process (Hydra's own launcher, a reused joblib worker) each compile GPT.forward for their
    own model: another shape is a recompile, which fullgraph makes an error once torch's limit is reached."""
    from xsa_exp.training.module import LanguageModel

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)  # 8 by default: two models show it
    idx = torch.randint(0, 128, (1, 33))
    for layers in ([0], [1]):
        shape = ModelConfig(n_layer=2, n_head=2, n_embd=32, sequence_len=32, vocab_size=128)
        module = LanguageModel(GPT(GPTConfig.of(shape, XSAConfig(layers=layers))), None, None, 10, None, 0,
                               compile=True)
        assert module.train_forward(idx[:, :-1], idx[:, 1:]).isfinite()
