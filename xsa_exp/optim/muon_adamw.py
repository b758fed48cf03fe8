"""One optimizer for Muon (hidden matrices) and AdamW (everything else).

Lightning's automatic optimization takes a single optimizer, so both algorithms live here as
param groups tagged `algorithm: "muon" | "adamw"`, each with every key of MuonGroup or AdamWGroup (build_param_groups
sets them from the config; nothing is defaulted here). `step(closure)` calls the closure first, which is what lets
Lightning run the forward/backward, gradient accumulation and clipping inside it.

A whole update is skipped when `found_inf` is set (a 0-dim tensor on the device, 1 for a non-finite
loss or gradient, set by the training loop before each step, as torch's GradScaler does for fused
optimizers): weights and optimizer state stay as they were. Muon masks on the device and fused AdamW
takes the flag in its kernel, so the step needs no host read; only the foreach AdamW path reads it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TypedDict

import torch
import torch.distributed as dist
from torch.optim.adamw import adamw

# Keller Jordan's quintic, maximising the slope at zero (same as torch.optim.Muon).
QUINTIC_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# Polar Express (Amsel et al. 2025, arXiv:2505.16932), one (a, b, c) per iteration, as used in
# modded-nanogpt and nanochat (whose 94b73ad normalises by 1.01 x the Frobenius norm, as we do).
POLAR_EXPRESS_COEFFICIENTS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


class MuonGroup(TypedDict):
    """A Muon param group. Weight decay is decoupled: as torch.optim.Muon (the weights x (1 - lr wd)), or, cautious,
    as nanochat (lr wd w subtracted only where the update and w agree in sign, with Muon's shape-adjusted lr)."""
    role: str
    algorithm: str  # "muon"
    params: list
    lr: float
    momentum: float
    nesterov: bool
    ns_steps: int
    ns_coefficients: str  # "quintic" | "polar_express"
    ns_dtype: str  # "bfloat16" | "float32"
    sharded: bool  # under DDP: each rank orthogonalizes its share of the matrices
    weight_decay: float
    cautious_weight_decay: bool
    variance_reduction: bool
    beta2: float  # variance reduction's decay


class AdamWGroup(TypedDict):
    role: str
    algorithm: str  # "adamw"
    params: list
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    fused: bool  # torch's fused kernel (takes found_inf on the device); else its foreach path


GROUP_KEYS = {"muon": MuonGroup.__required_keys__, "adamw": AdamWGroup.__required_keys__}


def orthogonalize(g: torch.Tensor, ns_steps: int = 5, coefficients: str = "quintic",
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Approximate U V^T of g = U S V^T by Newton-Schulz iterations, in bf16 by default; g is one matrix, or a
    stack of equal shape (batched matmuls, each matrix normalised on its own).

    The quintic path in bf16 uses the same operations and order as torch.optim.Muon, so a step matches
    it. fp32 costs more but does not amplify last-bit differences in g (e.g. from a different
    gradient summation order across devices) into bf16 rounding flips. One matrix keeps the 2-D operations
    (norm over all elements, addmm): on a CPU the batched ones round differently now and then, and the
    committed study ran these.
    """
    x = g.to(dtype)
    transposed = g.size(-2) > g.size(-1)
    if transposed:
        x = x.mT
    stacked = x.ndim == 3
    norm = x.norm(dim=(-2, -1), keepdim=True) if stacked else x.norm()
    if coefficients == "polar_express":
        x = x / (norm * 1.01 + 1e-6)
        schedule = [POLAR_EXPRESS_COEFFICIENTS[min(i, len(POLAR_EXPRESS_COEFFICIENTS) - 1)] for i in range(ns_steps)]
    else:
        x = x / norm.clamp(min=1e-7)
        schedule = [QUINTIC_COEFFICIENTS] * ns_steps
    multiply_add = torch.baddbmm if stacked else torch.addmm
    for a, b, c in schedule:
        gram = x @ x.mT
        x = multiply_add(x, multiply_add(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if transposed else x


def variance_reduce(update: torch.Tensor, second_moment: torch.Tensor,
                    new_weight: float | torch.Tensor) -> torch.Tensor:
    """NorMuon-style variance reduction (arXiv:2510.05491), as nanochat 94b73ad runs it after orthogonalization:
    each row of a tall matrix (column of a wide one) is divided by the running RMS of its own entries, then the
    matrix is rescaled to the Frobenius norm it had. second_moment, (rows, 1) or (1, cols) per matrix (or a stack),
    moves in place towards this update's mean squares by new_weight = 1 - beta2 (a 0-dim tensor of 0 on a
    skipped update: the moment stays as it was)."""
    reduce_dim = -1 if update.size(-2) >= update.size(-1) else -2
    mean_sq = update.float().square().mean(dim=reduce_dim, keepdim=True)
    n = update.size(reduce_dim)
    norm = (mean_sq.sum(dim=(-2, -1), keepdim=True) * n).sqrt()
    second_moment.lerp_(mean_sq.to(second_moment.dtype), new_weight)
    step_size = second_moment.clamp_min(1e-10).rsqrt()
    new_norm = ((mean_sq * n) * step_size.float().square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    return update * (step_size * (norm / new_norm.clamp_min(1e-10))).to(update.dtype)


def second_moment_shape(shape: torch.Size) -> tuple[int, int]:
    """One entry per row of a tall (or square) matrix, per column of a wide one."""
    return (shape[0], 1) if shape[0] >= shape[1] else (1, shape[1])


class MuonAdamW(torch.optim.Optimizer):
    """Param groups: MuonGroup or AdamWGroup, every key set."""

    def __init__(self, param_groups: list[dict]):
        for group in param_groups:
            if group["algorithm"] not in GROUP_KEYS:
                raise ValueError(f"param group {group['role']!r} needs algorithm 'muon' or 'adamw'")
            missing = GROUP_KEYS[group["algorithm"]] - group.keys()
            if missing:
                raise KeyError(f"param group {group['role']!r} lacks {', '.join(sorted(missing))}")
            if group["algorithm"] == "muon" and any(p.ndim != 2 for p in group["params"]):
                raise ValueError(f"param group {group['role']!r}: Muon takes 2-D matrices only")
        super().__init__(param_groups, defaults={})
        self.found_inf: torch.Tensor | None = None

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
        lr, wd = group["lr"], group["weight_decay"]
        variance_reduction, cautious = group["variance_reduction"], group["cautious_weight_decay"]
        ns_dtype = getattr(torch, group["ns_dtype"])
        params = [p for p in group["params"] if p.grad is not None]
        # sharded: under torch.distributed each rank orthogonalizes every world_size-th matrix and
        # broadcasts it; momentum (cheap) is still kept on every rank, so all states stay identical.
        sharded = (group["sharded"] and dist.is_available() and dist.is_initialized()
                   and dist.get_world_size() > 1)
        rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
        # On a skipped update the gradients count as zero and the momentum moves by a weight of 0 (so it is unchanged,
        # bit for bit); the update is multiplied by 0. Otherwise every value is what the unmasked step computes.
        keep = None if self.found_inf is None else 1 - self.found_inf
        skipped = None if keep is None else ~keep.bool()
        updates: list[torch.Tensor | None] = [None] * len(params)
        owned = self._update_momenta(group, params, keep, skipped, rank, world, updates, ns_dtype)
        self._orthogonalize(group, params, owned, keep, updates, ns_dtype)
        if sharded:  # broadcast sends raw memory: each matrix contiguous
            updates = [u.contiguous() for u in updates]
            for handle in [dist.broadcast(u, src=i % world, async_op=True) for i, u in enumerate(updates)]:
                handle.wait()
        if variance_reduction:  # after the broadcast, on every rank: the second moments stay identical everywhere
            self._variance_reduce(params, updates, 1 - group["beta2"] if keep is None else keep * (1 - group["beta2"]))
        self._apply(params, updates, lr, wd, cautious, keep)

    def _update_momenta(self, group, params, keep, skipped, rank, world, updates, ns_dtype) -> dict:
        """Each matrix's momentum from its gradient; returns the matrices this rank orthogonalizes, grouped (by
        shape on a GPU), and leaves an empty update for each matrix another rank broadcasts."""
        momentum, variance_reduction = group["momentum"], group["variance_reduction"]
        owned_by_shape = defaultdict(list)
        for i, p in enumerate(params):
            state = self.state[p]
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p)
            if skipped is not None:  # in place: a skipped update's gradients count as zero
                p.grad.masked_fill_(skipped, 0)
            grad = p.grad
            state["momentum_buffer"].lerp_(grad, 1 - momentum if keep is None else keep * (1 - momentum))
            if variance_reduction and "second_moment" not in state:
                state["second_moment"] = torch.zeros(second_moment_shape(p.shape), dtype=p.dtype, device=p.device)
            if i % world == rank:
                # Stacked by shape on a GPU (a few batched Newton-Schulz instead of one per matrix: fewer, larger
                # kernels); one matrix at a time on a CPU, where it measured faster (BENCHMARKS.md).
                owned_by_shape[p.shape if p.is_cuda else i].append((i, grad))
            else:
                updates[i] = torch.empty(p.shape, dtype=ns_dtype, device=p.device)
        return owned_by_shape

    def _orthogonalize(self, group, params, owned_by_shape, keep, updates, ns_dtype) -> None:
        momentum = group["momentum"]
        for owned in owned_by_shape.values():
            bufs = [self.state[params[i]]["momentum_buffer"] for i, _ in owned]
            momenta = [grad.lerp(buf, momentum) if group["nesterov"] else buf for (_, grad), buf in zip(owned, bufs)]
            stacked = len(momenta) > 1
            orthogonal = orthogonalize(torch.stack(momenta) if stacked else momenta[0], group["ns_steps"],
                                       group["ns_coefficients"], ns_dtype)
            if keep is not None:
                orthogonal.mul_(keep)
            for (i, _), update in zip(owned, orthogonal.unbind(0) if stacked else [orthogonal]):
                updates[i] = update

    @staticmethod
    def _apply(params, updates, lr, wd, cautious, keep) -> None:
        """Weight decay (cautious: only where the update and the weight agree in sign) and the update, at the
        matrix's shape-scaled lr."""
        for p, update in zip(params, updates):
            shape_lr = lr * math.sqrt(max(1.0, p.size(0) / p.size(1)))
            if wd and cautious:
                decay = (shape_lr * wd) * p * (update * p >= 0)
                p.sub_(decay if keep is None else decay * keep)
            elif wd:
                p.mul_(1 - lr * wd if keep is None else torch.where(keep.bool(), 1 - lr * wd, 1.0))
            p.add_(update.to(p.dtype), alpha=-shape_lr)

    def _variance_reduce(self, params: list[torch.Tensor], updates: list[torch.Tensor], new_weight) -> None:
        by_shape = defaultdict(list)  # stacked by shape on a GPU, as the orthogonalization
        for i, p in enumerate(params):
            by_shape[p.shape if p.is_cuda else i].append(i)
        for indices in by_shape.values():
            moments = [self.state[params[i]]["second_moment"] for i in indices]
            if len(indices) == 1:
                updates[indices[0]] = variance_reduce(updates[indices[0]], moments[0], new_weight)
                continue
            moment = torch.stack(moments)
            reduced = variance_reduce(torch.stack([updates[i] for i in indices]), moment, new_weight)
            torch._foreach_copy_(moments, list(moment.unbind(0)))
            for i, update in zip(indices, reduced.unbind(0)):
                updates[i] = update

    def _adamw_step(self, group: dict) -> None:
        fused = group["fused"]
        if not fused and self.found_inf is not None and self.found_inf.item():
            return  # the foreach path cannot take the flag on the device
        params = [p for p in group["params"] if p.grad is not None]
        for p in params:
            state = self.state[p]
            if not state:
                # The fused kernel keeps its step count on the device; the foreach path reads it on the host.
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu")
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        adamw(params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
              [s["step"] for s in states], foreach=not fused, fused=fused,
              found_inf=self.found_inf if fused else None, amsgrad=False, beta1=beta1, beta2=beta2,
              lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
