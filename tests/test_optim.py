import copy

import pytest
import torch

from tests import gloo
from tests.conftest import compose_config
from xsa_exp import precision
from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
from xsa_exp.model import GPT, GPTConfig
from xsa_exp.optim import MuonAdamW, OptimizerSchedule, build_param_groups, orthogonalize
from xsa_exp.optim.muon_adamw import GROUP_KEYS, variance_reduce


def relative_error(a, b):
    return ((a - b).norm() / b.norm()).item()


def muon_group(params, **kw):
    """torch.optim.Muon's step (the eager path unless compiled=True)."""
    return dict(dict(role="matrix", algorithm="muon", params=params, lr=0.02, momentum=0.95, nesterov=True,
                     ns_steps=5, ns_coefficients="quintic", ns_dtype="bfloat16", sharded=True, compiled=False,
                     weight_decay=0.1, cautious_weight_decay=False, variance_reduction=False, beta2=0.9), **kw)


def adamw_group(params, fused, **kw):
    return dict(dict(role="embedding", algorithm="adamw", params=params, lr=0.01, betas=(0.8, 0.95), eps=1e-10,
                     weight_decay=0.1, fused=fused), **kw)


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (48, 48)])
def test_muon_step_matches_torch_muon(shape):
    torch.manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(shape))
    ref = torch.nn.Parameter(ours.detach().clone())
    mine = MuonAdamW([muon_group([ours])])
    theirs = torch.optim.Muon([ref], lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, adjust_lr_fn="original")
    for _ in range(3):
        grad = torch.randn(shape)
        ours.grad, ref.grad = grad.clone(), grad.clone()
        mine.step()
        theirs.step()
        assert relative_error(ours.detach(), ref.detach()) < 1e-5
    # The comparison must be sensitive to the update, not just to the shared starting point.
    assert relative_error(ours.detach(), torch.randn(shape)) > 0.5


def test_adamw_groups_match_torch_adamw():
    torch.manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(10, 3))
    ref = torch.nn.Parameter(ours.detach().clone())
    mine = MuonAdamW([adamw_group([ours], fused=False)])
    theirs = torch.optim.AdamW([ref], lr=0.01, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.1)
    for _ in range(5):
        grad = torch.randn(10, 3)
        ours.grad, ref.grad = grad.clone(), grad.clone()
        mine.step()
        theirs.step()
    torch.testing.assert_close(ours.detach(), ref.detach(), rtol=1e-6, atol=1e-7)


def test_step_calls_the_closure_before_updating():
    p = torch.nn.Parameter(torch.ones(4, 4))
    opt = MuonAdamW([muon_group([p])])
    calls = []

    def closure():
        calls.append(p.detach().clone())
        p.grad = torch.randn(4, 4)
        return torch.tensor(1.5)

    assert opt.step(closure).item() == 1.5
    assert len(calls) == 1 and torch.equal(calls[0], torch.ones(4, 4)) and not torch.equal(p.detach(), calls[0])


def test_muon_rejects_vectors():
    with pytest.raises(ValueError, match="2-D"):
        MuonAdamW([muon_group([torch.nn.Parameter(torch.ones(4))])])


def test_orthogonalize_gives_near_unit_singular_values():
    # The input's singular values span 0.01..1 (x its scale); both iterations pull them towards 1.
    g = torch.randn(64, 32) @ torch.diag(torch.logspace(-2, 0, 32))
    for coefficients, (lo, hi) in {"quintic": (0.5, 1.3), "polar_express": (0.8, 1.2)}.items():
        s = torch.linalg.svdvals(orthogonalize(g, 5, coefficients, torch.bfloat16).float())
        assert lo < s.min() and s.max() < hi, (coefficients, s.min(), s.max())


@pytest.mark.parametrize("shape", [(48, 16), (16, 48)])
def test_stacked_newton_schulz_equals_one_matrix_at_a_time(shape):
    """On a GPU the step stacks the matrices of one shape: the same update as one matrix at a time, to the dtype's
    rounding (batched and 2-D matmuls may round an element differently now and then)."""
    torch.manual_seed(0)
    gs = torch.randn(3, *shape)
    for coefficients in ("quintic", "polar_express"):
        for dtype, tolerance in ((torch.bfloat16, 1e-2), (torch.float32, 1e-5)):
            stacked = orthogonalize(gs, 5, coefficients, dtype)
            assert stacked.shape == gs.shape
            for g, got in zip(gs, stacked):
                torch.testing.assert_close(got, orthogonalize(g, 5, coefficients, dtype), rtol=0, atol=tolerance)


