"""The real job's figures on a GPU: throughput, MFU and peak memory of `python train.py` at d12 and d24,
eager and compiled, and the exactness checks on the device. Part of `bash bench/gpu.sh`.

    python bench/gpu_runs.py --out gpu_runs.json            # on a CUDA machine
    python bench/gpu_runs.py --smoke --out smoke.json       # the same plumbing at tiny shapes, on any device
    python bench/gpu_runs.py --runs d12_compiled --precision bf16-mixed --fused-loss-head false   # the old setting

1. One `python train.py` per (preset, mode), one arm (alpha = 1), the study's stack (stack=nanochat_2604:
   sliding windows through FlexAttention; no lr warmup, which is longer than these runs), the presets' precision
   and loss head (trainer.precision=bf16-compute, model.fused_loss_head=true; --precision and --fused-loss-head
   set others), the preset's
   micro-batch and global batch, `--steps` updates, on a parquet corpus written here (documents of random words,
   so a 32,768-token BPE can be learned; the text does not matter for speed), a console line (a host sync) every
   4 updates.
   From each run's metrics.csv: the median train/tokens_per_sec, train/mfu and the peak
   train/peak_memory_gb over the updates after the first 4 (compilation, warm-up), the mean time of those
   first 4, the recompilations torch logs (TORCH_LOGS=recompiles) and the peak memory xsa_exp/memory.py
   predicts (its figures are bf16-mixed's with the unfused head: BENCHMARKS.md predicts the presets' settings
   apart). A run that fails (out of memory, say) is recorded with its last error line.
2. On the device: the XSA op at alpha = 0 returns y bit for bit (bf16) and a model at alpha = 0 gives
   standard attention's logits bit for bit under bf16 autocast and under bf16-compute; alpha = 1 makes z_i
   orthogonal to v_i in both (the largest |cos(z_i, v_i)| of any token, layer and head, measured on the op's own
   outputs in the model's forward); windowed attention (FlexAttention with the training forward's block mask on
   CUDA) against SDPA with the same mask (max |difference|, bf16, GQA); the fused loss head's chunks (as in the
   compiled forward) and Liger-Kernel's kernel (where installed) against the unfused head, loss and gradients from
   bf16 hidden states (the largest relative difference); greedy KV-cached generation equals full
   recomputation in fp32; and a compiled training run in the presets' precision and loss head whose updates
   between host-sync steps run under torch.cuda.set_sync_debug_mode("warn"): the synchronizing CUDA calls they
   make (0 expected).
The parts run in that order of importance (checks; compiled runs, the presets' default; eager runs; the sync
count) within --budget-s: a part that would start past it is recorded as skipped, a run is stopped at it, and
the JSON file is rewritten after every part, so a time limit keeps what finished. Prints a table for
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F
from data_loader import write_corpus  # bench/data_loader.py, beside this script: documents of random words
from hydra import compose, initialize_config_dir

from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
from xsa_exp.generate import generate
from xsa_exp.memory import predicted_peak_bytes
from xsa_exp.model import GPT, GPTConfig, XSASettings, exclusive_self_attention, gpt
from xsa_exp.model.gpt import causal_attention, window_block_mask, window_mask
from xsa_exp.model.loss_head import ChunkedLinearCrossEntropy, liger_fused_linear_cross_entropy, linear_cross_entropy
from xsa_exp.precision import prepare
from xsa_exp.training.metrics_log import HostSync

REPO = Path(__file__).resolve().parents[1]
PRESETS = ("d12", "d24")
WARMUP = 4  # updates per host sync in the throughput runs; the first WARMUP are not counted
SYNC_RUN_S = 60  # kept from the budget for the sync count's short compiled run, the last part
SMOKE = ["model.n_layer=2", "model.n_embd=128", "model.n_head=2", "model.sequence_len=128", "model.vocab_size=1024",
         "train.device_batch_size=4", "train.total_batch_tokens=1024"]


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def throughput_run(name: str, overrides: list[str], compiled: bool, workdir: Path, steps: int,
                   timeout_s: float) -> dict:
    run_dir = workdir / name
    args = [*overrides, "stack=nanochat_2604", "optim.schedule.warmup_steps=0",
            f"train.compile={str(compiled).lower()}", f"train.max_steps={steps}", "eval.every=0",
            "eval.core_every=0", "eval.diag_every=0", "logger=csv", f"log.print_every={WARMUP}", "xsa.alpha=1",
            f"hydra.run.dir={run_dir}"]
    cfg = compose_cfg([a for a in args if not a.startswith("hydra.")])
    with torch.device("meta"):
        model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    figures = {"run": name, "compiled": compiled, "device_batch_size": cfg.train.device_batch_size,
               "predicted_peak_gb": predicted_peak_bytes(model, cfg.train.device_batch_size, compiled) / 1e9}
    try:
        result = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True,
                                timeout=timeout_s, env={**os.environ, "TORCH_LOGS": "recompiles"})
    except subprocess.TimeoutExpired:
        return {**figures, "error": f"stopped at the time budget, after {timeout_s:.0f} s"}
    if result.returncode != 0:
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        return {**figures, "error": lines[-1] if lines else f"exit status {result.returncode}"}
    with open(run_dir / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["train/loss"]]
    steady = rows[WARMUP:] or rows
    tokens_per_step = cfg.train.total_batch_tokens
    tokens_per_sec = statistics.median(float(r["train/tokens_per_sec"]) for r in steady)
    mfu = statistics.median(float(r["train/mfu"]) for r in steady) if steady[0].get("train/mfu") else None
    return {**figures, "tokens_per_sec": tokens_per_sec, "mfu": mfu,
            "peak_memory_gb": max(float(r["train/peak_memory_gb"]) for r in rows),
            "first_updates_s": tokens_per_step / float(rows[0]["train/tokens_per_sec"]),
            "steady_update_s": tokens_per_step / tokens_per_sec,
            "recompiles": result.stderr.count("Recompiling function"),
            "recompile_reasons": recompile_reasons(result.stderr)}


def recompile_reasons(log: str) -> list[str]:
    """TORCH_LOGS=recompiles' lines (which function recompiled, which guard failed), without their timestamps,
    each once."""
    lines = [line.split("[__recompiles]", 1)[1].strip() for line in log.splitlines() if "[__recompiles]" in line]
    return list(dict.fromkeys(lines))[:30]


def exactness_checks(device: str, smoke: bool) -> dict:
    shape = dict(sequence_len=128, vocab_size=1024, n_layer=2, n_head=2, n_embd=128) if smoke else \
        dict(sequence_len=2048, vocab_size=32768, n_layer=4, n_head=12, n_embd=768)

    def model(precision: str = "32-true", **xsa) -> GPT:
        torch.manual_seed(0)
        m = GPT(GPTConfig(**shape, xsa=XSASettings(**xsa))).to(device)
        with torch.no_grad():  # non-zero projections, so XSA matters
            for p in m.parameters():
                p.add_(0.02 * torch.randn_like(p))
        prepare(m, precision)
        return m.eval()

    idx = torch.randint(0, shape["vocab_size"], (2, shape["sequence_len"]), device=device)
    checks = {}
    y, v = (torch.randn(2, 4, 64, 64, device=device, dtype=torch.bfloat16) for _ in range(2))
    checks["op_alpha0_returns_y_bf16"] = bool(torch.equal(exclusive_self_attention(y, v, 0.0), y))
    T = shape["sequence_len"]
    q, k, v = (torch.randn(2, heads, T, 64, device=device, dtype=torch.bfloat16) for heads in (12, 4, 4))
    window = T // 4
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(torch.arange(T, device=device), T, window),
                                           enable_gqa=True)
    block_mask = window_block_mask(T, window, q.device) if device == "cuda" else None  # the training forward's
    checks["window_attention_max_abs_diff_from_masked_sdpa_bf16"] = float(
        (causal_attention(q, k, v, window, block_mask) - dense).abs().max())
    checks.update(loss_head_differences(device, shape["n_embd"], shape["vocab_size"]))
    all_layers = list(range(shape["n_layer"]))
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        checks["alpha0_model_equals_standard_attention_bf16"] = bool(
            torch.equal(model(alpha=0.0, layers=all_layers)(idx), model(layers=[])(idx)))
        checks["alpha1_max_abs_cos_z_v_bf16"] = largest_cos_z_v(model(alpha=1.0, layers=all_layers), idx)
    with torch.no_grad():
        checks["alpha0_model_equals_standard_attention_bf16_compute"] = bool(torch.equal(
            model("bf16-compute", alpha=0.0, layers=all_layers)(idx), model("bf16-compute", layers=[])(idx)))
        checks["alpha1_max_abs_cos_z_v_bf16_compute"] = largest_cos_z_v(
            model("bf16-compute", alpha=1.0, layers=all_layers), idx)
    small = model(alpha=1.0, layers=all_layers)
    prompt = idx[0, :16].tolist()
    checks["kv_cache_greedy_equals_recomputation_fp32"] = \
        generate(small, prompt, 32, num_samples=2) == generate(small, prompt, 32, num_samples=2, use_cache=False)
    return checks


def loss_head_differences(device: str, width: int, vocab: int) -> dict:
    """The largest relative difference of loss, hidden-state and weight gradients from the unfused head's, for the
    chunked head and (installed, on CUDA) Liger-Kernel's, from bf16 hidden states and an fp32 weight."""
    torch.manual_seed(0)
    x = torch.randn(8192, width, device=device, dtype=torch.bfloat16, requires_grad=True)
    weight = (0.02 * torch.randn(vocab, width, device=device)).requires_grad_()
    targets = torch.randint(0, vocab, (8192,), device=device)
    targets[::16] = -1

    def unfused(x, weight, targets):
        logits = 15.0 * torch.tanh((x @ weight.to(x.dtype).T).float() / 15.0)
        return F.cross_entropy(logits, targets, ignore_index=-1)

    heads = {"chunked": lambda *a: ChunkedLinearCrossEntropy.apply(*a, 15.0, "mean")}
    if device == "cuda" and liger_fused_linear_cross_entropy() is not None:
        heads["liger"] = lambda *a: linear_cross_entropy(*a, 15.0)
    loss = unfused(x, weight, targets)
    reference = (loss, *torch.autograd.grad(loss, (x, weight)))
    checks = {}
    for name, head in heads.items():
        loss = head(x, weight, targets)
        ours = (loss, *torch.autograd.grad(loss, (x, weight)))
        checks[f"loss_head_{name}_max_rel_diff_bf16"] = max(
            float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(ours, reference))
    return checks


