"""Our model and optimizer under stack=nanochat_2604 against nanochat itself, at 94b73ad, on a CPU in fp32.

nanochat is not part of xsa-exp; fetch it next to the repository first:
    git clone https://github.com/karpathy/nanochat ../nanochat && git -C ../nanochat checkout 94b73ad
    python bench/compare_nanochat.py --nanochat ../nanochat

1. Forward: nanochat's GPT (its SDPA fallback, windows SSSL, smear, backout, q/k x 1.2) with perturbed random
   weights, the same weights copied into ours (XSA off); the largest logit difference, at the training length
   and at 2.5x it (nanochat takes inputs up to 10x, and its CORE scores long prompts whole).
2. Optimizer: identical gradients (nanochat's backward) fed to nanochat's MuonAdamW (its compiled fused kernels:
   Polar Express, variance reduction, cautious weight decay; AdamW per group) and to ours, with nanochat's
   schedule at each step (base_train.py's lr, momentum and weight-decay rules, which ours must reproduce);
   after each step the largest parameter difference per role, relative to the largest update of that role.
   On a CPU nanochat's orthogonalization runs in fp32 (its COMPUTE_DTYPE), so ours runs with
   optim.muon.ns_dtype=float32 for the exact comparison; the bf16 row shows what bf16 (the default, as
   nanochat runs on a GPU) changes. The row without weight decay separates the cautious mask: where an
   update element is ~0 its sign, and so whether that weight decays, is decided by rounding.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from xsa_exp.config.schema import ModelConfig, XSAConfig, typed  # noqa: E402
from xsa_exp.model import GPT, GPTConfig  # noqa: E402
from xsa_exp.optim import MuonAdamW, OptimizerSchedule, build_param_groups  # noqa: E402

SHAPE = dict(n_layer=4, n_head=4, n_embd=128, sequence_len=256, vocab_size=4096)  # 4096: no vocabulary padding
STEPS, TOTAL_STEPS = 5, 1000
LONG_INPUT = 640  # 2.5x the training length: every L layer windowed at 256, RoPE past its training positions


def nanochat_model(nanochat, n_kv_head: int):
    config = nanochat.gpt.GPTConfig(**SHAPE, n_kv_head=n_kv_head, window_pattern="SSSL")
    torch.manual_seed(0)
    model = nanochat.gpt.GPT(config)
    model.init_weights()
    with torch.no_grad():  # off the init, where zero projections and lambdas would hide every feature
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def our_model(n_kv_head: int, ns_dtype: str, weight_decay: float):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", ["stack=nanochat_2604", "xsa=off", "logger=csv", f"optim.muon.ns_dtype={ns_dtype}",
                                f"optim.muon.weight_decay={weight_decay}", f"model.n_kv_head={n_kv_head}",
                                *(f"model.{k}={v}" for k, v in SHAPE.items())])
    return GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig))), cfg


def our_name(nanochat_name: str) -> str:
    return nanochat_name.replace("transformer.h.", "blocks.").removeprefix("transformer.")


def nanochat_schedule(it: int, weight_decay: float) -> tuple[float, float, float]:
    """base_train.py at 94b73ad: lr multiplier, Muon momentum, Muon weight decay (unscaled) at step it."""
    warmdown = round(0.65 * TOTAL_STEPS)
    lrm = (it + 1) / 40 if it < 40 else 1.0 if it <= TOTAL_STEPS - warmdown else \
        (TOTAL_STEPS - it) / warmdown + (1 - (TOTAL_STEPS - it) / warmdown) * 0.05
    if it < 400:
        momentum = (1 - it / 400) * 0.85 + it / 400 * 0.97
    elif it >= TOTAL_STEPS - warmdown:
        progress = (it - (TOTAL_STEPS - warmdown)) / warmdown
        momentum = 0.97 * (1 - progress) + 0.90 * progress
    else:
        momentum = 0.97
    return lrm, momentum, weight_decay * 0.5 * (1 + math.cos(math.pi * it / TOTAL_STEPS))


def compare(nanochat, n_kv_head: int, ns_dtype: str, weight_decay: float) -> None:
    theirs = nanochat_model(nanochat, n_kv_head)
    ours, cfg = our_model(n_kv_head, ns_dtype, weight_decay)
    ours.load_state_dict({our_name(k): v for k, v in theirs.state_dict().items()})
    pairs = [(our_name(name), p, dict(ours.named_parameters())[our_name(name)])
             for name, p in theirs.named_parameters()]
    torch.manual_seed(1)
    idx = torch.randint(0, SHAPE["vocab_size"], (4, SHAPE["sequence_len"]))
    label = f"n_kv_head={n_kv_head}, our Newton-Schulz in {ns_dtype}, Muon weight decay {weight_decay}"
    if ns_dtype == "float32" and weight_decay:
        long = torch.randint(0, SHAPE["vocab_size"], (2, LONG_INPUT))
        with torch.no_grad():
            diff = (theirs(idx) - ours(idx)).abs().max().item()
            long_diff = (theirs(long) - ours(long)).abs().max().item()
        print(f"forward ({label}): max |logit difference| = {diff:.2e}; "
              f"{LONG_INPUT} tokens (past the training length, as CORE's long prompts) {long_diff:.2e}")

    optimizer = theirs.setup_optimizer(unembedding_lr=0.008, embedding_lr=0.3, matrix_lr=0.02,
                                       weight_decay=weight_decay, scalar_lr=0.5)
    ours_opt = MuonAdamW(build_param_groups(ours, cfg.optim, None, compiled=False))
    schedule = OptimizerSchedule(ours_opt, TOTAL_STEPS, cfg.optim.schedule.warmup_steps,
                                      cfg.optim.schedule.warmdown_frac, cfg.optim.schedule.final_lr_frac,
                                      cfg.optim.muon.momentum_start, cfg.optim.muon.momentum,
                                      cfg.optim.muon.momentum_warmup_steps, cfg.optim.muon.momentum_warmdown,
                                      cfg.optim.muon.weight_decay_schedule)
    role_of = {id(p): g["role"] for g in ours_opt.param_groups for p in g["params"]}
    worst: dict[str, tuple[float, float]] = {}  # role -> the largest |difference| and |update| over the steps
    for step in range(STEPS):
        lrm, momentum, wd = nanochat_schedule(step, weight_decay)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lrm
            if group["kind"] == "muon":
                group["momentum"], group["weight_decay"] = momentum, wd
        theirs.zero_grad(set_to_none=True)
        torch.manual_seed(100 + step)
        theirs(torch.randint(0, SHAPE["vocab_size"], (4, SHAPE["sequence_len"])),
               torch.randint(0, SHAPE["vocab_size"], (4, SHAPE["sequence_len"]))).backward()
        before = {name: p.detach().clone() for name, p, _ in pairs}
        for _, p, q in pairs:
            q.grad = p.grad.clone()
        optimizer.step()
        ours_opt.step()
        schedule.step()
        for name, p, q in pairs:
            role = role_of[id(q)]
            diff, update = (p - q).abs().max().item(), (p - before[name]).abs().max().item()
            d, u = worst.get(role, (0.0, 0.0))
            worst[role] = (max(d, diff), max(u, update))
        for _, p, q in pairs:  # each step starts from nanochat's parameters (the optimizer states run on)
            q.data.copy_(p.data)
    print(f"{STEPS} steps ({label}), max |Δparam| / max |update| per role: " + ", ".join(
        f"{role} {d:.1e} / {u:.1e}" for role, (d, u) in sorted(worst.items())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanochat", type=Path, required=True, help="a checkout of karpathy/nanochat at 94b73ad")
    args = parser.parse_args()
    os.environ.setdefault("NANOCHAT_DTYPE", "float32")
    torch.set_num_threads(1)
    sys.path.insert(0, str(args.nanochat.resolve()))
    import nanochat.gpt
    for n_kv_head in (4, 2):
        for ns_dtype, weight_decay in (("float32", 0.28), ("float32", 0.0), ("bfloat16", 0.28)):
            compare(nanochat, n_kv_head, ns_dtype, weight_decay)


if __name__ == "__main__":
    main()
