"""One optimizer for Muon (hidden matrices) and AdamW (everything else).

Lightning's automatic optimization takes a single optimizer, so both algorithms live here as
param groups tagged `algorithm: "muon" | "adamw"`, each with every key of MuonGroup or AdamWGroup (build_param_groups
sets them from the config; nothing is defaulted here). `step(closure)` calls the closure first, which is what lets
Lightning run the forward/backward, gradient accumulation and clipping inside it.

Muon steps each shape group (the group's matrices of one shape) as a whole: eagerly (one matrix at a time on a CPU,
stacked on a GPU), or, with `compiled`, as one torch.compile graph per shape group (momentum, Nesterov, Newton-Schulz,
variance reduction, weight decay and the update: a few fused kernels instead of ~12 launches per matrix), whose
hyperparameters are 0-D tensors so that the schedule's changing values never recompile it. Under DDP with `sharded`,
each rank orthogonalizes a contiguous share of each shape group and one all_gather per shape group brings every rank
all of its updates.

A whole update is skipped when `found_inf` is set (a 0-dim tensor on the device, 1 for a non-finite
loss or gradient, set by the training loop before each step, as torch's GradScaler does for fused
optimizers): weights and optimizer state stay as they were. Muon masks on the device and fused AdamW
takes the flag in its kernel, so the step needs no host read; only the foreach AdamW path reads it.
"""

from __future__ import annotations

import functools
import math
import types
import warnings
from dataclasses import dataclass
from typing import TypedDict

import torch
import torch.distributed as dist
from torch.optim.adamw import adamw

# torch 2.13 renames all_gather_into_tensor to all_gather_single and warns; torch 2.11 (the GPU image's) has only it.
warnings.filterwarnings("ignore", message="`torch.distributed.all_gather_into_tensor` is deprecated",
                        category=FutureWarning)

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
    sharded: bool  # under DDP: each rank orthogonalizes its share of each shape group
    compiled: bool  # one torch.compile graph per shape group
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


def orthogonalize(g: torch.Tensor, ns_steps: int, coefficients: str, dtype: torch.dtype) -> torch.Tensor:
    """Approximate U V^T of g = U S V^T by Newton-Schulz iterations in `dtype`; g is one matrix, or a
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


def shape_lr(lr: float, shape: torch.Size) -> float:
    """Muon's lr for a matrix of this shape: x sqrt(rows / cols) for a tall one (torch.optim.Muon's 'original')."""
    return lr * math.sqrt(max(1.0, shape[0] / shape[1]))


# ---------------------------------------------------------------- the compiled step of one shape group
# Stacked over the shape group's K matrices; the same operations, in the same order and dtypes, as the eager step,
# so the two agree to fp32 rounding. Hyperparameters arrive as 0-D tensors, found_inf as the device's flag.

def momentum_and_orthogonalize(grads: list[torch.Tensor], momenta: list[torch.Tensor], found_inf: torch.Tensor,
                               momentum: torch.Tensor, momentum_weight: torch.Tensor, owned: tuple[int, int],
                               chunk: int, nesterov: bool, ns_steps: int, ns_coefficients: str,
                               ns_dtype: torch.dtype) -> torch.Tensor:
    """Every momentum moves towards its gradient (in place; by momentum_weight = 1 - momentum, by 0 on a skipped
    update, whose gradients count as zero); the owned matrices [lo, hi) are orthogonalized (zero on a skipped update)
    and returned as a stack of `chunk`, zero-padded."""
    keep = 1 - found_inf
    grad = torch.stack(grads).masked_fill(found_inf.bool(), 0)
    moment = torch.stack(momenta).lerp(grad, keep * momentum_weight)
    for buffer, new in zip(momenta, moment.unbind(0)):
        buffer.copy_(new)
    lo, hi = owned
    if hi == lo:  # more ranks than this shape's matrices: nothing of it here
        return grad.new_zeros((chunk, *grad.shape[1:]), dtype=ns_dtype)
    x = grad[lo:hi].lerp(moment[lo:hi], momentum) if nesterov else moment[lo:hi]
    x = orthogonalize(x, ns_steps, ns_coefficients, ns_dtype) * keep
    if hi - lo < chunk:
        x = torch.cat([x, x.new_zeros((chunk - (hi - lo), *x.shape[1:]))])
    return x


def reduce_and_apply(updates: torch.Tensor, params: list[torch.Tensor], second_moments: list[torch.Tensor],
                     found_inf: torch.Tensor, lr: torch.Tensor, decay: torch.Tensor, beta2_weight: torch.Tensor,
                     cautious: bool) -> None:
    """Variance reduction (where second_moments are given), weight decay and the update, in place. lr is the shape's;
    decay is lr x wd (cautious) or 1 - lr x wd."""
    keep = 1 - found_inf
    if second_moments:
        moment = torch.stack(second_moments)
        updates = variance_reduce(updates, moment, keep * beta2_weight)
        for buffer, new in zip(second_moments, moment.unbind(0)):
            buffer.copy_(new)
    weights = torch.stack(params)
    if cautious:
        weights = weights - decay * weights * (updates * weights >= 0) * keep
    else:
        weights = weights * torch.where(found_inf.bool(), 1.0, decay)
    weights = weights - lr * updates.to(weights.dtype)  # a skipped update is 0 here
    for p, new in zip(params, weights.unbind(0)):
        p.copy_(new)


def muon_shape_step(grads, momenta, params, second_moments, found_inf, momentum, momentum_weight, lr, decay,
                    beta2_weight, nesterov, ns_steps, ns_coefficients, ns_dtype, cautious) -> None:
    """The whole step of one shape group on one device."""
    updates = momentum_and_orthogonalize(grads, momenta, found_inf, momentum, momentum_weight, (0, len(params)),
                                         len(params), nesterov, ns_steps, ns_coefficients, ns_dtype)
    reduce_and_apply(updates, params, second_moments, found_inf, lr, decay, beta2_weight, cautious)


@functools.cache
def compiled(fn, shape_group: tuple):
    """fn compiled for one shape group (its shape, size, device and static arguments): one graph, fullgraph (a graph
    break would split the step into eager pieces again). Dynamo keeps (and limits to 8) the graphs of one code object,
    so each shape group gets a code object of its own: its graph is a first compile, never a recompile of another's."""
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return torch.compile(own, fullgraph=True, dynamic=False)


