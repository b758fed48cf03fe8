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


def test_memory_model_predicts_the_presets_and_names_a_batch_that_fits():
    from xsa_exp.memory import fitting_batch_size, memory_warning, predicted_peak_bytes

    with torch.device("meta"):
        d12 = GPT(GPTConfig(sequence_len=2048, vocab_size=32768, n_layer=12, n_head=12, n_embd=768, xsa=XSASettings()))
    # The measured d12 figures (bench/memory_model.py): eager 85.3 GB, compiled 55.2 GB at 32 sequences.
    assert predicted_peak_bytes(d12, 32, compiled=False, muon=True) / 1e9 == pytest.approx(85.3, rel=0.03)
    assert predicted_peak_bytes(d12, 32, compiled=True, muon=True) / 1e9 == pytest.approx(55.2, rel=0.03)
    h100 = 80e9
    batch = fitting_batch_size(d12, h100, compiled=False, tokens_per_batch_unit=2048, total_batch_tokens=524288,
                               muon=True)
    assert batch == 16 and 524288 % (batch * 2048) == 0  # the largest divisor of the 256-sequence batch under 80 GB
    message = memory_warning(d12, 32, False, True, h100, "NVIDIA H100 80GB HBM3", 2048, 524288)
    assert message.startswith("predicted peak memory 87 GB (eager, train.device_batch_size=32) "
                              "exceeds this NVIDIA H100")
    assert "train.device_batch_size=16 fits" in message and "train.compile=true fits as it is" in message
    assert memory_warning(d12, 32, True, True, h100, "NVIDIA H100", 2048, 524288) is None
    assert memory_warning(d12, 32, False, True, 141e9, "NVIDIA H200", 2048, 524288) is None
