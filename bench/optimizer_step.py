"""Time of one MuonAdamW step at a preset's width, on random gradients (the forward and backward are not timed).

    python bench/optimizer_step.py --depth d12 --threads 2

Builds the preset's GPT and its param groups as training does, then times `--steps` optimizer steps after
`--warmup` and prints the median, the Muon and AdamW groups' shares (timed separately), the parameter counts and
the number of torch operators one step dispatches (each one a kernel launch on a GPU, where a step of small
kernels is bound by their count rather than by arithmetic). With --newton-schulz it also times the Newton-Schulz
iterations alone over the Muon matrices (`orthogonalize`, as the step calls it) and their arithmetic rate: the
floor under the Muon group's time on this machine.
It only uses the API that the optimizer has had from the start (MuonAdamW, build_param_groups), so the same
script times an older checkout: `PYTHONPATH=<old checkout> python bench/optimizer_step.py ...`.
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
                        help="override the preset's optim.adamw.fused (ignored by a checkout without it)")
    parser.add_argument("--newton-schulz", action="store_true", help="also time orthogonalize alone (its floor)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    conf = Path(xsa_exp.__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"depth={args.depth}"])
    torch.manual_seed(0)
    model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    groups = build_param_groups(model, cfg.optim)
    if args.adamw_fused is not None:
        for group in groups:
            group["fused"] = args.adamw_fused == "true"
    optimizer = MuonAdamW(groups)
    optimizer.found_inf = torch.zeros(())  # as training sets it each update (an older optimizer ignores it)
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
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        optimizer.step()
    operators = sum(1 for e in profile.events() if e.name.startswith("aten::") and e.cpu_parent is not None
                    and not e.cpu_parent.name.startswith("aten::"))
    counts = {a: sum(p.numel() for g in groups if g["algorithm"] == a for p in g["params"]) for a in ("muon", "adamw")}
    fused = sorted({g.get("fused", False) for g in groups if g["algorithm"] == "adamw"})
    print(f"xsa_exp from {Path(xsa_exp.__file__).parent}; depth={args.depth}, threads={args.threads}, "
          f"adamw fused={fused}; Muon {counts['muon']:,} and AdamW {counts['adamw']:,} parameters; "
          f"{operators:,} operators per step")
    if args.newton_schulz:
        timings["newton-schulz"], tflop = newton_schulz_times(groups, args.warmup, args.steps)
    for key, values in timings.items():
        print(f"{key:>6}: median {statistics.median(values):.3f} s over {len(values)} "
              f"(min {min(values):.3f}, max {max(values):.3f})")
    if args.newton_schulz:
        print(f"newton-schulz: {tflop:.3f} TFLOP per step, "
              f"{tflop / statistics.median(timings['newton-schulz']):.2f} TFLOP/s")


def newton_schulz_times(groups: list[dict], warmup: int, steps: int) -> tuple[list[float], float]:
    """Seconds of orthogonalize over every Muon matrix per step, and its TFLOP per step (per iteration of an m x n
    matrix, m <= n: the gram 2m^2n, its square 2m^3, the product with x 2m^2n)."""
    from xsa_exp.optim.muon_adamw import orthogonalize

    muon = [g for g in groups if g["algorithm"] == "muon"]
    matrices = [torch.randn_like(p) for g in muon for p in g["params"]]
    g0 = muon[0]
    dtype = getattr(torch, g0.get("ns_dtype", "bfloat16"))
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
