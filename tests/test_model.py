import warnings

import pytest
import torch

from xsa_exp.config.schema import LrConfig
from xsa_exp.model import GPT, GPTConfig, XSASettings, gpt


def make(learnable=False, alpha=1.0, **kw):
    torch.manual_seed(0)
    xsa = XSASettings(layers=[0, 1, 2, 3], learnable=learnable, alpha=alpha)
    return GPT(GPTConfig(sequence_len=16, vocab_size=300, n_layer=4, n_head=2, n_embd=32, xsa=xsa, **kw))


def test_value_embeddings_on_alternating_layers_including_last():
    assert make().config.ve_layers == [1, 3]
    assert GPTConfig(n_layer=5).ve_layers == [0, 2, 4]
    assert make(value_embeds=False).config.ve_layers == []
    model = make()
    assert sorted(model.value_embeds.keys()) == ["1", "3"]
    assert [b.attn.ve_gate is not None for b in model.blocks] == [False, True, False, True]


def test_logits_are_fp32_and_soft_capped():
    model = make()
    with torch.no_grad():
        model.lm_head.weight.mul_(1e4)
    logits = model(torch.randint(0, 300, (2, 16)))
    assert logits.dtype == torch.float32 and logits.shape == (2, 16, 300)
    assert logits.abs().max() <= 15.0
    assert make(logit_softcap=0.0)(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 300)


def test_untied_no_bias_zero_init_projections():
    model = make()
    assert model.lm_head.weight.data_ptr() != model.wte.weight.data_ptr()
    assert all(not n.endswith("bias") for n, _ in model.named_parameters())
    for block in model.blocks:
        assert block.attn.c_proj.weight.abs().sum() == 0 and block.mlp.c_proj.weight.abs().sum() == 0
    tied = make(tie_embeddings=True)
    assert tied.lm_head.weight is tied.wte.weight


def test_every_parameter_has_exactly_one_role():
    model = make(learnable=True, alpha=0.5)
    groups = model.named_param_groups()
    seen = [id(p) for params in groups.values() for _, p in params]
    assert len(seen) == len(set(seen)) == len(list(model.parameters()))
    assert all(p.ndim == 2 for _, p in groups["matrix"])
    assert {n for n, _ in groups["xsa_theta"]} == {f"blocks.{i}.attn.xsa_theta" for i in range(4)}
    counts = model.param_counts()
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")


def test_each_optimizer_role_has_its_learning_rate_key_and_a_parameter_with_two_roles_is_refused(monkeypatch):
    assert [role.name for role in gpt.PARAM_ROLES] == list(LrConfig.__dataclass_fields__)
    model = make()
    monkeypatch.setattr(gpt, "PARAM_ROLES", (*gpt.PARAM_ROLES, gpt.ParamRole("extra", lambda n, p: n == "x0_lambdas",
                                                                              "scalars")))
    with pytest.raises(RuntimeError, match="parameter x0_lambdas has 2 optimizer roles"):
        model.named_param_groups()


def test_loss_ignores_minus_one_targets_and_per_token_reduction():
    model = make()
    idx = torch.randint(0, 300, (2, 17))
    targets = idx[:, 1:].clone()
    per_token = model(idx[:, :-1], targets, loss_reduction="none")
    assert per_token.shape == (32,)
    targets[0, :8] = -1
    torch.testing.assert_close(model(idx[:, :-1], targets), per_token.view(2, 16)[targets >= 0].mean())


def test_flops_per_token_against_a_hand_count():
    # Without value embeddings: per layer q, k, v, o (4 d^2) and the MLP's two 4d x d matrices (8 d^2).
    d, layers, vocab, seq = 32, 4, 300, 16
    assert make(value_embeds=False).flops_per_token() == 6 * (12 * layers * d * d + vocab * d) + 12 * layers * d * seq
    # The d12 shape with value embeddings: their gates (12 channels -> 12 heads) on layers 1, 3, ..., 11 multiply too.
    d12 = GPT(GPTConfig(sequence_len=2048, vocab_size=32768, n_layer=12, n_head=12, n_embd=768, xsa=XSASettings()))
    hand = 6 * (12 * 12 * 768**2 + 6 * 12 * 12 + 32768 * 768) + 12 * 12 * 768 * 2048
    assert d12.flops_per_token() == hand == 6 * (84_934_656 + 864 + 25_165_824) + 226_492_416


