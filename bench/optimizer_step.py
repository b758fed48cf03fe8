"""Time of one MuonAdamW step at a preset's width, on random gradients (the forward and backward are not timed).

    python bench/optimizer_step.py --depth d12 --threads 2 [--compiled] [override ...]

Builds the preset's GPT and its param groups as training does (overrides as on train.py's command line, e.g.
stack=nanochat_2604), then times `--steps` optimizer steps after `--warmup` and prints the median, the Muon and
AdamW groups' shares (timed separately), the parameter counts and the kernels one step runs: the torch operators it
dispatches eagerly (each one a kernel launch on a GPU, where a step of small kernels is bound by their count rather
than by arithmetic), and, with --compiled (Muon's step compiled per shape group, as train.compile=true runs it), the
kernels inside the compiled graphs (inductor's fused loops and the matmuls it calls; on a GPU inductor may split
a fused CPU loop into a few Triton kernels). With --newton-schulz it also times the Newton-Schulz iterations alone
over the Muon matrices (`orthogonalize`, as the step calls it) and their arithmetic rate: the floor under the Muon
group's time on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

import xsa_exp
from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
from xsa_exp.model import GPT, GPTConfig
from xsa_exp.optim import MuonAdamW, build_param_groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", default="d12")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--adamw-fused", choices=("true", "false"), default=None,
                        help="override the preset's optim.adamw.fused")
    parser.add_argument("--compiled", action="store_true", help="Muon's step compiled per shape group")
    parser.add_argument("--newton-schulz", action="store_true", help="also time orthogonalize alone (its floor)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. stack=nanochat_2604")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch._inductor.config.cpp.enable_kernel_profile = True  # each fused CPU loop a profiler event of its own
    conf = Path(xsa_exp.__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"depth={args.depth}", *args.overrides])
    torch.manual_seed(0)
    model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    groups = build_param_groups(model, cfg.optim, None, compiled=args.compiled)
    if args.adamw_fused is not None:
        for group in groups:
            group["fused"] = args.adamw_fused == "true"
    optimizer = MuonAdamW(groups)
    optimizer.found_inf = torch.zeros(())  # as training sets it each update
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    timings = {"step": [], "muon": [], "adamw": []}
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        optimizer.step()
        t1 = time.perf_counter()
        if i >= args.warmup:
            timings["step"].append(t1 - t0)
    # The two algorithms' shares, timed apart (each group stepped alone, the others' gradients hidden).
    for algorithm in ("muon", "adamw"):
        saved = optimizer.param_groups
        optimizer.param_groups = [g for g in saved if g["algorithm"] == algorithm]
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            optimizer.step()
            if i >= args.warmup:
                timings[algorithm].append(time.perf_counter() - t0)
        optimizer.param_groups = saved
    eager, graph_kernels, hyper = kernels_per_step(optimizer)
    counts = {a: sum(p.numel() for g in groups if g["algorithm"] == a for p in g["params"]) for a in ("muon", "adamw")}
    fused = sorted({g["fused"] for g in groups if g["algorithm"] == "adamw"})
    ns_dtypes = sorted({g["ns_dtype"] for g in groups if g["algorithm"] == "muon"})
    print(f"xsa_exp from {Path(xsa_exp.__file__).parent}; depth={args.depth} {' '.join(args.overrides)}, "
          f"threads={args.threads}, adamw fused={fused}, muon compiled={args.compiled}, Newton-Schulz in "
          f"{ns_dtypes}; Muon {counts['muon']:,} and "
          f"AdamW {counts['adamw']:,} parameters; per step: {eager:,} eager operators ({hyper} of them filling the "
          f"compiled step's 0-D CPU hyperparameters) and {graph_kernels:,} kernels in compiled graphs")
    if args.newton_schulz:
        timings["newton-schulz"], tflop = newton_schulz_times(groups, args.warmup, args.steps)
    for key, values in timings.items():
        print(f"{key:>6}: median {statistics.median(values):.3f} s over {len(values)} "
              f"(min {min(values):.3f}, max {max(values):.3f})")
    if args.newton_schulz:
        print(f"newton-schulz: {tflop:.3f} TFLOP per step, "
              f"{tflop / statistics.median(timings['newton-schulz']):.2f} TFLOP/s")


def kernels_per_step(optimizer) -> tuple[int, int, int]:
    """(torch operators one step dispatches eagerly, kernels inside its compiled graphs, of the eager ones the fills
    of 0-D hyperparameter tensors) from the profiler: an operator called by another operator (its implementation)
    or by a compiled graph is not counted as eager."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        optimizer.step()
    eager = graph = hyper = 0
    for e in profile.events():
        parent = e.cpu_parent.name if e.cpu_parent is not None else ""
        if parent.startswith("## Call CompiledFxGraph"):
            graph += 1
        elif e.name.startswith("aten::") and parent and not parent.startswith("aten::"):
            eager += 1
            hyper += e.name == "aten::fill_" and parent.startswith("Optimizer.step")
    return eager, graph, hyper


def newton_schulz_times(groups: list[dict], warmup: int, steps: int) -> tuple[list[float], float]:
    """Seconds of orthogonalize over every Muon matrix per step, and its TFLOP per step (per iteration of an m x n
    matrix, m <= n: the gram 2m^2n, its square 2m^3, the product with x 2m^2n)."""
    from xsa_exp.optim.muon_adamw import orthogonalize

    muon = [g for g in groups if g["algorithm"] == "muon"]
    matrices = [torch.randn_like(p) for g in muon for p in g["params"]]
    g0 = muon[0]
    dtype = getattr(torch, g0["ns_dtype"])
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        for m in matrices:
            orthogonalize(m, g0["ns_steps"], g0["ns_coefficients"], dtype)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    flop = sum(g0["ns_steps"] * (4 * min(m.shape) ** 2 * max(m.shape) + 2 * min(m.shape) ** 3) for m in matrices)
    return times, flop / 1e12


if __name__ == "__main__":
    main()
