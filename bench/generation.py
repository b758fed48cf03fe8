"""Generation tokens/s with and without the KV cache (greedy, one prompt, batch of samples).

    python bench/generation.py [--depth tiny] [--new-tokens 200] [--samples 4] [--device cpu]

A randomly initialised model of the preset: decoding speed does not depend on the weights.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
from xsa_exp.generate import generate
from xsa_exp.model import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depth", default="tiny")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"depth={args.depth}"])
    torch.manual_seed(0)
    model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig))).to(args.device)
    prompt = torch.randint(0, cfg.model.vocab_size, (args.prompt_tokens,)).tolist()
    print(f"depth={args.depth} device={args.device} prompt={args.prompt_tokens} new={args.new_tokens} "
          f"samples={args.samples}")
    for use_cache in (True, False):
        generate(model, prompt, 8, args.samples, use_cache=use_cache)  # warm-up
        start = time.perf_counter()
        out = generate(model, prompt, args.new_tokens, args.samples, use_cache=use_cache)
        elapsed = time.perf_counter() - start
        n = sum(len(o) for o in out)
        print(f"  {'with' if use_cache else 'without'} KV cache: {n / elapsed:,.0f} tokens/s "
              f"({n} tokens in {elapsed:.2f} s)")


if __name__ == "__main__":
    main()
