import math

import pytest
import torch

from xsa_exp.data.datamodule import PackedRows, ShuffledRowSampler, pack_documents, unigram_bits_per_byte
from xsa_exp.data.tokenizer import SPECIAL_TOKENS, Tokenizer, load_or_train_tokenizer
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


def test_tokenizer_cache_is_reused(tmp_path, monkeypatch):
    first, path = load_or_train_tokenizer(tmp_path, "corpus-v300", 300, lambda: TEXTS)
    monkeypatch.setattr(Tokenizer, "train", classmethod(lambda *a, **k: pytest.fail("retrained a cached tokenizer")))
    second, path2 = load_or_train_tokenizer(tmp_path, "corpus-v300", 300, lambda: TEXTS)
    assert path == path2 and second.encode(TEXTS[1]) == first.encode(TEXTS[1])


def test_packing_prefixes_bos_and_cuts_rows(tokenizer):
    tokens = pack_documents(tokenizer, ["Let there be light.", "And there was light."])
    first, second = tokenizer.encode("Let there be light."), tokenizer.encode("And there was light.")
    assert tokens.tolist() == [tokenizer.bos_id, *first, tokenizer.bos_id, *second]
    rows = PackedRows(tokens, 4)
    assert len(rows) == len(tokens) // 4 and rows[1].tolist() == tokens[4:8].tolist()


def test_sampler_is_seeded_epoch_permutations():
    def take(seed, n):
        it = iter(ShuffledRowSampler(10, seed))
        return [next(it) for _ in range(n)]
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


def test_evaluate_bpb_of_a_uniform_model():
    vocab = 8

    class Uniform(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, idx, targets, loss_reduction):
            logits = torch.zeros(*idx.shape, vocab) + self.w
            return torch.nn.functional.cross_entropy(logits.view(-1, vocab), targets.reshape(-1), reduction=loss_reduction)

    token_bytes = torch.full((vocab,), 2)
    rows = torch.randint(0, vocab, (3, 2, 5))
    # Uniform over 8 tokens of 2 bytes each: 3 bits per token, 1.5 bits per byte.
    assert evaluate_bpb(Uniform(), rows, token_bytes) == pytest.approx(1.5)


def test_unigram_bits_per_byte_matches_hand_computation():
    token_bytes = torch.tensor([1, 1, 0])
    train = torch.tensor([0, 0, 0, 1])
    val = torch.tensor([0, 1, 2])
    counts = torch.tensor([4.0, 2.0, 1.0])  # add-one smoothed
    p = counts / counts.sum()
    expected = -(p[0].log2() + p[1].log2()) / 2
    assert unigram_bits_per_byte(train, val, token_bytes) == pytest.approx(expected.item())
