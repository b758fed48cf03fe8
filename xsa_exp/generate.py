"""Sampling from a trained GPT with a KV cache: greedy or temperature / top-k, with stop tokens.

One prompt, `num_samples` continuations decoded in parallel (nanochat's Engine pattern). The
prompt is prefilled once per sample row, then each step feeds only the new token; XSA in the
cached path projects each new token's attention output against that token's own value, exactly
as the full forward does (tested against full recomputation).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from xsa_exp.model import GPT, KVCache


@torch.no_grad()
def generate(model: GPT, prompt: list[int], max_new_tokens: int, num_samples: int = 1, temperature: float = 0.0,
             top_k: int | None = None, stop_tokens: Iterable[int] = (), seed: int = 0, use_cache: bool = True) -> list[list[int]]:
    """Continuations of prompt (without the prompt), each ending before its first stop token."""
    if len(prompt) + max_new_tokens > model.config.sequence_len:
        raise ValueError(f"prompt of {len(prompt)} + {max_new_tokens} new tokens exceeds model.sequence_len={model.config.sequence_len}")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    stop = set(stop_tokens)
    was_training = model.training
    model.eval()
    tokens = torch.tensor([prompt] * num_samples, dtype=torch.long, device=device)
    cache = KVCache(model.config, num_samples, len(prompt) + max_new_tokens, device) if use_cache else None
    logits = model(tokens, kv_cache=cache)[:, -1]
    outputs: list[list[int]] = [[] for _ in range(num_samples)]
    done = [False] * num_samples
    for _ in range(max_new_tokens):
        next_token = sample(logits, temperature, top_k, generator)
        for row, token in enumerate(next_token.tolist()):
            if not done[row]:
                if token in stop:
                    done[row] = True
                else:
                    outputs[row].append(token)
        if all(done):
            break
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        logits = (model(next_token[:, None], kv_cache=cache) if use_cache else model(tokens))[:, -1]
    model.train(was_training)
    return outputs


def sample(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator) -> torch.Tensor:
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)
