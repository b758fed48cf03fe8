"""Streamed-data readers at R = 1, 2, 4, 8 simulated ranks: the work each reader does and its rate,
against what one GPU consumes at d12 and d24.

    python bench/data_readers.py [--shards 4] [--ranks 1 2 4 8]

The corpus is written in ClimbMix's layout (shard_XXXXX.parquet, one `text` column, row groups of
1,024 documents, zstd level 3, as nanochat's dev/repackage_data_reference.py writes them) from the
embedded corpus: its training chapters drawn at random to fill the shards (a 16,384-token BPE: the
KJV has too few distinct words for the presets' 32,768). For each R, reader 0 of R (rank 0 with one
DataLoader worker, so R readers) reads one epoch of its share through `StreamedRows.epoch_rows`,
the code a training run uses, with the tokenizer's threads set as a worker's (this process's CPUs).
Reported: documents and tokens per reader (its work), wall seconds (median of --repeats epochs) and
tokens/s per reader; one GPU consumes 0.4 x 989e12 / FLOPs-per-token tokens/s (40% MFU of an
H100/H200's dense bf16 peak; FLOPs per token from GPT.flops_per_token).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from hydra import compose, initialize_config_dir

from xsa_exp.cluster import available_cpus, peak_flops
from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
from xsa_exp.data.corpus import load_sample_corpus
from xsa_exp.data.datamodule import TextDataModule
from xsa_exp.data.sources import read_documents
from xsa_exp.model import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[1]
ROW_GROUP = 1024  # documents per row group in ClimbMix's shards
DOCS_PER_SHARD = 8 * ROW_GROUP
MFU = 0.4


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def write_climbmix_layout(folder: Path, train_shards: int) -> None:
    """train_shards training shards and one validation shard of KJV chapters in ClimbMix's file layout."""
    chapters = load_sample_corpus()["train"]
    rng = random.Random(0)
    for shard in range(train_shards + 1):
        texts = [rng.choice(chapters) for _ in range(DOCS_PER_SHARD)]
        pq.write_table(pa.table({"text": texts}), folder / f"shard_{shard:05d}.parquet", row_group_size=ROW_GROUP,
                       use_dictionary=False, compression="zstd", compression_level=3, write_statistics=False)


def gpu_tokens_per_second(depth: str) -> float:
    cfg = compose_cfg([f"depth={depth}", "data=climbmix", "data.local_dir=/"])
    with torch.device("meta"):
        model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    return MFU * peak_flops("NVIDIA H200") / model.flops_per_token()


def one_reader(data: TextDataModule, ranks: int, repeats: int) -> dict:
    """Reader 0 of `ranks`: one epoch of its share, timed `repeats` times (median); its documents counted untimed."""
    rows = data.train_rows  # its tokenizer runs as many threads as this process's CPUs, as one worker's would
    documents = sum(len(batch) for batch in read_documents(data.corpus, data.corpus.train_files, 0, ranks))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        n_rows = sum(1 for _ in rows.epoch_rows(0, 0, ranks))
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    tokens = n_rows * rows.row_len
    return {"ranks": ranks, "documents": documents, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4, help="training shards of 8 row groups each")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per R (the median is reported)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_climbmix_layout(folder, args.shards)
        cfg = compose_cfg(["depth=d12", "model.vocab_size=16384", "data=climbmix", f"data.local_dir={folder}",
                           f"data.num_shards={args.shards + 1}",
                           "data.tokenizer_chars=20000000", f"cache_dir={folder / 'cache'}"])
        data = TextDataModule(cfg.data, cfg.model.sequence_len, cfg.model.vocab_size, cfg.train.device_batch_size,
                              cfg.seed, cfg.cache_dir)
        data.prepare_data()
        data.setup()
        results = [one_reader(data, ranks, args.repeats) for ranks in args.ranks]
    gpu = {depth: gpu_tokens_per_second(depth) for depth in ("d12", "d24")}
    figures = {"date": str(date.today()), "machine": f"{platform.processor() or platform.machine()}, "
               f"{available_cpus()} CPUs", "torch": torch.__version__, "shards": args.shards, "row_group": ROW_GROUP,
               "readers": results, "gpu_tokens_per_s_at_40pct_mfu": gpu}
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))
    print(f"{'R':>3} | {'documents/reader':>16} | {'tokens/reader':>13} | {'s':>6} | {'tokens/s/reader':>15} | "
          f"{'x d12 GPU':>9} | {'x d24 GPU':>9}")
    for r in results:
        print(f"{r['ranks']:>3} | {r['documents']:>16,} | {r['tokens']:>13,} | {r['seconds']:>6.1f} | "
              f"{r['tokens_per_s']:>15,.0f} | {r['tokens_per_s'] / gpu['d12']:>9.2f} | "
              f"{r['tokens_per_s'] / gpu['d24']:>9.2f}")
    print(f"one GPU at 40% MFU consumes {gpu['d12']:,.0f} tokens/s at d12 and {gpu['d24']:,.0f} at d24")


if __name__ == "__main__":
    main()
