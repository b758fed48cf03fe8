"""Packing documents into training rows, the same rule for every corpus.

Every document gets BOS prepended, all documents are concatenated in corpus order and cut into
consecutive rows of sequence_len + 1 tokens (inputs row[:-1], targets row[1:]). Rows may span
document boundaries (BOS marks them). The waste: the last partial row of a split (or of each epoch
of a streamed corpus), and the one prediction across each row boundary, about 1 / (sequence_len + 1)
of the tokens. No document is dropped or padded.

Rows of chat data (sft.py) also say which targets train: a token the model should not learn to
predict (a prompt, a tool output) is stored as -(id + 1), so masked rows travel through the same
row machinery (epochs, rank batches, checkpoints of the position) as plain ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from xsa_exp.data.tokenizer import Tokenizer


def pack_documents(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """BOS + tokens of every text, concatenated."""
    ids: list[int] = []
    for doc in tokenizer.encode_batch(texts):
        ids.append(tokenizer.bos_id)
        ids.extend(doc)
    return torch.tensor(ids, dtype=torch.int32)


def cut_rows(tokens: torch.Tensor, row_len: int) -> torch.Tensor:
    """Consecutive rows (n_rows, row_len) of a token sequence; the partial last row is dropped."""
    n_rows = len(tokens) // row_len
    return tokens[: n_rows * row_len].view(n_rows, row_len)


def packed_rows(tokenizer: Tokenizer, text_batches: Iterable[list[str]], row_len: int) -> Iterator[torch.Tensor]:
    """The rows cut_rows(pack_documents(all texts)) would give, produced batch by batch.

    Only the tokens of one batch of documents and a carry of less than one row are held at a time.
    """
    carry = torch.empty(0, dtype=torch.int32)
    for texts in text_batches:
        tokens = torch.cat([carry, pack_documents(tokenizer, texts)])
        rows = cut_rows(tokens, row_len)
        # Copies, not views: a view would keep the whole batch's tokens alive in a shuffle buffer.
        yield from (row.clone() for row in rows)
        carry = tokens[len(rows) * row_len:]


def mask_tokens(ids: list[int], mask: list[int]) -> list[int]:
    """ids with every untrained token (mask 0) stored as -(id + 1)."""
    return [i if m else -i - 1 for i, m in zip(ids, mask)]


def inputs_and_targets(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs rows[:, :-1] and targets rows[:, 1:] of rows (B, T + 1), with masked targets as -1 (ignored)."""
    tokens = torch.where(rows < 0, -rows - 1, rows)
    targets = torch.where(rows[:, 1:] < 0, -1, tokens[:, 1:])
    return tokens[:, :-1], targets
