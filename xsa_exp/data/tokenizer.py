"""Byte-level BPE in the nanochat way: trained with rustbpe, encoded with tiktoken, cached on disk.

A trained tokenizer is a folder: `merges.tiktoken` (tiktoken's own rank-file format), `tokenizer.json`
(split pattern, special tokens, vocab size) and `token_bytes.pt` (UTF-8 byte length of every token,
0 for special tokens; the denominator of bits-per-byte).
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import rustbpe
import tiktoken
import torch

from xsa_exp.cluster import available_cpus
from xsa_exp.data.sources import DataError

T = TypeVar("T")
# GPT-4's split pattern with numbers split into groups of at most two digits, as nanochat.
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|"""
                 r"""\s*[\r\n]|\s+(?!\S)|\s+""")
# BOS starts every document; the rest are the chat tokens the SFT stage renders conversations with.
SPECIAL_TOKENS = ["<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
                  "<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>"]


class Tokenizer:
    def __init__(self, mergeable_ranks: dict[bytes, int], pattern: str = SPLIT_PATTERN):
        offset = len(mergeable_ranks)
        self.special_tokens = {name: offset + i for i, name in enumerate(SPECIAL_TOKENS)}
        self.mergeable_ranks = mergeable_ranks
        self.pattern = pattern
        self.enc = tiktoken.Encoding(name="xsa-exp", pat_str=pattern, mergeable_ranks=mergeable_ranks,
                                     special_tokens=self.special_tokens)
        self.bos_id = self.special_tokens["<|bos|>"]
        self.threads = available_cpus()  # encode_batch's; a data loader worker takes its share

    @property
    def vocab_size(self) -> int:
        return self.enc.n_vocab

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> Tokenizer:
        """rustbpe's byte-level BPE of texts, learned in a child process (in_child_process says why)."""
        return cls(*in_child_process(lambda: learn_merges(texts, vocab_size)))

    def encode(self, text: str) -> list[int]:
        """Plain text to ids; special-token strings in the text are encoded as ordinary text."""
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(texts, num_threads=self.threads)

    def decode(self, ids: list[int]) -> str:
        return self.enc.decode(ids)

    def token_bytes(self) -> torch.Tensor:
        sizes = torch.zeros(self.vocab_size, dtype=torch.int32)
        for token, rank in self.mergeable_ranks.items():
            sizes[rank] = len(token)
        return sizes

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "merges.tiktoken", "wb") as f:
            for token, rank in sorted(self.mergeable_ranks.items(), key=lambda item: item[1]):
                f.write(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")
        meta = {"pattern": self.pattern, "special_tokens": self.special_tokens, "vocab_size": self.vocab_size}
        (directory / "tokenizer.json").write_text(json.dumps(meta, indent=1))
        torch.save(self.token_bytes(), directory / "token_bytes.pt")

    @classmethod
    def load(cls, directory: Path) -> Tokenizer:
        meta_path = directory / "tokenizer.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"no tokenizer at {directory} (missing tokenizer.json)")
        try:
            meta = json.loads(meta_path.read_text())
            pattern, merged = meta["pattern"], meta["vocab_size"] - len(meta["special_tokens"])
        except (ValueError, KeyError, TypeError) as e:  # a lost write: empty, cut short
            raise ValueError(f"{meta_path} is damaged ({type(e).__name__}: {e})") from None
        ranks = read_merges(directory / "merges.tiktoken")
        if sorted(ranks.values()) != list(range(merged)):  # tiktoken would panic on a repeated rank, not raise
            raise ValueError(f"{directory / 'merges.tiktoken'} is damaged: its ranks are not 0 to {merged - 1}, "
                             "each once (cut short?)")
        tokenizer = cls(ranks, pattern)
        if tokenizer.special_tokens != meta["special_tokens"]:
            raise ValueError(f"tokenizer at {directory} has other special tokens than this version of xsa-exp")
        return tokenizer


def read_merges(path: Path) -> dict[bytes, int]:
    """merges.tiktoken's ranks, read from the file itself: tiktoken's loader keeps a copy of every file it reads
    under the file's path in a temporary folder, so a run directory written anew at the same path (a rerun) would
    get the old run's merges back."""
    ranks = {}
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise ValueError(f"{path} is damaged: line {number} is not '<base64 token> <rank>'") from None
    return ranks


def learn_merges(texts: Iterable[str], vocab_size: int) -> tuple[dict[bytes, int], str]:
    """rustbpe's byte-level BPE of texts: the mergeable ranks and the split pattern."""
    n_merged = vocab_size - len(SPECIAL_TOKENS)
    if n_merged < 256:
        raise ValueError(f"model.vocab_size={vocab_size} is too small; "
                         f"byte-level BPE needs at least {256 + len(SPECIAL_TOKENS)}")
    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(iter(texts), n_merged, pattern=SPLIT_PATTERN)
    return {bytes(token): rank for token, rank in bpe.get_mergeable_ranks()}, bpe.get_pattern()


def load_or_train_tokenizer(cache_root: Path, key: str, vocab_size: int,
                            texts: Callable[[], Iterable[str]]) -> tuple[Tokenizer, Path]:
    """The tokenizer cached under cache_root/key, trained on texts() the first time.

    Written to a temporary folder and renamed into place, so concurrent runs (a sweep) never see a
    half-written tokenizer; a loser of the race simply uses the winner's.
    """
    directory = cache_root / "tokenizers" / key
    if (directory / "token_bytes.pt").is_file():
        return load_cached(directory), directory
    tokenizer = Tokenizer.train(texts(), vocab_size)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=directory.parent))
    tokenizer.save(staging)
    try:
        staging.rename(directory)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return load_cached(directory), directory
    return tokenizer, directory


