"""nanochat's April 2026 stack (stack=nanochat_2604): sliding windows, q/k scale, grouped-query attention, smear,
backout, Muon's variance reduction and cautious weight decay, per-role AdamW betas and weight decay, warmup and
the momentum / weight-decay schedules; each with XSA, the KV cache and the config checks it needs."""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from tests.conftest import compose_config
from xsa_exp.config.checks import validate
from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
from xsa_exp.errors import ConfigError
from xsa_exp.eval.diagnostics import attention_diagnostics
from xsa_exp.generate import generate, generate_batch
from xsa_exp.model import GPT, GPTConfig, KVCache, XSASettings
from xsa_exp.model.gpt import causal_attention, window_mask
from xsa_exp.model.xsa_op import exclusive_self_attention
from xsa_exp.optim import MuonAdamW, OptimizerSchedule, build_param_groups
from xsa_exp.optim.muon_adamw import variance_reduce

# The switches of the April 2026 stack, at a shape where the short window (128) is shorter than the context.
STACK = dict(window_pattern="SSSL", qk_scale=1.2, smear=True, backout=True, wte_init_std=0.8, fc_init_scale=0.4,
             resid_lambda_init=(1.15, 1.05), x0_lambda_init=(0.2, 0.05), ve_gate_init=0.02)
MODELS = {"classic": {}, "nanochat_2604": STACK, "nanochat_2604 + GQA": dict(STACK, n_kv_head=2),
          "windows only": dict(window_pattern="SSSL"), "smear only": dict(smear=True), "GQA only": dict(n_kv_head=1)}


def model_of(xsa=None, **switches) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(sequence_len=300, vocab_size=300, n_layer=4, n_head=4, n_embd=32, **switches,
                       xsa=XSASettings(**(xsa or dict(layers=[0, 1, 2, 3], alpha=1.0))))
    model = GPT(config)
    with torch.no_grad():  # non-zero projections, gates and lambdas, so every feature changes the output
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def test_windows_follow_nanochat_pattern():
    config = GPTConfig(sequence_len=2048, n_layer=12, window_pattern="SSSL")
    assert config.windows() == [512, 512, 512, None] * 3  # a quarter of 2048
    assert GPTConfig(sequence_len=2048, n_layer=6, window_pattern="SSSL").windows() == [512, 512, 512, None, 512, None]
    assert GPTConfig(sequence_len=1000, n_layer=2, window_pattern="S").windows() == [256, None]  # 250 up to 128s
    config = GPTConfig(sequence_len=256, n_layer=4, window_pattern="SL")
    assert config.windows() == config.windows(100) == [128, None, 128, None]
    # past the training length, nanochat's L layers keep a window of it: it covers 257 tokens, not 258
    assert config.windows(257) == [128, None, 128, None] and config.windows(258) == [128, 256, 128, 256]
    config = GPTConfig(sequence_len=128, n_layer=4, window_pattern="S")
    assert config.windows() == [None] * 4 and config.windows(1280) == [128] * 4  # 128 covers 128 tokens


