"""Exclusive Self-Attention: the op and the choice of layers it runs in.

z_i = y_i - alpha * (<y_i, v_i> / max(|v_i|^2, eps)) * v_i, per head, on the attention output y
before the output projection. alpha = 0 leaves y untouched; alpha = 1 removes the component of y_i
along the token's own value, so z_i is orthogonal to v_i.
"""

from __future__ import annotations

import torch

LAYER_SELECTIONS = "all, none, a list of layer indices, first:K, last:K, every:N, ve, non_ve"


def exclusive_self_attention(y: torch.Tensor, v: torch.Tensor, alpha: float | torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Remove alpha times the projection of y onto v along the last dim.

    y, v: (B, H, T, D). alpha: a float, or a tensor broadcastable to (B, H, T, 1), e.g. (1, H, 1, 1).
    The two reductions accumulate in fp32 so that alpha = 1 gives z orthogonal to v under bf16 too;
    the clamp keeps v = 0 finite (the projection is then 0 and z = y).
    """
    dot = (y * v).sum(dim=-1, keepdim=True, dtype=torch.float32)
    norm_sq = (v * v).sum(dim=-1, keepdim=True, dtype=torch.float32).clamp_min(eps)
    coef = (alpha * dot / norm_sq).to(y.dtype)
    return y - coef * v


def resolve_layers(spec, n_layer: int, ve_layers: list[int]) -> list[int]:
    """Turn an `xsa.layers` value into a sorted list of layer indices, or raise ValueError."""
    allowed = f"allowed: {LAYER_SELECTIONS} (n_layer={n_layer})"
    if isinstance(spec, (list, tuple)):
        layers = list(spec)
        for i in layers:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n_layer:
                raise ValueError(f"xsa.layers: layer {i!r} is out of range; use indices in 0..{n_layer - 1}")
        if len(set(layers)) != len(layers):
            raise ValueError(f"xsa.layers: duplicate layer in {layers}; list each layer once")
        return sorted(layers)
    if isinstance(spec, int) and not isinstance(spec, bool):
        return resolve_layers([spec], n_layer, ve_layers)
    if not isinstance(spec, str):
        raise ValueError(f"xsa.layers: cannot read {spec!r}; {allowed}")
    named = {"all": list(range(n_layer)), "none": [], "ve": list(ve_layers),
             "non_ve": [i for i in range(n_layer) if i not in ve_layers]}
    if spec in named:
        return named[spec]
    kind, sep, count = spec.partition(":")
    if sep and kind in ("first", "last", "every") and count.isdigit() and int(count) > 0:
        k = int(count)
        if kind == "every":
            return list(range(0, n_layer, k))
        if k > n_layer:
            raise ValueError(f"xsa.layers: {spec} asks for more layers than the model has; use K <= {n_layer}")
        return list(range(k)) if kind == "first" else list(range(n_layer - k, n_layer))
    raise ValueError(f"xsa.layers: unknown selection {spec!r}; {allowed}")
