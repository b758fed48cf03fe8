"""The schema's keys as leaves of a composed config: their types, bounds and choices, the check of each
(check_schema(), the first of checks.validate's checks) and the wording of every message that names a key."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterator

from omegaconf import DictConfig, ListConfig, OmegaConf

from xsa_exp.config import schema
from xsa_exp.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One key of a composed config, with its declared type and the metadata of its schema field."""
    key: str
    type: typing.Any
    meta: typing.Mapping
    node: DictConfig  # the parent node
    name: str


def leaves(cfg: DictConfig, prefix: str = "") -> Iterator[Leaf]:
    """Every leaf key of a composed config, following its schema (each structured node's dataclass).

    Keys that are not in the schema are yielded with type None (an appended `+key=value`); Hydra's own
    node (hydra.*, present when composed with return_hydra_config) is Hydra's to check."""
    cls = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(cls):
        return
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in cfg.keys():
        key = f"{prefix}{name}"
        if name == "hydra" and not prefix:
            continue
        if name not in fields:
            yield Leaf(key, None, {}, cfg, name)
            continue
        tp, meta = hints[name], fields[name].metadata
        child = None if OmegaConf.is_missing(cfg, name) else cfg._get_node(name)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_interpolation():
            if dataclasses.is_dataclass(OmegaConf.get_type(child)):
                yield from leaves(child, f"{key}.")
                continue
            value_type = typing.get_args(tp)[1] if typing.get_origin(tp) is dict else None
            if dataclasses.is_dataclass(value_type):  # Dict[str, dataclass]: each entry follows the dataclass
                for entry in child.keys():
                    yield from leaves(child[entry], f"{key}.{entry}.")
                continue
        yield Leaf(key, tp, meta, cfg, name)


def fmt(value) -> str:
    """A value as the command line would spell it: 2 for 2.0, 'post' for a string, null for None."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (DictConfig, ListConfig)):
        return str(OmegaConf.to_container(value))
    return repr(value) if isinstance(value, str) else str(value)


def _optional(tp) -> tuple[typing.Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return tp, False


def type_name(tp) -> str:
    """The type of a schema field in words: int, float, bool, str, list[float], ..., `or null` when Optional."""
    inner, optional = _optional(tp)
    if typing.get_origin(inner) is list:
        name = f"list[{type_name(typing.get_args(inner)[0])}]"
    elif typing.get_origin(inner) is dict:
        name = "dict"
    elif inner is typing.Any:
        name = "any"
    else:
        name = getattr(inner, "__name__", str(inner))
    return f"{name} or null" if optional else name


def bounds(meta: typing.Mapping) -> str:
    """The range of a number as an interval or a bound ([0, 1], (0, 1), >= 1, > 0); '' when unbounded."""
    lo, lo_open = (meta["gt"], True) if "gt" in meta else (meta.get("ge"), False)
    hi, hi_open = (meta["lt"], True) if "lt" in meta else (meta.get("le"), False)
    if lo is not None and hi is not None:
        return f"{'(' if lo_open else '['}{fmt(lo)}, {fmt(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {fmt(lo)}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {fmt(hi)}"
    return ""


def allowed(leaf_type, meta: typing.Mapping) -> str:
    """What a key accepts, in words: its type and its bounds or choices."""
    if "choices" in meta:
        return ", ".join(fmt(c) if not isinstance(c, str) else c for c in meta["choices"])
    if "accepts" in meta:
        return meta["accepts"]
    text = type_name(leaf_type).replace("bool", "true or false")
    return f"{text} {bounds(meta)}".strip()


def check_leaf(leaf: Leaf) -> None:
    """The bounds and choices in a key's schema metadata; a missing required value."""
    key, meta = leaf.key, leaf.meta
    if leaf.type is None:
        raise ConfigError(unknown_key_message(key, leaf.node.keys()))
    if OmegaConf.is_missing(leaf.node, leaf.name):
        raise ConfigError(meta.get("missing") or f"{key} is not set; allowed: {allowed(leaf.type, meta)}")
    value = leaf.node[leaf.name]
    hint = f"; {meta['hint']}" if "hint" in meta else ""
    if "choices" in meta:
        if value not in meta["choices"]:
            raise ConfigError(f"{key}={fmt(value)} is not an option; allowed: {allowed(leaf.type, meta)}{hint}")
        return
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    ok = all((("ge" not in meta) or value >= meta["ge"], ("gt" not in meta) or value > meta["gt"],
              ("le" not in meta) or value <= meta["le"], ("lt" not in meta) or value < meta["lt"]))
    if ok:
        return
    inner = _optional(leaf.type)[0]
    if inner is int and meta.get("ge") == 1 and not ({"le", "lt"} & set(meta)):
        raise ConfigError(f"{key}={fmt(value)} must be a positive integer{hint}")
    if ({"ge", "gt"} & set(meta)) and ({"le", "lt"} & set(meta)):
        raise ConfigError(f"{key}={fmt(value)} is outside {bounds(meta)}{hint}")
    raise ConfigError(f"{key}={fmt(value)} must be {bounds(meta)}{hint}")


def check_schema(cfg: DictConfig) -> None:
    """Raise ConfigError for the first key that is unknown, unset, out of its bounds or not one of its choices."""
    for leaf in leaves(cfg):
        check_leaf(leaf)


def unknown_key_message(key: str, siblings) -> str:
    parent, _, name = key.rpartition(".")
    siblings = sorted(str(k) for k in siblings if str(k) != name)
    close = difflib.get_close_matches(name, siblings, n=1)
    where = f"keys under {parent}" if parent else "top-level keys"
    guess = f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
    return f"{key} is not a key{guess} ({where}: {', '.join(siblings)})"


def schema_meta(*path: str, cls=schema.TrainConfig) -> typing.Mapping:
    for name in path[:-1]:
        cls = typing.get_type_hints(cls)[name]
    return next(f.metadata for f in dataclasses.fields(cls) if f.name == path[-1])