def test_inputs_past_the_training_length_are_windowed_as_nanochats():
    """Up to 10x the training length, as nanochat's RoPE tables (CORE scores long prompts whole): an L layer sees
    the training length of earlier tokens, the cache computes what the full forward does, and longer is refused."""
    torch.manual_seed(0)
    config = GPTConfig(sequence_len=64, vocab_size=300, n_layer=1, n_head=2, n_embd=16, window_pattern="L")
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
        idx = torch.randint(1, 300, (1, 150))
        other = idx.clone()
        other[0, 0] = 0
        changed = (model(idx) - model(other)).abs().amax(-1)[0] > 0
        assert changed[64] and not changed[65:].any()  # position 64 sees 0..64, position 65 sees 1..65
        cache = KVCache(config, 1, 150, "cpu")
        pieces = [model(idx[:, :40], kv_cache=cache), model(idx[:, 40:100], kv_cache=cache)]
        pieces += [model(idx[:, t:t + 1], kv_cache=cache) for t in range(100, 150)]
        torch.testing.assert_close(torch.cat(pieces, 1), model(idx), rtol=1e-5, atol=1e-5)
        model(torch.zeros(1, 640, dtype=torch.long))
        with pytest.raises(ValueError, match="input of 641 tokens exceeds 640, 10x model.sequence_len=64"):
            model(torch.zeros(1, 641, dtype=torch.long))


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_windowed_attention_sees_exactly_its_window(kv_heads):
    """Output i changes with key j exactly when i - window <= j <= i: nothing past the window, nothing ahead."""
    T, window = 40, 7
    q, k, v = (torch.randn(1, 4, T, 8), torch.randn(1, kv_heads, T, 8),
               torch.randn(1, kv_heads, T, 8, requires_grad=True))
    y = causal_attention(q, k, v, window)
    for i in (0, 5, 20, 39):
        (grad,) = torch.autograd.grad(y[0, :, i].sum(), v, retain_graph=True)
        seen = grad.abs().sum(dim=(0, 1, 3)) > 0
        assert seen.tolist() == [i - window <= j <= i for j in range(T)]
    mask = window_mask(torch.arange(T), T, window)
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(4 // kv_heads, 1),
                                              v.repeat_interleave(4 // kv_heads, 1), attn_mask=mask)
    torch.testing.assert_close(y, expected)


def test_flex_attention_path_equals_the_masked_sdpa_path():
    """The CUDA path (FlexAttention's block mask) computes what the CPU path does; run eagerly here."""
    from torch.nn.attention.flex_attention import flex_attention

    from xsa_exp.model.gpt import window_block_mask
    q, k, v = torch.randn(2, 4, 300, 16), torch.randn(2, 2, 300, 16), torch.randn(2, 2, 300, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is the slow reference path
        flex = flex_attention(q, k, v, block_mask=window_block_mask(300, 128, torch.device("cpu")), enable_gqa=True)
    torch.testing.assert_close(flex, causal_attention(q, k, v, 128), atol=1e-5, rtol=1e-5)


def windowed_model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(sequence_len=256, vocab_size=512, n_layer=4, n_head=2, n_embd=64, window_pattern="SSSL"))


def test_the_training_forward_attends_through_block_masks_and_evaluation_through_masked_sdpa(monkeypatch):
    """With GPT.use_block_masks (on CUDA, before training) the windowed layers of the training forward take
    FlexAttention, with the masks built once; evaluation (eval mode), whose lengths vary, takes masked SDPA and
    never calls (so never recompiles) the kernel. Both compute the same attention (eager FlexAttention here)."""
    from torch.nn.attention.flex_attention import flex_attention

    from xsa_exp.model import gpt

    calls = []

    def eager_flex(*args, **kwargs):
        calls.append(kwargs["block_mask"])
        return flex_attention(*args, **kwargs)

    monkeypatch.setattr(gpt, "compiled_flex_attention", lambda: eager_flex)
    model = windowed_model()
    idx = torch.randint(0, 512, (2, 256))
    with torch.no_grad():
        reference = model.train()(idx)  # no masks yet: masked SDPA
        model.use_block_masks(256, torch.device("cpu"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager FlexAttention warns that it is the slow reference path
            flexed = model(idx)
        assert len(calls) == 3 and len({id(m) for m in calls}) == 1  # layers 0-2 share one mask; layer 3 is full
        torch.testing.assert_close(flexed, reference, atol=1e-5, rtol=1e-5)
        calls.clear()
        model.eval()(idx[:, :100])  # another length, in evaluation
        assert calls == []


def test_the_compiled_training_forward_has_one_graph_with_windows():
    """A block mask built inside the compiled forward would break the graph at every windowed layer; built by
    use_block_masks, the training forward through FlexAttention is one graph (traced here on the CPU, through the
    same code as on CUDA)."""
    import torch._dynamo

    model = windowed_model().train().requires_grad_(False)
    model.use_block_masks(256, torch.device("cpu"))
    idx = torch.randint(0, 512, (2, 257))
    explained = torch._dynamo.explain(model.forward)(idx[:, :-1], idx[:, 1:])
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    assert sum("flex_attention" in str(op) for op in explained.ops_per_graph[0]) == 3  # the windowed layers


@pytest.mark.slow
@pytest.mark.parametrize("switches", [[], ["trainer.precision=bf16-compute", "model.fused_loss_head=true"]],
                         ids=["fp32", "bf16-compute, fused loss head"])
def test_the_compiled_training_forward_is_one_graph_without_recompiles_across_updates(switches, monkeypatch):
    """The training forward as LanguageModel compiles it (fullgraph: a break would raise), on the stack at a tiny
    size (windows through masked SDPA on a CPU, value embeddings, smear, backout, XSA at alpha 1): one graph, forward
    and backward, and no recompilation over several updates, in fp32 and in the GPU presets' precision and head.
    Graphs, breaks and recompiles are dynamo's and AOTAutograd's, so Inductor's code generation is left out
    (backend aot_eager); tests/test_training.py and tests/test_optim.py compile through Inductor."""
    import functools

    import torch._dynamo
    from torch._dynamo.utils import counters

    from xsa_exp.precision import prepare
    from xsa_exp.training.module import LanguageModel

    cfg = compose_config("stack=nanochat_2604", "model.n_layer=2", "model.n_embd=32", "model.n_head=2",
                         "model.sequence_len=256", "model.vocab_size=256", *switches)
    torch.manual_seed(0)
    model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    prepare(model, cfg.trainer.precision)
    assert model.config.windows() == [128, None] and model.config.ve_layers == [1]
    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    module = LanguageModel(model, cfg.optim, None, total_steps=10, run_config=None, max_skipped_steps=0, compile=True)
    optimizer = MuonAdamW(build_param_groups(model, cfg.optim, None, compiled=False))
    batch = torch.randint(0, 256, (2, 257))
    losses = []
    for _ in range(3):
        loss = module.train_forward(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    # one graph traced, and one forward-and-backward compilation of it, across the three updates
    assert counters["stats"]["unique_graphs"] == 1 and counters["aot_autograd"]["total"] == 1, dict(counters)
    assert losses[-1] < losses[0]


def test_under_bf16_autocast_every_layer_attends_over_bf16_values(monkeypatch):
    """The value-embedding layers too: mixed into v in fp32, the embedding would make v fp32 there (attention and
    XSA in fp32 in half the layers; on CUDA, a recompile of the compiled forward per dtype)."""
    from xsa_exp.model import gpt

    seen = []

    def recorded(q, k, v, window, block_mask=None):
        seen.append((q.dtype, k.dtype, v.dtype))
        return causal_attention(q, k, v, window, block_mask)

    monkeypatch.setattr(gpt, "causal_attention", recorded)
    model = windowed_model()
    assert sum(block.attn.ve_gate is not None for block in model.blocks) >= 1
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randint(0, 512, (2, 64)))
    assert seen == [(torch.bfloat16,) * 3] * len(model.blocks)


def test_xsa_with_gqa_projects_each_query_head_on_its_groups_value():
    B, H, H_kv, T, D = 2, 6, 2, 5, 8
    y, v = torch.randn(B, H, T, D), torch.randn(B, H_kv, T, D)
    group_v = v.repeat_interleave(H // H_kv, dim=1)  # query head h belongs to group h // 3
    z = exclusive_self_attention(y, v, 1.0)
    assert (F.cosine_similarity(z, group_v, dim=-1).abs() < 1e-6).all()
    torch.testing.assert_close(z, exclusive_self_attention(y, group_v, 1.0), rtol=0, atol=0)
    alpha = torch.rand(1, H, 1, 1)  # one learnable alpha per query head
    torch.testing.assert_close(exclusive_self_attention(y, v, alpha), exclusive_self_attention(y, group_v, alpha),
                               rtol=0, atol=0)
    assert torch.equal(exclusive_self_attention(y, v, 0.0), y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["nanochat_2604", "nanochat_2604 + GQA"])
def test_alpha_zero_is_standard_attention_and_alpha_one_orthogonal_under_the_stack(name, dtype):
    idx = torch.randint(0, 300, (2, 200))
    off = model_of(dict(layers=[], alpha=0.0), **MODELS[name])
    forced = model_of(dict(layers=[0, 1, 2, 3], alpha=0.0), **MODELS[name])
    for block in forced.blocks:  # run the op with alpha = 0 instead of skipping it
        block.attn.xsa_on = True
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        assert torch.equal(off(idx), forced(idx))
    full = model_of(**MODELS[name])
    diag = attention_diagnostics(full, idx[:1, :160])  # the probe runs the windowed, grouped attention explicitly
    assert diag["out_self_cos"].abs().max() < 1e-4


@pytest.mark.parametrize("name", list(MODELS))
def test_cached_logits_equal_full_recomputation(name):
    model = model_of(**MODELS[name])
    idx = torch.randint(0, 300, (2, 180))
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(model.config, 2, 180, "cpu")
        pieces = [model(idx[:, :100], kv_cache=cache)]  # past the window (128) in single tokens and in chunks
        for start, end in [(100, 101), (101, 140), (140, 141), (141, 180)]:
            pieces.append(model(idx[:, start:end], kv_cache=cache))
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)
    if model.config.n_kv_head:
        assert cache.k.shape[2] == model.config.n_kv_head  # the cache holds the key/value heads only


@pytest.mark.parametrize("name", ["nanochat_2604", "nanochat_2604 + GQA"])
def test_greedy_generation_equals_full_recomputation_and_padded_rows_their_own(name):
    model = model_of(**MODELS[name])
    prompt = torch.randint(0, 300, (120,)).tolist()
    cached = generate(model, prompt, max_new_tokens=30)
    assert cached == generate(model, prompt, max_new_tokens=30, use_cache=False)
    short = prompt[:90]  # left-padded by 30 in a batch with the long prompt: its smear and window see no padding
    assert (generate_batch(model, [prompt, short], max_new_tokens=30)
            == cached + generate(model, short, max_new_tokens=30))


def test_smear_and_backout_do_what_they_say():
    model = model_of(smear=True, backout=True)
    idx = torch.randint(0, 300, (1, 20))
    with torch.no_grad():
        x = F.rms_norm(model.wte(idx), (32,))
        smeared = model.smear(x, 0, None)
        gate = torch.sigmoid(model.smear_gate(x[:, 1:, :24]))
        torch.testing.assert_close(smeared[:, 1:], x[:, 1:] + model.smear_lambda * gate * x[:, :-1])
        assert torch.equal(smeared[:, 0], x[:, 0])
        model.backout_lambda.zero_()
        model.smear_lambda.zero_()
        plain = model_of()
        plain.load_state_dict({k: v for k, v in model.state_dict().items() if "smear" not in k and "backout" not in k})
        torch.testing.assert_close(model(idx), plain(idx))  # lambdas at 0: exactly the model without them


def test_new_parameters_have_one_role_each_and_the_flop_count_sees_windows():
    model = model_of(**MODELS["nanochat_2604 + GQA"])
    groups = model.named_param_groups()
    assert (sorted(name for name, _ in groups["smear_backout"])
            == ["backout_lambda", "smear_gate.weight", "smear_lambda"])
    names = [name for params in groups.values() for name, _ in params]
    assert sorted(names) == sorted(name for name, _ in model.named_parameters())
    c = model.config
    hidden = sum(p.numel() for block in model.blocks for p in block.parameters() if p.ndim == 2)
    expected = 6 * (hidden + model.lm_head.weight.numel()) + 12 * c.n_embd * (128 * 3 + 300)
    assert model.flops_per_token() == expected
    assert model.blocks[0].attn.c_k.weight.shape == (2 * 8, 32)  # GQA: two key/value heads of 8


def test_init_follows_the_stack():
    model = GPT(GPTConfig(n_layer=12, n_embd=768, n_head=12, vocab_size=1000, sequence_len=64, **STACK))
    torch.testing.assert_close(model.resid_lambdas, torch.tensor([1.15 - 0.10 * i / 11 for i in range(12)]))
    torch.testing.assert_close(model.x0_lambdas, torch.tensor([0.20 - 0.15 * i / 11 for i in range(12)]))
    assert abs(model.wte.weight.std().item() - 0.8) < 0.01
    bound = math.sqrt(3) / math.sqrt(768)
    assert model.blocks[0].mlp.c_fc.weight.abs().max() <= 0.4 * bound < model.blocks[0].attn.c_q.weight.abs().max()
    gate = model.blocks[1].attn.ve_gate.weight
    assert (0 <= gate.min() and gate.max() <= 0.02 and model.smear_lambda.item() == 0
            and model.backout_lambda.item() == pytest.approx(0.2))


# ---------------------------------------------------------------- optimizer


def test_variance_reduction_keeps_the_norm_and_evens_the_rows():
    torch.manual_seed(0)
    update = torch.randn(6, 4) * torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]])  # tall: rows differ in scale
    moment = torch.zeros(6, 1)
    reduced = variance_reduce(update, moment, 0.1)
    torch.testing.assert_close(moment, 0.1 * update.square().mean(dim=-1, keepdim=True))
    torch.testing.assert_close(reduced.norm(), update.norm())
    row_rms = reduced.square().mean(dim=-1).sqrt()
    torch.testing.assert_close(row_rms, row_rms[:1].expand(6))  # first step: every row at the same RMS
    wide = torch.randn(3, 5)
    moment = torch.zeros(1, 5)
    variance_reduce(wide, moment, 0.1)
    torch.testing.assert_close(moment, 0.1 * wide.square().mean(dim=0, keepdim=True))


def muon_group(p, **kw):
    return dict(dict(role="matrix", algorithm="muon", params=[p], lr=0.02, momentum=0.95, nesterov=True, ns_steps=5,
                     ns_coefficients="polar_express", ns_dtype="float32", sharded=True, compiled=False,
                     weight_decay=0.28, cautious_weight_decay=False, variance_reduction=False, beta2=0.9), **kw)


def test_cautious_weight_decay_decays_only_where_update_and_weight_agree():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 4))
    w.grad = torch.randn(8, 4)
    before = w.detach().clone()
    plain = torch.nn.Parameter(before.clone())
    plain.grad = w.grad.clone()
    MuonAdamW([muon_group(w, cautious_weight_decay=True)]).step()
    MuonAdamW([muon_group(plain, weight_decay=0.0)]).step()  # the same update without decay
    update = plain.detach() - before  # -lr_eff * orthogonalized momentum
    agree = (-update * before) >= 0
    lr_eff = 0.02 * math.sqrt(8 / 4)
    torch.testing.assert_close(w.detach(), before + update - lr_eff * 0.28 * before * agree)
    assert 0 < agree.sum() < agree.numel()


