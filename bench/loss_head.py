"""Peak memory of the loss head per token on this CPU: lm_head, soft-cap and cross-entropy, forward and backward,
unfused (the logits whole) against model.fused_loss_head (a chunk of them at a time), at d12's width and vocabulary.

    python bench/loss_head.py [--tokens 4096 8192] [--dtypes fp32 bf16] [--modes eager compiled] [--out loss_head.json]

Each measurement is one process: x (tokens, 768) requiring grad, as the final norm's output is, in fp32 or in bf16
(trainer.precision=bf16-compute), lm_head's fp32 weight (32,768 x 768), targets with every 16th ignored, the head as
GPT.forward runs it (eager, or torch.compile'd with fullgraph as the training forward), one warm-up pass, then the
process's peak resident set is reset (/proc/self/clear_refs) and one forward and backward runs: the rise of the peak
over the resident set before it, divided by the tokens, is the head's transient memory per token (logits, their
soft-capped fp32 copies, the loss's gradient; the weight's gradient counts, x's inputs do not). glibc returns every
freed block of 64 KiB or more, so the resident set follows the live tensors (as bench/memory_model.py does).
Two token counts split the peak into a fixed part (the weight's gradient, and the chunked head's fp32 sum of it) and
a part per token; the d12 column is fixed + 65,536 tokens x per token.

The chunked head cuts the tokens into chunks of about tokens x width / vocab (Liger-Kernel's rule: 1/32 of them at
4,096 and 8,192 tokens, as at d12's 65,536), so its memory per token here is the one at d12's micro-batch.
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

from peak_rss import measure_in_child, rss_kib  # bench/peak_rss.py, beside this script

WIDTH, VOCAB, SOFTCAP = 768, 32768, 15.0
D12_TOKENS = 32 * 2048  # d12's micro-batch


def measure(tokens: int, dtype: str, fused: bool, compiled: bool) -> int:
    """Transient bytes of one forward and backward of the head, in a fresh process."""
    return measure_in_child(__file__, tokens, dtype, int(fused), int(compiled))


def child(tokens: int, dtype: str, fused: bool, compiled: bool) -> None:
    import torch
    import torch.nn.functional as F

    from xsa_exp.model.loss_head import linear_cross_entropy

    def unfused(x, weight, targets):  # GPT.forward's head without model.fused_loss_head
        logits = F.linear(x, weight.to(x.dtype)).float()
        logits = SOFTCAP * torch.tanh(logits / SOFTCAP)
        return F.cross_entropy(logits, targets, ignore_index=-1)

    def head(x, weight, targets):
        return linear_cross_entropy(x, weight, targets, SOFTCAP) if fused else unfused(x, weight, targets)

    torch.manual_seed(0)
    x = torch.randn(tokens, WIDTH, dtype=torch.float32 if dtype == "fp32" else torch.bfloat16, requires_grad=True)
    weight = torch.nn.Parameter(0.02 * torch.randn(VOCAB, WIDTH))
    targets = torch.randint(0, VOCAB, (tokens,))
    targets[::16] = -1
    step = torch.compile(head, fullgraph=True) if compiled else head

    def once() -> None:
        x.grad = weight.grad = None
        step(x, weight, targets).backward()

    once()
    x.grad = weight.grad = None
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set (VmHWM) to the current one
    before = rss_kib("VmRSS")
    step(x, weight, targets).backward()
    print((rss_kib("VmHWM") - before) * 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", nargs="+", type=int, default=[4096, 8192])
    parser.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    parser.add_argument("--modes", nargs="+", choices=["eager", "compiled"], default=["eager", "compiled"])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        tokens, dtype, fused, compiled = args.child
        child(int(tokens), dtype, bool(int(fused)), bool(int(compiled)))
        return
    figures = {"date": str(date.today()), "width": WIDTH, "vocab": VOCAB, "rows": []}
    print(f"{'x dtype':<8}{'mode':<10}{'head':<9}" + "".join(f"{f'peak MB, {n} tok':>18}" for n in args.tokens)
          + f"{'fixed MB':>10}{'bytes/token':>13}{'GB at d12 micro-batch':>23}")
    for dtype in args.dtypes:
        for mode in args.modes:
            for fused in (False, True):
                peaks = [measure(tokens, dtype, fused, mode == "compiled") for tokens in args.tokens]
                # peak = fixed + tokens x per token (the fixed part: the weight's gradient and its fp32 sum)
                n0, n1, p0, p1 = args.tokens[0], args.tokens[-1], peaks[0], peaks[-1]
                per_token = (p1 - p0) / (n1 - n0) if n1 != n0 else p0 / n0
                fixed = p0 - n0 * per_token
                row = {"dtype": dtype, "mode": mode, "head": "chunked" if fused else "unfused",
                       "peak_bytes": dict(zip(args.tokens, peaks)), "fixed_bytes": fixed, "bytes_per_token": per_token,
                       "d12_micro_batch_gb": (fixed + D12_TOKENS * per_token) / 1e9}
                figures["rows"].append(row)
                print(f"{dtype:<8}{mode:<10}{row['head']:<9}" + "".join(f"{p / 1e6:>18.1f}" for p in peaks)
                      + f"{fixed / 1e6:>10.1f}{per_token:>13,.0f}{row['d12_micro_batch_gb']:>23.2f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
