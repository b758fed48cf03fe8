"""What sliding windows (model.window_pattern=SSSL) cost on this machine's CPU, against full context.

    python bench/window_attention.py            # one thread, as the study runs

Two measurements, each the median of --repeats after a warm-up:
1. attention alone, (8, 4 heads, T, 32) at T = 256 and 1024 (the short window: 128 and 256): full-context SDPA
   (is_causal) and the CPU path for a window (SDPA with a boolean mask), forward + backward and forward only,
   and forward only FlexAttention compiled for the CPU (the block-sparse kernel of the CUDA path; it has no
   backward on a CPU);
2. one training forward + backward of the tiny model (4 x 128, batch 8 x 256) with window_pattern L and SSSL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from xsa_exp.model import GPT, GPTConfig, XSASettings  # noqa: E402
from xsa_exp.model.gpt import window_mask  # noqa: E402


def median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def attention_costs(T: int, repeats: int) -> dict[str, float]:
    """Forward + backward of SDPA causal and SDPA with the window's mask; forward only of those and of compiled
    FlexAttention (torch 2.13 has no FlexAttention backward on a CPU, so CPU training cannot use it)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    window = -(-T // 4 // 128) * 128
    q, k, v = (torch.randn(8, 4, T, 32, requires_grad=True) for _ in range(3))
    mask = window_mask(torch.arange(T), T, window)
    block_mask = create_block_mask(lambda b, h, qi, ki: (ki <= qi) & (qi - ki <= window), None, None, T, T,
                                   device="cpu")
    flex = torch.compile(flex_attention, dynamic=False)
    full = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    masked = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731

    def forward_only(attend):
        def run():
            with torch.no_grad():
                attend()
        return run
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    return {"train, full context (SDPA causal)": median_seconds(lambda: full().sum().backward(), repeats),
            f"train, window {window} (SDPA, boolean mask)": median_seconds(lambda: masked().sum().backward(), repeats),
            "forward, full context (SDPA causal)": median_seconds(forward_only(full), repeats),
            f"forward, window {window} (SDPA, boolean mask)": median_seconds(forward_only(masked), repeats),
            f"forward, window {window} (FlexAttention, compiled)":
                median_seconds(forward_only(lambda: flex(qd, kd, vd, block_mask=block_mask)), repeats)}


def model_cost(window_pattern: str, repeats: int) -> float:
    torch.manual_seed(0)
    model = GPT(GPTConfig(sequence_len=256, vocab_size=4096, n_layer=4, n_head=4, n_embd=128,
                          window_pattern=window_pattern, xsa=XSASettings(layers=[0, 1, 2, 3])))
    idx = torch.randint(0, 4096, (8, 256))
    return median_seconds(lambda: model(idx, idx).backward(), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}")
    for T in (256, 1024):
        costs = attention_costs(T, args.repeats)
        for name, seconds in costs.items():
            full = costs[f"{name.split(',')[0]}, full context (SDPA causal)"]
            print(f"attention T={T}: {name}: {seconds * 1e3:.2f} ms ({seconds / full:.2f}x full context)")
    full, windowed = model_cost("L", args.repeats), model_cost("SSSL", args.repeats)
    print(f"tiny model forward + backward: L {full * 1e3:.1f} ms, SSSL {windowed * 1e3:.1f} ms "
          f"({windowed / full:.2f}x)")


if __name__ == "__main__":
    main()
