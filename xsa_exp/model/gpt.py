"""A GPT in the modern nanochat style, with Exclusive Self-Attention in every selected layer.

Features (each a GPTConfig switch, nanochat-like defaults): untied token embedding and lm_head,
parameter-free RMSNorm, no biases, RoPE and QK-norm, ReLU^2 MLP, zero-initialised output
projections, fp32 logits with a tanh soft-cap, value embeddings on alternating layers (always
including the last) and per-layer residual scalars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from xsa_exp.model.xsa import XSASettings
from xsa_exp.model.xsa_op import exclusive_self_attention, initial_theta, learnable_alpha


def value_embedding_layers(n_layer: int, enabled: bool = True) -> list[int]:
    """Alternating layers ending at the last one, or none when value embeddings are off."""
    return [i for i in range(n_layer) if i % 2 == (n_layer - 1) % 2] if enabled else []


# nanochat's starting points, named for why they are what they are:
# the untied output head starts near zero, so the first logits are nearly uniform and the initial loss is
# close to ln(vocab_size) instead of a confident random guess that the first updates must undo;
LM_HEAD_INIT_STD = 0.001
# each block's residual stream starts as itself plus a tenth of the token embedding x0 (x = r_i x + l_i x0,
# r_i = 1, l_i = 0.1): enough of a skip to the input to help early training, small enough not to swamp the
# block outputs; both scalars are learned from there.
X0_LAMBDA_INIT = 0.1


@dataclass
class GPTConfig:
    sequence_len: int = 2048
    vocab_size: int = 32768
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    rope: bool = True
    rope_base: float = 100000.0
    qk_norm: bool = True
    mlp_activation: str = "relu2"  # relu2 | gelu
    value_embeds: bool = True
    ve_gate_channels: int = 12
    resid_scalars: bool = True
    logit_softcap: float = 15.0  # 0 turns the soft-cap off
    zero_init_proj: bool = True
    tie_embeddings: bool = False
    xsa: XSASettings = field(default_factory=XSASettings)  # the layers it runs in, its strength, where v comes from

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ve_layers(self) -> list[int]:
        return value_embedding_layers(self.n_layer, self.value_embeds)

    @classmethod
    def from_config(cls, model_cfg, xsa_cfg) -> GPTConfig:
        """Build from the Hydra `model` and `xsa` nodes; raises ConfigError on a bad layer selection."""
        config = cls(**dict(model_cfg))
        config.xsa = XSASettings.from_config(xsa_cfg, config.n_layer, config.ve_layers)
        return config


def norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


def rotary_cos_sin(seq_len: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return freqs.cos()[None, None], freqs.sin()[None, None]  # (1, 1, T, head_dim/2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


class KVCache:
    """Keys and values of every layer for the positions generated so far (B, H, max_len, D each).

    Stored in the dtype attention computes in (bf16 under bf16 autocast, else the weights'), decided when
    the first keys arrive: under autocast half the memory of fp32, and no cast of the whole prefix at each
    decoding step.

    Rows of different prompt lengths are left-padded: `first[b]` is row b's first real position, and
    no real token attends to the padding before it. RoPE scores depend only on the distance between
    positions, so a padded row computes what it would alone (up to float rounding)."""

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, device, first: torch.Tensor | None = None):
        self.shape = (config.n_layer, batch_size, config.n_head, max_len, config.head_dim)
        self.device = device
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.pos = 0
        self.first = None if first is None or not first.any() else first.to(device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store the new k, v at pos..pos+T and attend the new queries over everything cached so far."""
        if self.k is None:
            # Attention runs in autocast's dtype where autocast is on (SDPA casts q, k, v to it), else in k's.
            kind = k.device.type
            dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else k.dtype
            self.k = torch.zeros(self.shape, device=self.device, dtype=dtype)
            self.v = torch.zeros(self.shape, device=self.device, dtype=dtype)
        T = q.size(2)
        end = self.pos + T
        self.k[layer, :, :, self.pos:end] = k
        self.v[layer, :, :, self.pos:end] = v
        # A no-op where q has the cache's dtype (always, under autocast or not); a guard where it has not.
        keys, values = self.k[layer, :, :, :end].to(q.dtype), self.v[layer, :, :, :end].to(q.dtype)
        if T == 1 and self.first is None:  # one new token sees every cached position
            return F.scaled_dot_product_attention(q, keys, values)
        # New token i (absolute position pos + i) sees positions 0..pos + i ...
        key_pos = torch.arange(end, device=q.device)
        query_pos = torch.arange(self.pos, end, device=q.device)[:, None]
        mask = key_pos <= query_pos  # (T, end)
        if self.first is not None:
            # ... that are not padding; a padding query sees itself, so its softmax stays finite.
            mask = mask & ((key_pos >= self.first[:, None, None]) | (key_pos == query_pos))  # (B, T, end)
            mask = mask[:, None]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.qk_norm = config.qk_norm
        self.c_q = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_k = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_v = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.ve_gate_channels = config.ve_gate_channels
        has_ve = layer_idx in config.ve_layers
        self.ve_gate = nn.Linear(config.ve_gate_channels, config.n_head, bias=False) if has_ve else None
        self.xsa = config.xsa
        self.xsa_on = config.xsa.on(layer_idx)  # off: skipped entirely, bit-identical to standard attention
        self.xsa_theta = None
        if self.xsa_on and self.xsa.learnable:
            theta = initial_theta(self.xsa.alpha, self.xsa.parametrization)
            self.xsa_theta = nn.Parameter(torch.full((config.n_head,), theta))
        # Set by the attention diagnostics pass only (xsa_exp.eval.diagnostics); None in training.
        self.probe = None

    def alpha(self) -> float | torch.Tensor:
        """The XSA strength: a float, or one learnable value per head shaped (1, H, 1, 1)."""
        if self.xsa_theta is None:
            return self.xsa.alpha
        return learnable_alpha(self.xsa_theta, self.xsa.parametrization).view(1, -1, 1, 1)

    @torch.no_grad()
    def head_alphas(self) -> torch.Tensor:
        """The alpha each head applies now, (H,) fp32 on CPU: 0 where XSA is off in this layer."""
        if not self.xsa_on:
            return torch.zeros(self.n_head)
        alpha = self.alpha()
        return torch.full((self.n_head,), alpha) if isinstance(alpha, float) else alpha.detach().float().cpu().flatten()

    def forward(self, x: torch.Tensor, ve: torch.Tensor | None, cos_sin, kv_cache: KVCache | None = None) -> torch.Tensor:
        """cos_sin: rotary tables already sliced to the positions of x. With kv_cache, x holds the
        tokens after those already cached; XSA still projects against each new token's own v_i."""
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.c_k(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = self.c_v(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v_plain = v
        if ve is not None:
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., : self.ve_gate_channels]))  # (B, T, H)
            v = v + gate.transpose(1, 2).unsqueeze(-1) * ve.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = norm(q), norm(k)
        if cos_sin is not None:
            q, k = apply_rotary(q, *cos_sin), apply_rotary(k, *cos_sin)
        if kv_cache is not None:
            y = kv_cache.attend(self.layer_idx, q, k, v)
        elif self.probe is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = self.probe.attend(q, k, v)
        z = y
        if self.xsa_on:
            z = exclusive_self_attention(y, v if self.xsa.value_source == "mixed" else v_plain, self.alpha(), self.xsa.eps)
        if self.probe is not None:
            self.probe.record(y=y, z=z, v=v)
        return self.c_proj(z.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)
        self.relu2 = config.mlp_activation == "relu2"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        h = F.relu(h).square() if self.relu2 else F.gelu(h)
        return self.c_proj(h)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp = MLP(config)

    def forward(self, x, ve, cos_sin, kv_cache=None):
        x = x + self.attn(norm(x), ve, cos_sin, kv_cache)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(config.vocab_size, config.n_embd) for i in config.ve_layers})
        self.resid_lambdas = self.x0_lambdas = None
        if config.resid_scalars:
            self.resid_lambdas = nn.Parameter(torch.ones(config.n_layer))
            self.x0_lambdas = nn.Parameter(torch.full((config.n_layer,), X0_LAMBDA_INIT))
        if config.rope:
            cos, sin = rotary_cos_sin(config.sequence_len, config.head_dim, config.rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """nanochat's init: uniform hidden matrices with the std of N(0, 1/n_embd), zero output projections."""
        c = self.config
        bound = math.sqrt(3) * c.n_embd**-0.5
        if c.tie_embeddings:
            nn.init.normal_(self.wte.weight, std=0.02)  # one matrix serves both ends: GPT-2's init
        else:
            nn.init.normal_(self.wte.weight, std=1.0)
            nn.init.normal_(self.lm_head.weight, std=LM_HEAD_INIT_STD)
        for block in self.blocks:
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
                nn.init.uniform_(lin.weight, -bound, bound)
            for lin in (block.attn.c_proj, block.mlp.c_proj):
                if c.zero_init_proj:
                    nn.init.zeros_(lin.weight)
                else:
                    nn.init.uniform_(lin.weight, -bound, bound)
            if block.attn.ve_gate is not None:
                nn.init.zeros_(block.attn.ve_gate.weight)
        for emb in self.value_embeds.values():
            nn.init.uniform_(emb.weight, -bound, bound)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, loss_reduction: str = "mean",
                kv_cache: KVCache | None = None):
        """Logits (B, T, V) in fp32, or the cross-entropy against targets (-1 = ignore).

        With kv_cache, idx continues the cached sequence (positions start at kv_cache.pos)."""
        start = kv_cache.pos if kv_cache is not None else 0
        end = start + idx.size(1)
        if end > self.config.sequence_len:
            raise ValueError(f"input of {end} tokens exceeds model.sequence_len={self.config.sequence_len}")
        cos_sin = (self.rope_cos[:, :, start:end], self.rope_sin[:, :, start:end]) if self.config.rope else None
        x = norm(self.wte(idx))
        x0 = x
        for i, block in enumerate(self.blocks):
            if self.resid_lambdas is not None:
                x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
            x = block(x, ve, cos_sin, kv_cache)
        if kv_cache is not None:
            kv_cache.pos = end
        logits = self.lm_head(norm(x)).float()
        if self.config.logit_softcap:
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1, reduction=loss_reduction)

    def xsa_alphas(self) -> torch.Tensor:
        """The alpha of every layer and head, (n_layer, n_head): what a learnable run has learned so far."""
        return torch.stack([block.attn.head_alphas() for block in self.blocks])

    def named_param_groups(self) -> dict[str, list[tuple[str, nn.Parameter]]]:
        """Every parameter under exactly one role; the optimizer assigns lr and algorithm per role."""
        groups: dict[str, list] = {"matrix": [], "embedding": [], "value_embedding": [], "unembedding": [],
                                   "resid_scalar": [], "x0_scalar": [], "xsa_theta": []}
        for name, p in self.named_parameters():
            if name.endswith("xsa_theta"):
                role = "xsa_theta"
            elif name.startswith("blocks.") and p.ndim == 2:
                role = "matrix"
            elif name == "wte.weight":
                role = "embedding"
            elif name.startswith("value_embeds."):
                role = "value_embedding"
            elif name == "lm_head.weight":
                role = "unembedding"
            elif name == "resid_lambdas":
                role = "resid_scalar"
            elif name == "x0_lambdas":
                role = "x0_scalar"
            else:
                raise RuntimeError(f"parameter {name} has no optimizer role; add it to GPT.named_param_groups")
            groups[role].append((name, p))
        return {role: params for role, params in groups.items() if params}

    def flops_per_token(self) -> int:
        """Training FLOPs per token, as nanochat and the PaLM appendix count them: 6 x the parameters that multiply
        (hidden matrices + lm_head; forward 2, backward 4) + 12 x layers x width x sequence (attention scores and
        values, forward and backward, without the causal halving). Embedding lookups and scalars are free."""
        c = self.config
        multiplying = self.param_counts()["hidden matrices"] + self.lm_head.weight.numel()
        return 6 * multiplying + 12 * c.n_layer * c.n_embd * c.sequence_len

    def param_counts(self) -> dict[str, int]:
        counts = {role: sum(p.numel() for _, p in params) for role, params in self.named_param_groups().items()}
        return {
            "total": sum(p.numel() for p in self.parameters()),
            "hidden matrices": counts.get("matrix", 0),
            "embeddings (wte + lm_head)": counts.get("embedding", 0) + counts.get("unembedding", 0),
            "value embeddings": counts.get("value_embedding", 0),
            "scalars": sum(counts.get(r, 0) for r in ("resid_scalar", "x0_scalar", "xsa_theta")),
        }