def test_memory_model_predicts_the_presets_and_names_what_fits():
    from xsa_exp.memory import fitting_batch_size, memory_warning, predicted_peak_bytes, state_bytes
    from xsa_exp.precision import prepare

    with torch.device("meta"):
        d12 = GPT(GPTConfig(sequence_len=2048, vocab_size=32768, n_layer=12, n_head=12, n_embd=768, xsa=XSASettings(),
                            fused_loss_head=True))
    fp32_state = state_bytes(d12, muon=True)
    prepare(d12, "bf16-compute")  # the embeddings' weights, grads and AdamW moments in bf16: 8 bytes each, not 16
    embeddings = d12.wte.weight.numel() + sum(e.weight.numel() for e in d12.value_embeds.values())
    assert fp32_state - state_bytes(d12, muon=True) == 8 * embeddings

    def peak_gb(compiled: bool, fused: bool) -> float:
        return predicted_peak_bytes(d12, 32, "bf16-compute", compiled, True, fused) / 1e9

    # bench/memory_model.py's own d12 figures (BENCHMARKS.md, "Memory per micro-batch token"): compiled 34.6 GB with
    # the fused head, 49.4 with the full logits; eager 43.8 and 79.4
    assert [peak_gb(True, True), peak_gb(True, False), peak_gb(False, True), peak_gb(False, False)] == pytest.approx(
        [34.6, 49.4, 43.8, 79.4], rel=0.03)
    assert predicted_peak_bytes(d12, 32, "bf16-true", True, True) is None  # no figures for it: no prediction
    h100 = 80e9
    assert fitting_batch_size(d12, h100, "bf16-compute", False, 2048, 524288, True) == 32
    assert memory_warning(d12, 32, "bf16-compute", True, True, h100, "NVIDIA H100", 2048, 524288) is None
    d12.config.fused_loss_head = False
    message = memory_warning(d12, 64, "bf16-compute", True, True, h100, "NVIDIA H100 80GB HBM3", 2048, 524288)
    assert message.startswith("predicted peak memory 98 GB (bf16-compute, compiled, train.device_batch_size=64) "
                              "exceeds this NVIDIA H100 80GB HBM3's 80 GB; train.device_batch_size=32 fits")
    assert "model.fused_loss_head=true fits as it is" in message and "train.compile=true" not in message
    assert memory_warning(d12, 64, "bf16-compute", True, True, 141e9, "NVIDIA H200", 2048, 524288) is None


def test_a_gpu_run_predicted_not_to_fit_says_so_before_it_starts(monkeypatch):
    """What training calls on CUDA (no GPU here: its properties stand in), with the run's precision and settings."""
    from types import SimpleNamespace

    from tests.conftest import compose_config
    from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
    from xsa_exp.precision import prepare
    from xsa_exp.training.run import warn_if_it_will_not_fit

    cfg = compose_config("experiment=xsa_d24", "data.local_dir=/data")  # compiled, bf16-compute, the fused head
    with torch.device("meta"):
        model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    prepare(model, "bf16-compute")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    said = {}
    for name, memory in (("NVIDIA H100 80GB HBM3", 80e9), ("NVIDIA A100-SXM4-40GB", 40e9)):
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda i, name=name, memory=memory: SimpleNamespace(total_memory=memory, name=name))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn_if_it_will_not_fit(model, cfg, "bf16-compute")
        said[name] = [str(w.message) for w in caught if "predicted peak memory" in str(w.message)]
    assert said["NVIDIA H100 80GB HBM3"] == []  # bench/memory_model.py measured 52.2 GB at d24 (BENCHMARKS.md)
    assert said["NVIDIA A100-SXM4-40GB"] == [
        "predicted peak memory 51 GB (bf16-compute, compiled, train.device_batch_size=16) exceeds this "
        "NVIDIA A100-SXM4-40GB's 40 GB; train.device_batch_size=8 fits (gradient accumulation keeps the global batch)"]
