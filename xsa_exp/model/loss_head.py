"""The loss head without the logits (model.fused_loss_head): lm_head, tanh soft-cap and cross-entropy, forward and
backward, so that the (tokens, vocabulary) logits never exist whole: 2^31 elements per d12 micro-batch (32 x 2048 x
32,768), 8.6 GB in fp32 alone, where a chunk of them is 0.27 GB.

On CUDA, outside a compiled graph (eager training, evaluations), Liger-Kernel's fused linear cross-entropy where it
is installed (`pip install -e ".[liger]"`; it needs triton). Everywhere else, and always inside the compiled training
forward, the chunked Function below: Liger's forward reads the number of counted targets with .item(), a host sync
and a graph break that torch.compile(fullgraph=True) refuses, while inductor fuses each chunk's soft-cap, softmax and
gradient into a few kernels over that chunk. Both compute the logits in the inputs' dtype (bf16 under
trainer.precision=bf16-compute) and the soft-cap, softmax and loss in fp32, as the unfused head does.
"""

from __future__ import annotations

import functools

import torch

IGNORE_INDEX = -1  # targets that count for nothing: padding, masked SFT tokens


def chunk_size(tokens: int, vocab_size: int, width: int) -> int:
    """Tokens per chunk, Liger-Kernel's rule: a chunk's logits about as large as the hidden states (vocab / width
    chunks), rounded up to a power of two. 2,048 tokens of 65,536 at d12's micro-batch, 1,024 of 32,768 at d24's."""
    chunks = -(-vocab_size // width)
    return 1 << (-(-tokens // chunks) - 1).bit_length()


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float,
                         reduction: str = "mean") -> torch.Tensor:
    """cross_entropy(softcap * tanh(x @ weight.T / softcap), targets), ignoring IGNORE_INDEX targets; x: (N, C),
    weight: (V, C), multiplied in x's dtype; targets: (N,); softcap 0 is none. reduction: mean, sum, or none (a loss
    per token, without gradients)."""
    if x.is_cuda and not torch.compiler.is_compiling() and (liger := liger_fused_linear_cross_entropy()) is not None:
        return liger(x, weight.to(x.dtype), targets, ignore_index=IGNORE_INDEX, softcap=softcap or None,
                     reduction=reduction, accum_dtype=torch.float32)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        if reduction == "none":
            raise ValueError("the chunked loss head computes gradients for a mean or a sum, not per token")
        return ChunkedLinearCrossEntropy.apply(x, weight, targets, softcap, reduction)
    losses, _, _ = chunked_losses_and_gradients(x, weight, targets, softcap, None)
    return reduced(losses, targets, reduction)


@functools.cache
def liger_fused_linear_cross_entropy():
    """Liger-Kernel's fused linear cross-entropy, or None where it is not installed."""
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError:
        return None
    return liger_fused_linear_cross_entropy


def reduced(losses: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return losses
    total = losses.sum()
    # the mean over counted targets, as F.cross_entropy's; their count stays on the device (no sync)
    return total / (targets != IGNORE_INDEX).sum() if reduction == "mean" else total


def chunked_losses_and_gradients(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float,
                                 grad_scale: torch.Tensor | float | None):
    """Each token's loss (fp32, 0 where ignored), and with grad_scale (the loss's derivative per counted token: 1 for
    a sum, 1 / count for a mean) the gradients of grad_scale x their sum with respect to x and weight, one chunk of
    tokens at a time: a chunk's fp32 logits are all that exists of them. The weight's gradient is summed in fp32 and
    returned in the weight's dtype (the fp32 master weight's under bf16-compute)."""
    step = chunk_size(x.size(0), weight.size(0), weight.size(1))
    w = weight.to(x.dtype)
    losses, grad_x = [], []
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if grad_scale is not None \
        else None
    for start in range(0, x.size(0), step):
        x_chunk, t_chunk = x[start:start + step], targets[start:start + step]
        logits = (x_chunk @ w.T).float()
        if softcap:
            tanh = torch.tanh(logits / softcap)
            logits = softcap * tanh
        counted = t_chunk != IGNORE_INDEX
        target = t_chunk.clamp_min(0).unsqueeze(1)
        lse = torch.logsumexp(logits, dim=1)
        losses.append(torch.where(counted, lse - logits.gather(1, target).squeeze(1), 0.0))
        if grad_scale is None:
            continue
        # d loss / d logits = softmax - one-hot, through the soft-cap's derivative 1 - tanh^2
        grad = torch.exp(logits - lse.unsqueeze(1)).scatter_add(1, target, torch.full_like(lse, -1.0).unsqueeze(1))
        if softcap:
            grad = grad * (1 - tanh * tanh)
        grad = (grad * (counted.unsqueeze(1) * grad_scale)).to(x.dtype)
        grad_x.append((grad @ w).to(x.dtype))
        grad_weight = add_product(grad_weight, grad.T, x_chunk)
    losses = torch.cat(losses)
    if grad_scale is None:
        return losses, None, None
    return losses, torch.cat(grad_x), grad_weight.to(weight.dtype)


def add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """total + a @ b, summed into fp32 total. A bf16 product cast and added instead would let inductor fuse every
    chunk's addition into one kernel that holds all the chunks' products at once (32 x 50 MB at d12). So bf16 a and b
    go through one matmul that sums into fp32 (add_product_fp32)."""
    if a.dtype == torch.float32:
        return total.addmm_(a, b)
    return add_product_fp32(total, a, b)


@torch.library.custom_op("xsa_exp::add_product_fp32", mutates_args=())
def add_product_fp32(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 total + a @ b of bf16 a and b: on CUDA torch's addmm with out_dtype, elsewhere (no kernel for it) a matmul
    of their fp32 copies. An op of its own, opaque to the compiler: inductor has no lowering for addmm's out_dtype
    overload (pytorch issue #163880) and fails to compile the training forward on it."""
    if a.is_cuda:
        return torch.addmm(total, a, b, out_dtype=torch.float32)
    return torch.addmm(total, a.float(), b.float())


@add_product_fp32.register_fake
def _(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(total)


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """The loss and its gradients in one pass, as Liger-Kernel computes them: the gradients are the chunks' by-products
    in the forward, and the backward only scales them by the loss's incoming gradient (Lightning's 1 / accumulation),
    so nothing is recomputed and no logits are kept for it."""

    @staticmethod
    def forward(ctx, x, weight, targets, softcap, reduction):
        grad_scale = 1 / (targets != IGNORE_INDEX).sum() if reduction == "mean" else 1.0
        losses, grad_x, grad_weight = chunked_losses_and_gradients(x, weight, targets, softcap, grad_scale)
        ctx.save_for_backward(grad_x, grad_weight)
        return reduced(losses, targets, reduction)

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_weight = ctx.saved_tensors
        return grad_x * grad_loss, grad_weight * grad_loss, None, None, None
