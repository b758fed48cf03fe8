import pytest
import torch
import torch.nn.functional as F

from xsa_exp.model import GPT, GPTConfig, XSASettings, exclusive_self_attention, resolve_layers


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_alpha_zero_returns_y_exactly():
    y, v = rand(2, 3, 5, 8), rand(2, 3, 5, 8, seed=1)
    assert torch.equal(exclusive_self_attention(y, v, 0.0), y)


def test_alpha_one_makes_output_orthogonal_to_own_value_per_head():
    y, v = rand(2, 4, 16, 32), rand(2, 4, 16, 32, seed=1)
    z = exclusive_self_attention(y, v, 1.0)
    assert F.cosine_similarity(y, v, dim=-1).abs().mean() > 0.05  # the input is not orthogonal already
    assert F.cosine_similarity(z, v, dim=-1).abs().max() < 1e-5


def test_partial_alpha_removes_that_fraction_of_the_projection():
    y, v = rand(1, 2, 4, 8), rand(1, 2, 4, 8, seed=1)
    z = exclusive_self_attention(y, v, 0.25)
    proj = (y * v).sum(-1, keepdim=True) / (v * v).sum(-1, keepdim=True)
    torch.testing.assert_close((z * v).sum(-1, keepdim=True) / (v * v).sum(-1, keepdim=True), 0.75 * proj)


def test_per_head_alpha_broadcasts():
    y, v = rand(2, 3, 4, 8), rand(2, 3, 4, 8, seed=1)
    alpha = torch.tensor([0.0, 0.5, 1.0]).view(1, 3, 1, 1)
    z = exclusive_self_attention(y, v, alpha)
    for h, a in enumerate([0.0, 0.5, 1.0]):
        torch.testing.assert_close(z[:, h], exclusive_self_attention(y[:, h], v[:, h], a))


def test_zero_value_gives_finite_output_and_gradients():
    y = rand(1, 2, 3, 4).requires_grad_()
    v = torch.zeros(1, 2, 3, 4, requires_grad=True)
    z = exclusive_self_attention(y, v, 1.0)
    z.sum().backward()
    assert torch.equal(z, y.detach())
    assert torch.isfinite(y.grad).all() and torch.isfinite(v.grad).all()


def nearly_parallel(shape, seed=0):
    """y = 0.99 v + 0.01 noise: the case where z is a small difference of large terms."""
    v = rand(*shape, seed=seed)
    return 0.99 * v + 0.01 * rand(*shape, seed=seed + 1), v


