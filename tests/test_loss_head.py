"""The fused loss head (model.fused_loss_head): lm_head, soft-cap and cross-entropy a chunk of tokens at a time, equal
to the unfused head to fp32 rounding, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

from xsa_exp.model import GPT, GPTConfig, XSASettings
from xsa_exp.model.loss_head import chunk_size, linear_cross_entropy


def unfused(x, weight, targets, softcap, reduction="mean"):
    logits = (x @ weight.to(x.dtype).T).float()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction=reduction)


def inputs(tokens=300, width=16, vocab=200, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, width, generator=generator)
    weight = 2 * torch.randn(vocab, width, generator=generator)  # logits past the soft-cap's knee
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    targets[::7] = -1
    return x, weight, targets


def test_chunks_follow_liger_kernels_rule():
    assert chunk_size(65536, 32768, 768) == 2048 and chunk_size(32768, 32768, 1024) == 1024  # d12, d24 micro-batches
    assert chunk_size(300, 200, 16) == 32 and chunk_size(1, 32768, 768) == 1


@pytest.mark.parametrize("softcap", [15.0, 0.0])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_loss_and_gradients_equal_the_unfused_head_to_fp32_rounding(softcap, reduction):
    x, weight, targets = inputs()
    grads = {}
    for name, head in (("unfused", unfused), ("chunked", linear_cross_entropy)):
        xg, wg = x.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = head(xg, wg, targets, softcap, reduction)
        (0.25 * loss).backward()  # an incoming gradient other than 1, as under gradient accumulation
        grads[name] = loss.detach(), xg.grad, wg.grad
    for ours, theirs in zip(grads["chunked"], grads["unfused"]):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert (grads["chunked"][1][::7] == 0).all()  # ignored targets: no gradient


def test_per_token_losses_without_gradients_and_a_clear_error_with_them():
    x, weight, targets = inputs()
    torch.testing.assert_close(linear_cross_entropy(x, weight, targets, 15.0, "none"),
                               unfused(x, weight, targets, 15.0, "none"), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="not per token"):
        linear_cross_entropy(x.requires_grad_(), weight, targets, 15.0, "none")


def test_bf16_inputs_multiply_in_bf16_and_return_an_fp32_weight_gradient():
    """Under bf16-compute x is bf16 and lm_head's weight the fp32 master: the logits are a bf16 matmul, as the unfused
    head's, and the weight's gradient, summed over the chunks in fp32, comes back fp32."""
    x, weight, targets = inputs()
    grads = {}
    for name, head in (("unfused", unfused), ("chunked", linear_cross_entropy)):
        xg, wg = x.bfloat16().requires_grad_(), weight.clone().requires_grad_()
        loss = head(xg, wg, targets, 15.0)
        loss.backward()
        grads[name] = loss.detach(), xg.grad, wg.grad
    assert grads["chunked"][1].dtype == torch.bfloat16 and grads["chunked"][2].dtype == torch.float32
    for ours, theirs in zip(grads["chunked"], grads["unfused"]):
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-3)


def test_the_bf16_head_compiles_with_inductor_and_equals_eager():
    """The compiled training forward takes the chunked head; its fp32 sum of bf16 products is an op inductor does not
    lower (add_product_fp32), on CUDA addmm's out_dtype overload, which inductor cannot compile."""
    from torch._inductor.utils import run_and_get_code

    x, weight, targets = inputs(tokens=64, vocab=32)  # two chunks: each chunk is its own kernels to build
    results = {}
    for name in ("eager", "compiled"):
        xg, wg = x.bfloat16().requires_grad_(), weight.clone().requires_grad_()
        if name == "eager":
            loss = linear_cross_entropy(xg, wg, targets, 15.0)
        else:
            loss, code = run_and_get_code(torch.compile(linear_cross_entropy, fullgraph=True), xg, wg, targets, 15.0)
            # called as the op it is, whatever it runs on the device, never lowered by inductor
            assert "torch.ops.xsa_exp.add_product_fp32" in "\n".join(code)
        loss.backward()
        results[name] = loss.detach(), xg.grad, wg.grad
    for ours, theirs in zip(results["compiled"], results["eager"]):
        torch.testing.assert_close(ours, theirs, rtol=1e-2, atol=1e-3)


def test_the_model_with_the_fused_head_trains_as_with_the_unfused_one():
    """Same loss and gradients for every parameter through the whole model (stack switches, XSA, padding targets)."""
    grads = {}
    idx = torch.randint(0, 300, (2, 65))
    targets = idx[:, 1:].clone()
    targets[0, :10] = -1
    for fused in (False, True):
        torch.manual_seed(0)
        model = GPT(GPTConfig(sequence_len=64, vocab_size=300, n_layer=2, n_head=2, n_embd=32, smear=True,
                              backout=True, zero_init_proj=False, fused_loss_head=fused,
                              xsa=XSASettings(layers=[0, 1], alpha=1.0)))
        loss = model(idx[:, :-1], targets)
        loss.backward()
        grads[fused] = loss.detach(), {n: p.grad for n, p in model.named_parameters()}
        logits = model(idx[:, :-1])  # without targets: the logits, whatever the head
        assert logits.shape == (2, 64, 300) and logits.dtype == torch.float32
    torch.testing.assert_close(grads[True][0], grads[False][0], rtol=1e-6, atol=1e-6)
    for name, grad in grads[False][1].items():
        torch.testing.assert_close(grads[True][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)
