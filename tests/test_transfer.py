"""nanochat's hyperparameter transfer (optim.nanochat_transfer, xsa_exp/config/arithmetic.py) against nanochat's own
arithmetic, written out below from its scripts/base_train.py at 94b73ad, for nanochat's depths and the study's
shapes; the depth=nanochat family; the CPU study presets keeping it off."""

import math

import pytest
import torch

from tests.conftest import compose_config
from xsa_exp.config.arithmetic import (
    batch_tokens,
    max_steps,
    model_scaling_params,
    nanochat_shape,
    nanochat_transfer,
)
from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
from xsa_exp.errors import ConfigError
from xsa_exp.model import GPT, GPTConfig


def nanochat_base_train(num_scaling_params: int, d12_scaling_params: int, total_batch_size: int = -1,
                        target_param_data_ratio: float = 12, weight_decay: float = 0.28) -> dict:
    """scripts/base_train.py's lines from `target_tokens = ...` to `num_iterations = ...`, as nanochat wrote them."""
    target_tokens = int(target_param_data_ratio * num_scaling_params)
    D_REF = target_param_data_ratio * d12_scaling_params
    B_REF = 2**19
    if total_batch_size == -1:
        batch_size_ratio = target_tokens / D_REF
        predicted_batch_size = B_REF * batch_size_ratio ** 0.383
        total_batch_size = 2 ** round(math.log2(predicted_batch_size))
    batch_lr_scale = 1.0
    batch_ratio = total_batch_size / B_REF
    if batch_ratio != 1.0:
        batch_lr_scale = batch_ratio ** 0.5
    weight_decay_scaled = weight_decay * math.sqrt(total_batch_size / B_REF) * (D_REF / target_tokens)
    num_iterations = target_tokens // total_batch_size
    return {"batch": total_batch_size, "lr": batch_lr_scale, "wd": weight_decay_scaled, "steps": num_iterations}


def scaling_params_of_built_model(cfg) -> int:
    """nanochat's get_scaling_params (transformer matrices + lm_head) on the model itself, built on the meta device."""
    with torch.device("meta"):
        model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    return model.param_counts()["hidden matrices"] + model.lm_head.weight.numel()


def nanochat_d12():
    return compose_config("depth=nanochat", "model.n_layer=12", "stack=nanochat_2604", "data=climbmix",
                          "data.local_dir=/")


