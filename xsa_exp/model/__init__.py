from xsa_exp.model.gpt import GPT, GPTConfig, KVCache
from xsa_exp.model.modes import evaluating
from xsa_exp.model.xsa import exclusive_self_attention, resolve_layers

__all__ = ["GPT", "GPTConfig", "KVCache", "evaluating", "exclusive_self_attention", "resolve_layers"]
