"""One optimizer for Muon (hidden matrices) and AdamW (everything else).

Lightning's automatic optimization takes a single optimizer, so both algorithms live here as
param groups tagged `algorithm: "muon" | "adamw"`. `step(closure)` calls the closure first, which
is what lets Lightning run the forward/backward, gradient accumulation and clipping inside it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

# Keller Jordan's quintic, maximising the slope at zero (same as torch.optim.Muon).
QUINTIC_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# Polar Express (Amsel et al. 2025, arXiv:2505.16932), one (a, b, c) per iteration, as used in
# modded-nanogpt and nanochat with a 2% safety factor on the initial normalisation.
POLAR_EXPRESS_COEFFICIENTS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def orthogonalize(g: torch.Tensor, ns_steps: int = 5, coefficients: str = "quintic",
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Approximate U V^T of g = U S V^T by Newton-Schulz iterations, in bf16 by default.

    The quintic path in bf16 uses the same operations and order as torch.optim.Muon, so a step matches
    it. fp32 costs more but does not amplify last-bit differences in g (e.g. from a different
    gradient summation order across devices) into bf16 rounding flips.
    """
    x = g.to(dtype)
    transposed = g.size(0) > g.size(1)
    if transposed:
        x = x.T
    if coefficients == "polar_express":
        x = x / (x.norm() * 1.02 + 1e-6)
        schedule = [POLAR_EXPRESS_COEFFICIENTS[min(i, len(POLAR_EXPRESS_COEFFICIENTS) - 1)] for i in range(ns_steps)]
    else:
        x = x / x.norm().clamp(min=1e-7)
        schedule = [QUINTIC_COEFFICIENTS] * ns_steps
    for a, b, c in schedule:
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if transposed else x


class MuonAdamW(torch.optim.Optimizer):
    """Param groups carry `algorithm`; Muon groups: lr, momentum, nesterov, ns_steps, ns_coefficients,
    ns_dtype (optional, "bfloat16" by default), sharded (optional), weight_decay; AdamW groups: lr, betas, eps, weight_decay. Both use decoupled weight decay."""

    def __init__(self, param_groups: list[dict]):
        for group in param_groups:
            if group.get("algorithm") not in ("muon", "adamw"):
                raise ValueError(f"param group {group.get('role')!r} needs algorithm 'muon' or 'adamw'")
            if group["algorithm"] == "muon" and any(p.ndim != 2 for p in group["params"]):
                raise ValueError(f"param group {group.get('role')!r}: Muon takes 2-D matrices only")
        super().__init__(param_groups, defaults={})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["algorithm"] == "muon":
                self._muon_step(group)
            else:
                self._adamw_step(group)
        return loss

    def _muon_step(self, group: dict) -> None:
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        ns_dtype = getattr(torch, group.get("ns_dtype", "bfloat16"))
        params = [p for p in group["params"] if p.grad is not None]
        # sharded: under torch.distributed each rank orthogonalizes every world_size-th matrix and
        # broadcasts it; momentum (cheap) is still kept on every rank, so all states stay identical.
        sharded = group.get("sharded", False) and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
        updates = []
        for i, p in enumerate(params):
            state = self.state[p]
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - momentum)
            if i % world == rank:
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = orthogonalize(update, group["ns_steps"], group["ns_coefficients"], ns_dtype)
                updates.append(update.contiguous() if sharded else update)  # broadcast sends raw memory
            else:
                updates.append(torch.empty(p.shape, dtype=ns_dtype, device=p.device))
        if sharded:
            for handle in [dist.broadcast(u, src=i % world, async_op=True) for i, u in enumerate(updates)]:
                handle.wait()
        for p, update in zip(params, updates):
            p.mul_(1 - lr * wd)
            p.add_(update.to(p.dtype), alpha=-lr * math.sqrt(max(1.0, p.size(0) / p.size(1))))

    def _adamw_step(self, group: dict) -> None:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            step = state["step"].item()
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(p.grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            bias_correction1 = 1 - beta1**step
            bias_correction2_sqrt = math.sqrt(1 - beta2**step)
            p.mul_(1 - lr * wd)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)