def load_cached(directory: Path) -> Tokenizer:
    try:
        return Tokenizer.load(directory)
    except (FileNotFoundError, ValueError) as e:
        raise DataError(f"the cached tokenizer {directory} is damaged ({e}); delete that folder, and the next run "
                        "trains it again") from None


def in_child_process(work: Callable[[], T]) -> T:
    """work() in a forked child process, its result or its exception handed back. rustbpe holds the GIL while it
    merges, minutes on a real corpus (2B characters of ClimbMix), which would starve this process's threads: the run
    directory lock's heartbeat among them, whose silence stops the run. rustbpe runs only in such children: a child
    forked from a process whose rayon thread pool had started would wait for those threads forever. Where fork is
    not the default (not Linux), in this process."""
    if sys.platform != "linux":
        return work()
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        receive.close()  # else a parent gone before reading would leave this child blocked in send() for ever
        # the parent's handlers (submitit's requeue on SIGUSR2, its SIGTERM bypass) are the parent's to run
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for parents in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(parents, signal.SIG_IGN)
        try:
            outcome = (True, work())
        except BaseException as e:  # handed to the parent, which raises it
            outcome = (False, e)
        try:
            send.send(outcome)
        except Exception as e:  # an exception that does not pickle: its line
            send.send((False, RuntimeError(f"{type(outcome[1]).__name__}: {outcome[1]} ({e})")))

    process = context.Process(target=child, name="tokenizer training", daemon=True)
    process.start()
    send.close()
    try:
        done, value = receive.recv()
    except EOFError:  # the child died without a word
        process.join()
        raise DataError(f"the tokenizer's training process ended with exit status {process.exitcode} (a negative "
                        "status is the signal that killed it; -9, out of memory?): lower data.tokenizer_chars, or "
                        "give the job more memory") from None
    finally:
        receive.close()
    process.join()
    if not done:
        raise value
    return value


def char_budget(texts: Iterable[str], n_chars: int) -> Iterator[str]:
    """The texts in order until n_chars characters in all, the last one cut to fit: the tokenizer's
    training sample (nanochat trains on about 2B characters of its corpus)."""
    left = n_chars
    for text in texts:
        yield text[:left]
        left -= min(len(text), left)
        if left == 0:
            return
