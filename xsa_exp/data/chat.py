"""Conversations as token ids with a training mask, in nanochat's chat format.

<|bos|> then turns: <|user_start|> text <|user_end|>, <|assistant_start|> reply <|assistant_end|>.
An assistant reply is text, or a list of parts: {"type": "text"}, {"type": "python"} (a tool call,
wrapped in <|python_start|> ... <|python_end|>) and {"type": "python_output"} (the tool's answer,
in <|output_start|> ... <|output_end|>). A system message is folded into the first user message.
Mask 1 marks the tokens the model learns to produce: the assistant's text and tool calls and the
<|assistant_end|> that closes them; everything else (prompts, tool outputs, BOS) is 0.
"""

from __future__ import annotations

from xsa_exp.data.tokenizer import Tokenizer


def render_conversation(tokenizer: Tokenizer, messages: list[dict],
                        max_tokens: int | None = None) -> tuple[list[int], list[int]]:
    if messages and messages[0]["role"] == "system":
        if len(messages) < 2 or messages[1]["role"] != "user":
            raise ValueError("a system message must be followed by a user message")
        messages = [{"role": "user", "content": messages[0]["content"] + "\n\n" + messages[1]["content"]},
                    *messages[2:]]
    special = tokenizer.special_tokens
    ids, mask = [tokenizer.bos_id], [0]

    def add(tokens: list[int], trained: int) -> None:
        ids.extend(tokens)
        mask.extend([trained] * len(tokens))

    for i, message in enumerate(messages):
        expected = "user" if i % 2 == 0 else "assistant"
        if message["role"] != expected:
            raise ValueError(f"message {i} has role {message['role']!r}; conversations alternate user, assistant, ...")
        if expected == "user":
            add([special["<|user_start|>"], *tokenizer.encode(message["content"]), special["<|user_end|>"]], 0)
            continue
        add([special["<|assistant_start|>"]], 0)
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for part in parts:
            tokens = tokenizer.encode(part["text"])
            if part["type"] == "text":
                add(tokens, 1)
            elif part["type"] == "python":
                add([special["<|python_start|>"], *tokens, special["<|python_end|>"]], 1)
            elif part["type"] == "python_output":
                add([special["<|output_start|>"], *tokens, special["<|output_end|>"]], 0)
            else:
                raise ValueError(f"unknown assistant part type {part['type']!r}; use text, python or python_output")
        add([special["<|assistant_end|>"]], 1)
    return ids[:max_tokens], mask[:max_tokens]


def render_prompt(tokenizer: Tokenizer, messages: list[dict]) -> list[int]:
    """A conversation ending with a user message, then <|assistant_start|>: what the model continues."""
    if not messages or messages[-1]["role"] != "user":
        raise ValueError("a prompt ends with a user message")
    ids, _ = render_conversation(tokenizer, messages)
    return [*ids, tokenizer.special_tokens["<|assistant_start|>"]]
