"""Exclusive Self-Attention, the op (its settings are xsa_exp/model/xsa_settings.py).

z_i = y_i - alpha * (<y_i, v_i> / max(|v_i|^2, eps)) * v_i, per head, on the attention output y
before the output projection. alpha = 0 leaves y untouched; alpha = 1 removes the component of y_i
along the token's own value, so z_i is orthogonal to v_i.
"""

from __future__ import annotations

import math

import torch

from xsa_exp.config.schema import XSAConfig


def exclusive_self_attention(y: torch.Tensor, v: torch.Tensor, alpha: float | torch.Tensor,
                             eps: float = XSAConfig.eps) -> torch.Tensor:
    """Remove alpha times the projection of y onto v along the last dim.

    y: (B, H, T, D); v: (B, H, T, D), or (B, H_kv, T, D) under grouped-query attention, where each group of
    H / H_kv query heads is projected onto its shared value (broadcast, not copied). alpha: a float, or a
    tensor broadcastable to (B, H, T, 1), e.g. (1, H, 1, 1).
    The projection and the subtraction run in fp32 (or the inputs' precision, where higher) and the result
    is cast once: where y is nearly parallel to v, z is a small difference of large terms, and bf16 rounding
    of either term would leave a visible component along v. The clamp keeps v = 0 finite (the projection is
    then 0 and z = y).
    """
    if v.size(1) != y.size(1):  # grouped: (B, H_kv, group, T, D) against (B, H_kv, 1, T, D)
        groups = (v.size(1), -1)
        if isinstance(alpha, torch.Tensor) and alpha.dim() == 4:  # per query head (1, H, 1, 1), or (1, 1, 1, 1)
            alpha = alpha.unflatten(1, groups) if alpha.size(1) > 1 else alpha.unsqueeze(1)
        return _project_out(y.unflatten(1, groups), v.unsqueeze(2), alpha, eps).flatten(1, 2)
    return _project_out(y, v, alpha, eps)


def _project_out(y: torch.Tensor, v: torch.Tensor, alpha: float | torch.Tensor, eps: float) -> torch.Tensor:
    compute = torch.promote_types(torch.promote_types(y.dtype, v.dtype), torch.float32)
    yc, vc = y.to(compute), v.to(compute)
    dot = (yc * vc).sum(dim=-1, keepdim=True)
    norm_sq = (vc * vc).sum(dim=-1, keepdim=True).clamp_min(eps)
    return (yc - (alpha * dot / norm_sq) * vc).to(y.dtype)


def learnable_alpha(theta: torch.Tensor, parametrization: str) -> torch.Tensor:
    """alpha from its trained parameter: sigmoid keeps it in (0, 1) for every theta; tanh (modded-nanogpt's
    signed form) allows (-1, 1), where a negative alpha adds the token's own value instead of removing it."""
    return torch.sigmoid(theta) if parametrization == "sigmoid" else torch.tanh(theta)


def initial_theta(alpha: float, parametrization: str) -> float:
    """The theta at which learnable_alpha starts at alpha (inside (0, 1) for sigmoid, [0, 1) for tanh)."""
    if not (0 < alpha < 1 if parametrization == "sigmoid" else 0 <= alpha < 1):
        raise ValueError(f"initial alpha {alpha} is out of reach of {parametrization}(theta); "
                         "use a value inside (0, 1)")
    return math.log(alpha / (1 - alpha)) if parametrization == "sigmoid" else math.atanh(alpha)