@pytest.mark.parametrize("inputs", ["random", "nearly_parallel"])
def test_alpha_one_is_orthogonal_under_cpu_bf16_autocast(inputs):
    y, v = (rand(2, 4, 16, 64), rand(2, 4, 16, 64, seed=1)) if inputs == "random" else nearly_parallel((2, 4, 16, 64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = exclusive_self_attention(y.bfloat16(), v.bfloat16(), 1.0)
    assert z.dtype == torch.bfloat16
    assert F.cosine_similarity(z.float(), v.bfloat16().float(), dim=-1).abs().max() <= 1e-2


def test_bf16_rounding_of_the_subtraction_would_break_orthogonality():
    # The case the fp32 subtraction exists for: done in bf16 it leaves a large component along v.
    y, v = nearly_parallel((2, 4, 16, 64))
    y, v = y.bfloat16(), v.bfloat16()
    coef = ((y.float() * v.float()).sum(-1, keepdim=True) / (v.float() * v.float()).sum(-1, keepdim=True)).bfloat16()
    z_bf16_subtraction = y - coef * v
    assert F.cosine_similarity(z_bf16_subtraction.float(), v.float(), dim=-1).abs().max() > 0.1


@pytest.mark.parametrize("spec, expected", [
    ("all", [0, 1, 2, 3, 4, 5]), ("none", []), ([4, 1], [1, 4]), (3, [3]), ("first:2", [0, 1]),
    ("last:2", [4, 5]), ("every:2", [0, 2, 4]), ("every:4", [0, 4]), ("ve", [1, 3, 5]), ("non_ve", [0, 2, 4]),
])
def test_layer_selection(spec, expected):
    assert resolve_layers(spec, 6, [1, 3, 5]) == expected


@pytest.mark.parametrize("spec, message", [
    ([6], "out of range"), ([-1], "out of range"), ([1, 1], "duplicate"), ("last:7", "more layers"),
    ("first:0", "unknown selection"), ("most", "unknown selection"), (1.5, "cannot read"),
])
def test_bad_layer_selection(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_layers(spec, 6, [1, 3, 5])


def tiny_model(seed=0, **xsa):
    torch.manual_seed(seed)
    cfg = GPTConfig(sequence_len=32, vocab_size=300, n_layer=3, n_head=2, n_embd=32, xsa=XSASettings(**xsa))
    model = GPT(cfg)
    # Zero-initialised projections would hide XSA entirely at init: give them weights.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("autocast", [False, True])
def test_model_alpha_zero_through_the_op_is_bit_identical_to_standard_attention(monkeypatch, autocast):
    """A fixed alpha of 0 skips the op (XSASettings.on); forced to run it anyway, the op must still give standard
    attention's logits bit for bit, in fp32 and under bf16 autocast (its fp32 round trip is exact)."""
    idx = torch.randint(0, 300, (2, 32))
    standard = tiny_model(layers=[])
    monkeypatch.setattr(XSASettings, "on", lambda self, layer: layer in self.layers)
    alpha_zero = tiny_model(layers=[0, 1, 2], alpha=0.0)
    full = tiny_model(layers=[0, 1, 2], alpha=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        assert torch.equal(standard(idx), alpha_zero(idx))
        assert not torch.equal(standard(idx), full(idx))


def test_the_op_computes_in_the_inputs_precision_when_above_fp32():
    y, v = rand(2, 3, 5, 8).double(), rand(2, 3, 5, 8, seed=1).double()
    assert torch.equal(exclusive_self_attention(y, v, 0.0), y)
    z = exclusive_self_attention(y, v, 1.0)
    assert z.dtype == torch.float64 and (z * v).sum(-1).abs().max() < 1e-12


def block_outputs(model, idx) -> list[torch.Tensor]:
    outputs = []
    hooks = [block.register_forward_hook(lambda mod, args, out: outputs.append(out)) for block in model.blocks]
    model(idx)
    for hook in hooks:
        hook.remove()
    return outputs


def test_unselected_layers_are_untouched():
    idx = torch.randint(0, 300, (2, 32))
    standard = block_outputs(tiny_model(layers=[]), idx)
    last_only = block_outputs(tiny_model(layers=[2], alpha=1.0), idx)
    assert torch.equal(standard[0], last_only[0]) and torch.equal(standard[1], last_only[1])
    assert (standard[2] - last_only[2]).abs().max() > 1e-3


def test_learnable_alpha_is_sigmoid_theta_per_head_from_the_initial_alpha_and_trains():
    model = tiny_model(layers=[0, 2], learnable=True, alpha=0.3)
    # tiny_model perturbs every parameter, theta too; a fresh model starts exactly at xsa_alpha.
    fresh = GPT(GPTConfig(sequence_len=32, vocab_size=300, n_layer=3, n_head=2, n_embd=32,
                          xsa=XSASettings(layers=[0, 2], learnable=True, alpha=0.3)))
    torch.testing.assert_close(fresh.xsa_alphas(), torch.tensor([[0.3, 0.3], [0.0, 0.0], [0.3, 0.3]]))
    thetas = [b.attn.xsa_theta for b in model.blocks]
    assert thetas[1] is None and thetas[0].shape == (2,)
    idx = torch.randint(0, 300, (2, 32))
    model(idx[:, :-1], idx[:, 1:]).backward()
    assert thetas[0].grad is not None and thetas[0].grad.abs().sum() > 0
    with torch.no_grad():
        thetas[0].copy_(torch.tensor([0.3, -0.7]))
    torch.testing.assert_close(model.blocks[0].attn.alpha().flatten(), torch.sigmoid(torch.tensor([0.3, -0.7])))
    torch.testing.assert_close(model.xsa_alphas()[0], torch.sigmoid(torch.tensor([0.3, -0.7])))


@pytest.mark.parametrize("theta", [-30.0, 30.0])
def test_learnable_sigmoid_alpha_stays_in_zero_one_for_extreme_theta(theta):
    model = tiny_model(layers=[0, 1, 2], learnable=True, alpha=0.5)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.xsa_theta.fill_(theta)
    alphas = model.xsa_alphas()
    assert ((alphas >= 0) & (alphas <= 1)).all()
    assert torch.allclose(alphas, torch.full_like(alphas, 0.0 if theta < 0 else 1.0), atol=1e-6)
    assert torch.isfinite(model(torch.randint(0, 300, (1, 32)))).all()


def test_tanh_parametrization_is_the_signed_option():
    model = tiny_model(layers=[0], learnable=True, alpha=0.5, parametrization="tanh")
    with torch.no_grad():
        model.blocks[0].attn.xsa_theta.fill_(-5.0)
    assert model.xsa_alphas()[0].max() < -0.99  # the inversion the sigmoid default rules out
    fresh = GPT(GPTConfig(sequence_len=32, vocab_size=300, n_layer=3, n_head=2, n_embd=32,
                          xsa=XSASettings(layers=[0], learnable=True, alpha=0.5, parametrization="tanh")))
    torch.testing.assert_close(fresh.xsa_alphas()[0], torch.tensor([0.5, 0.5]))


def test_value_source_plain_projects_against_unmixed_value(monkeypatch):
    """The v given to the op: plain = c_v(x) before the value-embedding mix, mixed = after it (the same
    weights, so the mixed model with its value embeddings zeroed hands the op the plain value)."""
    from xsa_exp.model import gpt

    seen = []
    real_op = gpt.exclusive_self_attention
    monkeypatch.setattr(gpt, "exclusive_self_attention", lambda y, v, *a, **k: seen.append(v) or real_op(y, v, *a, **k))
    idx = torch.randint(0, 300, (2, 32))

    def value_given_to_xsa(model):
        seen.clear()
        model(idx)
        assert len(seen) == 1  # layer 2 only
        return seen[0]

    mixed = tiny_model(layers=[2], value_source="mixed")
    plain = tiny_model(layers=[2], value_source="plain")
    assert 2 in mixed.config.ve_layers
    v_plain, v_mixed = value_given_to_xsa(plain), value_given_to_xsa(mixed)
    with torch.no_grad():
        mixed.value_embeds["2"].weight.zero_()
    v_unmixed = value_given_to_xsa(mixed)
    assert torch.equal(v_plain, v_unmixed)
    assert (v_mixed - v_plain).abs().max() > 1e-3


def test_settings_are_built_once_and_hold_the_one_on_rule():
    from omegaconf import OmegaConf

    from xsa_exp.arm import Arm
    from xsa_exp.config.schema import XSAConfig, typed

    xsa_cfg = OmegaConf.create({"alpha": 0.0, "learnable": False, "parametrization": "sigmoid", "value_source": "plain",
                                "layers": "last:2", "eps": 1e-6})
    settings = XSASettings.of(typed(xsa_cfg, XSAConfig), 6, [1, 3, 5])
    assert settings.layers == [4, 5] and settings.value_source == "plain"
    assert not settings.on(5) and not settings.active  # a fixed alpha of 0 runs nowhere
    assert XSASettings(alpha=0.0, learnable=True, layers=[5]).on(5)  # a learnable alpha starting at 0 runs
    assert not XSASettings(alpha=1.0, layers=[5]).on(4)
    model = GPT(GPTConfig(sequence_len=32, vocab_size=300, n_layer=3, n_head=2, n_embd=32, xsa=XSASettings(layers=[1])))
    assert [block.attn.xsa_on for block in model.blocks] == [False, True, False]
    # The report decides "no XSA" with the same rule, on run.json's values.
    run = {"optim": "muon", "alpha": 0.5, "learnable": False, "layers": "all", "value_source": "mixed", "lr_scale": 1}
    assert Arm.of_run({**run, "xsa_layers": [0, 1]}, "sigmoid").alpha == 0.5
    assert (Arm.of_run({**run, "xsa_layers": []}, "sigmoid").alpha == 0.0
            and Arm.of_run({**run, "alpha": 0, "xsa_layers": [0]}, "sigmoid").layers == "")