@dataclass
class ShapeStep:
    """One shape group between its orthogonalization and its update: the gather in flight under DDP."""
    params: list[torch.Tensor]
    updates: torch.Tensor | list[torch.Tensor]  # gathered (K x ..., padded) under DDP, else one per matrix
    gather: dist.Work | None
    key: tuple = ()  # compiled: the shape group's key, and the update's tensor arguments
    hyper: tuple = ()


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
        self._hyper: dict[tuple, tuple[torch.Tensor, ...]] = {}  # the compiled step's hyperparameters

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Muon first: under DDP its gathers travel while AdamW steps.
        pending = [(group, shape_step) for group in self.param_groups if group["algorithm"] == "muon"
                   for shape_step in self._muon_start(group)]
        for group in self.param_groups:
            if group["algorithm"] == "adamw":
                self._adamw_step(group)
        for group, shape_step in pending:
            self._muon_finish(group, shape_step)
        return loss

    # ---------------------------------------------------------------- Muon

    def _muon_start(self, group: dict) -> list[ShapeStep]:
        """Momentum and orthogonalization of each shape group (this rank's share under sharding, gathered
        asynchronously); the compiled step on one device does the whole update here."""
        params = [p for p in group["params"] if p.grad is not None]
        for p in params:
            state = self.state[p]
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p)
            if group["variance_reduction"] and "second_moment" not in state:
                state["second_moment"] = torch.zeros(second_moment_shape(p.shape), dtype=p.dtype, device=p.device)
        sharded = group["sharded"] and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
        by_shape: dict[torch.Size, list[torch.Tensor]] = {}
        for p in params:
            by_shape.setdefault(p.shape, []).append(p)
        steps = []
        for shape_params in by_shape.values():
            # Rank r orthogonalizes the shape group's matrices [r chunk, (r + 1) chunk), padded to world x chunk.
            chunk = -(-len(shape_params) // world)
            owned = (min(rank * chunk, len(shape_params)), min((rank + 1) * chunk, len(shape_params)))
            if group["compiled"]:
                step = self._compiled_start(group, shape_params, owned, chunk, world)
            else:
                step = self._eager_start(group, shape_params, owned, chunk, world)
            if step is not None:
                steps.append(step)
        return steps

    def _muon_finish(self, group: dict, step: ShapeStep) -> None:
        if step.gather is not None:
            step.gather.wait()
        if group["compiled"]:
            compiled(reduce_and_apply, step.key)(step.updates[:len(step.params)], step.params,
                                                 self._second_moments(step.params), *step.hyper,
                                                 group["cautious_weight_decay"])
            return
        updates = list(step.updates[:len(step.params)].unbind(0)) if step.gather is not None else step.updates
        if group["variance_reduction"]:
            # after the gather, on every rank: the second moments stay identical everywhere
            beta2_weight = 1 - group["beta2"] if self.found_inf is None else (1 - self.found_inf) * (1 - group["beta2"])
            updates = self._variance_reduce(step.params, updates, beta2_weight)
        self._apply(step.params, updates, group["lr"], group["weight_decay"], group["cautious_weight_decay"],
                    None if self.found_inf is None else 1 - self.found_inf)

    def _second_moments(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.state[p]["second_moment"] for p in params if "second_moment" in self.state[p]]

    @staticmethod
    def _gather(mine: torch.Tensor, world: int) -> tuple[torch.Tensor, dist.Work]:
        """Every rank's share of a shape group, in rank order, in one collective (asynchronous). Made contiguous:
        a tall matrix's update is a transposed view, which NCCL refuses ("Tensors must be contiguous")."""
        gathered = torch.empty((world * mine.size(0), *mine.shape[1:]), dtype=mine.dtype, device=mine.device)
        return gathered, dist.all_gather_into_tensor(gathered, mine.contiguous(), async_op=True)

    def _compiled_start(self, group, params, owned, chunk, world) -> ShapeStep | None:
        p = params[0]
        found_inf = self.found_inf if self.found_inf is not None else torch.zeros((), device=p.device)
        statics = (group["nesterov"], group["ns_steps"], group["ns_coefficients"], getattr(torch, group["ns_dtype"]))
        key = (p.shape, len(params), str(p.device), owned, chunk, *statics, group["cautious_weight_decay"],
               group["variance_reduction"])
        # 0-D CPU tensors, one set per shape group (its lr is the shape's): their values change every update without
        # recompiling, and the device reads them as kernel arguments (nanochat's way).
        if key not in self._hyper:
            self._hyper[key] = tuple(torch.zeros(()) for _ in range(5))
        hyper = self._hyper[key]
        lr, wd = shape_lr(group["lr"], p.shape), group["weight_decay"]
        for t, value in zip(hyper, (group["momentum"], 1 - group["momentum"], lr,
                                    lr * wd if group["cautious_weight_decay"] else 1 - group["lr"] * wd,
                                    1 - group["beta2"])):
            t.fill_(value)
        momentum, momentum_weight, lr_t, decay, beta2_weight = hyper
        grads = [q.grad for q in params]
        momenta = [self.state[q]["momentum_buffer"] for q in params]
        if world == 1:
            compiled(muon_shape_step, key)(grads, momenta, params, self._second_moments(params), found_inf, momentum,
                                           momentum_weight, lr_t, decay, beta2_weight, *statics,
                                           group["cautious_weight_decay"])
            return None
        mine = compiled(momentum_and_orthogonalize, key)(grads, momenta, found_inf, momentum, momentum_weight, owned,
                                                         chunk, *statics)
        return ShapeStep(params, *self._gather(mine, world), key=key, hyper=(found_inf, lr_t, decay, beta2_weight))

    def _eager_start(self, group, params, owned, chunk, world) -> ShapeStep:
        # On a skipped update the gradients count as zero and the momentum moves by a weight of 0 (so it is unchanged,
        # bit for bit); the update is multiplied by 0. Otherwise every value is what the unmasked step computes.
        keep = None if self.found_inf is None else 1 - self.found_inf
        skipped = None if keep is None else ~keep.bool()
        momentum = group["momentum"]
        for p in params:
            if skipped is not None:  # in place: a skipped update's gradients count as zero
                p.grad.masked_fill_(skipped, 0)
            self.state[p]["momentum_buffer"].lerp_(p.grad, 1 - momentum if keep is None else keep * (1 - momentum))
        lo, hi = owned
        bufs = [self.state[p]["momentum_buffer"] for p in params[lo:hi]]
        momenta = [p.grad.lerp(buf, momentum) if group["nesterov"] else buf for p, buf in zip(params[lo:hi], bufs)]
        ns = (group["ns_steps"], group["ns_coefficients"], getattr(torch, group["ns_dtype"]))
        # Stacked on a GPU (a few batched Newton-Schulz instead of one per matrix: fewer, larger kernels); one
        # matrix at a time on a CPU, where it measured faster (BENCHMARKS.md).
        if params[0].is_cuda and len(momenta) > 1:
            orthogonal = orthogonalize(torch.stack(momenta), *ns)
            if keep is not None:
                orthogonal.mul_(keep)
            updates = list(orthogonal.unbind(0))
        else:
            updates = [orthogonalize(m, *ns) for m in momenta]
            if keep is not None:
                for update in updates:
                    update.mul_(keep)
        if world == 1:
            return ShapeStep(params, updates, None)
        padding = [torch.zeros(params[0].shape, dtype=ns[2], device=params[0].device)] * (chunk - len(updates))
        return ShapeStep(params, *self._gather(torch.stack(updates + padding), world))

    @staticmethod
    def _apply(params, updates, lr, wd, cautious, keep) -> None:
        """Weight decay (cautious: only where the update and the weight agree in sign) and the update, at the
        matrix's shape-scaled lr."""
        for p, update in zip(params, updates):
            lr_p = shape_lr(lr, p.shape)
            if wd and cautious:
                decay = (lr_p * wd) * p * (update * p >= 0)
                p.sub_(decay if keep is None else decay * keep)
            elif wd:
                p.mul_(1 - lr * wd if keep is None else torch.where(keep.bool(), 1 - lr * wd, 1.0))
            p.add_(update.to(p.dtype), alpha=-lr_p)

    def _variance_reduce(self, params: list[torch.Tensor], updates: list[torch.Tensor], new_weight) -> list:
        """Stacked on a GPU, as the orthogonalization; one matrix at a time on a CPU."""
        moments = [self.state[p]["second_moment"] for p in params]
        if not (params[0].is_cuda and len(params) > 1):
            return [variance_reduce(u, m, new_weight) for u, m in zip(updates, moments)]
        moment = torch.stack(moments)
        reduced = variance_reduce(torch.stack(updates), moment, new_weight)
        torch._foreach_copy_(moments, list(moment.unbind(0)))
        return list(reduced.unbind(0))

    # ---------------------------------------------------------------- AdamW

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