SHAPES = {  # nanochat's depth family, and the study's own shapes (heads of 64)
    "nanochat d12": ["depth=nanochat", "model.n_layer=12"], "nanochat d20": ["depth=nanochat", "model.n_layer=20"],
    "nanochat d24": ["depth=nanochat", "model.n_layer=24"], "nanochat d26": ["depth=nanochat", "model.n_layer=26"],
    "study d12": ["depth=d12"], "study d24": ["depth=d24"],
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_transfer_equals_nanochats_arithmetic(shape):
    cfg = compose_config(*SHAPES[shape], "stack=nanochat_2604", "data=climbmix", "data.local_dir=/")
    expected = nanochat_base_train(scaling_params_of_built_model(cfg), scaling_params_of_built_model(nanochat_d12()))
    transfer = nanochat_transfer(cfg)
    assert model_scaling_params(cfg.model) == scaling_params_of_built_model(cfg)
    assert (transfer.batch_tokens, transfer.lr_factor, transfer.muon_weight_decay, max_steps(cfg, None)) == (
        expected["batch"], expected["lr"], expected["wd"], expected["steps"])


def test_the_study_shapes_figures():
    """d12 keeps nanochat's reference batch and lrs; d24 (3.05x d12's horizon) gets 2^20 tokens, lrs x sqrt(2) and a
    Muon weight decay of 0.130, as the issue worked out by hand."""
    d12 = nanochat_transfer(compose_config("experiment=xsa_d12", "data.local_dir=/", "eval.core_every=0"))
    d24 = nanochat_transfer(compose_config("experiment=xsa_d24", "data.local_dir=/", "eval.core_every=0"))
    assert (d12.batch_tokens, d12.lr_factor) == (2**19, 1.0) and d12.muon_weight_decay == pytest.approx(0.28, abs=1e-5)
    assert (d24.batch_tokens, d24.lr_factor) == (2**20, math.sqrt(2))
    assert d24.muon_weight_decay == pytest.approx(0.1299, abs=1e-4)
    assert d24.horizon_tokens / d24.reference_tokens == pytest.approx(3.05, abs=0.01)


def test_cfg_job_resolve_prints_the_derived_figures():
    """`python train.py experiment=xsa_d24 --cfg job --resolve` shows what the run will use, under optim.transfer."""
    import subprocess
    import sys

    import yaml

    from tests.conftest import REPO

    printed = subprocess.run([sys.executable, "train.py", "experiment=xsa_d24", "--cfg", "job", "--resolve"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
    shown = yaml.safe_load(printed)["optim"]["transfer"]
    assert shown == nanochat_transfer(compose_config("experiment=xsa_d24")).as_dict()
    assert (shown["batch_tokens"], shown["lr_factor"], round(shown["muon_weight_decay"], 3)) == (2**20, 2**0.5, 0.130)


@pytest.mark.parametrize("override", ["optim.transfer.lr_factor=2", "optim.transfer.batch_tokens=null"])
def test_the_derived_figures_are_read_only(override):
    from xsa_exp.config.checks import validate

    with pytest.raises(ConfigError, match=r"optim.transfer is read-only: .* set train.total_batch_tokens"):
        validate(compose_config("experiment=xsa_d24", "data.local_dir=/", "eval.core_every=0", override))


def test_a_given_batch_is_kept_and_scales_the_lrs_and_weight_decay():
    cfg = compose_config("experiment=xsa_d24", "data.local_dir=/", "eval.core_every=0",
                         "train.total_batch_tokens=524288")
    transfer = nanochat_transfer(cfg)
    assert (transfer.batch_tokens, transfer.batch_derived, transfer.lr_factor) == (2**19, False, 1.0)
    assert transfer.muon_weight_decay == pytest.approx(0.28 / 3.048, rel=1e-3)


def test_nanochats_depth_family_rounds_width_up_to_heads_of_128():
    assert [nanochat_shape(n) for n in (12, 20, 26, 3)] == [(768, 6), (1280, 10), (1664, 13), (256, 2)]
    cfg = compose_config("depth=nanochat", "model.n_layer=26")
    assert (cfg.model.n_embd, cfg.model.n_head, cfg.model.n_embd // cfg.model.n_head) == (1664, 13, 128)


def test_without_the_transfer_a_batch_must_be_given():
    with pytest.raises(ConfigError, match="train.total_batch_tokens is not set"):
        batch_tokens(compose_config("depth=nanochat", "train.total_batch_tokens=null", "data=climbmix",
                                    "data.local_dir=/"))
    assert batch_tokens(compose_config("depth=d12", "data=climbmix", "data.local_dir=/")) == 524288  # classic: given


@pytest.mark.parametrize("preset", ["study_stack", "study_field", "study_stack_ablation", "study_x0_path",
                                    "study_carriers"])
def test_the_cpu_study_presets_take_the_stacks_lrs_as_given(preset):
    """The committed study on the stack ran its lrs and weight decay as given: the presets pin the transfer off."""
    cfg = compose_config(f"experiment={preset}")
    assert cfg.stack_name == "nanochat_2604" and not cfg.optim.nanochat_transfer and nanochat_transfer(cfg) is None
    assert set(cfg.optim.transfer.values()) == {None}


@pytest.mark.slow
def test_depth_nanochat_trains_at_a_tiny_width_with_the_transfer(tmp_path, monkeypatch):
    from xsa_exp.run_dir import read_run_info
    from xsa_exp.training import run as training
    from xsa_exp.training.run import train

    printed = []
    monkeypatch.setattr(training, "rank_zero_info", printed.append)
    cfg = compose_config("depth=nanochat", "model.n_layer=2", "model.sequence_len=64", "model.vocab_size=512",
                         "stack=nanochat_2604", "logger=csv", "train.compile=false", "train.max_steps=2",
                         "train.device_batch_size=32", "optim.schedule.warmup_steps=0", "eval.every=2",
                         "eval.val_tokens=1024",
                         "eval.core_every=0", "eval.diag_every=0")
    run = read_run_info(train(cfg, tmp_path / "run"))
    expected = nanochat_transfer(cfg)
    assert (cfg.model.n_embd, cfg.model.n_head) == (128, 1)
    assert run["tokens_per_step"] == expected.batch_tokens and run["nanochat_transfer"] == expected.as_dict()
    assert any(expected.describe() in message for message in printed)


def test_the_readme_and_study_page_give_the_presets_arithmetic():
    """README's and docs/study.md's cost figures follow from the configs (steps, batch, tokens) and the throughput
    BENCHMARKS.md records for one H200 (GPU-hours), so they cannot drift from the arithmetic again."""
    from tests.conftest import REPO

    readme, study = (" ".join((REPO / name).read_text().split()) for name in ("README.md", "docs/study.md"))
    benchmarks = (REPO / "BENCHMARKS.md").read_text()
    hours = []
    for depth, tokens_per_second in (("d12", 339_242), ("d24", 140_186)):
        assert f"{tokens_per_second:,}" in benchmarks
        cfg = compose_config(f"experiment=xsa_{depth}", "data.local_dir=/", "eval.core_every=0")
        steps, batch = max_steps(cfg, None), batch_tokens(cfg)
        hours.append(f"{steps * batch / tokens_per_second / 3600:.1f}")
        for text in (readme, study):
            assert f"{steps:,} steps of {batch:,} tokens" in text and f"{steps * batch / 1e9:.2f}B tokens" in text
        assert f"about {hours[-1]} GPU-hours" in study
    transfer = nanochat_transfer(compose_config("experiment=xsa_d24", "data.local_dir=/", "eval.core_every=0"))
    assert f"lrs × {transfer.lr_factor:.4f}, Muon weight decay {transfer.muon_weight_decay:.3f}" in readme
    assert f"about {hours[0]} and {hours[1]} GPU-hours" in readme
