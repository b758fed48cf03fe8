"""The order training reads rows in, and how ranks and workers split it.

The global row sequence is endless and depends only on the corpus, sequence_len and the seed (so
arms that differ in model or XSA settings see the same batches in the same order):
- data=sample: epochs, each a permutation of all packed rows drawn from a generator seeded with
  (seed, epoch).
- streamed corpora: epochs, each the training files packed in file and document order (packing.py)
  and shuffled through a buffer of data.shuffle_rows rows seeded with (seed, epoch). Memory holds the
  buffer and one batch of documents, however long the run.

The global sequence is cut into batches of device_batch_size rows; rank r of R takes batches r, r+R,
r+2R, ... and its DataLoader worker w of W makes the rank's batches w, w+W, ... (the DataLoader
hands out workers' batches round-robin), so no row is read twice or skipped and the sequence does
not depend on R or W. Whole batches per rank make R ranks sum exactly the per-batch gradients that
one device sums over R accumulated micro-batches. The price: every
reader walks the whole sequence and keeps its share, so for a streamed corpus each reader tokenizes
all the text; more workers give no more throughput than one (which moves reading off the training
process).

Position: global rows consumed. A reader started at row s skips the rows before it; for a streamed
corpus that means reading and tokenizing them again.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from itertools import count

import torch
from torch.utils.data import IterableDataset, get_worker_info

from xsa_exp.data.packing import packed_rows
from xsa_exp.data.sources import DataError, StreamedCorpus, read_documents
from xsa_exp.data.tokenizer import Tokenizer


# A prime above any epoch count a run reaches: seed * EPOCH_SEED_STRIDE + epoch is then one distinct seed per
# (seed, epoch) pair, so two runs' seeds never give the same epoch order (with a stride of 1, seed 1 epoch 1 and
# seed 2 epoch 0 would shuffle alike). Changing it changes every data order, so every number.
EPOCH_SEED_STRIDE = 1_000_003


def epoch_seed(seed: int, epoch: int) -> int:
    return seed * EPOCH_SEED_STRIDE + epoch


class EpochPermutations:
    """Rows held in memory (data=sample), epoch e in the order randperm(n_rows) seeded with (seed, e)."""

    def __init__(self, rows: torch.Tensor, seed: int):
        self.rows, self.seed = rows, seed

    def __iter__(self) -> Iterator[torch.Tensor]:
        for epoch in count():
            generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
            for i in torch.randperm(len(self.rows), generator=generator).tolist():
                yield self.rows[i]


class StreamedRows:
    """A streamed corpus's training files, packed, through a shuffle buffer seeded with (seed, epoch)."""

    def __init__(self, corpus: StreamedCorpus, tokenizer: Tokenizer, row_len: int, seed: int, buffer_rows: int):
        self.corpus, self.tokenizer, self.row_len = corpus, tokenizer, row_len
        self.seed, self.buffer_rows = seed, buffer_rows

    def __iter__(self) -> Iterator[torch.Tensor]:
        for epoch in count():
            rows = packed_rows(self.tokenizer, read_documents(self.corpus, self.corpus.train_files), self.row_len)
            n_rows = 0
            for row in buffer_shuffle(rows, self.buffer_rows, random.Random(epoch_seed(self.seed, epoch))):
                n_rows += 1
                yield row
            if n_rows == 0:
                raise DataError(f"the training files of data={self.corpus.name} hold fewer than sequence_len + 1 = "
                                f"{self.row_len} tokens; add data or use a shorter model.sequence_len")


def buffer_shuffle(items: Iterable, size: int, rng: random.Random) -> Iterator:
    """A permutation of items that holds at most `size` of them: each new item takes the place of a
    random one in the buffer, which is yielded; the rest come out shuffled at the end."""
    buffer = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        i = rng.randrange(size)
        yield buffer[i]
        buffer[i] = item
    rng.shuffle(buffer)
    yield from buffer


class RankBatches(IterableDataset):
    """This rank's (and DataLoader worker's) batches of the global row sequence, from global row start_row on.

    The global sequence is cut into batches of batch_size rows; rank r of R takes batches r, r + R, ...,
    and DataLoader worker w of W takes that rank's batches w, w + W, ... (so the loader's round-robin
    over workers restores the rank's order)."""

    def __init__(self, rows: Iterable[torch.Tensor], batch_size: int, rank: int = 0, world_size: int = 1,
                 start_row: int = 0):
        self.rows, self.batch_size = rows, batch_size
        self.rank, self.world_size, self.start_row = rank, world_size, start_row

    def __iter__(self) -> Iterator[torch.Tensor]:
        worker = get_worker_info()
        worker_id, n_workers = (worker.id, worker.num_workers) if worker else (0, 1)
        rows_per_batch = self.batch_size * self.world_size  # global rows behind one batch of every rank
        batch = []
        for index, row in enumerate(self.rows):
            offset = index - self.start_row
            # Rank r takes whole global batches r, r + R, ...: a step then sums the same per-batch gradients
            # whether they come from R ranks or from R accumulated micro-batches on one device.
            if offset < 0 or (offset // self.batch_size) % self.world_size != self.rank \
                    or (offset // rows_per_batch) % n_workers != worker_id:
                continue
            batch.append(row)
            if len(batch) == self.batch_size:
                yield torch.stack(batch).long()
                batch = []
