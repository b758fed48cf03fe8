"""What a run trains and evaluates on, whatever the corpus (data.name):

- sample, wiki: the embedded corpora (corpus.py: the KJV, Wikipedia's vital articles), tokenized and
  packed in memory;
- sft: the chat mixture of the SFT stage (sft.py), rendered with its loss mask and packed in memory,
  with the base run's tokenizer;
- climbmix, local: parquet / jsonl / txt files (sources.py), read, tokenized and packed as training
  goes; the training set is never in memory whole.

Each gives the tokenizer trained on (data.tokenizer_chars characters of) its training split, an
endless global sequence of training rows that ranks and workers split (streaming.py), the first rows
of its validation split packed the same way (packing.py), and the number of global rows training has
consumed, saved in checkpoints so a resumed run continues with the next row.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from itertools import islice
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from xsa_exp.cluster import rank_cpus
from xsa_exp.config.schema import DataConfig
from xsa_exp.data.corpus import EMBEDDED_CORPORA
from xsa_exp.data.packing import cut_rows, inputs_and_targets, pack_documents
from xsa_exp.data.sft import conversation_rows, load_conversations
from xsa_exp.data.sources import DataError, read_documents, streamed_corpus
from xsa_exp.data.streaming import EpochPermutations, RankBatches, StreamedRows
from xsa_exp.data.tokenizer import Tokenizer, char_budget, load_or_train_tokenizer


class TextDataModule(L.LightningDataModule):
    def __init__(self, data_cfg: DataConfig, sequence_len: int, vocab_size: int, device_batch_size: int, seed: int,
                 cache_dir: str, tokenizer_dir: Path | None = None, local_ranks: int = 1):
        """tokenizer_dir: use this trained tokenizer (a run's own copy) instead of the cache; local_ranks: the training
        processes on this node, which tokenize at the same time (each with its share of the CPUs)."""
        super().__init__()
        self.load_embedded = None  # an embedded corpus's splits, loaded when needed
        if data_cfg.name in EMBEDDED_CORPORA:
            self.load_embedded, fingerprint_of = EMBEDDED_CORPORA[data_cfg.name]
            self.corpus, fingerprint = None, fingerprint_of()
        elif data_cfg.name == "sft":
            if tokenizer_dir is None:
                raise DataError("data=sft trains with a base run's tokenizer; "
                                "use stage=sft init_from=<base run directory>")
            self.corpus, fingerprint = None, "sft"
        elif data_cfg.name in ("climbmix", "local"):
            self.corpus = streamed_corpus(data_cfg)
            fingerprint = self.corpus.fingerprint
        else:
            raise ValueError(f"data={data_cfg.name} is not an option; "
                             f"allowed: {', '.join(EMBEDDED_CORPORA)}, sft, climbmix, local")
        self.data_cfg = data_cfg
        self.sequence_len, self.vocab_size = sequence_len, vocab_size
        self.device_batch_size, self.seed = device_batch_size, seed
        self.cache_dir = Path(cache_dir).expanduser()
        # null: the whole training split (embedded corpora only); data=sft has none (the base run's tokenizer).
        self.tokenizer_chars = None if data_cfg.name == "sft" else data_cfg.tokenizer_chars  # sft: its base run's
        self.tokenizer_doc_chars = data_cfg.tokenizer_doc_chars if self.corpus is not None else None  # streamed only
        budget = "" if self.tokenizer_chars is None else f"-c{self.tokenizer_chars}"
        budget += "" if self.tokenizer_doc_chars is None else f"-d{self.tokenizer_doc_chars}"
        self.tokenizer_key = f"{data_cfg.name}-{fingerprint}{budget}-v{vocab_size}"
        self.tokenizer: Tokenizer | None = None
        self.tokenizer_dir = tokenizer_dir
        self.cpus = rank_cpus(local_ranks)
        self.rows_consumed = 0  # global rows (all ranks) handed to training steps so far
        self.readers: list[int] | None = None  # a stream's [ranks, data loader workers per rank], once reading

    def tokenizer_texts(self) -> Iterable[str]:
        if self.corpus is None:
            texts = self.load_embedded()["train"]
        else:
            cap = self.tokenizer_doc_chars
            texts = (text[:cap] for batch in read_documents(self.corpus, self.corpus.train_files) for text in batch)
        return texts if self.tokenizer_chars is None else char_budget(texts, self.tokenizer_chars)

    def prepare_data(self) -> None:
        # Runs on one process per node: train the tokenizer once, the other ranks load it in setup().
        if self.tokenizer_dir is None:
            load_or_train_tokenizer(self.cache_dir, self.tokenizer_key, self.vocab_size, self.tokenizer_texts)

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        given = self.tokenizer_dir is not None  # the base run's (SFT), else trained on this corpus
        if given:
            self.tokenizer = Tokenizer.load(self.tokenizer_dir)
        else:
            self.tokenizer, self.tokenizer_dir = load_or_train_tokenizer(
                self.cache_dir, self.tokenizer_key, self.vocab_size, self.tokenizer_texts)
        self.tokenizer.threads = self.cpus
        size = self.tokenizer.vocab_size
        if size != self.vocab_size:
            fix = (f"it was made for another size; set model.vocab_size={size}" if given else
                   f"its training text is too small to learn more; add text or set model.vocab_size={size}")
            raise DataError(f"tokenizer at {self.tokenizer_dir} has {size} tokens, model.vocab_size is "
                            f"{self.vocab_size}: {fix}")
        self.token_bytes = self.tokenizer.token_bytes()
        row_len = self.sequence_len + 1
        if self.data_cfg.name == "sft":
            self.setup_chat(row_len, training=stage != "validate")
            return
        if self.corpus is None:
            self.setup_embedded(row_len)
            return
        self.train_rows = StreamedRows(self.corpus, self.tokenizer, row_len, self.seed, self.data_cfg.shuffle_rows,
                                       self.cpus, self.data_cfg.packing)
        # Read on first use: how many rows depends on the caller (eval.val_tokens, evaluate.py's val_tokens).
        self.val_rows, self.val_complete = torch.empty(0, row_len, dtype=torch.int32), False
        # A unigram baseline would need the training tokens counted; a streamed corpus has no such pass.
        self.unigram_bpb = None
        rank_zero_info(f"data: {self.corpus.name}, streamed from {len(self.corpus.train_files):,} training files "
                       f"({self.corpus.train_files[0]} ...), validation {', '.join(self.corpus.val_files)}; "
                       f"tokenizer {self.tokenizer_dir}; unigram baseline n/a for a streamed corpus")

    def setup_embedded(self, row_len: int) -> None:
        corpus = self.load_embedded()
        train_tokens = pack_documents(self.tokenizer, corpus["train"])
        val_tokens = pack_documents(self.tokenizer, corpus["validation"])
        train_rows = cut_rows(train_tokens, row_len)
        self.val_rows, self.val_complete = cut_rows(val_tokens, row_len), True
        if len(train_rows) == 0 or len(self.val_rows) == 0:
            raise DataError(f"model.sequence_len={self.sequence_len} is longer than the corpus split; "
                            "use a shorter sequence")
        self.train_rows = EpochPermutations(train_rows, self.seed)
        self.unigram_bpb = unigram_bits_per_byte(train_tokens, val_tokens, self.token_bytes)
        rank_zero_info(f"data: {len(train_tokens):,} train tokens ({len(train_rows):,} rows), "
                       f"{len(val_tokens):,} validation tokens; tokenizer {self.tokenizer_dir}; "
                       f"unigram baseline {self.unigram_bpb:.3f} bits/byte")

    def setup_chat(self, row_len: int, training: bool) -> None:
        """training=False (evaluation): only the validation conversations, not the whole mixture, are read."""
        val, _ = load_conversations(self.data_cfg, "val_sources")
        self.val_rows, self.val_complete = conversation_rows(self.tokenizer, val, row_len, self.seed), True
        self.unigram_bpb = None
        if len(self.val_rows) == 0:
            raise DataError(f"the SFT validation conversations hold fewer than sequence_len + 1 = {row_len} tokens; "
                            "add conversations or use a shorter sequence")
        message = f"validation {len(val):,} conversations ({len(self.val_rows):,} rows); tokenizer {self.tokenizer_dir}"
        if training:
            train, counts = load_conversations(self.data_cfg, "train_sources")
            train_rows = conversation_rows(self.tokenizer, train, row_len, self.seed)
            if len(train_rows) == 0:
                raise DataError(f"the SFT training conversations hold fewer than sequence_len + 1 = {row_len} tokens; "
                                "add conversations or use a shorter sequence")
            self.train_rows = EpochPermutations(train_rows, self.seed)
            trained = float((train_rows[:, 1:] >= 0).float().mean())
            message = (f"SFT mixture {', '.join(f'{name} {n:,}' for name, n in counts.items())} conversations -> "
                       f"{len(train_rows):,} rows ({trained:.0%} of targets are assistant tokens), {message}")
        rank_zero_info(f"data: {message}")

    @property
    def epoch_tokens(self) -> int | None:
        """Training tokens per pass over the data, for a corpus held in memory (None for a stream)."""
        return None if self.corpus is not None else len(self.train_rows.rows) * self.sequence_len

    def train_dataloader(self) -> DataLoader:
        rank, world_size = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        # Rows in memory need no workers; a stream is read and tokenized off the training process.
        workers = 0 if self.corpus is None else self.data_cfg.num_workers
        if self.corpus is not None:
            self.check_readers([world_size, max(1, workers)])
        batches = RankBatches(self.train_rows, self.device_batch_size, rank, world_size, start_row=self.rows_consumed)
        # Pinned on CUDA: Lightning copies each batch with non_blocking=True, which overlaps the copy with the device's
        # work only from pinned memory (from pageable memory the host waits for the copy).
        pin = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        # fork on Linux, as a plain process has it: a job of Hydra's joblib launcher runs in a loky worker, whose
        # default context is loky's, which cannot start a data loader worker
        context = "fork" if workers and sys.platform == "linux" else None
        return DataLoader(batches, batch_size=None, num_workers=workers, pin_memory=pin,
                          multiprocessing_context=context)

    def check_readers(self, readers: list[int]) -> None:
        """A stream's order depends on its readers (ranks x workers): a resumed run must keep them."""
        if self.readers is not None and self.readers != readers:
            (ranks, workers), (now_ranks, now_workers) = self.readers, readers
            raise DataError(f"this run's stream was read by {ranks} ranks x {workers} data loader workers, and would "
                            f"be resumed with {now_ranks} x {now_workers}, which reads other batches; resume with "
                            f"trainer.devices x trainer.num_nodes = {ranks} and data.num_workers = {workers}")
        self.readers = readers

    def on_before_batch_transfer(self, batch: torch.Tensor, dataloader_idx: int) -> torch.Tensor:
        # Lightning calls this for each batch a training step consumes (not for batches fetched ahead),
        # on every rank; each rank's batch stands for device_batch_size x world_size global rows.
        self.rows_consumed += len(batch) * self.trainer.world_size
        return batch

    def state_dict(self) -> dict:
        return {"rows_consumed": self.rows_consumed, "tokenizer_key": self.tokenizer_key,
                **({"readers": self.readers} if self.readers else {})}

    def load_state_dict(self, state: dict) -> None:
        # The key names the corpus (for data=local: each training file's name, size and modification time), the
        # tokenizer's sample and vocabulary: another key would mean other token ids and another stream than the
        # checkpoint's weights and rows_consumed were made with.
        if "tokenizer_key" not in state:
            raise DataError("this run's checkpoint holds no tokenizer key (written before xsa-exp recorded one), so "
                            "its data cannot be checked; start it again in a new directory")
        if state["tokenizer_key"] != self.tokenizer_key:
            raise DataError(f"this run was trained on data with tokenizer key {state['tokenizer_key']}, and its data "
                            f"settings now give {self.tokenizer_key}: the corpus changed since (for data=local: a "
                            "training file added, removed, rewritten or copied without its modification time); "
                            "restore the files as they were to resume, or start a new run in a new directory")
        self.rows_consumed = state["rows_consumed"]
        self.readers = state.get("readers")  # a stream's [ranks, workers]; absent for rows held in memory

    def validation_rows(self, n_rows: int | None) -> torch.Tensor:
        """The first n_rows validation rows (all if None or the split has fewer), int32 (n, sequence_len + 1)."""
        if (n_rows is None or len(self.val_rows) < n_rows) and not self.val_complete:
            files = read_documents(self.corpus, self.corpus.val_files)
            rows = list(islice(self.train_rows.pack(self.tokenizer, files, self.sequence_len + 1), n_rows))
            if not rows:
                raise DataError(f"the validation files of data={self.corpus.name} "
                                f"({', '.join(self.corpus.val_files)}) hold fewer than sequence_len + 1 = "
                                f"{self.sequence_len + 1} tokens; use a larger validation split")
            self.val_rows, self.val_complete = torch.stack(rows), n_rows is None or len(rows) < n_rows
        return self.val_rows[:n_rows]

    def diagnostics_inputs(self, n_rows: int) -> torch.Tensor:
        """Inputs (B, T) of the first n_rows validation rows: the fixed batch of the attention diagnostics."""
        return inputs_and_targets(self.validation_rows(n_rows).long())[0]

    def val_batches(self, max_tokens: int | None, rank: int = 0, world_size: int = 1) -> list[torch.Tensor]:
        """The first ceil(max_tokens / sequence_len) validation rows (every row if max_tokens is None or exceeds the
        split), this rank's share, batched."""
        rows = self.validation_rows(self._val_row_count(max_tokens))[rank::world_size].long()
        return list(rows.split(self.device_batch_size))

    def _val_row_count(self, max_tokens: int | None) -> int | None:
        return None if max_tokens is None else math.ceil(max_tokens / self.sequence_len)

    def val_scope(self, max_tokens: int | None) -> dict:
        """How much of the validation split val_batches(max_tokens) covers, in scored tokens (rows x sequence_len):
        {"tokens": N, "split_tokens": M (None where a streamed split was not read to its end), "whole": bool}."""
        n_rows = len(self.validation_rows(self._val_row_count(max_tokens)))
        whole = self.val_complete and n_rows == len(self.val_rows)
        split = len(self.val_rows) * self.sequence_len if self.val_complete else None
        return {"tokens": n_rows * self.sequence_len, "split_tokens": split, "whole": whole}


def unigram_bits_per_byte(train_tokens: torch.Tensor, val_tokens: torch.Tensor, token_bytes: torch.Tensor) -> float:
    """Bits per byte of a model that predicts every token from its training frequency (add-one smoothed):
    the floor any trained model should get well below."""
    counts = torch.bincount(train_tokens.long(), minlength=len(token_bytes)).double() + 1
    log2_p = (counts / counts.sum()).log2()
    targets = val_tokens.long()
    nbytes = token_bytes[targets]
    keep = nbytes > 0
    return float(-log2_p[targets[keep]].sum() / nbytes[keep].sum())
