import math

import pytest
import torch
import torch.nn.functional as F

from xsa_exp.eval.diagnostics import (
    METRICS,
    AttentionProbe,
    attention_diagnostics,
    flatten_diagnostics,
    probes_installed,
)
from xsa_exp.model import GPT, GPTConfig, XSASettings

N_LAYER, N_HEAD, T = 3, 2, 32


def make(layers=(0, 1, 2), **kw):
    """A small model whose attention matters downstream: noise on every parameter, zero-inits included."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(sequence_len=T, vocab_size=300, n_layer=N_LAYER, n_head=N_HEAD, n_embd=32,
                          xsa=XSASettings(layers=list(layers), **kw)))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def batch():
    return torch.randint(0, 300, (2, T), generator=torch.Generator().manual_seed(1))


def test_out_self_cos_vanishes_at_alpha_one():
    diag = attention_diagnostics(make(alpha=1.0), batch())
    assert set(diag) == set(METRICS)
    for values in diag.values():
        assert values.shape == (N_LAYER, N_HEAD) and values.dtype == torch.float32 and values.device.type == "cpu"
    assert diag["out_self_cos"].abs().max() < 1e-4
    assert diag["attn_self_cos"].abs().min() > 0.05


def test_out_self_cos_equals_attn_self_cos_without_xsa():
    diag = attention_diagnostics(make(layers=()), batch())
    assert torch.equal(diag["out_self_cos"], diag["attn_self_cos"])


def test_xsa_op_at_alpha_zero_leaves_out_self_cos_equal_to_attn_self_cos(monkeypatch):
    """The op itself, run with alpha = 0 (which the model would skip), must leave the output as it was."""
    from xsa_exp.model import gpt

    model = make(alpha=0.0)
    for block in model.blocks:
        block.attn.xsa_on = True
    calls = []
    real_op = gpt.exclusive_self_attention
    monkeypatch.setattr(gpt, "exclusive_self_attention", lambda *a, **k: calls.append(1) or real_op(*a, **k))
    diag = attention_diagnostics(model, batch())
    assert len(calls) == N_LAYER
    torch.testing.assert_close(diag["out_self_cos"], diag["attn_self_cos"], rtol=0, atol=1e-6)


def test_xsa_only_in_selected_layers():
    diag = attention_diagnostics(make(layers=[1]), batch())
    assert diag["out_self_cos"][1].abs().max() < 1e-4 and diag["attn_self_cos"][1].abs().min() > 0.05
    assert torch.equal(diag["out_self_cos"][[0, 2]], diag["attn_self_cos"][[0, 2]])


class CheckingProbe(AttentionProbe):
    """Also runs SDPA on the same q, k, v and keeps the largest difference from the explicit y."""

    max_diff = 0.0

    def attend(self, q, k, v, mask=None):
        y = super().attend(q, k, v, mask)
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        self.max_diff = max(self.max_diff, (y - sdpa).abs().max().item())
        return y


def test_probed_forward_matches_training_path():
    model, idx = make(), batch()
    model.eval()
    with torch.no_grad():
        expected = model(idx)
        with probes_installed(model):
            probed = model(idx)
        probes = [CheckingProbe() for _ in model.blocks]
        try:
            for block, probe in zip(model.blocks, probes):
                block.attn.probe = probe
            model(idx)
        finally:
            for block in model.blocks:
                block.attn.probe = None
    torch.testing.assert_close(probed, expected, atol=1e-5, rtol=1e-5)
    assert all(probe.sums and probe.max_diff < 1e-5 for probe in probes)  # every layer ran, and matched SDPA


def test_explicit_attention_matches_sdpa_on_random_inputs():
    q, k, v = torch.randn(3, 2, 4, 9, 8).unbind(0)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(AttentionProbe().attend(q, k, v), expected)


def test_uniform_attention_has_known_diag_and_entropy():
    B, H, n, D = 2, 3, 7, 4
    probe = AttentionProbe()
    v = torch.randn(B, H, n, D)
    y = probe.attend(torch.zeros(B, H, n, D), torch.randn(B, H, n, D), v)  # q = 0: every score equal
    means = probe.means()
    torch.testing.assert_close(means["diag_attn"], torch.full((H,), sum(1 / (i + 1) for i in range(n)) / n))
    torch.testing.assert_close(means["attn_entropy"], torch.full((H,), sum(math.log(i + 1) for i in range(n)) / n))
    torch.testing.assert_close(y, v.cumsum(dim=-2) / torch.arange(1, n + 1).view(n, 1))


def test_peaked_attention_has_known_diag_and_entropy():
    # q = k = s * e_t (orthonormal rows): score c = s^2 / sqrt(D) on the diagonal, 0 elsewhere, so
    # row i puts e^c / (e^c + i) = 3 / (3 + i) on itself and 1 / (3 + i) on each earlier token.
    n, D = 6, 8
    s = math.sqrt(math.log(3) * math.sqrt(D))
    qk = (s * torch.eye(D)[:n]).expand(2, 2, n, D)
    probe = AttentionProbe()
    probe.attend(qk, qk, torch.randn(2, 2, n, D))
    diag = [3 / (3 + i) for i in range(n)]
    entropy = [-p * math.log(p) - i / (3 + i) * math.log(1 / (3 + i)) for i, p in enumerate(diag)]
    torch.testing.assert_close(probe.means()["diag_attn"], torch.full((2,), sum(diag) / n))
    torch.testing.assert_close(probe.means()["attn_entropy"], torch.full((2,), sum(entropy) / n))


def value_sim(v):
    probe = AttentionProbe()
    probe.record(y=v, z=v, v=v)
    return probe.means()["value_sim"]


def test_value_sim_of_hand_built_values():
    n = 9
    scales = torch.rand(1, 1, n, 1) + 0.5  # cosines ignore the norms
    same = torch.randn(1, 2, 1, 5).expand(1, 2, n, 5) * scales
    torch.testing.assert_close(value_sim(same), torch.ones(2))
    # Alternating orthogonal e0, e1: row i has i earlier tokens, of which those of i's parity match.
    alternating = torch.eye(5)[torch.arange(n) % 2].view(1, 1, n, 5) * scales
    expected = sum((i // 2) / i for i in range(1, n)) / (n - 1)
    torch.testing.assert_close(value_sim(alternating), torch.tensor([expected]))


def test_value_sim_matches_brute_force():
    v = torch.randn(2, 3, 10, 4)
    cos = F.cosine_similarity(v.unsqueeze(-2), v.unsqueeze(-3), dim=-1)  # (B, H, T, T)
    rows = [cos[..., i, :i].mean(dim=-1) for i in range(1, 10)]
    torch.testing.assert_close(value_sim(v), torch.stack(rows, dim=-1).mean(dim=(0, 2)))


@pytest.mark.parametrize("training", [True, False])
def test_pass_leaves_parameters_rng_and_mode_unchanged(training):
    model = make()
    model.train(training)
    modes = []

    def draw(module, args):  # without the RNG restore, this would move the generator
        torch.rand(1)
        modes.append(module.training)

    hook = model.blocks[1].register_forward_pre_hook(draw)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    rng = torch.get_rng_state()
    attention_diagnostics(model, batch())
    hook.remove()
    assert modes == [False]  # the pass itself runs in eval mode
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(p, params[name]) for name, p in model.named_parameters())
    assert all(m.training == training for m in model.modules())
    assert all(block.attn.probe is None for block in model.blocks)


def test_probes_removed_and_mode_restored_when_forward_raises():
    model = make()
    model.train()

    def fail(module, args):
        raise RuntimeError("boom")

    hook = model.blocks[2].register_forward_pre_hook(fail)  # after two probes have run
    with pytest.raises(RuntimeError, match="boom"):
        attention_diagnostics(model, batch())
    hook.remove()
    assert model.training and all(block.attn.probe is None for block in model.blocks)


def test_the_pass_computes_fp32_matmuls_in_full_fp32_and_restores_the_precision(monkeypatch):
    """CUDA training allows TF32 for fp32 matmuls; the probes' attention must not use it (evaluate.py does not)."""
    seen = []
    real_attend = AttentionProbe.attend

    def attend(self, *args, **kwargs):
        seen.append(torch.get_float32_matmul_precision())
        return real_attend(self, *args, **kwargs)

    monkeypatch.setattr(AttentionProbe, "attend", attend)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        attention_diagnostics(make(), batch())
        assert seen == ["highest"] * N_LAYER
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_bf16_autocast_accumulates_in_fp32():
    model, idx = make(), batch()
    exact = attention_diagnostics(model, idx)
    bf16 = attention_diagnostics(model, idx, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    for name in METRICS:
        assert bf16[name].dtype == torch.float32 and bf16[name].isfinite().all()
        torch.testing.assert_close(bf16[name], exact[name], atol=0.01, rtol=0.01)
    assert bf16["out_self_cos"].abs().max() < 1e-3


def test_explicit_attention_stays_fp32_under_autocast():
    q, k, v = torch.randn(3, 2, 4, 32, 16).unbind(0)
    exact = AttentionProbe().attend(q, k, v)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        probed = AttentionProbe().attend(q, k, v)
    torch.testing.assert_close(probed, exact, atol=1e-6, rtol=1e-6)


def test_flatten_diagnostics_names_and_counts():
    diag = {name: torch.arange(N_LAYER * N_HEAD, dtype=torch.float32).view(N_LAYER, N_HEAD) for name in METRICS}
    flat = flatten_diagnostics(diag)
    assert len(flat) == len(METRICS) * (1 + N_LAYER + N_LAYER * N_HEAD)
    for name in METRICS:
        assert flat[f"diag/{name}"] == 2.5
        assert [flat[f"diag/{name}/L{layer}"] for layer in range(N_LAYER)] == [0.5, 2.5, 4.5]
        assert flat[f"diag/{name}/L2/H1"] == 5.0
    assert all(isinstance(value, float) for value in flat.values())
    assert set(flatten_diagnostics(attention_diagnostics(make(), batch()))) == set(flat)