def largest_cos_z_v(model: GPT, idx: torch.Tensor) -> float:
    """The largest |cos(z_i, v_i)| over every token, layer and head of one forward, from the XSA op's own inputs
    and outputs (a mean over tokens would let errors of opposite sign cancel)."""
    worst = []

    def recorded(y, v, alpha, eps):
        z = exclusive_self_attention(y, v, alpha, eps)
        v = v.repeat_interleave(z.size(1) // v.size(1), dim=1)  # each query head's value (GQA)
        worst.append(F.cosine_similarity(z.float(), v.float(), dim=-1).abs().max().item())
        return z

    gpt.exclusive_self_attention = recorded
    try:
        model(idx)
    finally:
        gpt.exclusive_self_attention = exclusive_self_attention
    return max(worst)


def synchronizing_calls_between_host_syncs(smoke: bool, settings: list[str]) -> dict | str:
    """Synchronizing CUDA calls made by the updates that are not host-sync steps of a short compiled run, and
    the Python lines that made them, each with its count (on a machine without CUDA the same run, to test the
    plumbing, with nothing to count)."""
    import lightning as L

    from xsa_exp.training import run as training

    cuda = torch.cuda.is_available()

    class SyncDebug(L.Callback):  # last, so each window runs from one update's hooks to the end of the next one's
        sync = HostSync([WARMUP])

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            upcoming = trainer.global_step + 1
            quiet = upcoming < trainer.max_steps and not self.sync.due(upcoming, trainer.max_steps)
            if cuda:
                torch.cuda.set_sync_debug_mode("warn" if quiet else "default")

    real_build = training.build_callbacks
    training.build_callbacks = lambda *a: real_build(*a) + [SyncDebug()]
    cfg = compose_cfg(["depth=tiny", f"trainer={'gpu' if cuda else 'cpu'}", "train.compile=true",
                       *settings, "train.max_steps=12", f"log.print_every={WARMUP}",
                       "eval.every=0", "eval.diag_every=0", "logger=csv", *(SMOKE if smoke else [])])
    try:
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            training.train(cfg, Path(tmp) / "run")
    finally:
        training.build_callbacks = real_build
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    if not cuda:
        return "run completed; no CUDA, nothing to count"
    # torch's own words for a synchronizing call (its notice that sync debug mode is a prototype is not one)
    sites = collections.Counter(f"{w.filename}:{w.lineno}" for w in caught
                                if "called a synchronizing CUDA operation" in str(w.message))
    return {"count": sum(sites.values()), "sites": dict(sites)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help=f"updates per run (the first {WARMUP} are not counted)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, to test the script on any device")
    parser.add_argument("--budget-s", type=float, default=330, help="seconds for every part together")
    parser.add_argument("--out", type=Path, default=Path("gpu_runs.json"))
    runs_named = [f"{preset}_{mode}" for mode in ("compiled", "eager") for preset in PRESETS]
    parser.add_argument("--runs", nargs="*", choices=runs_named, default=runs_named,
                        help="the throughput runs, in this order (default: all; none: only the checks)")
    parser.add_argument("--precision", choices=["bf16-compute", "bf16-mixed"], default="bf16-compute",
                        help="trainer.precision of the training runs (default: the presets')")
    parser.add_argument("--fused-loss-head", choices=["true", "false"], default="true",
                        help="model.fused_loss_head of the training runs (default: the presets')")
    args = parser.parse_args()
    settings = [f"trainer.precision={args.precision}", f"model.fused_loss_head={args.fused_loss_head}"]
    started = time.monotonic()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda" and not args.smoke:
        sys.exit("bench/gpu_runs.py: no CUDA device visible to torch (use --smoke to test the script on a CPU)")
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    capacity = torch.cuda.get_device_properties(0).total_memory / 1e9 if device == "cuda" else None
    runs = []
    figures = {"date": str(date.today()), "device": name, "memory_gb": capacity, "torch": torch.__version__,
               "cuda": torch.version.cuda, "smoke": args.smoke, "budget_s": args.budget_s, "settings": settings,
               "runs": runs,
               "checks": exactness_checks(device, args.smoke)}
    args.out.write_text(json.dumps(figures, indent=1))

    def left() -> float:
        return args.budget_s - (time.monotonic() - started)

    cache = os.environ.get("XSA_EXP_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "corpus").mkdir()
        write_corpus(workdir / "corpus", files=3, docs=300 if args.smoke else 3000)  # learns a 32,768-token BPE
        os.environ["XSA_EXP_CACHE"] = str(workdir / "cache")  # one tokenizer, learned by the first run
        data = ["data=local", f"data.path={workdir / 'corpus'}", "data.tokenizer_chars=20000000"]
        for run in args.runs:  # compiled first by default: the presets' default
            preset, mode = run.split("_")
            compiled = mode == "compiled"
            if left() - SYNC_RUN_S < 30:
                runs.append({"run": run, "compiled": compiled, "skipped": "out of the time budget"})
                continue
            shape = [f"depth={preset}", *data, *settings, *(SMOKE if args.smoke else [])]
            runs.append(throughput_run(run, shape, compiled, workdir, args.steps, left() - SYNC_RUN_S))
            args.out.write_text(json.dumps(figures, indent=1))
    if cache is None:
        os.environ.pop("XSA_EXP_CACHE")
    else:
        os.environ["XSA_EXP_CACHE"] = cache
    figures["checks"]["synchronizing_cuda_calls_between_host_syncs"] = (  # its run is not bounded: start it in time
        synchronizing_calls_between_host_syncs(args.smoke, settings) if left() > SYNC_RUN_S / 2
        else "skipped: out of the time budget")
    args.out.write_text(json.dumps(figures, indent=1))
    print(f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}, {date.today()}, {' '.join(settings)}")
    print(f"| run | micro-batch | tokens/s | MFU | peak GB (predicted) | first {WARMUP} updates s/update "
          "| steady update s | recompiles |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        if "skipped" in r:
            print(f"| {r['run']} | skipped: {r['skipped']} | | | | | | |")
            continue
        if "error" in r:
            print(f"| {r['run']} | {r['device_batch_size']} | failed: {r['error'][:80]} | | "
                  f"(predicted {r['predicted_peak_gb']:.1f}) | | | |")
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        print(f"| {r['run']} | {r['device_batch_size']} | {r['tokens_per_sec']:,.0f} | {mfu} "
              f"| {r['peak_memory_gb']:.1f} ({r['predicted_peak_gb']:.1f}) | {r['first_updates_s']:.1f} "
              f"| {r['steady_update_s']:.2f} | {r['recompiles']} |")
    for r in runs:
        for reason in r.get("recompile_reasons", []):
            print(f"{r['run']}: {reason}")
    for check, value in figures["checks"].items():
        print(f"{check}: {value}")


if __name__ == "__main__":
    main()
