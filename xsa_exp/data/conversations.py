"""Rows of an SFT source as conversations, one converter per `format` (see sft.py for the formats), and
nanochat's multiple-choice prompt, which the chat evaluation asks too."""

from __future__ import annotations

import re
from collections.abc import Callable

LETTERS = "ABCDEFGHIJ"
CALCULATOR_NOTE = re.compile(r"(<<[^>]+>>)")


def multiple_choice_prompt(question: str, choices: list[str]) -> str:
    """nanochat's multiple-choice format, shared by SFT data and the ARC / MMLU evaluation."""
    options = "".join(f"- {choice}={letter}\n" for letter, choice in zip(LETTERS, choices))
    return f"Multiple Choice question: {question}\n{options}\nRespond only with the letter of the correct answer."


def messages_conversation(row: dict, tool_calls: bool) -> list[dict]:
    return [{"role": m["role"], "content": m["content"]} for m in row["messages"]]


def mmlu_conversation(row: dict, tool_calls: bool) -> list[dict]:
    row = row.get("train") or row  # cais/mmlu auxiliary_train nests each example in a `train` field
    return [{"role": "user", "content": multiple_choice_prompt(row["question"], list(row["choices"]))},
            {"role": "assistant", "content": LETTERS[int(row["answer"])]}]


def gsm8k_conversation(row: dict, tool_calls: bool) -> list[dict]:
    parts = []
    for piece in CALCULATOR_NOTE.split(row["answer"]):
        if not CALCULATOR_NOTE.fullmatch(piece):
            parts.append({"type": "text", "text": piece})
        elif tool_calls:
            note = piece[2:-2]  # nanochat's split: the last "=" parts the expression from its value
            expression, value = note.rsplit("=", 1) if "=" in note else (note, "")
            parts += [{"type": "python", "text": expression}, {"type": "python_output", "text": value}]
    return [{"role": "user", "content": row["question"]}, {"role": "assistant", "content": parts}]


CONVERTERS: dict[str, Callable[[dict, bool], list[dict]]] = {
    "messages": messages_conversation, "mmlu": mmlu_conversation, "gsm8k": gsm8k_conversation}