def test_fused_adamw_equals_the_foreach_path_to_float_rounding():
    torch.manual_seed(0)
    start = [torch.randn(10, 3), torch.randn(7)]
    runs = {}
    for fused in (False, True):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        opt = MuonAdamW([adamw_group(params, fused)])
        for step in range(5):
            for i, p in enumerate(params):
                p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * step + i))
            opt.step()
        runs[fused] = [p.detach() for p in params]
    for a, b, s in zip(runs[False], runs[True], start):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert not torch.equal(a, s)


@pytest.mark.parametrize("fused", [False, True])
def test_found_inf_skips_the_whole_update_exactly(fused):
    """With found_inf = 1 (NaN gradients) weights and state stay as they were, step counts included: the next
    update equals that of an optimizer that never saw the skipped one."""
    torch.manual_seed(0)
    start = [torch.randn(8, 4), torch.randn(4, 8), torch.randn(8, 4), torch.randn(5)]

    def build():
        params = [torch.nn.Parameter(t.clone()) for t in start]
        return params, MuonAdamW([muon_group(params[:3]), adamw_group(params[3:], fused)])

    def grads(params, step):
        for i, p in enumerate(params):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * step + i))

    skipping, opt = build()
    plain, ref = build()
    for step in range(2):
        grads(skipping, step)
        grads(plain, step)
        opt.found_inf, ref.found_inf = torch.zeros(()), None
        opt.step()
        ref.step()
    before = copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in skipping]
    for p in skipping:
        p.grad = torch.full_like(p, float("nan"))
    opt.found_inf = torch.ones(())
    opt.step()
    after = opt.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(before[1], skipping))
    assert all(torch.equal(before[0]["state"][k][n], after["state"][k][n])
               for k in after["state"] for n in after["state"][k])
    grads(skipping, 2)
    grads(plain, 2)
    opt.found_inf = torch.zeros(())
    opt.step()
    ref.step()
    assert all(torch.equal(a, b) for a, b in zip(skipping, plain))


# The nanochat_2604 stack's Muon (Polar Express, variance reduction, cautious weight decay) and the classic one.
STACK_MUON = dict(ns_coefficients="polar_express", variance_reduction=True, cautious_weight_decay=True,
                  weight_decay=0.28)
SHAPES = [(32, 16), (16, 48), (24, 24), (32, 16), (24, 24), (24, 24)]


def run_muon(settings: dict, steps: int = 4, skip_at: int = 2) -> tuple[list, dict, list]:
    """Muon steps on SHAPES from fixed gradients, update `skip_at` skipped (NaN gradients, found_inf = 1); returns
    the weights, the optimizer state and the weights just before and after the skipped update."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in SHAPES]
    opt = MuonAdamW([muon_group(params, **settings)])
    around_skip = []
    for step in range(steps):
        for i, p in enumerate(params):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * step + i))
            if step == skip_at:
                p.grad.fill_(float("nan"))
        opt.found_inf = torch.tensor(float(step == skip_at))
        if step == skip_at:
            around_skip.append(([p.detach().clone() for p in params], copy.deepcopy(opt.state_dict()["state"])))
        opt.step()
        if step == skip_at:
            around_skip.append(([p.detach().clone() for p in params], copy.deepcopy(opt.state_dict()["state"])))
    return [p.detach() for p in params], opt.state_dict()["state"], around_skip


def per_matrix_reference(settings: dict, steps: int = 4, skip_at: int = 2) -> list:
    """The eager CPU step as the committed study ran it (before the shape groups), written out one matrix at a time:
    masked gradient, momentum, Nesterov, 2-D Newton-Schulz, variance reduction, weight decay, update."""
    g = muon_group([], **settings)
    torch.manual_seed(0)
    params = [torch.randn(shape) for shape in SHAPES]
    momenta = [torch.zeros_like(p) for p in params]
    moments = [torch.zeros((p.size(0), 1) if p.size(0) >= p.size(1) else (1, p.size(1))) for p in params]
    for step in range(steps):
        keep = 1 - torch.tensor(float(step == skip_at))
        for i, (p, m, v) in enumerate(zip(params, momenta, moments)):
            grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * step + i))
            grad.masked_fill_(~keep.bool(), 0)
            m.lerp_(grad, keep * (1 - g["momentum"]))
            update = orthogonalize(grad.lerp(m, g["momentum"]) if g["nesterov"] else m, g["ns_steps"],
                                   g["ns_coefficients"], getattr(torch, g["ns_dtype"]))
            update.mul_(keep)
            if g["variance_reduction"]:
                update = variance_reduce(update, v, keep * (1 - g["beta2"]))
            lr = g["lr"] * max(1.0, p.size(0) / p.size(1)) ** 0.5
            if g["cautious_weight_decay"]:
                p.sub_((lr * g["weight_decay"]) * p * (update * p >= 0) * keep)
            else:
                p.mul_(torch.where(keep.bool(), 1 - g["lr"] * g["weight_decay"], 1.0))
            p.add_(update.to(p.dtype), alpha=-lr)
    return params


@pytest.mark.parametrize("settings", [{}, STACK_MUON, dict(STACK_MUON, ns_dtype="float32", nesterov=False)],
                         ids=["classic", "stack", "stack-fp32-no-nesterov"])
def test_the_eager_cpu_step_is_the_per_matrix_step_bit_for_bit(settings):
    """The CPU study presets' Muon (eager, one matrix at a time) is unchanged by the shape groups: every bit."""
    got, _, _ = run_muon(settings)
    for a, b in zip(got, per_matrix_reference(settings)):
        assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("settings", [dict(STACK_MUON, ns_dtype="float32"),
                                      dict(ns_dtype="float32", nesterov=False)], ids=["stack", "classic-no-nesterov"])
