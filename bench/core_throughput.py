"""CORE evaluation throughput (examples/second) for a depth preset on this machine.

    python bench/core_throughput.py [--depth tiny] [--max-per-task 20] [--bundle ../shared/eval_bundle] [--device cpu]

--max-per-task 0 scores every example, the published protocol.

Uses a randomly initialised model of the preset (throughput does not depend on the weights) and a
byte-level stand-in tokenizer of the preset's vocabulary size, so it needs no trained run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
from xsa_exp.eval.bundle import bundle_problem, resolve_bundle_dir
from xsa_exp.eval.core import evaluate_core
from xsa_exp.model import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[1]


class ByteTokenizer:
    """UTF-8 bytes as tokens: more tokens per example than BPE, so a conservative throughput."""

    bos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depth", default="tiny")
    parser.add_argument("--max-per-task", type=int, default=20, help="0: every example (the published protocol)")
    parser.add_argument("--bundle", default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"depth={args.depth}"])
    # --bundle, else $XSA_EXP_EVAL_BUNDLE, else the cache, else this repository's ../shared/eval_bundle (the dev VM's)
    bundle = resolve_bundle_dir(args.bundle)
    if bundle_problem(bundle) and not args.bundle and not bundle_problem(REPO.parent / "shared" / "eval_bundle"):
        bundle = REPO.parent / "shared" / "eval_bundle"
    if bundle_problem(bundle):
        print(f"CORE throughput skipped: the eval bundle is {bundle_problem(bundle)} "
              "(python -m xsa_exp.eval.bundle download, or --bundle / $XSA_EXP_EVAL_BUNDLE)")
        return
    model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig))).to(args.device)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if args.device == "cuda"
                else torch.autocast("cpu", enabled=False))
    start = time.perf_counter()
    with autocast:
        result = evaluate_core(model, ByteTokenizer(), bundle, model.config.max_input_len, args.max_per_task or None)
    elapsed = time.perf_counter() - start
    n = len(result.examples)
    print(f"depth={args.depth} device={args.device} {result.name}: {n} examples in {elapsed:.1f} s "
          f"= {n / elapsed:.1f} examples/s")


if __name__ == "__main__":
    main()
