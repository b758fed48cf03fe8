import pytest
import torch

from xsa_exp.generate import generate, generate_batch
from xsa_exp.model import GPT, GPTConfig, KVCache, XSASettings


def trained_like_model(**xsa):
    torch.manual_seed(0)
    model = GPT(GPTConfig(sequence_len=48, vocab_size=300, n_layer=3, n_head=2, n_embd=32, xsa=XSASettings(**xsa)))
    with torch.no_grad():  # non-zero projections and thetas, so XSA and its cached path matter
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


ARMS = {"alpha=0": dict(layers=[0, 1, 2], alpha=0.0), "alpha=1": dict(layers=[0, 1, 2], alpha=1.0),
        "learnable": dict(layers=[0, 2], learnable=True, alpha=0.5),
        "plain": dict(layers=[0, 1, 2], value_source="plain")}


@pytest.mark.parametrize("arm", list(ARMS))
def test_cached_logits_equal_full_recomputation(arm):
    model = trained_like_model(**ARMS[arm]).eval()
    idx = torch.randint(0, 300, (2, 40))
    full = model(idx)
    cache = KVCache(model.config, 2, 40, "cpu")
    pieces = [model(idx[:, :17], kv_cache=cache)]  # prefill several tokens, then one at a time and in chunks
    for start, end in [(17, 18), (18, 19), (19, 25), (25, 40)]:
        pieces.append(model(idx[:, start:end], kv_cache=cache))
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arm", list(ARMS))
def test_cached_generation_equals_full_recomputation_token_for_token(arm):
    model = trained_like_model(**ARMS[arm])
    prompt = [5, 17, 42, 7, 99]
    cached = generate(model, prompt, max_new_tokens=30, num_samples=2)
    full = generate(model, prompt, max_new_tokens=30, num_samples=2, use_cache=False)
    assert cached == full and len(cached[0]) == 30
    sampled = generate(model, prompt, 20, num_samples=3, temperature=1.0, top_k=50, seed=1)
    assert sampled == generate(model, prompt, 20, num_samples=3, temperature=1.0, top_k=50, seed=1, use_cache=False)


def test_xsa_changes_generation_and_the_cache_does_not_hide_it():
    """Each arm's cached generation is its full-recompute greedy decoding, and those differ between the arms."""
    prompt = [5, 17, 42]
    off, on = trained_like_model(**ARMS["alpha=0"]), trained_like_model(**ARMS["alpha=1"])
    cached_off, cached_on = generate(off, prompt, 20)[0], generate(on, prompt, 20)[0]
    assert cached_off == generate(off, prompt, 20, use_cache=False)[0]
    assert cached_on == generate(on, prompt, 20, use_cache=False)[0]
    assert cached_off != cached_on


def test_stop_tokens_and_length_limit():
    model = trained_like_model(**ARMS["alpha=1"])
    free = generate(model, [1, 2, 3], 10)[0]
    stopped = generate(model, [1, 2, 3], 10, stop_tokens=[free[4]])[0]
    assert stopped == free[: free.index(free[4])]
    assert len(generate(model, [1] * 40, 10)[0]) == 10  # past the training length, as nanochat generates
    with pytest.raises(ValueError, match="exceeds 480, 10x model.sequence_len=48"):
        generate(model, [1] * 400, 90)


@pytest.mark.parametrize("arm", list(ARMS))
def test_batched_prompts_of_different_lengths_continue_as_each_would_alone(arm):
    model = trained_like_model(**ARMS[arm]).eval()
    prompts = [[5, 17, 42, 7, 99], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], [250]]
    # the padded prefill gives each row's last logits as its prompt alone does
    width = max(map(len, prompts))
    padding = torch.tensor([width - len(p) for p in prompts])
    idx = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    batched = model(idx, kv_cache=KVCache(model.config, 3, width, "cpu", first=padding))[:, -1]
    alone = torch.stack([model(torch.tensor([p]))[0, -1] for p in prompts])
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-4)
    # and the greedy continuations are the same tokens
    assert generate_batch(model, prompts, 25) == [generate(model, p, 25)[0] for p in prompts]


@pytest.mark.parametrize("prompts, options, message", [
    ([[1, 2]], {"temperature": -1.0}, r"temperature=-1.0; use 0 \(greedy\) or more"),
    ([[1, 2]], {"temperature": float("nan")}, r"temperature=nan"),
    ([[1, 2]], {"temperature": 1.0, "top_k": 0}, r"top_k=0; use 1 or more, or None for every token"),
    ([[1, 2]], {"max_new_tokens": -3}, r"max_new_tokens=-3; use 0 or more"),
    ([[1, 2], []], {}, r"prompts must be one or more non-empty token lists"),
    ([], {}, r"prompts must be one or more non-empty token lists"),
    ([[1, 300]], {}, r"prompt token ids must be in \[0, 300\) \(model.vocab_size=300\)"),
])
def test_arguments_outside_their_range_are_refused_by_name(prompts, options, message):
    """A negative temperature would sample the least likely tokens; the others would fail deep inside torch."""
    with pytest.raises(ValueError, match=message):
        generate_batch(trained_like_model(**ARMS["alpha=1"]), prompts, **{"max_new_tokens": 5, **options})


def test_full_recomputation_refuses_padded_prompts():
    with pytest.raises(ValueError, match="use_cache=False needs prompts of one length"):
        generate_batch(trained_like_model(**ARMS["alpha=1"]), [[1, 2], [3]], 5, use_cache=False)


def test_the_cache_is_in_the_compute_dtype():
    model = trained_like_model(**ARMS["alpha=1"]).eval()
    idx = torch.randint(0, 300, (2, 8))
    cache = KVCache(model.config, 2, 8, "cpu")
    model(idx, kv_cache=cache)
    assert cache.k.dtype == cache.v.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cache = KVCache(model.config, 2, 8, "cpu")
        model(idx, kv_cache=cache)
    assert cache.k.dtype == cache.v.dtype == torch.bfloat16  # half the memory, no cast of the prefix per step


@pytest.mark.parametrize("arm", list(ARMS))
def test_cached_logits_under_bf16_autocast_are_full_recomputation_to_bf16_rounding(arm):
    """Tolerance: both paths round to bf16 (8 significant bits) at every matmul, in a different order, so the
    logits (|logit| up to about 7 here) agree to 0.1 and the greedy choice at 95% of the positions or more."""
    model = trained_like_model(**ARMS[arm]).eval()
    idx = torch.randint(0, 300, (2, 40))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(idx)
        cache = KVCache(model.config, 2, 40, "cpu")
        cached = torch.cat([model(idx[:, a:b], kv_cache=cache) for a, b in [(0, 17), (17, 18), (18, 25), (25, 40)]], 1)
    assert (cached - full).abs().max() <= 0.1
    assert (cached.argmax(-1) == full.argmax(-1)).float().mean() >= 0.95
