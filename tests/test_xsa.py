import pytest
import torch
import torch.nn.functional as F

from xsa_exp.model import GPT, GPTConfig, exclusive_self_attention, resolve_layers


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


def test_bf16_alpha_one_is_orthogonal_to_bf16_precision():
    y, v = rand(2, 4, 16, 64).bfloat16(), rand(2, 4, 16, 64, seed=1).bfloat16()
    z = exclusive_self_attention(y, v, 1.0)
    assert F.cosine_similarity(z.float(), v.float(), dim=-1).abs().max() < 2e-2


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
    cfg = GPTConfig(sequence_len=32, vocab_size=300, n_layer=3, n_head=2, n_embd=32, **xsa)
    model = GPT(cfg)
    # Zero-initialised projections would hide XSA entirely at init: give them weights.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def test_model_alpha_zero_is_bit_identical_to_standard_attention():
    idx = torch.randint(0, 300, (2, 32))
    standard = tiny_model(xsa_layers=[])
    alpha_zero = tiny_model(xsa_layers=[0, 1, 2], xsa_alpha=0.0)
    full = tiny_model(xsa_layers=[0, 1, 2], xsa_alpha=1.0)
    assert torch.equal(standard(idx), alpha_zero(idx))
    assert not torch.equal(standard(idx), full(idx))


def test_unselected_layers_are_untouched():
    model = tiny_model(xsa_layers=[2], xsa_alpha=1.0)
    assert [b.attn.xsa_on for b in model.blocks] == [False, False, True]


def test_learnable_alpha_is_tanh_theta_per_head_and_trains():
    model = tiny_model(xsa_layers=[0, 2], xsa_learnable=True, xsa_theta_init=0.0)
    thetas = [b.attn.xsa_theta for b in model.blocks]
    assert thetas[1] is None and thetas[0].shape == (2,)
    idx = torch.randint(0, 300, (2, 32))
    model(idx[:, :-1], idx[:, 1:]).backward()
    assert thetas[0].grad is not None and thetas[0].grad.abs().sum() > 0
    with torch.no_grad():
        thetas[0].fill_(0.3)
    torch.testing.assert_close(model.blocks[0].attn.alpha().flatten(), torch.tanh(torch.tensor([0.3, 0.3])))


def test_value_source_plain_projects_against_unmixed_value():
    idx = torch.randint(0, 300, (2, 32))
    mixed = tiny_model(xsa_layers=[2], xsa_value_source="mixed")
    plain = tiny_model(xsa_layers=[2], xsa_value_source="plain")
    assert 2 in mixed.config.ve_layers
    assert not torch.equal(mixed(idx), plain(idx))
