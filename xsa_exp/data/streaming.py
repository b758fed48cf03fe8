"""The order training reads rows in, and how ranks and workers split it.

Both orders depend only on the corpus, sequence_len, the seed and (for a stream) the number of
readers, never on the model or XSA settings, so two arms see the same batches in the same order.

data=sample, wiki and sft (rows in memory): one global sequence of epochs, each a permutation of all rows
drawn from a generator seeded with (seed, epoch). It is cut into batches of device_batch_size rows;
rank r of R takes batches r, r+R, ... and its DataLoader worker w of W the rank's batches w, w+W, ...,
so the sequence does not depend on R or W, and R ranks sum exactly the per-batch gradients that one
device sums over R accumulated micro-batches.

Streamed corpora (climbmix, local): each of the K = R x W readers (reader k = rank x W + worker; W = 1
without workers) reads and tokenizes only its share of the training documents (sources.read_documents:
whole parquet row groups, or blocks of a json/txt file, dealt round), packs it, shuffles the rows
through its own buffer of data.shuffle_rows seeded with (seed, epoch, k, K), epoch after epoch, and
makes that rank's batches w, w+W, ... So a reader's work falls as 1/K. What is guaranteed instead of one global order:
the same batches for the same seed, R and W; and for any R and W, every training document in exactly
one reader's share, so each reader's epoch is its share and all of them together are the whole
corpus, once (readers' epochs drift apart by at most a chunk's rows). A resumed run must keep R and W
(the datamodule checks). Memory holds the buffer and one chunk of documents, however long the run.

Position: global rows consumed, so each rank has consumed rows / (device_batch_size x R) batches and
each reader knows how many of its own batches to skip (for a stream: read and tokenize again).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from itertools import count, islice

import torch
from torch.utils.data import IterableDataset, get_worker_info

from xsa_exp.data.packing import PACKINGS
from xsa_exp.data.sources import DataError, StreamedCorpus, read_documents
from xsa_exp.data.tokenizer import Tokenizer

# A prime above any epoch count a run reaches: seed * EPOCH_SEED_STRIDE + epoch is then one distinct seed per
# (seed, epoch) pair, so two runs' seeds never give the same epoch order (with a stride of 1, seed 1 epoch 1 and
# seed 2 epoch 0 would shuffle alike). Changing it changes every data order, so every number.
EPOCH_SEED_STRIDE = 1_000_003


def epoch_seed(seed: int, epoch: int) -> int:
    return seed * EPOCH_SEED_STRIDE + epoch


class EpochPermutations:
    """Rows held in memory (data=sample, wiki, sft), epoch e in the order randperm(n_rows) seeded with (seed, e)."""

    def __init__(self, rows: torch.Tensor, seed: int):
        self.rows, self.seed = rows, seed

    def __iter__(self) -> Iterator[torch.Tensor]:
        for epoch in count():
            generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
            for i in torch.randperm(len(self.rows), generator=generator).tolist():
                yield self.rows[i]

    def batches(self, batch_size: int, rank: int, world_size: int, worker: int, workers: int,
                start_row: int) -> Iterator[torch.Tensor]:
        """Global batches rank, rank + R, ... of the sequence from global row start_row on, and of those this
        worker's: w, w + W, ... (the DataLoader's round-robin over workers restores the rank's order)."""
        rows_per_batch = batch_size * world_size  # global rows behind one batch of every rank
        batch = []
        for index, row in enumerate(self):
            offset = index - start_row
            # Rank r takes whole global batches r, r + R, ...: a step then sums the same per-batch gradients
            # whether they come from R ranks or from R accumulated micro-batches on one device.
            if offset < 0 or (offset // batch_size) % world_size != rank \
                    or (offset // rows_per_batch) % workers != worker:
                continue
            batch.append(row)
            if len(batch) == batch_size:
                yield torch.stack(batch).long()
                batch = []


class StreamedRows:
    """A streamed corpus's training files, each reader's share packed and shuffled through its own buffer."""

    def __init__(self, corpus: StreamedCorpus, tokenizer: Tokenizer, row_len: int, seed: int, buffer_rows: int,
                 cpus: int, packing: str):
        """cpus: the rank's share of the CPUs, which its data loader workers share; packing: data.packing."""
        self.corpus, self.tokenizer, self.row_len = corpus, tokenizer, row_len
        self.seed, self.buffer_rows, self.cpus, self.pack = seed, buffer_rows, cpus, PACKINGS[packing]

    def epoch_rows(self, epoch: int, reader: int, readers: int) -> Iterator[torch.Tensor]:
        """One epoch of reader `reader` of `readers`: its share of the documents, packed and shuffled."""
        documents = read_documents(self.corpus, self.corpus.train_files, reader, readers)
        # One seed per (seed, epoch, reader) for a given number of readers; a single reader's is epoch_seed's.
        rng = random.Random(epoch_seed(self.seed, epoch) * readers + reader)
        return buffer_shuffle(self.pack(self.tokenizer, documents, self.row_len), self.buffer_rows, rng)

    def reader_rows(self, reader: int, readers: int) -> Iterator[torch.Tensor]:
        """Reader `reader` of `readers`, epoch after epoch."""
        for epoch in count():
            n_rows = 0
            for row in self.epoch_rows(epoch, reader, readers):
                n_rows += 1
                yield row
            if n_rows == 0:
                share = f"reader {reader} of {readers} (ranks x data loader workers) has" if readers > 1 else "hold"
                fix = "; use fewer data.num_workers or ranks, or more training files" if readers > 1 else ""
                raise DataError(f"the training files of data={self.corpus.name}: {share} fewer than sequence_len + 1 = "
                                f"{self.row_len} tokens; add data or use a shorter model.sequence_len{fix}")

    def batches(self, batch_size: int, rank: int, world_size: int, worker: int, workers: int,
                start_row: int) -> Iterator[torch.Tensor]:
        """The rank's batches from global row start_row on: batch i of a rank is reader rank x W + i % W's batch i // W.
        The DataLoader asks its workers in turn starting with worker 0, so after c consumed batches worker w
        plays reader role (w + c) % W."""
        consumed = start_row // (batch_size * world_size)  # batches each rank has consumed
        role = (worker + consumed) % workers
        done = len(range(role, consumed, workers))  # of those, made by this role's reader
        # The DataLoader's workers share the rank's CPUs, each tokenizing its share.
        self.tokenizer.threads = max(1, self.cpus // workers)
        rows = islice(self.reader_rows(rank * workers + role, world_size * workers), done * batch_size, None)
        while True:  # reader_rows never ends
            yield torch.stack(list(islice(rows, batch_size))).long()


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
    """This rank's (and DataLoader worker's) batches of `rows`, in the order its `batches` gives, from global
    row start_row on."""

    def __init__(self, rows: EpochPermutations | StreamedRows, batch_size: int, rank: int = 0, world_size: int = 1,
                 start_row: int = 0):
        self.rows, self.batch_size = rows, batch_size
        self.rank, self.world_size, self.start_row = rank, world_size, start_row

    def __iter__(self) -> Iterator[torch.Tensor]:
        worker = get_worker_info()
        worker_id, n_workers = (worker.id, worker.num_workers) if worker else (0, 1)
        return self.rows.batches(self.batch_size, self.rank, self.world_size, worker_id, n_workers, self.start_row)
