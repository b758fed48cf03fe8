"""Exclusive Self-Attention's settings: XSASettings, built once from a run's `xsa` config, with the
layers it runs in resolved, and the one rule for whether it runs in a layer. The op is xsa_op.py.

No torch here: the report applies the same rule to a run's run.json.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from xsa_exp.config.schema import XSAConfig
from xsa_exp.errors import ConfigError

LAYER_SELECTIONS = "all, none, a list of layer indices, first:K, last:K, every:N, ve, non_ve"


@dataclass
class XSASettings(XSAConfig):
    """What a model's XSA does: the schema's `xsa` keys (xsa_exp/config/schema.py: each default and meaning, once), with
    the layer selection resolved to the indices it runs in."""
    layers: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, xsa: XSAConfig, n_layer: int, ve_layers: list[int]) -> XSASettings:
        """From the schema's typed `xsa` settings, the layer selection resolved for n_layer (ConfigError if it cannot
        be)."""
        return cls(**{**asdict(xsa), "layers": resolve_layers(xsa.layers, n_layer, ve_layers)})

    def on(self, layer: int) -> bool:
        """Whether XSA runs in this layer: selected, and not a fixed alpha of 0. Where it does not run it is
        skipped entirely (not multiplied by zero), so that layer is bit-identical to standard attention."""
        return layer in self.layers and (self.learnable or self.alpha != 0.0)

    @property
    def active(self) -> bool:
        """Whether XSA runs in any layer (else the model is standard attention)."""
        return any(self.on(layer) for layer in self.layers)


def resolve_layers(spec, n_layer: int, ve_layers: list[int]) -> list[int]:
    """Turn an `xsa.layers` value into a sorted list of layer indices, or raise ConfigError."""
    allowed = f"allowed: {LAYER_SELECTIONS} (n_layer={n_layer})"
    if isinstance(spec, (list, tuple)):
        layers = list(spec)
        for i in layers:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n_layer:
                raise ConfigError(f"xsa.layers: layer {i!r} is out of range; use indices in 0..{n_layer - 1}")
        if len(set(layers)) != len(layers):
            raise ConfigError(f"xsa.layers: duplicate layer in {layers}; list each layer once")
        return sorted(layers)
    if isinstance(spec, int) and not isinstance(spec, bool):
        return resolve_layers([spec], n_layer, ve_layers)
    if not isinstance(spec, str):
        raise ConfigError(f"xsa.layers: cannot read {spec!r}; {allowed}")
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
            raise ConfigError(f"xsa.layers: {spec} asks for more layers than the model has; use K <= {n_layer}")
        return list(range(k)) if kind == "first" else list(range(n_layer - k, n_layer))
    raise ConfigError(f"xsa.layers: unknown selection {spec!r}; {allowed}")