@pytest.mark.parametrize("variance_reduction", [False, True])
def test_a_skipped_update_leaves_the_stack_muon_state_exactly(variance_reduction):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 4))
    opt = MuonAdamW([muon_group(w, cautious_weight_decay=True, variance_reduction=variance_reduction)])
    opt.found_inf = torch.zeros(())
    w.grad = torch.randn(8, 4)
    opt.step()
    state = {k: v.clone() for k, v in opt.state[w].items()}
    before = w.detach().clone()
    opt.found_inf = torch.ones(())
    w.grad = torch.full((8, 4), float("nan"))
    opt.step()
    assert torch.equal(w.detach(), before)
    assert all(torch.equal(opt.state[w][k], v) for k, v in state.items())


def test_stack_schedule_matches_nanochat_formulas():
    """nanochat 94b73ad's get_lr_multiplier, get_muon_momentum and get_weight_decay, transcribed."""
    N, warmup, warmdown_ratio, final = 1000, 40, 0.65, 0.05
    w = torch.nn.Parameter(torch.randn(4, 4))
    opt = MuonAdamW([muon_group(w)])
    sched = OptimizerSchedule(opt, N, warmup, warmdown_ratio, final, 0.85, 0.97, 400, 0.90, "cosine")
    warmdown = round(warmdown_ratio * N)

    def lr(it):
        if it < warmup:
            return (it + 1) / warmup
        if it <= N - warmdown:
            return 1.0
        progress = (N - it) / warmdown
        return progress + (1 - progress) * final

    def momentum(it):
        if it < 400:
            return (1 - it / 400) * 0.85 + it / 400 * 0.97
        if it >= N - warmdown:
            progress = (it - (N - warmdown)) / warmdown
            return 0.97 * (1 - progress) + 0.90 * progress
        return 0.97

    for it in (0, 1, 39, 40, 200, 349, 350, 351, 399, 400, 600, 999):
        assert sched.lr_factor(it) == pytest.approx(lr(it), abs=1e-12)
        assert sched.momentum(it) == pytest.approx(momentum(it), abs=1e-12)
        assert sched.weight_decay_factor(it) == pytest.approx(0.5 * (1 + math.cos(math.pi * it / N)), abs=1e-12)
    for _ in range(500):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(0.28 * 0.5 * (1 + math.cos(math.pi * 500 / N)))


