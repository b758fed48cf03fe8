"""XSA step-time overhead, and the Lightning framework's overhead over a bare PyTorch loop.

    python bench/xsa_overhead.py --mode cpu          # tiny and d12 widths, short sequences
    python bench/xsa_overhead.py --mode cpu --precision bf16-mixed   # the same under CPU bf16 autocast
    python bench/xsa_overhead.py --mode gpu          # d12 and d24 at seq 2048, bf16, torch.compile, MFU

XSA: full training steps (forward, backward, MuonAdamW step) for alpha = 0 (standard attention),
alpha = 1 and learnable alpha on the same initial weights and the same batch, interleaved
A/B/C, A/B/C, ... after warm-up (the order rotates every repeat), so slow drifts of the machine hit
every arm alike; each timed step starts from the arm's state after warm-up (restored untimed). Reported: median
step time, the median of the per-repeat ratios to alpha = 0 with
a bootstrap 95% interval, tokens/s, and peak memory (GPU: per arm, the other arms' resident weights and
state left out; CPU: the process's peak RSS). GPU mode runs the study's stack (stack=nanochat_2604: windowed
layers through FlexAttention's block masks, as the training forward).

Lightning: the same model, optimizer, schedule and batch trained by `Trainer.fit` (with a run's metrics callbacks:
its rows and console line every log.print_every updates) and by a plain loop (zero_grad, forward, backward, step,
scheduler step), with and without LanguageModel's update guard (gradient norm, non-finite flag), in blocks of steps
whose order rotates. Trainer.fit over the guarded loop is the framework's cost; the guarded loop over the plain one,
the guard's.

MFU = tokens/s x flops-per-token / peak flops, with flops per token = 6 x (parameters that
multiply: hidden matrices + lm_head) + 12 x n_layer x n_embd x seq_len (attention scores and
values, forward + backward, without the causal halving), as nanochat and the PaLM appendix count.
"""

from __future__ import annotations

import argparse
import copy
import random
import resource
import signal
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir

from xsa_exp.cluster import peak_flops
from xsa_exp.config.schema import ModelConfig, OptimConfig, XSAConfig, typed
from xsa_exp.model import GPT, GPTConfig
from xsa_exp.optim import MuonAdamW, OptimizerSchedule, build_param_groups
from xsa_exp.precision import BF16_COMPUTE, prepare
from xsa_exp.training.module import LanguageModel, update_guard

REPO = Path(__file__).resolve().parents[1]
ARMS = {"alpha=0": ["xsa.alpha=0"], "alpha=1": ["xsa.alpha=1"], "learnable": ["xsa=learnable"]}
H200_BF16_PEAK_FLOPS = 989e12  # dense bf16 tensor-core peak


class Stopped(BaseException):
    """SIGTERM (bench/gpu.sh's time limit): the table is printed for the repeats finished, then the script ends."""


def stop(*_) -> None:
    raise Stopped


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def build(overrides: list[str], device: str, compile_model: bool, precision: str):
    cfg = compose_cfg(overrides)
    torch.manual_seed(0)
    model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig))).to(device)
    prepare(model, precision)
    if device == "cuda":
        model.use_block_masks(cfg.model.sequence_len, torch.device(device))
    if compile_model:
        model.compile()
    optimizer = MuonAdamW(build_param_groups(model, cfg.optim, None, compiled=compile_model))
    scheduler = OptimizerSchedule(optimizer, 10**6, 0.0, 0.0, 0.0, 0.85, 0.95, 300, None, "constant")
    return cfg, model, optimizer, scheduler


def train_step(model, optimizer, scheduler, batch, autocast, guard: bool = False) -> None:
    """One update; with guard, LanguageModel's update guard between the backward and the step."""
    optimizer.zero_grad(set_to_none=True)
    with autocast():
        loss = model(batch[:, :-1], batch[:, 1:])
    loss.backward()
    if guard:
        _, optimizer.found_inf = update_guard(model.parameters(), loss.detach())
    optimizer.step()
    scheduler.step()


