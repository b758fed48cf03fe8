"""Packing documents into training rows of sequence_len + 1 tokens (inputs row[:-1], targets row[1:]); every
document gets BOS prepended. Two rules:

- concat (every embedded corpus, data=local by default): all documents concatenated in corpus order and cut into
  consecutive rows. Rows may span document boundaries (BOS marks them). The waste: the last partial row of a split
  (or of each epoch of a streamed corpus), and the one prediction across each row boundary, about
  1 / (sequence_len + 1) of the tokens. No document is dropped or padded.
- bestfit (data=climbmix by default; `data.packing`): nanochat's BOS-aligned best fit (its dataloader.py), so that
  val/bpb is measured on nanochat's rows. Each row starts at a document's BOS and is filled from a buffer of the
  next 1,000 documents, each time with the longest that fits whole (the first of equals); when none fits, the
  shortest is cropped to fill the row, its rest dropped. Every token sees its document's start; at 2048 tokens
  nanochat counts about 35% of ClimbMix's tokens cropped away. At the end of a stream (nanochat's never ends) the
  buffer is packed out and the last partial row dropped.

Rows of chat data (sft.py) also say which targets train: a token the model should not learn to
predict (a prompt, a tool output) is stored as -(id + 1), so masked rows travel through the same
row machinery (epochs, rank batches, checkpoints of the position) as plain ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
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


BESTFIT_BUFFER, BESTFIT_CHUNK = 1000, 128  # nanochat's buffer_size and tokenizer_batch_size


def best_fit_rows(tokenizer: Tokenizer, text_batches: Iterable[list[str]], row_len: int) -> Iterator[torch.Tensor]:
    """nanochat's BOS-aligned best-fit rows of the documents in text_batches (see the module's docstring). As
    nanochat's, the buffer is refilled 128 documents of a batch at a time while it holds fewer than 1,000."""
    chunks = ([[tokenizer.bos_id, *tokens] for tokens in tokenizer.encode_batch(texts[start:start + BESTFIT_CHUNK])]
              for texts in text_batches for start in range(0, len(texts), BESTFIT_CHUNK))
    buffer: list[list[int]] = []
    lengths = np.empty(0, dtype=np.int64)  # of the buffer's documents: numpy's argmax, not a Python scan, per pick
    while True:
        row: list[int] = []
        while len(row) < row_len:
            while len(buffer) < BESTFIT_BUFFER and (chunk := next(chunks, None)) is not None:
                buffer.extend(chunk)
                lengths = np.append(lengths, [len(doc) for doc in chunk])
            if not buffer:
                return  # the stream's end: its partial row is dropped
            remaining = row_len - len(row)
            fitting = np.where(lengths <= remaining, lengths, -1)
            pick = int(fitting.argmax())  # argmax and argmin take the first of equals
            whole = fitting[pick] >= 0
            if not whole:  # none fits: the shortest, cropped to fill the row
                pick = int(lengths.argmin())
            row += buffer.pop(pick) if whole else buffer.pop(pick)[:remaining]
            lengths = np.delete(lengths, pick)
        yield torch.tensor(row, dtype=torch.int32)


PACKINGS = {"concat": packed_rows, "bestfit": best_fit_rows}  # data.packing of a streamed corpus


def mask_tokens(ids: list[int], mask: list[int]) -> list[int]:
    """ids with every untrained token (mask 0) stored as -(id + 1)."""
    return [i if m else -i - 1 for i, m in zip(ids, mask)]


def inputs_and_targets(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs rows[:, :-1] and targets rows[:, 1:] of rows (B, T + 1), with masked targets as -1 (ignored)."""
    tokens = torch.where(rows < 0, -rows - 1, rows)
    targets = torch.where(rows[:, 1:] < 0, -1, tokens[:, 1:])
    return tokens[:, :-1], targets
