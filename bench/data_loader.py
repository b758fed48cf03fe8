"""Data pipeline figures: loader throughput vs training throughput, and memory of streamed runs.

    python bench/data_loader.py [--steps 50]
    python bench/data_loader.py --setup-only
    python bench/data_loader.py --packing

0. Set-up of an embedded corpus (read, tokenize, pack; the tokenizer already cached), the median of 5: what every
   run on it pays before its first update. --setup-only prints this alone.
1. Loader alone: tokens/s of the tiny preset's training DataLoader for the embedded corpus and for a
   streamed `data=local` parquet corpus (written here: 8 files of random-word documents), compared
   with the tiny preset's training tokens/s (one timed training run of 30 steps).
2. Memory: peak RSS of `python train.py data=local ...` (streamed) over N and 4N steps.
--packing: the streamed loader alone at the presets' 2,048 tokens, data.packing=concat against bestfit
(nanochat's best fit from a buffer of 1,000 documents, in Python), and how many of the tokens each keeps.
"""

from __future__ import annotations

import argparse
import csv
import random
import re
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hydra import compose, initialize_config_dir

from xsa_exp.data.datamodule import TextDataModule

REPO = Path(__file__).resolve().parents[1]
def write_corpus(folder: Path, files: int = 8, docs: int = 3000) -> None:
    """Documents of words drawn from 20,000 random letter strings: enough variety for a 4096-token BPE, and for
    the presets' 32,768 (3 files of 3,000 documents learn all 32,768 tokens; bench/gpu_runs.py uses it)."""
    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(20000)]
    for i in range(files):
        texts = [" ".join(rng.choices(words, k=rng.randint(50, 400))) for _ in range(docs)]
        pq.write_table(pa.table({"text": texts}), folder / f"part_{i:03d}.parquet")


def set_up(overrides: list[str]) -> TextDataModule:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    data = TextDataModule(cfg.data, cfg.model.sequence_len, cfg.model.vocab_size, cfg.train.device_batch_size,
                          cfg.seed, cfg.cache_dir)
    data.prepare_data()
    data.setup()
    return data


def setup_seconds(overrides: list[str], repeats: int = 5) -> float:
    set_up(overrides)  # trains the tokenizer if it is not cached yet
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        set_up(overrides)
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2]


def loader_tokens_per_second(overrides: list[str], batches: int) -> float:
    data = set_up(overrides)
    loader = iter(data.train_dataloader())
    next(loader)  # start-up (workers, first file) is not throughput
    start = time.perf_counter()
    tokens = sum(batch.numel() for batch in islice(loader, batches))
    return tokens / (time.perf_counter() - start)


def timed_train(args: list[str]) -> tuple[float, int, float]:
    """(wall seconds, peak RSS MB, median train tokens/s) of one train.py run, via /usr/bin/time -v."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = subprocess.run(["/usr/bin/time", "-v", sys.executable, "train.py", f"hydra.run.dir={tmp}/run", *args],
                                cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if result.returncode:
            sys.exit(result.stderr[-3000:])
        rss_mb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr).group(1)) // 1024
        with open(Path(tmp) / "run" / "metrics.csv") as f:
            rates = sorted(float(r["train/tokens_per_sec"]) for r in csv.DictReader(f) if r["train/tokens_per_sec"])
    return wall, rss_mb, rates[len(rates) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--setup-only", action="store_true", help="only the embedded corpora's set-up time")
    parser.add_argument("--packing", action="store_true", help="only the streamed loader under each data.packing")
    args = parser.parse_args()
    if args.packing:
        with tempfile.TemporaryDirectory() as tmp:
            write_corpus(Path(tmp))
            for packing in ("concat", "bestfit"):
                overrides = ["data=local", f"data.path={tmp}", "model.sequence_len=2048", "train.device_batch_size=4",
                             "data.num_workers=1", f"data.packing={packing}"]
                rates = sorted(loader_tokens_per_second(overrides, 100) for _ in range(3))
                print(f"loader alone, local parquet at 2,048 tokens, data.packing={packing}: {rates[1]:,.0f} tokens/s "
                      "(median of 3)")
        return
    for name in ("sample", "wiki"):
        print(f"set-up, data={name} (read, tokenize, pack): {setup_seconds([f'data={name}']):.2f} s (median of 5)")
    if args.setup_only:
        return
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp)
        write_corpus(corpus)
        local = ["data=local", f"data.path={corpus}", "logger=csv"]
        _, _, train_rate = timed_train(["logger=csv", "train.max_steps=30", "eval.every=1000", "eval.diag_every=0"])
        print(f"training, tiny preset: {train_rate:,.0f} tokens/s (median over 30 steps)")
        for name, overrides in (("sample (in memory)", []), ("local parquet (streamed)", local)):
            rate = loader_tokens_per_second(overrides, 200)
            print(f"loader alone, {name}: {rate:,.0f} tokens/s = {rate / train_rate:,.0f}x training")
        for steps in (args.steps, 4 * args.steps):
            wall, rss, _ = timed_train([*local, f"train.max_steps={steps}", "eval.every=1000", "eval.diag_every=0"])
            print(f"streamed run, {steps} steps: peak RSS {rss} MB, wall {wall:.0f} s")


if __name__ == "__main__":
    main()