def timed(fn, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bootstrap_median_ci(ratios: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(n))
    return medians[int(0.025 * n)], medians[int(0.975 * n) - 1]


def xsa_overhead(label: str, shape: list[str], batch_size: int, device: str, compile_model: bool, warmup: int,
                 repeats: int, precision: str, arm_names: tuple[str, ...] = tuple(ARMS)):
    """precision: 32-true, bf16-mixed (autocast) or bf16-compute (the GPU presets')."""
    try:
        arms = {name: build(shape + ARMS[name], device, compile_model, precision) for name in arm_names}
        cfg = next(iter(arms.values()))[0]
        batch = torch.randint(0, cfg.model.vocab_size, (batch_size, cfg.model.sequence_len + 1), device=device,
                              generator=torch.Generator(device=device).manual_seed(0))
        autocast = ((lambda: torch.autocast(device, dtype=torch.bfloat16)) if precision == "bf16-mixed"
                    else nullcontext)
        times = {name: [] for name in arms}
        peak = {}
        for name, (_, model, opt, sched) in arms.items():
            if device == "cuda":  # the other arms' weights (and grads and state once warmed up) are not this one's
                torch.cuda.reset_peak_memory_stats()
                others = torch.cuda.memory_allocated() - sum(p.numel() * p.element_size() for p in model.parameters())
            for _ in range(warmup):
                timed(lambda: train_step(model, opt, sched, batch, autocast), device)
            peak[name] = (torch.cuda.max_memory_allocated() - others) / 2**30 if device == "cuda" else None
    except Stopped:
        sys.exit(f"bench/xsa_overhead.py: stopped at its limit while building, compiling or warming up {label}, "
                 "before the first repeat")
    # Every timed step starts from the state after warm-up (restored, untimed): trained on one repeated
    # batch, the arms' weights would drift apart and their step times with them, for reasons (denormals,
    # numerics) that are not XSA's cost.
    snapshots = {name: (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
                 for name, (_, model, opt, _) in arms.items()}
    names = list(arms)
    stopped = False
    try:
        for r in range(repeats):
            for name in names[r % len(names):] + names[: r % len(names)]:
                _, model, opt, sched = arms[name]
                model.load_state_dict(snapshots[name][0])  # copied into the parameters
                opt.load_state_dict(copy.deepcopy(snapshots[name][1]))  # adopted as the live state: a copy's
                times[name].append(timed(lambda: train_step(model, opt, sched, batch, autocast), device))
    except Stopped:
        repeats, stopped = min(map(len, times.values())), True
        times = {name: t[:repeats] for name, t in times.items()}  # whole repeats only: every arm's ratio paired
        if repeats == 0:
            sys.exit(f"bench/xsa_overhead.py: stopped at its limit before the first repeat of {label}")
    tokens = batch_size * cfg.model.sequence_len
    base = times["alpha=0"]
    fpt = arms["alpha=0"][1].flops_per_token()
    print(f"\n{label}: n_layer={cfg.model.n_layer} n_embd={cfg.model.n_embd} n_head={cfg.model.n_head} "
          f"seq={cfg.model.sequence_len} batch={batch_size} vocab={cfg.model.vocab_size} device={device} "
          f"compile={compile_model} {precision} repeats={repeats} "
          f"(after {warmup} warm-up steps per arm)")
    print(f"{'arm':<11}{'median step ms':>15}{'tokens/s':>11}{'ratio to alpha=0 [95% CI]':>32}"
          + (f"{'peak GiB':>10}{'MFU':>7}" if device == "cuda" else ""))
    for name in names:
        ratios = [t / b for t, b in zip(times[name], base)]
        lo, hi = bootstrap_median_ci(ratios)
        median = statistics.median(times[name])
        line = (f"{name:<11}{median * 1e3:>15.1f}{tokens / median:>11,.0f}{statistics.median(ratios):>14.4f} "
                f"[{lo:.4f}, {hi:.4f}]")
        if device == "cuda":
            # the table's, else an H200's
            device_peak = peak_flops(torch.cuda.get_device_name()) or H200_BF16_PEAK_FLOPS
            line += f"{peak[name]:>10.2f}{tokens / median * fpt / device_peak:>7.1%}"
        print(line)
    if device == "cpu":
        print(f"process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB (all arms)")
    if stopped:
        sys.exit(f"bench/xsa_overhead.py: stopped at its limit after {repeats} repeats of {label}")
    op_ms = xsa_op_time(cfg, batch_size, device, precision != "32-true") * cfg.model.n_layer * 1e3
    print(f"XSA op alone, forward + backward over {cfg.model.n_layer} layers: {op_ms:.2f} ms = "
          f"{op_ms / (statistics.median(base) * 1e3):.2%} of the median alpha=0 step")


def xsa_op_time(cfg, batch_size: int, device: str, bf16: bool, reps: int = 50) -> float:
    """Median time of the XSA op's forward and backward on one layer's (B, H, T, D) tensors, eager: a low-noise
    estimate of what XSA adds to a step (whole-step ratios carry the machine's step-to-step noise), an upper bound
    where the steps are compiled and fuse the op into its neighbours."""
    from xsa_exp.model import exclusive_self_attention

    shape = (batch_size, cfg.model.n_head, cfg.model.sequence_len, cfg.model.n_embd // cfg.model.n_head)
    dtype = torch.bfloat16 if bf16 else torch.float32
    y = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(shape, device=device, dtype=dtype)
    step = lambda: exclusive_self_attention(y, v, 1.0).backward(grad)  # noqa: E731
    for _ in range(5):
        step()
    return statistics.median(timed(step, device) for _ in range(reps))


class FixedBatch(torch.utils.data.Dataset):
    def __init__(self, batch: torch.Tensor, length: int):
        self.batch, self.length = batch, length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return self.batch


class StepClock(L.Callback):
    def __init__(self):
        self.stamps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.stamps.append(time.perf_counter())


def lightning_overhead(shape: list[str], batch_size: int, block: int, blocks: int):
    """Per-step wall time of Trainer.fit, of a bare loop with LanguageModel's update guard (the gradient norm and the
    non-finite flag, computed on the device every update) and of a bare loop without it, in blocks of `block` steps,
    the three arms' order rotating from block to block."""
    from xsa_exp.training.host import keep_freed_host_memory
    from xsa_exp.training.metrics_log import HostSync, TrainMetrics, UpdateClock

    keep_freed_host_memory()  # glibc's malloc as a CPU run sets it (training/run.py), for all three arms
    cfg = compose_cfg(shape)
    batch = torch.randint(0, cfg.model.vocab_size, (batch_size, cfg.model.sequence_len + 1),
                          generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(FixedBatch(batch, 10**9), batch_size=None)

    def per_step(stamps: list[float]) -> float:
        return (stamps[-1] - stamps[1]) / (len(stamps) - 2)  # after 2 warm-up steps

    def lightning() -> float:
        torch.manual_seed(0)
        model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
        module = LanguageModel(model, typed(cfg.optim, OptimConfig), None, 10**6, None, cfg.train.skip_nonfinite_steps,
                               compile=False)
        clock = StepClock()
        # A run's metrics callbacks (xsa_exp/training/run.py) are part of the framework's cost: the rows, read at
        # the host-sync steps, and the console line, both every log.print_every updates as in a default run.
        update_clock = UpdateClock(HostSync([cfg.log.print_every]))
        metrics = TrainMetrics(batch.numel(), cfg.log.ema_beta, cfg.log.print_every, update_clock,
                               model.flops_per_token(), None)
        trainer = L.Trainer(accelerator="cpu", max_steps=block + 2, logger=False,
                            callbacks=[metrics, clock, update_clock], limit_val_batches=0,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, loader)
        return per_step(clock.stamps)

    def bare(guard: bool) -> float:
        _, model, optimizer, scheduler = build(shape, "cpu", False, "32-true")
        data, stamps = iter(loader), []
        for _ in range(block + 2):
            train_step(model, optimizer, scheduler, next(data), nullcontext, guard)
            stamps.append(time.perf_counter())
        return per_step(stamps)

    arms = {"lightning": lightning, "guarded": lambda: bare(True), "bare": lambda: bare(False)}
    seconds = {name: [] for name in arms}
    for i in range(blocks):
        names = list(arms)[i % 3:] + list(arms)[:i % 3]
        for name in names:
            seconds[name].append(arms[name]())
    ms = {name: statistics.median(s) * 1e3 for name, s in seconds.items()}
    print(f"\nLightning vs bare loop ({' '.join(shape)}, batch {batch_size}, {blocks} blocks x {block} steps): median "
          f"step {ms['lightning']:.1f} ms (Trainer.fit), {ms['guarded']:.1f} ms (bare loop with the update guard), "
          f"{ms['bare']:.1f} ms (bare loop)")
    for label, num, den in (("Trainer.fit / bare loop with the guard (the framework)", "lightning", "guarded"),
                            ("bare loop with the guard / bare loop (the guard)", "guarded", "bare"),
                            ("Trainer.fit / bare loop (both)", "lightning", "bare")):
        ratios = [a / b for a, b in zip(seconds[num], seconds[den])]
        lo, hi = bootstrap_median_ci(ratios)
        print(f"  {label}: ratio {statistics.median(ratios):.4f} [{lo:.4f}, {hi:.4f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--precision", choices=["32-true", "bf16-mixed"], default="32-true",
                        help="CPU mode: fp32, or bf16 autocast as trainer.precision=bf16-mixed "
                             "(GPU mode runs the presets' bf16-compute with the fused loss head)")
    parser.add_argument("--parts", nargs="+", choices=["tiny", "d12", "lightning"],
                        default=["tiny", "d12", "lightning"], help="CPU mode: which measurements to run")
    parser.add_argument("--depths", nargs="+", choices=["d12", "d24"], default=["d12", "d24"],
                        help="GPU mode: the presets")
    parser.add_argument("--blocks", type=int, default=5,
                        help="CPU mode: Lightning vs bare loop blocks of 20 steps each")
    parser.add_argument("--keep-denormals", action="store_true",
                        help="CPU mode: leave denormal floats on (the default flushes them, see below)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, stop)
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.mode == "cpu":
        # The arms train on one repeated batch and their weights drift apart; denormal floats that appear
        # on the way slow CPU arithmetic by different amounts per arm, which is not XSA's cost. (GPUs
        # flush them in bf16 matmuls anyway.)
        torch.set_flush_denormal(not args.keep_denormals)
        repeats = args.repeats or 30
        if "tiny" in args.parts:
            xsa_overhead("tiny width", ["depth=tiny", "model.sequence_len=128"], 8, "cpu", False, 3, repeats,
                         args.precision)
        if "d12" in args.parts:
            xsa_overhead("d12 width", ["depth=d12", "model.n_layer=2", "model.sequence_len=128",
                                       "model.vocab_size=8192"], 4, "cpu", False, 2, repeats, args.precision)
        if "lightning" in args.parts:
            lightning_overhead(["depth=tiny", "model.sequence_len=128"], 8, block=20, blocks=args.blocks)
    else:
        repeats = args.repeats or 20
        batches = {"d12": 16, "d24": 8}  # half the presets' micro-batches: both arms stay resident
        for depth in args.depths:  # alpha = 1 against 0 only: a compile per arm is the time this part has
            xsa_overhead(depth, [f"depth={depth}", "stack=nanochat_2604", "model.fused_loss_head=true"],
                         batches[depth], "cuda", True, 5, repeats, BF16_COMPUTE, ("alpha=0", "alpha=1"))


if __name__ == "__main__":
    main()
