"""Attention diagnostics: the study's mechanism evidence, per layer and head, on a fixed batch.

A separate pass, never part of a training step. `attention_diagnostics` sets an `AttentionProbe` as
`probe` on every `CausalSelfAttention`, runs one eager forward under no_grad in eval mode and
removes the probes again, leaving the parameters, the train/eval mode, the RNG state and the fp32
matmul precision as they were. Its fp32 matmuls run in full fp32 even where CUDA training allows
TF32, so that training's figures and evaluate.py's agree. The probe computes attention explicitly
(SDPA's default causal mask and 1/sqrt(D) scale, softmax in fp32) so that it sees the attention
probabilities; memory is O(B H T^2), so keep the batch small. Every metric is an fp32 sum over
tokens divided by their count, so bf16 autocast is fine.

Metrics, each averaged over the batch's tokens (attention rows), per layer and head:
  attn_self_cos  cos(y_i, v_i): the attention output before XSA vs the token's own value
  out_self_cos   cos(z_i, v_i): the same after XSA, ~0 wherever alpha = 1
  diag_attn      a_ii: the attention probability on the token itself
  value_sim      mean over j < i of cos(v_i, v_j), over the rows i >= 1 (row 0 has no earlier token);
                 computed exactly from prefix sums of vhat = v / |v|: vhat_i . (sum_{j<i} vhat_j) / i
  attn_entropy   entropy of the attention row, in nats
v is the value attention used (after value-embedding mixing). With xsa.value_source=plain, XSA
projects out the plain value instead, so out_self_cos is then not ~0 in value-embedding layers.

flatten_diagnostics names the scalars for CSV/wandb: diag/{metric} (mean over layers and heads),
diag/{metric}/L{layer} (mean over the layer's heads) and diag/{metric}/L{layer}/H{head}.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F

from xsa_exp.model import evaluating

METRICS = ("attn_self_cos", "out_self_cos", "diag_attn", "value_sim", "attn_entropy")


class AttentionProbe:
    """Explicit causal attention for one layer, plus per-head fp32 sums of each metric."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}

    def _add(self, name: str, values: torch.Tensor) -> None:
        """values: (B, H, N), one per token; summed over batch and tokens, kept per head."""
        self.sums[name] = self.sums.get(name, 0) + values.float().sum(dim=(0, 2))
        self.counts[name] = self.counts.get(name, 0) + values.size(0) * values.size(2)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """Stands in for the layer's attention; q, k, v: (B, H, T, D), mask: (T, T) bool, True where a query
        sees a key (the layer's window); None: causal."""
        if mask is None:
            mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        # fp32 even under autocast: these probabilities are what we measure.
        with torch.autocast(q.device.type, enabled=False):
            scores = (q.float() @ k.float().transpose(-2, -1)) * q.size(-1) ** -0.5
            a = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = a @ v.float()
        self._add("diag_attn", a.diagonal(dim1=-2, dim2=-1))
        self._add("attn_entropy", -torch.special.xlogy(a, a).sum(dim=-1))  # xlogy: 0 log 0 = 0 where masked
        return y.to(v.dtype)

    def record(self, y: torch.Tensor, z: torch.Tensor, v: torch.Tensor) -> None:
        """y: attention output, z: after XSA (z = y where XSA is off), v: the values; all (B, H, T, D)."""
        y, z, v = y.float(), z.float(), v.float()
        self._add("attn_self_cos", F.cosine_similarity(y, v, dim=-1))
        self._add("out_self_cos", F.cosine_similarity(z, v, dim=-1))
        # Prefix sums instead of a T x T matrix; subtracting vhat_i (not 1) keeps v_i = 0 exact.
        vhat = F.normalize(v, dim=-1)
        earlier = vhat.cumsum(dim=-2) - vhat
        n_earlier = torch.arange(1, v.size(-2), device=v.device)
        self._add("value_sim", (vhat * earlier).sum(dim=-1)[..., 1:] / n_earlier)

    def means(self) -> dict[str, torch.Tensor]:
        """Each metric recorded so far as a per-head mean, (H,) on CPU."""
        return {name: (total / self.counts[name]).cpu() for name, total in self.sums.items()}


@contextmanager
def probes_installed(model):
    """One AttentionProbe per layer, set on model.blocks[i].attn and always removed afterwards."""
    probes = [AttentionProbe() for _ in model.blocks]
    try:
        for block, probe in zip(model.blocks, probes):
            block.attn.probe = probe
        yield probes
    finally:
        for block in model.blocks:
            block.attn.probe = None


@contextmanager
def full_fp32_matmuls():
    """Matmuls of fp32 tensors in fp32, not TF32 ("high", which CUDA training sets), restored afterwards."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@torch.no_grad()
def attention_diagnostics(model, idx: torch.Tensor, autocast=nullcontext) -> dict[str, torch.Tensor]:
    """Every metric in METRICS as an fp32 (n_layer, n_head) tensor on CPU, averaged over idx's tokens.

    idx: (B, T) token ids. autocast: a callable returning the forward's context (as in training)."""
    device = next(model.parameters()).device
    # fork_rng restores the CPU (and this CUDA device's) RNG, so the pass cannot shift training's randomness.
    with evaluating(model), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
            full_fp32_matmuls(), probes_installed(model) as probes, autocast():
        model(idx.to(device))
    means = [probe.means() for probe in probes]
    return {name: torch.stack([m[name] for m in means]) for name in METRICS}


def flatten_diagnostics(diag: dict[str, torch.Tensor]) -> dict[str, float]:
    """Scalars named diag/{metric}, diag/{metric}/L{layer} and diag/{metric}/L{layer}/H{head}."""
    flat = {}
    for name, values in diag.items():
        flat[f"diag/{name}"] = values.mean().item()
        for layer, heads in enumerate(values):
            flat[f"diag/{name}/L{layer}"] = heads.mean().item()
            for head, value in enumerate(heads):
                flat[f"diag/{name}/L{layer}/H{head}"] = value.item()
    return flat
