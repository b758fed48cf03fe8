"""The GPT (gpt.py), XSA's settings (xsa_settings.py) and op (xsa_op.py), eval mode (modes.py).

Names load on first use, so that importing xsa_exp.model.xsa_settings does not import torch (the report uses it).
"""

import importlib

_HOME = {"GPT": "gpt", "GPTConfig": "gpt", "KVCache": "gpt", "evaluating": "modes",
         "exclusive_self_attention": "xsa_op", "XSASettings": "xsa_settings", "resolve_layers": "xsa_settings"}

__all__ = list(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f"xsa_exp.model.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