# ---------------------------------------------------------------- config


def test_stack_composes_and_sets_only_what_differs_from_classic():
    classic, stack = compose_config("stack=classic"), compose_config("stack=nanochat_2604")
    assert classic.stack_name == "classic" and stack.stack_name == "nanochat_2604"
    stack_file = OmegaConf.load("conf/stack/nanochat_2604.yaml")

    def leaves(node, prefix=""):
        for k, v in node.items():
            if OmegaConf.is_dict(v) and k not in ("role_betas", "role_weight_decay"):
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"
    for key in leaves(stack_file):
        assert OmegaConf.select(classic, key) != OmegaConf.select(stack, key), f"{key} is the classic value"
    validate(stack)
    model = GPT(GPTConfig.of(typed(stack.model, ModelConfig), typed(stack.xsa, XSAConfig)))
    groups = {g["role"]: g for g in build_param_groups(model, stack.optim, None, compiled=False)}
    assert groups["unembedding"]["betas"] == (0.8, 0.96) and groups["unembedding"]["weight_decay"] == 0.01
    assert groups["x0_scalar"]["betas"] == (0.96, 0.95) and groups["resid_scalar"]["weight_decay"] == 0.05
    assert groups["smear_backout"]["lr"] == 0.2 and groups["smear_backout"]["betas"] == (0.8, 0.95)
    assert groups["matrix"]["variance_reduction"] and groups["matrix"]["cautious_weight_decay"]