def test_the_compiled_step_equals_the_eager_step(settings):
    """One compiled graph per shape group (3 shapes, one of 3 matrices) gives the eager step to fp32 rounding, a
    skipped update included (weights and state unchanged, bit for bit)."""
    eager, eager_state, _ = run_muon(settings)
    compiled, compiled_state, ((weights_before, state_before), (weights_after, state_after)) = run_muon(
        dict(settings, compiled=True))
    assert all(torch.equal(a, b) for a, b in zip(weights_before, weights_after))
    assert all(torch.equal(state_before[k][n], state_after[k][n]) for k in state_after for n in state_after[k])
    for a, b in zip(compiled, eager):
        assert relative_error(a, b) < 1e-6
    for k in eager_state:
        assert sorted(eager_state[k]) == sorted(compiled_state[k])
        for n in eager_state[k]:
            assert relative_error(compiled_state[k][n], eager_state[k][n]) < 1e-6, n
    assert relative_error(compiled[0], torch.randn(SHAPES[0])) > 0.5


@pytest.mark.parametrize("native", [True, False])
def test_param_groups_carry_every_key_at_the_schema_default(monkeypatch, native):
    """ns_dtype=auto: nanochat's bf16 where the CPU computes bf16 natively, fp32 where bf16 matmul is emulated."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    model, cfg = model_and_cfg("xsa=learnable")
    assert cfg.optim.muon.ns_dtype == "auto"
    groups = build_param_groups(model, cfg.optim, None, compiled=True)
    for group in groups:
        assert set(group) == set(GROUP_KEYS[group["algorithm"]]), group["role"]
    muon = next(g for g in groups if g["algorithm"] == "muon")
    assert muon["sharded"] and not muon["variance_reduction"] and muon["compiled"]
    assert muon["ns_dtype"] == ("bfloat16" if native else "float32")
    assert all(g["fused"] for g in groups if g["algorithm"] == "adamw")
    del muon["beta2"]
    with pytest.raises(KeyError, match="'matrix' lacks beta2"):
        MuonAdamW(groups)


@pytest.mark.parametrize("setting,compiled", [("null", True), ("false", False), ("true", True)])
def test_muon_compiles_as_the_model_unless_optim_muon_compile_says_otherwise(setting, compiled):
    model, cfg = model_and_cfg(f"optim.muon.compile={setting}")
    for train_compile in (True, False):
        groups = build_param_groups(model, cfg.optim, None, compiled=train_compile)
        expected = train_compile if setting == "null" else compiled
        assert all(g["compiled"] == expected for g in groups if g["algorithm"] == "muon"), (setting, train_compile)


def model_and_cfg(*overrides):
    cfg = compose_config("model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.vocab_size=300",
                         "model.sequence_len=16", *overrides)
    torch.manual_seed(0)
    return GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig))), cfg


def test_routing_every_parameter_once_no_vector_on_muon():
    model, cfg = model_and_cfg("xsa=learnable")
    opt = MuonAdamW(build_param_groups(model, cfg.optim, None, compiled=False))
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    by_role = {g["role"]: g for g in opt.param_groups}
    assert by_role["matrix"]["algorithm"] == "muon"
    for group in opt.param_groups:
        if group["algorithm"] == "muon":
            assert all(p.ndim == 2 for p in group["params"])
    assert by_role["xsa_theta"]["algorithm"] == "adamw"
    # AdamW lrs of the embeddings shrink with width as (n_embd / 768)^-0.5; scalars keep theirs.
    assert by_role["embedding"]["lr"] == pytest.approx(0.2 * (32 / 768) ** -0.5)
    assert by_role["x0_scalar"]["lr"] == 0.5
    assert by_role["embedding"]["betas"] == (0.8, 0.95) and by_role["embedding"]["eps"] == 1e-10


def test_optim_adamw_puts_everything_on_adamw():
    model, cfg = model_and_cfg("optim=adamw")
    opt = MuonAdamW(build_param_groups(model, cfg.optim, None, compiled=False))
    assert {g["algorithm"] for g in opt.param_groups} == {"adamw"}
    matrix = next(g for g in opt.param_groups if g["role"] == "matrix")
    assert matrix["lr"] == 0.003 and matrix["weight_decay"] == 0.1


def test_state_dict_round_trip_continues_identically(monkeypatch):
    """Restored on a CPU where ns_dtype=auto resolves otherwise, the run keeps its first attempt's dtype."""
    model, cfg = model_and_cfg("xsa=learnable")
    twin = copy.deepcopy(model)
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    opt = MuonAdamW(build_param_groups(model, cfg.optim, None, compiled=False))
    idx = torch.randint(0, 300, (2, 17))

    def step(m, o):
        o.zero_grad()
        m(idx[:, :-1], idx[:, 1:]).backward()
        o.step()

    step(model, opt)
    twin.load_state_dict(model.state_dict())
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    restored = MuonAdamW(build_param_groups(twin, cfg.optim, None, compiled=False))
    restored.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert {g["ns_dtype"] for g in restored.param_groups if g["algorithm"] == "muon"} == {"bfloat16"}
    step(model, opt)
    step(twin, restored)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_schedule_warmup_constant_warmdown_and_momentum():
    p = torch.nn.Parameter(torch.ones(2, 2))
    q = torch.nn.Parameter(torch.ones(2))
    opt = MuonAdamW([muon_group([p]), adamw_group([q], fused=True, lr=0.1, weight_decay=0)])
    sched = OptimizerSchedule(opt, total_steps=100, warmup_steps=10, warmdown_frac=0.5, final_lr_frac=0.2,
                              momentum_start=0.85, momentum_end=0.95, momentum_warmup_steps=40, momentum_warmdown=None,
                              weight_decay_schedule="constant")
    lrs, momenta = [], []
    for _ in range(100):
        lrs.append(opt.param_groups[1]["lr"])
        momenta.append(opt.param_groups[0]["momentum"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.1 / 10) and lrs[9] == pytest.approx(0.1)
    assert all(lr == pytest.approx(0.1) for lr in lrs[10:51])
    assert lrs[75] == pytest.approx(0.1 * (0.5 * 0.2 + 0.5))
    assert lrs[99] == pytest.approx(0.1 * (0.02 + 0.98 * 0.2))
    assert momenta[0] == 0.85 and momenta[20] == pytest.approx(0.90) and momenta[40:] == [pytest.approx(0.95)] * 60


def _sharded_worker(rank: int, world: int, out: str, compiled: bool) -> None:
    params = _sharded_problem_steps(sharded=True, compiled=compiled)
    if rank == 1:  # the rank that did not orthogonalize matrix 0 must still end with identical weights
        torch.save([p.detach() for p in params], out)


def _sharded_problem_steps(sharded: bool, compiled: bool) -> list:
    torch.manual_seed(0)
    # Each shape group is split between the ranks (the one (16, 48) matrix: rank 1 has none of it) and gathered.
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in [(32, 16), (16, 48), (24, 24), (32, 16), (24, 24)]]
    settings = dict(STACK_MUON, ns_dtype="float32", compiled=True) if compiled else {}
    opt = MuonAdamW([muon_group(params, sharded=sharded, **settings)])
    for step in range(3):
        for i, p in enumerate(params):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(100 * step + i))
        opt.step()
    return params


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True])
def test_sharded_orthogonalization_equals_the_unsharded_update(tmp_path, compiled):
    """Eager: bit for bit; compiled: to fp32 rounding (a rank's share is a smaller stack for the batched matmuls)."""
    out = str(tmp_path / "rank1.pt")
    gloo.spawn(_sharded_worker, out, compiled)
    expected = _sharded_problem_steps(sharded=False, compiled=compiled)
    for got, want in zip(torch.load(out), expected):
        assert torch.equal(got, want.detach()) if not compiled else relative_error(got, want.detach()) < 1e-6
