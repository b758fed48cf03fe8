import pytest

from xsa_exp.data.chat import render_conversation
from xsa_exp.data.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train(["What is two plus two? It is four. Let me compute 2+2 = 4."] * 20, 300)


def test_only_assistant_tokens_are_trained(tokenizer):
    s = tokenizer.special_tokens
    ids, mask = render_conversation(tokenizer, [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me compute "},
                                          {"type": "python", "text": "2+2"},
                                          {"type": "python_output", "text": "4"},
                                          {"type": "text", "text": "It is four."}]},
    ])
    assert len(ids) == len(mask) and ids[0] == tokenizer.bos_id
    user_end = ids.index(s["<|user_end|>"])
    assert tokenizer.decode(ids[2:user_end]) == "Be brief.\n\nWhat is two plus two?"
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m and t < tokenizer.bos_id])
    assert trained == "Let me compute 2+2It is four."
    assert mask[ids.index(s["<|python_start|>"])] == 1 and mask[ids.index(s["<|output_start|>"])] == 0
    assert mask[ids.index(s["<|assistant_start|>"])] == 0 and ids[-1] == s["<|assistant_end|>"] and mask[-1] == 1
    assert sum(mask[:user_end + 1]) == 0


def test_truncation_and_bad_turn_order(tokenizer):
    ids, mask = render_conversation(tokenizer, [{"role": "user", "content": "What is two plus two?"},
                                                {"role": "assistant", "content": "It is four."}], max_tokens=5)
    assert len(ids) == len(mask) == 5
    with pytest.raises(ValueError, match="alternate user, assistant"):
        render_conversation(tokenizer, [{"role": "assistant", "content": "hi"}])