def test_study_presets_pin_their_stacks():
    assert compose_config("experiment=study_base").stack_name == "classic"
    # a rerun under stack=nanochat_2604
    assert compose_config("experiment=study_base", "stack=nanochat_2604").stack_name == "nanochat_2604"
    for preset in ("xsa_d12", "xsa_d24"):
        cfg = compose_config(f"experiment={preset}")
        assert cfg.stack_name == "nanochat_2604" and cfg.model.window_pattern == "SSSL"


@pytest.mark.parametrize("override, message", [
    ("model.n_kv_head=3", "model.n_kv_head=3 does not divide model.n_head=4"),
    ("model.window_pattern=SSX", "use a string of S (short window) and L"),
    ("model.resid_lambda_init=[1.0]", "give two values, [first layer, last layer]"),
    ("+optim.adamw.role_betas.lm_head=[0.8,0.9]", "unknown role 'lm_head'"),
    ("+optim.adamw.role_betas.embedding=[0.8,1.5]", "must be two numbers in [0, 1)"),
])
def test_stack_settings_errors_name_the_fix(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose_config(override))


def test_warmup_longer_than_the_run_is_refused():
    w = torch.nn.Parameter(torch.randn(4, 4))
    with pytest.raises(ConfigError, match="shorten the warmup"):
        OptimizerSchedule(MuonAdamW([muon_group(w)]), 100, 40, 0.65, 0.05, 0.85, 0.97, 400, None, "constant")
