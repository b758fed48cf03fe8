"""Precisions: the fp32 path is the op sequence it was before bf16-compute and the fused loss head existed (the CPU
study presets keep their bits), bf16-compute computes in bf16 from the embeddings on with fp32 master matrices, and
q and k reach attention in v's dtype on every path."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from xsa_exp.eval.diagnostics import AttentionProbe, attention_diagnostics
from xsa_exp.generate import generate
from xsa_exp.model import GPT, GPTConfig, KVCache, XSASettings, gpt
from xsa_exp.precision import lightning_precision, prepare

FP32_OPS = Path(__file__).parent / "fixtures" / "fp32_ops"
STACK = dict(window_pattern="SSSL", qk_scale=1.2, smear=True, backout=True, wte_init_std=0.8, fc_init_scale=0.4,
             resid_lambda_init=(1.15, 1.05), x0_lambda_init=(0.2, 0.05), ve_gate_init=0.02)


class OpLog(TorchDispatchMode):
    """Every aten op that runs, with its outputs' dtypes and shapes."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = [f"{t.dtype}{list(t.shape)}".replace("torch.", "") for t in tree_leaves(out)
                  if isinstance(t, torch.Tensor)]
        self.ops.append(f"{func} {' '.join(shapes)}")
        return out


def model_of(stack: bool, **switches) -> GPT:
    """Two layers: a windowed one without and a full one with value embeddings (window 128 of 256 positions)."""
    torch.manual_seed(0)
    return GPT(GPTConfig(sequence_len=256, vocab_size=512, n_layer=2, n_head=2, n_embd=64,
                         xsa=XSASettings(layers=[0, 1], alpha=1.0), **(STACK if stack else {}), **switches))


@pytest.mark.parametrize("stack", [False, True], ids=["classic", "nanochat_2604"])
def test_the_fp32_training_forward_and_backward_are_the_op_sequence_of_before(stack):
    """The fixtures were recorded at db5b7c3, before CastedLinear, the casts to v's and x's dtype and the fused loss
    head: in fp32 with the head unfused, every one of them does nothing, op for op (machine-independent, unlike the
    bits, which the study presets' committed runs check: a rerun of one gives its val/bpb to the last digit). One
    edit since: the RoPE tables cover 10x the training length, so their first 256 positions are a slice, not an
    alias."""
    idx = torch.randint(0, 512, (2, 257), generator=torch.Generator().manual_seed(0))
    model = model_of(stack)
    log = OpLog()
    with log:
        model(idx[:, :-1], idx[:, 1:]).backward()
    expected = (FP32_OPS / f"{'nanochat_2604' if stack else 'classic'}.txt").read_text().splitlines()
    assert log.ops == expected


def test_bf16_compute_stores_the_embeddings_in_bf16_and_keeps_fp32_master_matrices():
    model = model_of(True)
    prepare(model, "bf16-compute")
    bf16 = {name for name, p in model.named_parameters() if p.dtype == torch.bfloat16}
    assert bf16 == {"wte.weight", "value_embeds.1.weight"}  # everything else, matrices and scalars, fp32
    assert lightning_precision("bf16-compute") == "32-true" and lightning_precision("bf16-mixed") == "bf16-mixed"
    seen = []
    for block in model.blocks:
        block.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    idx = torch.randint(0, 512, (2, 257))
    loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert seen == [torch.bfloat16] * 2 and loss.dtype == torch.float32  # the residual stream; the loss in fp32
    assert model(idx[:, :8]).dtype == torch.float32  # logits cast for the soft-cap
    assert all(p.grad.dtype == p.dtype for p in model.parameters())  # fp32 gradients for the fp32 masters


def test_bf16_compute_with_tied_embeddings_keeps_the_shared_matrix_an_fp32_master():
    """wte is lm_head too: it stays fp32 (and its gradient), and the residual stream still computes in bf16."""
    model = model_of(True, tie_embeddings=True)
    prepare(model, "bf16-compute")
    assert model.lm_head.weight is model.wte.weight and model.wte.weight.dtype == torch.float32
    assert {name for name, p in model.named_parameters() if p.dtype == torch.bfloat16} == {"value_embeds.1.weight"}
    seen = []
    model.blocks[0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    idx = torch.randint(0, 512, (2, 257))
    model(idx[:, :-1], idx[:, 1:]).backward()
    assert seen == [torch.bfloat16] and model.wte.weight.grad.dtype == torch.float32


def test_bf16_compute_is_fp32_to_bf16_rounding():
    idx = torch.randint(0, 512, (2, 256))
    fp32 = model_of(True, zero_init_proj=False).eval()
    bf16 = model_of(True, zero_init_proj=False).eval()
    prepare(bf16, "bf16-compute")
    with torch.no_grad():
        torch.testing.assert_close(bf16(idx), fp32(idx), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("setting", ["bf16-compute", "CUDA autocast"])
def test_q_and_k_reach_attention_in_v_dtype_on_every_path(monkeypatch, setting):
    """Training, evaluation, the KV cache and the diagnostics probe. Under CUDA autocast rms_norm returns fp32 (torch
    >= 2.12: simulated here, since CPU autocast leaves it in bf16) while v comes bf16 from its matmul."""
    seen = []
    # where each path takes q, k, v among its positional arguments
    for path, owner, name, first in (("sdpa", gpt, "causal_attention", 0), ("cache", KVCache, "attend", 2),
                                     ("probe", AttentionProbe, "attend", 1)):
        def recorded(*args, _path=path, _original=getattr(owner, name), _first=first, **kwargs):
            seen.append((_path, tuple(t.dtype for t in args[_first:_first + 3])))
            return _original(*args, **kwargs)
        monkeypatch.setattr(owner, name, recorded)
    model = model_of(True, zero_init_proj=False)
    context = torch.autocast("cpu", dtype=torch.bfloat16, enabled=setting == "CUDA autocast")
    if setting == "bf16-compute":
        prepare(model, "bf16-compute")
    else:
        monkeypatch.setattr(gpt, "norm", lambda x: F.rms_norm(x.float(), (x.size(-1),)))
    idx = torch.randint(0, 512, (1, 200))
    with context:
        model.train()(idx[:, :-1], idx[:, 1:])
        with torch.no_grad():
            model.eval()(idx)
            generate(model, idx[0, :150].tolist(), max_new_tokens=3)
        attention_diagnostics(model, idx)
    assert {path for path, _ in seen} == {"sdpa", "cache", "probe"}
    assert {dtypes for _, dtypes in seen} == {(torch.bfloat16,) * 3}
