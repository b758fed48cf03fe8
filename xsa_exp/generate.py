"""Sampling from a trained GPT with a KV cache: greedy or temperature / top-k, with stop tokens, and
optional calculator tool use.

A batch of prompts (or one prompt, `num_samples` times) decoded in parallel: the prompts are
left-padded to one length and prefilled once, then each step feeds only the new tokens; the cache
keeps the padding out of every real token's attention, so each row continues as it would alone
(tested). XSA in the cached path projects each new token's attention output against that token's
own value, exactly as the full forward does (tested against full recomputation).

Tool use (nanochat's GSM8K calculator): when a row closes a <|python_start|> expression
<|python_end|> call, the expression is evaluated as nanochat's calculator does and <|output_start|> result
<|output_end|> is forced into that row, token by token, before the model samples again.
"""

from __future__ import annotations

import ast
import operator
import string
from collections import deque
from collections.abc import Iterable

import torch

from xsa_exp.data.tokenizer import Tokenizer
from xsa_exp.model import GPT, KVCache, evaluating


def generate(model: GPT, prompt: list[int], max_new_tokens: int, num_samples: int = 1, **options) -> list[list[int]]:
    """num_samples continuations of one prompt; options as generate_batch's."""
    return generate_batch(model, [prompt] * num_samples, max_new_tokens, **options)


@torch.no_grad()
def generate_batch(model: GPT, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                   top_k: int | None = None, stop_tokens: Iterable[int] = (), seed: int = 0, use_cache: bool = True,
                   tool_use: Tokenizer | None = None) -> list[list[int]]:
    """The continuation of each prompt (without the prompt), each ending before its first stop token.
    With tool_use (the run's tokenizer) calculator calls are answered; without, they are plain tokens.
    use_cache=False recomputes the whole sequence every step (a check of the cache; equal-length prompts)."""
    check_arguments(model, prompts, max_new_tokens, temperature, top_k)
    width = max(map(len, prompts))
    if width + max_new_tokens > model.config.max_input_len:
        raise ValueError(f"prompt of {width} + {max_new_tokens} new tokens exceeds {model.config.max_input_len}, 10x "
                         f"model.sequence_len={model.config.sequence_len}")
    padding = torch.tensor([width - len(p) for p in prompts])
    if not use_cache and padding.any():
        raise ValueError("use_cache=False needs prompts of one length (only the cache masks padding)")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    stop = set(stop_tokens)
    rows = len(prompts)
    calculator = CalculatorTool(tool_use, rows) if tool_use is not None else None
    with evaluating(model):
        tokens = torch.tensor([[0] * (width - len(p)) + p for p in prompts], dtype=torch.long, device=device)
        cache = KVCache(model.config, rows, width + max_new_tokens, device, first=padding) if use_cache else None
        logits = model(tokens, kv_cache=cache)[:, -1]
        outputs: list[list[int]] = [[] for _ in range(rows)]
        done = [False] * rows
        for _ in range(max_new_tokens):
            next_token = sample(logits, temperature, top_k, generator)
            if calculator is not None:
                next_token = torch.tensor(calculator.next_tokens(next_token.tolist()), device=device)
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
    return outputs


def check_arguments(model: GPT, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                    top_k: int | None) -> None:
    """ValueError naming the argument and what it accepts: a negative temperature would sample the least likely
    tokens, and the others fail deep inside torch."""
    vocab = model.config.vocab_size
    if not prompts or not all(prompts):
        raise ValueError("prompts must be one or more non-empty token lists (num_samples >= 1)")
    if any(not 0 <= t < vocab for p in prompts for t in p):
        raise ValueError(f"prompt token ids must be in [0, {vocab}) (model.vocab_size={vocab})")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens}; use 0 or more")
    if not temperature >= 0:
        raise ValueError(f"temperature={temperature}; use 0 (greedy) or more")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k}; use 1 or more, or None for every token")


