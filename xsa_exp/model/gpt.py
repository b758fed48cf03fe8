"""A GPT in the modern nanochat style, with Exclusive Self-Attention in every selected layer.

Features (each a GPTConfig switch, nanochat-like defaults): untied token embedding and lm_head,
parameter-free RMSNorm, no biases, RoPE and QK-norm, ReLU^2 MLP, zero-initialised output
projections, fp32 logits with a tanh soft-cap, value embeddings on alternating layers (always
including the last) and per-layer residual scalars. Off by default, on in nanochat's April 2026 stack
(conf/stack/nanochat_2604.yaml): sliding-window attention by layer, a q/k scale after QK-norm,
grouped-query attention, smear (a gated share of the previous token's embedding) and backout (the
mid-network residual subtracted before the final norm).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from xsa_exp.config.schema import ModelConfig, XSAConfig
from xsa_exp.model.layout import SMEAR_GATE_CHANNELS, value_embedding_layers
from xsa_exp.model.loss_head import linear_cross_entropy
from xsa_exp.model.xsa_op import exclusive_self_attention, initial_theta, learnable_alpha
from xsa_exp.model.xsa_settings import XSASettings


@dataclass(frozen=True)
class ParamRole:
    """What the optimizer does with a kind of parameter. The name is its learning-rate key, optim.lr.<name>."""
    name: str
    owns: Callable[[str, nn.Parameter], bool]  # (parameter name, parameter) -> whether it has this role
    counted_as: str                             # its line in GPT.param_counts
    muon: bool = False                          # orthogonalized by Muon (unless optim.matrix_algorithm=adamw)
    width_scaled_lr: bool = False               # AdamW lr x (n_embd / 768)^-0.5 (optim.width_lr_scaling), nanochat's
    batch_scaled_lr: bool = True                # lr x sqrt(batch / 2^19) under optim.nanochat_transfer, as nanochat


# Every parameter has exactly one role (GPT.named_param_groups checks it); the optimizer's groups follow this order.
PARAM_ROLES = (
    ParamRole("matrix", lambda name, p: name.startswith("blocks.") and p.ndim == 2, "hidden matrices", muon=True),
    ParamRole("embedding", lambda name, p: name == "wte.weight", "embeddings (wte + lm_head)", width_scaled_lr=True),
    ParamRole("value_embedding", lambda name, p: name.startswith("value_embeds."), "value embeddings",
              width_scaled_lr=True),
    ParamRole("unembedding", lambda name, p: name == "lm_head.weight", "embeddings (wte + lm_head)",
              width_scaled_lr=True),
    ParamRole("resid_scalar", lambda name, p: name == "resid_lambdas", "scalars"),
    ParamRole("x0_scalar", lambda name, p: name == "x0_lambdas", "scalars"),
    # nanochat keeps these at a fixed lr at every batch
    ParamRole("smear_backout", lambda name, p: name in ("smear_gate.weight", "smear_lambda", "backout_lambda"),
              "scalars", batch_scaled_lr=False),
    ParamRole("xsa_theta", lambda name, p: name.endswith(".xsa_theta"), "scalars", batch_scaled_lr=False),
)
ROLE_BY_NAME = {role.name: role for role in PARAM_ROLES}


# nanochat's starting points, named for why they are what they are:
# the untied output head starts near zero, so the first logits are nearly uniform and the initial loss is
# close to ln(vocab_size) instead of a confident random guess that the first updates must undo;
LM_HEAD_INIT_STD = 0.001
# each block's residual stream starts as itself plus a tenth of the token embedding x0 (x = r_i x + l_i x0,
# r_i = 1, l_i = 0.1 unless model.resid_lambda_init / x0_lambda_init say otherwise): enough of a skip to the
# input to help early training, small enough not to swamp the block outputs; both scalars are learned from there.
# The smear gate starts slightly open, like the value-embedding gates of the April 2026 stack (nanochat's value
# after 94b73ad, which leaves this weight uninitialised).
SMEAR_GATE_INIT_MAX = 0.02


@dataclass
class GPTConfig(ModelConfig):
    """The schema's `model` keys (xsa_exp/config/schema.py: every switch's default and meaning, once; the shape is the
    depth preset's, no default) and the resolved XSA settings."""
    xsa: XSASettings = field(default_factory=XSASettings)  # the layers it runs in, its strength, where v comes from

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ve_layers(self) -> list[int]:
        return value_embedding_layers(self.n_layer, self.value_embeds)

    @property
    def max_input_len(self) -> int:
        """The longest input the model takes: nanochat's RoPE tables cover 10x the training length, and its CORE
        scores a longer prompt whole, so ours does too."""
        return 10 * self.sequence_len

    def windows(self, length: int | None = None) -> list[int | None]:
        """Each layer's sliding window as nanochat counts it (a query sees itself and `window` earlier keys): S a
        quarter of the training length rounded up to 128 (FlashAttention's tile), L the training length. None where
        the window covers an input of `length` tokens whole (the training length by default, and any shorter
        input); only a longer input (a CORE prompt) meets the L layers' window."""
        short = -(-self.sequence_len // 4 // 128) * 128
        windows = [short if self.window_pattern[i % len(self.window_pattern)] == "S" else self.sequence_len
                   for i in range(self.n_layer)]
        windows[-1] = self.sequence_len
        longest = max(length or 0, self.sequence_len)
        return [None if w >= longest - 1 else w for w in windows]

    @classmethod
    def of(cls, model: ModelConfig, xsa: XSAConfig) -> GPTConfig:
        """From the schema's typed `model` and `xsa` settings; raises ConfigError on a bad layer selection."""
        config = cls(**dataclasses.asdict(model))
        config.xsa = XSASettings.of(xsa, config.n_layer, config.ve_layers)
        return config


class CastedLinear(nn.Linear):
    """nn.Linear whose weight is cast to the input's dtype in the matmul, as nanochat's Linear: the weight stays the
    fp32 master (its optimizer state fp32 too) and a bf16 input multiplies in bf16 (GPT.compute_in). With an fp32
    input, or under autocast, it is nn.Linear: the cast does nothing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype))


def layer_ramp(first: float, last: float, n_layer: int) -> torch.Tensor:
    """One value per layer, linear from `first` at layer 0 to `last` at the last layer (nanochat's scalar inits)."""
    return torch.tensor([first - (first - last) * i / max(n_layer - 1, 1) for i in range(n_layer)])


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


def window_mask(query_pos: torch.Tensor, key_len: int, window: int | None) -> torch.Tensor:
    """(T, key_len) bool: query at absolute position p sees keys p - window .. p (all of 0 .. p when window is None)."""
    key_pos = torch.arange(key_len, device=query_pos.device)
    mask = key_pos <= query_pos[:, None]
    if window is not None:
        mask = mask & (query_pos[:, None] - key_pos <= window)
    return mask


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
                     block_mask=None) -> torch.Tensor:
    """Causal attention of q (B, H, T, D) over k, v (B, H_kv, T, D), each query within its window. Full context
    is SDPA's causal kernel. A window is FlexAttention's block-sparse kernel where a block mask for this length
    is given (the training forward on CUDA, GPT.use_block_masks; the dense-mask SDPA that nanochat warns about
    skips nothing), else SDPA with a boolean mask: evaluations, whose lengths change from call to call and would
    recompile the kernel each time, and CPUs, where FlexAttention has no backward (the cost there: BENCHMARKS.md,
    "Sliding windows on CPU")."""
    gqa = k.size(1) != q.size(1)
    if window is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if block_mask is not None and tuple(block_mask.seq_lengths) == (q.size(2), k.size(2)):
        # inside the compiled training forward, the plain op: the outer compile makes it the kernel, and tracing a
        # torch.compile'd function breaks the graph on some torch versions
        flex = flex_attention if torch.compiler.is_compiling() else compiled_flex_attention()
        return flex(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    mask = window_mask(torch.arange(q.size(2), device=q.device), k.size(2), window)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


@functools.cache
def compiled_flex_attention():
    """FlexAttention runs as a kernel only compiled (eager, it computes every score)."""
    return torch.compile(flex_attention, dynamic=False)


def window_block_mask(seq_len: int, window: int, device: torch.device):
    """FlexAttention's block mask of a causal window over seq_len positions (built outside any compiled graph:
    built inside one, it would break the graph at every windowed layer)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def sliding_window(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx <= window)
    return create_block_mask(sliding_window, B=None, H=None, Q_LEN=seq_len, KV_LEN=seq_len, device=device)


class KVCache:
    """Keys and values of every layer for the positions generated so far (B, H_kv, max_len, D each), and, for
    smear, the last position's token embedding.

    Stored in the dtype attention computes in, v's (q and k are cast to it: CausalSelfAttention.forward), decided
    when the first keys arrive: bf16 under bf16 autocast or bf16-compute, half the memory of fp32. With grouped-query
    attention it holds the n_kv_head heads, not one per query head.

    Rows of different prompt lengths are left-padded: `first[b]` is row b's first real position, and
    no real token attends to (or smears in) the padding before it. RoPE scores depend only on the distance
    between positions, so a padded row computes what it would alone (up to float rounding)."""

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, device, first: torch.Tensor | None = None):
        self.shape = (config.n_layer, batch_size, config.kv_heads, max_len, config.head_dim)
        self.device = device
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.prev_embedding: torch.Tensor | None = None  # (B, 1, C): the embedding at pos - 1, for smear
        self.pos = 0
        self.first = None if first is None or not first.any() else first.to(device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None) -> torch.Tensor:
        """Store the new k, v at pos..pos+T and attend the new queries over the cached positions in their window."""
        if self.k is None:
            self.k = torch.zeros(self.shape, device=self.device, dtype=v.dtype)
            self.v = torch.zeros(self.shape, device=self.device, dtype=v.dtype)
        T = q.size(2)
        end = self.pos + T
        self.k[layer, :, :, self.pos:end] = k
        self.v[layer, :, :, self.pos:end] = v
        keys, values = self.k[layer, :, :, :end], self.v[layer, :, :, :end]
        gqa = keys.size(1) != q.size(1)
        if T == 1 and self.first is None and (window is None or window >= end - 1):  # one token sees every cached one
            return F.scaled_dot_product_attention(q, keys, values, enable_gqa=gqa)
        # New token i (absolute position pos + i) sees positions pos + i - window .. pos + i ...
        query_pos = torch.arange(self.pos, end, device=q.device)
        mask = window_mask(query_pos, end, window)  # (T, end)
        if self.first is not None:
            # ... that are not padding; a padding query sees itself, so its softmax stays finite.
            key_pos = torch.arange(end, device=q.device)
            mask = mask & ((key_pos >= self.first[:, None, None]) | (key_pos == query_pos[:, None]))  # (B, T, end)
            mask = mask[:, None]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        self.qk_norm, self.qk_scale = config.qk_norm, config.qk_scale
        self.sequence_len = config.sequence_len
        self.window = config.windows()[layer_idx]  # for inputs up to the training length
        self.long_input_window = config.windows(config.max_input_len)[layer_idx]  # for longer ones (CORE's prompts)
        self.block_mask = None  # FlexAttention's mask for the training length (GPT.use_block_masks), windows only
        kv_dim = self.n_kv_head * self.head_dim
        self.c_q = CastedLinear(config.n_embd, config.n_embd, bias=False)
        self.c_k = CastedLinear(config.n_embd, kv_dim, bias=False)
        self.c_v = CastedLinear(config.n_embd, kv_dim, bias=False)
        self.c_proj = CastedLinear(config.n_embd, config.n_embd, bias=False)
        self.ve_gate_channels = config.ve_gate_channels
        has_ve = layer_idx in config.ve_layers
        self.ve_gate = CastedLinear(config.ve_gate_channels, self.n_kv_head, bias=False) if has_ve else None
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

    def forward(self, x: torch.Tensor, ve: torch.Tensor | None, cos_sin,
                kv_cache: KVCache | None = None) -> torch.Tensor:
        """cos_sin: rotary tables already sliced to the positions of x. With kv_cache, x holds the
        tokens after those already cached; XSA still projects against each new token's own v_i (with GQA,
        each query head against its group's value)."""
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v_plain = v
        if ve is not None:
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., : self.ve_gate_channels]))  # (B, T, H_kv)
            # ve in v's dtype: an fp32 embedding would make v fp32 under bf16 autocast (attention and XSA in fp32,
            # a recompile per dtype)
            ve = ve.to(v.dtype).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
            v = v + gate.transpose(1, 2).unsqueeze(-1) * ve
        if self.qk_norm:
            q, k = norm(q), norm(k)
        if cos_sin is not None:
            q, k = apply_rotary(q, *cos_sin), apply_rotary(k, *cos_sin)
        if self.qk_scale != 1.0:  # sharper attention, the scale split between q and k
            q, k = q * self.qk_scale, k * self.qk_scale
        # every attention path in v's dtype: under CUDA autocast rms_norm returns fp32 (torch >= 2.12), and q and k
        # would reach attention in fp32 (FlexAttention, the KV cache) while v is bf16
        q, k = q.to(v.dtype), k.to(v.dtype)
        length = T + (kv_cache.pos if kv_cache is not None else 0)
        window = self.window if length <= self.sequence_len else self.long_input_window
        if kv_cache is not None:
            y = kv_cache.attend(self.layer_idx, q, k, v, window)
        elif self.probe is None:
            y = causal_attention(q, k, v, window, self.block_mask if self.training else None)
        else:
            y = self.probe.attend(q, self.per_query_head(k), self.per_query_head(v),
                                  window_mask(torch.arange(T, device=x.device), T, window))
        z = y
        if self.xsa_on:
            z = exclusive_self_attention(y, v if self.xsa.value_source == "mixed" else v_plain, self.alpha(),
                                         self.xsa.eps)
        if self.probe is not None:
            self.probe.record(y=y, z=z, v=self.per_query_head(v))
        return self.c_proj(z.transpose(1, 2).reshape(B, T, C))

    def per_query_head(self, t: torch.Tensor) -> torch.Tensor:
        """(B, H_kv, T, D) -> (B, H, T, D), each key/value head repeated for its query group (diagnostics only)."""
        return t.repeat_interleave(self.n_head // self.n_kv_head, dim=1)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = CastedLinear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = CastedLinear(4 * config.n_embd, config.n_embd, bias=False)
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
        self.embedding_dtype: torch.dtype | None = None  # what the token embedding's lookups compute in (compute_in)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.lm_head = CastedLinear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        kv_dim = config.kv_heads * config.head_dim
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(config.vocab_size, kv_dim) for i in config.ve_layers})
        self.resid_lambdas = self.x0_lambdas = None
        if config.resid_scalars:
            self.resid_lambdas = nn.Parameter(layer_ramp(*config.resid_lambda_init, config.n_layer))
            self.x0_lambdas = nn.Parameter(layer_ramp(*config.x0_lambda_init, config.n_layer))
        self.smear_gate = self.smear_lambda = self.backout_lambda = None
        if config.smear:  # lambda from 0: the model starts without it
            self.smear_gate = CastedLinear(SMEAR_GATE_CHANNELS, 1, bias=False)
            self.smear_lambda = nn.Parameter(torch.zeros(1))
        if config.backout:
            self.backout_lambda = nn.Parameter(torch.full((1,), 0.2))
        if config.rope:
            cos, sin = rotary_cos_sin(config.max_input_len, config.head_dim, config.rope_base)
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
            nn.init.normal_(self.wte.weight, std=c.wte_init_std)
            nn.init.normal_(self.lm_head.weight, std=LM_HEAD_INIT_STD)
        for block in self.blocks:
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v):
                nn.init.uniform_(lin.weight, -bound, bound)
            nn.init.uniform_(block.mlp.c_fc.weight, -bound * c.fc_init_scale, bound * c.fc_init_scale)
            for lin in (block.attn.c_proj, block.mlp.c_proj):
                if c.zero_init_proj:
                    nn.init.zeros_(lin.weight)
                else:
                    nn.init.uniform_(lin.weight, -bound, bound)
        for emb in self.value_embeds.values():
            nn.init.uniform_(emb.weight, -bound, bound)
        for block in self.blocks:  # after the value embeddings: the order nanochat draws them in
            if block.attn.ve_gate is not None:
                if c.ve_gate_init > 0:
                    nn.init.uniform_(block.attn.ve_gate.weight, 0.0, c.ve_gate_init)
                else:
                    nn.init.zeros_(block.attn.ve_gate.weight)
        if self.smear_gate is not None:
            nn.init.uniform_(self.smear_gate.weight, 0.0, SMEAR_GATE_INIT_MAX)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, loss_reduction: str = "mean",
                kv_cache: KVCache | None = None):
        """Logits (B, T, V) in fp32, or the cross-entropy against targets (-1 = ignore); with model.fused_loss_head,
        the cross-entropy without the logits (xsa_exp/model/loss_head.py).

        With kv_cache, idx continues the cached sequence (positions start at kv_cache.pos)."""
        start = kv_cache.pos if kv_cache is not None else 0
        end = start + idx.size(1)
        if end > self.config.max_input_len:
            raise ValueError(f"input of {end} tokens exceeds {self.config.max_input_len}, 10x "
                             f"model.sequence_len={self.config.sequence_len}")
        cos_sin = (self.rope_cos[:, :, start:end], self.rope_sin[:, :, start:end]) if self.config.rope else None
        x = self.wte(idx)
        if self.embedding_dtype is not None:  # bf16-compute with a tied (fp32) wte: the stream starts in bf16 still
            x = x.to(self.embedding_dtype)
        x = norm(x)
        if self.smear_gate is not None:
            x = self.smear(x, start, kv_cache)
        x0 = x
        backout_layer = self.config.n_layer // 2 if self.backout_lambda is not None else None
        for i, block in enumerate(self.blocks):
            if self.resid_lambdas is not None:
                x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
            x = block(x, ve, cos_sin, kv_cache)
            if i == backout_layer:
                x_backout = x
        if backout_layer is not None:  # remove the low-level features of the first half before the logits
            x = x - self.backout_lambda.to(x.dtype) * x_backout
        if kv_cache is not None:
            kv_cache.pos = end
        x = norm(x)
        if targets is not None and self.config.fused_loss_head:
            return linear_cross_entropy(x.flatten(0, 1), self.lm_head.weight, targets.reshape(-1),
                                        self.config.logit_softcap, loss_reduction)
        logits = self.lm_head(x).float()
        if self.config.logit_softcap:
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1,
                               reduction=loss_reduction)

    @torch.no_grad()
    def compute_in(self, dtype: torch.dtype) -> None:
        """Compute in dtype as nanochat does, without autocast (trainer.precision=bf16-compute): the token and value
        embeddings are stored in dtype, so the residual stream and every activation computed from it are dtype, while
        the matrices keep fp32 master weights and optimizer state, cast to dtype in each matmul (CastedLinear), and
        the scalars stay fp32 (a 0-dim scalar times a bf16 tensor is bf16). The logits are cast to fp32 for the
        soft-cap and the loss. A tied token embedding is lm_head's matrix too, whose fp32 master weight stays: it is
        kept fp32 and its lookups are cast to dtype."""
        self.embedding_dtype = dtype
        if not self.config.tie_embeddings:
            self.wte.to(dtype)
        for embedding in self.value_embeds.values():
            embedding.to(dtype)

    def smear(self, x: torch.Tensor, start: int, kv_cache: KVCache | None) -> torch.Tensor:
        """x_p + lambda * sigmoid(gate(x_p[:24])) * x_{p-1} at every position p >= 1 (cheap bigram information)."""
        prev = x[:, :-1]
        if kv_cache is not None:
            if kv_cache.prev_embedding is not None:
                prev = torch.cat([kv_cache.prev_embedding, prev], dim=1)
            kv_cache.prev_embedding = x[:, -1:]
        n = prev.size(1)  # the last n positions of x have a previous token
        if n == 0:
            return x
        current = x[:, -n:]
        gate = torch.sigmoid(self.smear_gate(current[..., :SMEAR_GATE_CHANNELS]))
        share = self.smear_lambda.to(x.dtype) * gate * prev
        if kv_cache is not None and kv_cache.first is not None:  # a row's first real token has no previous one
            pos = torch.arange(start + x.size(1) - n, start + x.size(1), device=x.device)
            share = share * (pos - 1 >= kv_cache.first[:, None]).unsqueeze(-1)
        return torch.cat([x[:, : x.size(1) - n], current + share], dim=1)

    def xsa_alphas(self) -> torch.Tensor:
        """The alpha of every layer and head, (n_layer, n_head): what a learnable run has learned so far."""
        return torch.stack([block.attn.head_alphas() for block in self.blocks])

    def residual_scalars(self) -> dict[str, torch.Tensor]:
        """The learned mix before each block, x = resid_lambda[i] x + x0_lambda[i] x0: {"resid": (n_layer,),
        "x0": (n_layer,)}, or {} without model.resid_scalars."""
        if self.resid_lambdas is None:
            return {}
        return {"resid": self.resid_lambdas.detach(), "x0": self.x0_lambdas.detach()}

    def named_param_groups(self) -> dict[str, list[tuple[str, nn.Parameter]]]:
        """The parameters of each role in PARAM_ROLES (roles without parameters left out)."""
        groups: dict[str, list] = {role.name: [] for role in PARAM_ROLES}
        for name, p in self.named_parameters():
            roles = [role.name for role in PARAM_ROLES if role.owns(name, p)]
            if len(roles) != 1:
                raise RuntimeError(f"parameter {name} has {len(roles)} optimizer roles ({roles}); give it exactly "
                                   "one in PARAM_ROLES (xsa_exp/model/gpt.py)")
            groups[roles[0]].append((name, p))
        return {role: params for role, params in groups.items() if params}

    def use_block_masks(self, seq_len: int, device: torch.device) -> None:
        """Give each windowed layer FlexAttention's block mask for training inputs of seq_len tokens on device,
        built here once, outside any compiled graph; the training forward then attends through it (on CUDA:
        FlexAttention has no CPU backward)."""
        masks = {}
        for block in self.blocks:
            window = block.attn.window
            if window is not None:
                if window not in masks:
                    masks[window] = window_block_mask(seq_len, window, device)
                block.attn.block_mask = masks[window]

    def flops_per_token(self) -> int:
        """Training FLOPs per token, as nanochat and the PaLM appendix count them: 6 x the parameters that multiply
        (hidden matrices + lm_head; forward 2, backward 4) + 12 x width x the keys each layer's queries see
        (attention scores and values, forward and backward, without the causal halving: the sequence, or the
        window where a layer has one). Embedding lookups, gates of one output and scalars are free."""
        c = self.config
        multiplying = self.param_counts()["hidden matrices"] + self.lm_head.weight.numel()
        return 6 * multiplying + sum(12 * c.n_embd * min(w or c.sequence_len, c.sequence_len) for w in c.windows())

    def param_counts(self) -> dict[str, int]:
        counts = {"total": sum(p.numel() for p in self.parameters())}
        counts.update({role.counted_as: 0 for role in PARAM_ROLES})
        for role, params in self.named_param_groups().items():
            counts[ROLE_BY_NAME[role].counted_as] += sum(p.numel() for _, p in params)
        return counts
