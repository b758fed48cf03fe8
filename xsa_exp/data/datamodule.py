"""Tokenised, packed rows of the corpus, and the order training reads them in.

Packing: every document gets BOS prepended, all documents are concatenated in corpus order and cut
into consecutive rows of sequence_len + 1 tokens (inputs row[:-1], targets row[1:]). Rows may span
document boundaries (BOS marks them); the only waste is the last partial row and the one
prediction across each row boundary, about 1 / (sequence_len + 1) of the tokens.

Order: an endless sequence of epochs, each a permutation of all rows drawn from a generator seeded
with (seed, epoch). It depends on nothing else, so runs that differ only in model or XSA settings
see the same batches in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset, Sampler

from xsa_exp.data.corpus import load_sample_corpus, sample_corpus_fingerprint
from xsa_exp.data.tokenizer import Tokenizer, load_or_train_tokenizer


class PackedRows(Dataset):
    def __init__(self, tokens: torch.Tensor, row_len: int):
        n_rows = len(tokens) // row_len
        self.rows = tokens[: n_rows * row_len].view(n_rows, row_len)

    def __len__(self) -> int:
        return self.rows.size(0)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.rows[i].long()


class ShuffledRowSampler(Sampler[int]):
    """Endless row indices: epoch e is randperm(n_rows) from a generator seeded with seed * 1_000_003 + e."""

    def __init__(self, n_rows: int, seed: int):
        self.n_rows, self.seed = n_rows, seed

    def __iter__(self) -> Iterator[int]:
        epoch = 0
        while True:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            yield from torch.randperm(self.n_rows, generator=generator).tolist()
            epoch += 1


def pack_documents(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for doc in tokenizer.encode_batch(texts):
        ids.append(tokenizer.bos_id)
        ids.extend(doc)
    return torch.tensor(ids, dtype=torch.int32)


class TextDataModule(L.LightningDataModule):
    def __init__(self, data_cfg, sequence_len: int, vocab_size: int, device_batch_size: int, seed: int, cache_dir: str,
                 tokenizer_dir: Path | None = None):
        """tokenizer_dir: use this trained tokenizer (a run's own copy) instead of the cache."""
        super().__init__()
        if data_cfg.name != "sample":
            raise ValueError(f"data={data_cfg.name} is not available in this version; use data=sample")
        self.sequence_len, self.vocab_size = sequence_len, vocab_size
        self.device_batch_size, self.seed = device_batch_size, seed
        self.cache_dir = Path(cache_dir).expanduser()
        self.tokenizer_key = f"{data_cfg.name}-{sample_corpus_fingerprint()}-v{vocab_size}"
        self.tokenizer: Tokenizer | None = None
        self.tokenizer_dir = tokenizer_dir

    def prepare_data(self) -> None:
        # Runs on one process per node: train the tokenizer once, the other ranks load it in setup().
        if self.tokenizer_dir is None:
            load_or_train_tokenizer(self.cache_dir, self.tokenizer_key, self.vocab_size,
                                lambda: load_sample_corpus()["train"]["text"])

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        corpus = load_sample_corpus()
        if self.tokenizer_dir is not None:
            self.tokenizer = Tokenizer.load(self.tokenizer_dir)
        else:
            self.tokenizer, self.tokenizer_dir = load_or_train_tokenizer(
                self.cache_dir, self.tokenizer_key, self.vocab_size, lambda: corpus["train"]["text"])
        if self.tokenizer.vocab_size != self.vocab_size:
            raise ValueError(f"tokenizer at {self.tokenizer_dir} has {self.tokenizer.vocab_size} tokens, model.vocab_size is {self.vocab_size}")
        self.token_bytes = self.tokenizer.token_bytes()
        train_tokens = pack_documents(self.tokenizer, corpus["train"]["text"])
        val_tokens = pack_documents(self.tokenizer, corpus["validation"]["text"])
        self.train_rows = PackedRows(train_tokens, self.sequence_len + 1)
        self.val_rows = PackedRows(val_tokens, self.sequence_len + 1)
        if len(self.train_rows) == 0 or len(self.val_rows) == 0:
            raise ValueError(f"model.sequence_len={self.sequence_len} is longer than the corpus split; use a shorter sequence")
        self.unigram_bpb = unigram_bits_per_byte(train_tokens, val_tokens, self.token_bytes)
        rank_zero_info(f"data: {len(train_tokens):,} train tokens ({len(self.train_rows):,} rows), "
                       f"{len(val_tokens):,} validation tokens; tokenizer {self.tokenizer_dir}; "
                       f"unigram baseline {self.unigram_bpb:.3f} bits/byte")

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_rows, batch_size=self.device_batch_size,
                          sampler=ShuffledRowSampler(len(self.train_rows), self.seed))

    def val_rows_head(self, n_rows: int) -> torch.Tensor:
        """The first n_rows validation rows (B, T + 1): the fixed batch of the attention diagnostics."""
        return self.val_rows.rows[:n_rows].long()

    def val_batches(self, max_tokens: int, rank: int = 0, world_size: int = 1) -> list[torch.Tensor]:
        """The first ceil(max_tokens / sequence_len) validation rows (all if fewer), this rank's share, batched."""
        n_rows = min(len(self.val_rows), math.ceil(max_tokens / self.sequence_len))
        rows = self.val_rows.rows[:n_rows][rank::world_size].long()
        return list(rows.split(self.device_batch_size))


def unigram_bits_per_byte(train_tokens: torch.Tensor, val_tokens: torch.Tensor, token_bytes: torch.Tensor) -> float:
    """Bits per byte of a model that predicts every token from its training frequency (add-one smoothed):
    the floor any trained model should get well below."""
    counts = torch.bincount(train_tokens.long(), minlength=len(token_bytes)).double() + 1
    log2_p = (counts / counts.sum()).log2()
    targets = val_tokens.long()
    nbytes = token_bytes[targets]
    keep = nbytes > 0
    return float(-log2_p[targets[keep]].sum() / nbytes[keep].sum())