def sample(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator) -> torch.Tensor:
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)


class CalculatorTool:
    """Per row: collects the tokens of an open tool call and queues the tokens forced after it."""

    def __init__(self, tokenizer: Tokenizer, num_rows: int):
        special = tokenizer.special_tokens
        self.tokenizer = tokenizer
        self.call_start, self.call_end = special["<|python_start|>"], special["<|python_end|>"]
        self.output_start, self.output_end = special["<|output_start|>"], special["<|output_end|>"]
        self.calls: list[list[int] | None] = [None] * num_rows  # tokens of the open call, None outside one
        self.forced: list[deque[int]] = [deque() for _ in range(num_rows)]

    def next_tokens(self, sampled: list[int]) -> list[int]:
        """The tokens the rows take this step: a queued forced token, else the sampled one."""
        tokens = []
        for row, token in enumerate(sampled):
            if self.forced[row]:
                token = self.forced[row].popleft()
            elif token == self.call_start:
                self.calls[row] = []
            elif token == self.call_end and self.calls[row] is not None:
                result = calculate(self.tokenizer.decode(self.calls[row]))
                self.calls[row] = None
                if result is not None:
                    self.forced[row].extend([self.output_start, *self.tokenizer.encode(result), self.output_end])
            elif self.calls[row] is not None:
                self.calls[row].append(token)
            tokens.append(token)
        return tokens


# nanochat's calculator (engine.py, use_calculator): arithmetic in these characters, or a string's .count(...) in
# those, its words refused; the result as Python prints it.
ARITHMETIC_CHARS = frozenset("0123456789*+-/.() ")
STRING_CHARS = frozenset(string.ascii_letters + string.digits + "'\"()._ ")
REFUSED_WORDS = ("__", "import", "exec", "eval", "compile", "open", "file", "input", "raw_input", "globals", "locals",
                 "vars", "dir", "getattr", "setattr", "delattr", "hasattr")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.FloorDiv: operator.floordiv, ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_BITS = 4096  # the largest number computed: far past any grade-school answer, fast to print
# The longest string a method call may make, and the largest number it may take, checked before the call: a call such
# as 'a'.center(9999999999), or replaces chained on a grown string, would otherwise take the host's memory.
MAX_TEXT = 10_000


def calculate(expression: str) -> str | None:
    """nanochat's calculator's answer to a tool call, or None where it gives none: arithmetic of numbers with
    + - * / // and parentheses ("1,000" is 1000; ** refused), or a string method call such as
    'strawberry'.count('r'); the value as Python prints it ("10/2" gives 5.0). Parsed, never eval'd: a model's text
    runs nothing. (Past MAX_BITS or MAX_TEXT it answers None, where nanochat's 3 s time limit would decide.)"""
    expression = expression.replace(",", "").strip()
    if set(expression) <= ARITHMETIC_CHARS:
        if "**" in expression:
            return None
    elif not (set(expression) <= STRING_CHARS and ".count(" in expression
              and not any(word in expression.lower() for word in REFUSED_WORDS)):
        return None

    def value(node: ast.AST):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float, str):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            result = OPERATORS[type(node.op)](value(node.left), value(node.right))
            if isinstance(result, int) and result.bit_length() > MAX_BITS:
                raise ValueError("result too large")
            return result
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.keywords \
                and not node.func.attr.startswith("_"):
            receiver, args = value(node.func.value), [value(arg) for arg in node.args]
            if any(isinstance(arg, int) and abs(arg) > MAX_TEXT for arg in args):
                raise ValueError("argument too large")
            result = getattr(receiver, node.func.attr)(*args)
            if isinstance(result, str) and len(result) > MAX_TEXT:
                raise ValueError("text too long")
            return result
        raise ValueError(f"not a calculation: {ast.dump(node)[:40]}")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError, AttributeError, RecursionError,
            MemoryError):
        return None
    return None if result is None else str(result)
