"""Streamed corpora (data=climbmix from a local mirror, data=local): files, tokenizer budget, each
reader's share and order, resuming, and the errors for missing data. Fixtures are small files written
here and read through the same path as the hub (fsspec + pyarrow for parquet, `datasets` streaming for
json and txt)."""

import json
import os
import random
import subprocess
import sys
from itertools import islice
from types import SimpleNamespace

import lightning as L
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.conftest import REPO, compose_config
from xsa_exp.config.checks import validate
from xsa_exp.config.schema import data_settings
from xsa_exp.data import sources
from xsa_exp.data.datamodule import TextDataModule
from xsa_exp.data.packing import PACKINGS
from xsa_exp.data.sources import DataError, read_documents
from xsa_exp.data.tokenizer import Tokenizer
from xsa_exp.errors import ConfigError

SEQ, VOCAB, BATCH = 32, 300, 4
VAL_MARK, TRAIN_MARK, OTHER_FIELD_MARK = "qqvalqq", "jjtrainjj", "xxnotexx"
WORDS = ["the", "a", "light", "earth", "water", "and", "was", "day", "night", "God", "said", "made", "over", "under",
         "seven", "12", "345", "it", "good", "very", "heaven", "firmament", "seed", "tree", "fruit", "kind"]


def documents(seed: int, n: int, mark: str) -> list[str]:
    rng = random.Random(seed)
    return [f"{mark} {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) for i in range(n)]


def write_parquet(path, texts, column="text"):
    pq.write_table(pa.table({column: texts}), path, row_group_size=7)  # several row groups per file


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """A ClimbMix mirror of 4 shards: shard_00000-00002 train, shard_00003 (the last) validation."""
    root = tmp_path_factory.mktemp("climbmix")
    for shard in range(3):
        write_parquet(root / f"shard_{shard:05d}.parquet", documents(shard, 30, TRAIN_MARK))
    write_parquet(root / "shard_00003.parquet", documents(99, 30, VAL_MARK))
    return root


def climbmix_cfg(mirror, *overrides):
    return compose_config("data=climbmix", f"data.local_dir={mirror}", "data.num_shards=4",
                          "data.tokenizer_chars=20000", "data.shuffle_rows=16", "data.num_workers=0",
                          f"model.sequence_len={SEQ}", f"model.vocab_size={VOCAB}", *overrides)


def datamodule(cfg, cache, batch_size=BATCH, seed=0, rank=0, world_size=1):
    data = TextDataModule(data_settings(cfg.data), SEQ, VOCAB, batch_size, seed, str(cache))
    data.prepare_data()
    data.setup()
    # what train_dataloader reads
    data.trainer = SimpleNamespace(global_rank=rank, world_size=world_size,
                                   strategy=SimpleNamespace(root_device=torch.device("cpu")))
    return data


def take_rows(data, n_rows) -> torch.Tensor:
    batches = iter(data.train_dataloader())
    rows = torch.cat(list(islice(batches, n_rows // data.device_batch_size)))
    del batches  # shuts the workers down
    return rows


def epoch_rows(data) -> torch.Tensor:
    """One epoch of training rows in file order (before shuffling), packed as data.packing says."""
    files = read_documents(data.corpus, data.corpus.train_files)
    return torch.stack(list(PACKINGS[data.data_cfg.packing](data.tokenizer, files, SEQ + 1)))


def decoded(data, rows) -> str:
    return "\n".join(data.tokenizer.decode(row.tolist()) for row in rows)


def one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizers")


@pytest.fixture(scope="module")
def reference(mirror, cache):
    """The single-process global row sequence: 1.5 epochs or more."""
    data = datamodule(climbmix_cfg(mirror), cache)
    n_epoch = len(epoch_rows(data))
    return take_rows(data, 24 * (n_epoch * 3 // 2 // 24 + 1)), n_epoch


# (1) the mirror: tokenizer budget, rows, the validation shard kept out of training

def test_climbmix_mirror_trains_the_tokenizer_within_the_char_budget(mirror, tmp_path, monkeypatch):
    from xsa_exp.data import tokenizer as tokenizer_module

    learn = tokenizer_module.learn_merges
    texts_seen = tmp_path / "texts.json"  # written by the training process, a child of this one

    def spy(texts, vocab_size):
        texts = list(texts)
        texts_seen.write_text(json.dumps(texts))
        return learn(texts, vocab_size)

    monkeypatch.setattr(tokenizer_module, "learn_merges", spy)
    data = datamodule(climbmix_cfg(mirror, "data.tokenizer_chars=5000"), tmp_path)
    seen = json.loads(texts_seen.read_text())
    assert sum(map(len, seen)) == 5000  # the corpus has more: the budget is used up exactly
    assert seen[0] == documents(0, 1, TRAIN_MARK)[0] and VAL_MARK not in "".join(seen)
    assert data.tokenizer.vocab_size == VOCAB and data.tokenizer_dir.name == data.tokenizer_key
    assert data.tokenizer_key.endswith("-c5000-d10000-v300")  # ClimbMix's documents cut at nanochat's 10,000

    capped = datamodule(climbmix_cfg(mirror, "data.tokenizer_chars=2000", "data.tokenizer_doc_chars=40"), tmp_path)
    seen = json.loads(texts_seen.read_text())
    assert sum(map(len, seen)) == 2000 and max(map(len, seen)) == 40
    assert seen[:2] == [d[:40] for d in documents(0, 2, TRAIN_MARK)]
    assert capped.tokenizer_key.endswith("-c2000-d40-v300")

    monkeypatch.setattr(Tokenizer, "train", classmethod(lambda *a: pytest.fail("retrained a cached tokenizer")))
    again = datamodule(climbmix_cfg(mirror, "data.tokenizer_chars=5000"), tmp_path)
    assert again.tokenizer_dir == data.tokenizer_dir
    # The key names the corpus (its training shards), the budget, the documents' cut and the vocabulary.
    keys = {TextDataModule(data_settings(climbmix_cfg(mirror, *o).data), SEQ, v, BATCH, 0, str(tmp_path)).tokenizer_key
            for o, v in [(["data.tokenizer_chars=5000"], VOCAB),
                         (["data.tokenizer_chars=5000", "data.num_train_shards=2"], VOCAB),
                         (["data.tokenizer_chars=6000"], VOCAB), (["data.tokenizer_chars=5000"], 301),
                         (["data.tokenizer_chars=5000", "data.tokenizer_doc_chars=null"], VOCAB)]}
    assert len(keys) == 5


def test_climbmix_mirror_yields_rows_and_holds_out_the_last_shard(mirror, cache, monkeypatch):
    data = datamodule(climbmix_cfg(mirror), cache)
    assert [p.rsplit("/", 1)[1] for p in data.corpus.train_files] == [f"shard_{i:05d}.parquet" for i in range(3)]
    assert data.corpus.val_files == (f"{mirror.resolve()}/shard_00003.parquet",)
    read = []
    read_file = sources._read_file
    monkeypatch.setattr(sources, "_read_file",
                        lambda corpus, file, mine: read.append(file) or read_file(corpus, file, mine))
    n_epoch = len(epoch_rows(data))
    read.clear()
    n_rows = BATCH * (2 * n_epoch // BATCH + 1)  # into the third epoch
    rows = take_rows(data, n_rows)
    assert rows.dtype == torch.int64 and rows.shape == (n_rows, SEQ + 1)
    assert read and not any(f.endswith("shard_00003.parquet") for f in read)
    text = decoded(data, rows)
    assert TRAIN_MARK in text and VAL_MARK not in text
    # each document starts with BOS (2 epochs, short tails)
    assert (rows == data.tokenizer.bos_id).sum() >= 2 * (90 - 2)
    val = data.val_batches(10 * SEQ)
    assert sum(len(b) for b in val) == 10 and all(b.dtype == torch.int64 for b in val)
    val_text = decoded(data, torch.cat(val))
    assert VAL_MARK in val_text and TRAIN_MARK not in val_text
    assert torch.equal(data.validation_rows(3).long(), torch.cat(val)[:3])
    assert data.unigram_bpb is None and data.token_bytes.shape == (VOCAB,)


@pytest.mark.parametrize("packing", ["bestfit", "concat"])
def test_validation_rows_are_the_first_rows_of_the_validation_shard(mirror, cache, packing):
    data = datamodule(climbmix_cfg(mirror, f"data.packing={packing}"), cache)
    files = read_documents(data.corpus, data.corpus.val_files)
    expected = torch.stack(list(islice(PACKINGS[packing](data.tokenizer, files, SEQ + 1), 25)))
    if packing == "bestfit":  # nanochat's rows: each starts at a document
        assert (expected[:, 0] == data.tokenizer.bos_id).all()
    assert torch.equal(torch.cat(data.val_batches(5 * SEQ)), expected[:5].long())
    assert torch.equal(torch.cat(data.val_batches(25 * SEQ)), expected.long())  # a larger request reads further
    assert torch.equal(torch.cat(data.val_batches(25 * SEQ, rank=1, world_size=2)), expected[1::2].long())
    assert len(torch.cat(data.val_batches(10**6))) < 10**6 // SEQ  # capped at the shard


# (2) readers: each rank (and worker) reads and tokenizes only its share; its batches are fixed by seed, ranks, workers

def share(data, reader, readers) -> list[str]:
    return [text for batch in read_documents(data.corpus, data.corpus.train_files, reader, readers) for text in batch]


@pytest.mark.parametrize("readers", [2, 3, 4, 8])
def test_readers_partition_the_training_documents(mirror, cache, readers):
    data = datamodule(climbmix_cfg(mirror), cache)
    shares = [share(data, k, readers) for k in range(readers)]
    assert sorted(sum(shares, [])) == sorted(share(data, 0, 1))  # every document in exactly one share
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 7  # 15 row groups of up to 7 documents, dealt round: at most one apart


def test_a_rank_tokenizes_only_its_share(mirror, cache):
    data = datamodule(climbmix_cfg(mirror), cache, rank=0, world_size=2)
    tokenized, encode = [], data.tokenizer.encode_batch
    data.tokenizer.encode_batch = lambda texts: tokenized.extend(texts) or encode(texts)
    take_rows(data, BATCH * 10)
    mine, theirs = set(share(data, 0, 2)), set(share(data, 1, 2))
    assert tokenized and set(tokenized) <= mine and not set(tokenized) & theirs


@pytest.mark.parametrize("world_size,workers", [(1, 2), (2, 1), (2, 2), (3, 1)])
def test_a_rank_interleaves_the_batches_of_its_workers_readers(mirror, cache, world_size, workers):
    cfg = climbmix_cfg(mirror, f"data.num_workers={workers}")
    n_batches = 6 * workers
    for rank in range(world_size):
        data = datamodule(cfg, cache, rank=rank, world_size=world_size)
        batches = take_rows(data, n_batches * BATCH).view(n_batches, BATCH, SEQ + 1)
        readers = [data.train_rows.reader_rows(rank * workers + w, world_size * workers) for w in range(workers)]
        for i, batch in enumerate(batches):  # the DataLoader takes its workers' batches in turn
            assert torch.equal(batch, torch.stack(list(islice(readers[i % workers], BATCH))).long())


# (3) the order depends on the seed only

def test_same_seed_same_rows_whatever_the_batch_size_and_another_seed_another_order(mirror, cache, reference):
    expected, n_epoch = reference
    cfg = climbmix_cfg(mirror)
    assert torch.equal(take_rows(datamodule(cfg, cache, batch_size=6), 6 * 20), expected[:120])
    other = take_rows(datamodule(cfg, cache, seed=1), len(expected))
    assert not torch.equal(other[:n_epoch], expected[:n_epoch])
    # The same rows, in another order: only the shuffle depends on the seed.
    same_epoch = epoch_rows(datamodule(cfg, cache))
    for rows in (expected[:n_epoch], other[:n_epoch]):
        assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, same_epoch.tolist()))
    assert not torch.equal(expected[n_epoch:2 * n_epoch][:24], expected[:24])  # each epoch is shuffled anew


# (4) resuming

@pytest.mark.parametrize("world_size,workers", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_state_dict_resumes_at_the_next_row(mirror, cache, world_size, workers):
    cfg = climbmix_cfg(mirror, f"data.num_workers={workers}")
    ranks = [datamodule(cfg, cache, rank=r, world_size=world_size) for r in range(world_size)]
    uninterrupted = []
    for data in ranks:
        batches = list(islice(iter(data.train_dataloader()), 8))
        for batch in batches[:7]:
            data.on_before_batch_transfer(batch, 0)  # Lightning's call for each consumed batch
        uninterrupted.append(batches[7])
    state = ranks[0].state_dict()
    assert state == {"rows_consumed": 7 * BATCH * world_size, "readers": [world_size, workers],
                     "tokenizer_key": ranks[0].tokenizer_key}
    assert all(d.state_dict() == state for d in ranks)
    for r in range(world_size):
        data = datamodule(cfg, cache, rank=r, world_size=world_size)
        data.load_state_dict(state)
        assert torch.equal(next(iter(data.train_dataloader())), uninterrupted[r])


def test_resuming_a_stream_with_other_readers_is_one_line_naming_the_fix(mirror, cache):
    data = datamodule(climbmix_cfg(mirror, "data.num_workers=1"), cache)
    data.load_state_dict({"rows_consumed": 8 * BATCH, "readers": [2, 1], "tokenizer_key": data.tokenizer_key})
    with pytest.raises(DataError) as e:
        data.train_dataloader()
    assert ("read by 2 ranks x 1 data loader workers" in one_line(e)
            and "trainer.devices x trainer.num_nodes = 2" in str(e.value))


def test_a_file_failing_in_a_data_loader_worker_is_one_line(mirror, cache, tmp_path):
    """torch hands a worker's exception back as its type with "Caught ... Original Traceback" and the traceback as
    its text: the line is still the error's own."""
    for i in range(4):
        (tmp_path / f"shard_{i:05d}.parquet").write_bytes((mirror / f"shard_{i:05d}.parquet").read_bytes())
    data = datamodule(climbmix_cfg(tmp_path, "data.num_workers=1"), cache)
    (tmp_path / "shard_00001.parquet").write_bytes(b"PAR1" + bytes(64) + b"PAR1")  # damaged since the start
    with pytest.raises(DataError) as e:
        take_rows(data, 64 * BATCH)
    assert one_line(e).startswith(f"cannot read {tmp_path}/shard_00001.parquet (")
    assert one_line(e).endswith("; it is damaged: replace it (download it again)")


def test_resuming_on_a_changed_corpus_is_one_line_naming_the_fix(tmp_path, cache):
    """A training file rewritten (or copied without its time) between a preemption and the resume gives another
    tokenizer key: the resumed run would tokenize and deal its stream otherwise, so it is refused."""
    folder = tmp_path / "jsonl"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        (folder / name).write_text("".join(f'{{"text": "document {i} of {name}"}}\n' for i in range(50)))
    cfg = compose_config("data=local", f"data.path={folder}/*.jsonl", "data.tokenizer_chars=20000")
    state = datamodule(cfg, cache).state_dict()
    datamodule(cfg, cache).load_state_dict(state)  # the same files: resumes
    with pytest.raises(DataError, match="holds no tokenizer key"):
        datamodule(cfg, cache).load_state_dict({"rows_consumed": state["rows_consumed"]})
    os.utime(folder / "a.jsonl", ns=(0, 0))
    with pytest.raises(DataError) as e:
        datamodule(cfg, cache).load_state_dict(state)
    assert "the corpus changed since" in one_line(e) and "restore the files as they were" in str(e.value)


class Recorder(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch.clone())
        return self.w.sum() * batch.float().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_checkpoint_resumes_the_data_exactly(mirror, cache, tmp_path):
    cfg = climbmix_cfg(mirror, "data.num_workers=1")

    def fit(max_steps, ckpt_path=None):
        module, data = Recorder(), TextDataModule(data_settings(cfg.data), SEQ, VOCAB, BATCH, 0, str(cache))
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, accumulate_grad_batches=2, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=str(tmp_path))
        trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
        return trainer, module

    _, whole = fit(6)
    first, _ = fit(3)
    first.save_checkpoint(tmp_path / "step3.ckpt")
    assert torch.load(tmp_path / "step3.ckpt", weights_only=False)["TextDataModule"] == {
        "rows_consumed": 6 * BATCH, "readers": [1, 1], "tokenizer_key": first.datamodule.tokenizer_key}
    _, resumed = fit(6, tmp_path / "step3.ckpt")
    assert len(whole.seen) == 12 and len(resumed.seen) == 6
    assert all(torch.equal(a, b) for a, b in zip(resumed.seen, whole.seen[6:]))


# (5) missing data

@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_offline_without_a_mirror_is_one_line_naming_the_url_and_the_fix(variable, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv(variable, "1")
    cfg = compose_config("data=climbmix")
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    message = one_line(e)
    assert "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle" in message
    assert "data.local_dir" in message and f"unset {variable}" in message
    with pytest.raises(DataError) as e:
        TextDataModule(data_settings(cfg.data), SEQ, VOCAB, BATCH, 0, "/nonexistent")
    assert one_line(e) == message


def test_a_partial_mirror_is_one_line_naming_the_missing_file_and_the_fix(mirror, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "shard_00000.parquet").write_bytes((mirror / "shard_00000.parquet").read_bytes())
    with pytest.raises(ConfigError) as e:
        validate(climbmix_cfg(tmp_path))
    message = one_line(e)
    assert f"{tmp_path}/shard_00001.parquet is missing (and 2 more files)" in message
    assert "data.local_dir" in message and "data.num_train_shards" in message
    validate(climbmix_cfg(mirror, "data.num_train_shards=1"))  # a complete mirror passes, offline too
    for i in range(4):  # a download cut short: found before training reaches the file
        whole = (mirror / f"shard_{i:05d}.parquet").read_bytes()
        (tmp_path / f"shard_{i:05d}.parquet").write_bytes(whole[:len(whole) // 2] if i in (1, 2) else whole)
    with pytest.raises(ConfigError) as e:
        validate(climbmix_cfg(tmp_path))
    assert one_line(e) == (f"{tmp_path}/shard_00001.parquet is not a whole parquet file (and 1 more "
                           "files): a download that stopped part-way, or a copy cut short; download it again")
    for i in range(1, 4):
        (tmp_path / f"shard_{i:05d}.parquet").unlink()

    with pytest.raises(ConfigError) as e:
        validate(climbmix_cfg(tmp_path / "nowhere"))
    assert f"data.local_dir={tmp_path / 'nowhere'} is not a directory" in one_line(e)
    # Without the config check (evaluate.py, or a file removed since), reading fails the same way.
    data = TextDataModule(data_settings(climbmix_cfg(tmp_path, "data.num_train_shards=2").data), SEQ, VOCAB, BATCH, 0,
                          str(tmp_path))
    with pytest.raises(DataError) as e:
        data.prepare_data()
    message = one_line(e)
    assert f"cannot read {tmp_path}/shard_00001.parquet" in message and "data.local_dir" in message


def test_train_py_reports_offline_missing_data_in_one_line(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "train.py", "data=climbmix", f"hydra.run.dir={tmp_path}/run"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("config error: data=climbmix streams from https://huggingface.co/")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


# (6) local corpora

def test_local_jsonl_corpus_reads_the_configured_field_and_holds_out_the_last_file(tmp_path, cache):
    for name, seed, mark in (("a", 1, TRAIN_MARK), ("b", 2, TRAIN_MARK), ("c", 3, VAL_MARK)):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            for text in documents(seed, 40, mark):
                f.write(json.dumps({"id": seed, "body": text, "note": OTHER_FIELD_MARK}) + "\n")
    cfg = compose_config("data=local", f"data.path={tmp_path}", "data.text_column=body", "data.tokenizer_chars=20000",
                         "data.num_workers=0")
    validate(cfg)
    data = datamodule(cfg, cache)
    assert ([p.rsplit("/", 1)[1] for p in data.corpus.train_files + data.corpus.val_files]
            == ["a.jsonl", "b.jsonl", "c.jsonl"])
    text = decoded(data, take_rows(data, 2 * len(epoch_rows(data))))
    assert TRAIN_MARK in text and VAL_MARK not in text and OTHER_FIELD_MARK not in text
    val_text = decoded(data, data.validation_rows(10).long())
    assert VAL_MARK in val_text and TRAIN_MARK not in val_text

    local = data_settings(compose_config("data=local", f"data.path={tmp_path}").data)
    bad = TextDataModule(local, SEQ, VOCAB, BATCH, 0, str(cache))
    with pytest.raises(DataError) as e:
        bad.prepare_data()
    assert one_line(e) == (f"data.text_column='text' is not a column of {tmp_path}/a.jsonl (it has id, body, note); "
                           "set data.text_column")


def test_local_txt_corpus_with_a_validation_path(tmp_path, cache):
    (tmp_path / "corpus").mkdir()
    for name, seed in (("1", 1), ("2", 2), ("3", 3)):
        (tmp_path / "corpus" / f"{name}.txt").write_text("\n\n".join(documents(seed, 30, TRAIN_MARK)))
    (tmp_path / "corpus" / "val.txt").write_text("\n\n".join(documents(4, 30, VAL_MARK)))
    (tmp_path / "corpus" / "notes.md").write_text(OTHER_FIELD_MARK)  # not a corpus format: ignored
    overrides = ["data=local", f"data.path={tmp_path}/corpus/*.txt", f"data.val_path={tmp_path}/corpus/val.txt",
                 "data.tokenizer_chars=20000", "data.num_workers=0"]
    cfg = compose_config(*overrides, "data.txt_sample_by=paragraph")
    validate(cfg)
    data = datamodule(cfg, cache)
    assert [p.rsplit("/", 1)[1] for p in data.corpus.train_files] == ["1.txt", "2.txt", "3.txt"]  # val.txt kept out
    assert sum(map(len, read_documents(data.corpus, data.corpus.train_files))) == 90  # a document per paragraph
    text = decoded(data, take_rows(data, len(epoch_rows(data))))
    assert TRAIN_MARK in text and VAL_MARK not in text and OTHER_FIELD_MARK not in text
    assert VAL_MARK in decoded(data, data.validation_rows(10).long())
    whole_files = compose_config(*overrides).data  # the default: a file is a document
    assert sum(map(len, read_documents(sources.local_corpus(whole_files), data.corpus.train_files))) == 3


@pytest.mark.parametrize("name,content,expected", [
    ("a.jsonl", b'{"text": "one"}\n\n{"text": "two"}\n{"text": "three}\n{"text": "four"}\n',
     "line 4 is not valid JSON (Unterminated string starting at column 10)"),
    ("a.jsonl", b'\xef\xbb\xbf{"text": "one"}\n{"text": "two"}\n["three"]\n', "line 3 is not a JSON object"),
    ("a.json", b'[\n {"text": "one"},\n {"text": "two"}\n {"text": "three"}\n]\n',
     "line 4 is not valid JSON (Expecting ',' delimiter at column 2)"),
    ("a.txt", b"one\ntwo\n\nfour \xff\n", "line 4 is not UTF-8 (byte 0xff at byte 6 of the line)")])
def test_a_malformed_line_is_named_as_an_editor_numbers_it(tmp_path, name, content, expected):
    """The readers count rows from 0 within a chunk of the file (a malformed line 18 was "row 17"); the message
    names the line as an editor shows it, counting blank lines (and not a byte-order mark)."""
    (tmp_path / name).write_bytes(content)
    (tmp_path / "val.txt").write_text("the validation file\n")
    corpus = sources.local_corpus(compose_config("data=local", f"data.path={tmp_path}", "data.txt_sample_by=line").data)
    with pytest.raises(DataError) as e:
        list(read_documents(corpus, (str(tmp_path / name),)))
    assert one_line(e).startswith(f"cannot read {tmp_path / name}: {expected}; check that the file is readable")


def test_local_corpus_settings_are_checked_in_one_line(tmp_path):
    (tmp_path / "only.jsonl").write_text('{"text": "x"}\n')
    cases = [([], "data=local needs data.path"),
             ([f"data.path={tmp_path}/none*"], f"data.path={tmp_path}/none* matches no .parquet"),
             ([f"data.path={tmp_path}"], "matches one file"),
             ([f"data.path={tmp_path}", f"data.val_path={tmp_path}/only.jsonl"], "has no files besides"),
             ([f"data.path={tmp_path}", "data.txt_sample_by=page"], "data.txt_sample_by='page' is not an option"),
             ([f"data.path={tmp_path}", "data.shuffle_rows=0"], "data.shuffle_rows=0 must be a positive integer")]
    for overrides, expected in cases:
        with pytest.raises(ConfigError) as e:
            validate(compose_config("data=local", *overrides))
        assert expected in one_line(e)
