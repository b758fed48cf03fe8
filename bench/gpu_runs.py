"""The real job's figures on a GPU, each with what explains it: throughput, MFU, peak memory, compilation and where
the time goes in training at d12 and d24; the exactness checks on the device; the synchronizing CUDA calls of the
study's path. Part of `bash bench/gpu.sh`.

    python bench/gpu_runs.py --out gpu_runs.json            # on a CUDA machine: about 6 minutes (below)
    python bench/gpu_runs.py --smoke --out smoke.json       # the same plumbing at tiny shapes, on any device
                                                            # (compiled by Dynamo with aot_eager, not Inductor)
    python bench/gpu_runs.py --runs d12_compiled d12_eager  # eager runs only when asked for
    python bench/gpu_runs.py --runs d12_compiled --precision bf16-mixed --fused-loss-head false   # the old setting

The parts, in order, within --budget-s (JSON keys in quotes; gpu_runs.json is rewritten after every part):
1. "checks", in this process: the XSA op at alpha = 0 returns y bit for bit (bf16) and a model at alpha = 0 gives
   standard attention's logits bit for bit under bf16 autocast and under bf16-compute; alpha = 1 makes z_i
   orthogonal to v_i in both (the largest |cos(z_i, v_i)| of any token, layer and head, measured on the op's own
   outputs in the model's forward); windowed attention (FlexAttention with the training forward's block mask on
   CUDA) against SDPA with the same mask (max |difference|, bf16, GQA); the fused loss head's chunks (as in the
   compiled forward) and Liger-Kernel's kernel (where installed) against the unfused head, loss and gradients from
   bf16 hidden states (the largest relative difference); greedy KV-cached generation equals full recomputation in fp32.
2. "runs": one child process per run (`--child`), which composes the run's config as train.py does and calls
   xsa_exp.training.run.train itself, with a measuring callback after training's own (the final checkpoint, which
   no figure needs, is not written). The study's path: stack=nanochat_2604 (sliding windows through FlexAttention's
   block masks on CUDA; no lr warmup, which is longer than these runs), alpha = 1, the presets' precision and loss
   head (trainer.precision=bf16-compute, model.fused_loss_head=true; --precision and --fused-loss-head set others),
   the preset's micro-batch, a console line (a host sync) every 10 updates as in the study, and a parquet corpus
   written here and streamed by data=local's loader and its worker, packed as the presets' ClimbMix is
   (data.packing=bestfit; documents of random words, so that a 32,768-token BPE can be learned; the text does not
   matter for speed). Each run takes 2 warm-up updates (the
   first compiles the forward and Muon's step), 20 steady updates at d12 and 10 at d24, then 2 profiled updates:
   - warm-up: "start_s" (process start to the first update), "warmup_update_s" (each, synchronized), and
     "warmup_peak_gb"; then the device's peak memory is reset.
   - steady: "tokens_per_sec", "mfu" and "steady_update_s" over the steady updates on one clock synchronized at both
     ends (the host syncs every 10 updates fall inside, as in a real run), and "steady_peak_gb", beside
     "predicted_peak_gb" (xsa_exp/memory.py, for the run's precision, mode and loss head).
   - "compile", from torch._dynamo's own counters and recompile log: "unique_graphs", "graph_breaks" and
     "recompiles" (with "recompiles_after_first_update") and their reasons. Targets: 0 breaks, 0 recompiles after
     update 1.
   - "profile", torch.profiler over the 2 last updates: time per kernel family (matmul, attention, elementwise,
     reduction/norm, optimizer: every kernel launched from the optimizer step, grad norm included; communication,
     memcpy/memset, other) as ms per update and share of kernel time, and the GPU's idle fraction (1 - the union of
     its kernels' busy intervals / the window's wall time). On a CPU (--smoke) the leaf CPU operators stand in.
   d12 runs its preset's batch (524,288 tokens: 8 micro-batches of 32 x 2048). d24 runs half its preset's
   (524,288 of 1,048,576 tokens: 16 micro-batches of 16 x 2048; "batch_note"): its 10 steady updates at the real batch
   (about 7.5 s each on an H200) would take twice as long, 75 s, which the budget has not. The micro-batches are the
   preset's, so tokens/s and MFU differ from the real batch's only by the optimizer step's share, which halves there.
   A run that fails (out of memory, say) is recorded with its last log line, and the end of its log is printed.
3. "sync_check" (measured before the runs), a child on the study's real path at a reduced size that still has
   windows (d12 with 4 layers, sequence 2048, 2 micro-batches of 4 per update, compiled, bf16-compute, the fused loss
   head, the streamed corpus, 12 updates with a console line every 4): the synchronizing CUDA calls made by the
   updates after the warm-up that are not host-sync steps, under torch.cuda.set_sync_debug_mode("warn"), with the
   lines that made them (0 expected).
   Under --smoke on a CPU it runs eager: there is nothing to count without CUDA.
--smoke times 3 steady updates, not 20, of a model 64 wide on 64-token sequences: it tests the plumbing, not a rate,
and on a CPU without native bf16 its bf16 matmuls are generic loops (a d12 update 0.21 s on the Zen 5 EPYC held
to AVX2; BENCHMARKS.md).

Budget (--budget-s; bench/gpu.sh gives it the time its other parts are not expected to need): each part is
expected to take, on one H100/H200, from the H200's figures in BENCHMARKS.md ("GPU figures", taken before the
one-graph forward, bf16-compute and the fused loss head, which should all shorten it): the checks with the corpus
40 s; a compiled run START_S + COMPILE_S + (2 + steady + 2 x 1.5) updates x UPDATE_S (d12 106 s, d24 128 s); the
sync check 60 s; about 334 s in all. The sync check runs first, with 90 s at most; then each run may use whatever is
left but 60 s for each run after it; a part with under 60 s is recorded as skipped, one that fails records its error
and the next part runs; a child stopped at its limit, or by bench/gpu.sh's
(SIGTERM), keeps what it had written, and after bench/gpu.sh's no part starts. A check that fails records its error.
A sync check that fails on the study's path ("error") sends the runs to the path that ran on 2026-12-04
(trainer.precision=bf16-mixed, model.fused_loss_head=false, optim.muon.compile=false; "fallback" says so), which
would otherwise fail alike.
Prints a table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import functools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import date
from pathlib import Path
from typing import NamedTuple

import lightning as L
import torch
import torch.nn.functional as F
from data_loader import write_corpus  # bench/data_loader.py, beside this script: documents of random words
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from xsa_exp.cluster import device_peak_flops, synchronized_time
from xsa_exp.config.arithmetic import batch_tokens
from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
from xsa_exp.generate import generate
from xsa_exp.memory import predicted_peak_bytes
from xsa_exp.model import GPT, GPTConfig, XSASettings, exclusive_self_attention, gpt
from xsa_exp.model.gpt import causal_attention, window_block_mask, window_mask
from xsa_exp.model.loss_head import ChunkedLinearCrossEntropy, liger_fused_linear_cross_entropy, linear_cross_entropy
from xsa_exp.precision import prepare
from xsa_exp.training.metrics_log import UpdateClock

REPO = Path(__file__).resolve().parents[1]
PRESETS = ("d12", "d24")
WARMUP, PROFILED = 2, 2  # updates of a throughput run before the timed ones (compile, warm-up) and after them
STEADY = {"d12": 20, "d24": 10}  # the timed updates: d24's 10 fit bench/gpu.sh's budget after the XSA overhead
SMOKE_STEADY = 3
BATCH_DIVISOR = {"d24": 2}  # d24 measured at half its batch: the module docstring says why
# Expected seconds on one H100/H200 (module docstring), from the H200's figures of 2026-12-04 in BENCHMARKS.md.
UPDATE_S = {"d12": 1.55, "d24": 3.74}  # a steady update of 524,288 tokens
COMPILE_S = {"d12": 47, "d24": 42}     # the first 4 updates took 13.3 and 14.3 s each: that less 4 steady updates
START_S = {"d12": 20, "d24": 30}       # the runs' 76 and 105 s less their 6 updates, and at d24 less about 10 s of
                                       # final checkpoint (8 GB) that the child does not write
PROFILED_SLOWDOWN = 1.5  # a profiled update, with its share of the summary, over a steady one (a guess)
SYNC_S = 60              # the tiny preset's sync-count run took 50 s; the windows add FlexAttention's kernels (a guess)
# The runs' settings after a failed sync check: the path that ran on 2026-12-04 (autocast, the unfused head, Muon eager)
FALLBACK_SETTINGS = ["trainer.precision=bf16-mixed", "model.fused_loss_head=false", "optim.muon.compile=false"]
MIN_PART_S = 60          # a run or the sync check is not started with less: its compilation alone takes about that
SMOKE = ["model.n_layer=2", "model.n_embd=64", "model.n_head=2", "model.sequence_len=64", "model.vocab_size=1024",
         "train.device_batch_size=4", "train.total_batch_tokens=1024"]
# The sync check's run: the study's path at a size that compiles fast and still has windows (3 of its 4 layers).
SYNC_RUN = ["depth=d12", "model.n_layer=4", "train.device_batch_size=4", "train.total_batch_tokens=16384",
            "train.compile=true", "train.max_steps=12", "log.print_every=4"]
# --smoke's compiled runs: Dynamo's graph capture, so graph breaks and recompiles are counted as on a GPU, without
# Inductor's C++ compilation (half a minute a run on 2 CPU cores); tests/test_training.py compiles with Inductor.
SMOKE_BACKEND = "aot_eager"
OPTIMIZER_MARK = "gpu_runs: optimizer step"  # the profiler's range from on_before_optimizer_step to the update's end
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # the profiler's GPU activities that keep the device busy
LAUNCHES = ("cuda_runtime", "cuda_driver")  # the host calls that queue them (triton launches through the driver)
# Kernel families by name (lowercase, the first that matches); CPU operators' names under --smoke.
FAMILIES = (
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_scatter"),
    ("memcpy/memset", r"memcpy|memset"),
    ("attention", r"attention|flex|flash|fmha|sdpa"),
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|matmul|(^|[_:])(b|add|baddb)?mm($|_)"),
    ("optimizer", r"multi_tensor_apply|adam|foreach"),
    ("reduction/norm", r"triton_(red|per)_|reduce|norm|softmax|cross_entropy|(^|[_:])(sum|mean|amax)($|_)"),
    ("elementwise", r"triton_poi_|elementwise|(^|[_:])(add|mul|sub|div|copy|fill|zero)_?($|_)"),
)


def compose_cfg(overrides: list[str]) -> DictConfig:
    """A run's config as train.py hands it to training: Hydra's record of the run set, the group choices
    (depth_name, ...) resolved, the hydra node dropped (as tests/conftest.py's compose_config)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(copy.deepcopy(cfg))  # set_config makes the node it keeps read-only
    with open_dict(cfg):
        for name in ("depth_name", "stack_name", "stage_name"):
            cfg[name] = cfg[name]
        del cfg["hydra"]
    return cfg


def estimated_s(preset: str) -> float:
    """A compiled run's expected wall time on one H100/H200: start, compilation, then each update at the steady rate."""
    updates = WARMUP + STEADY[preset] + PROFILED * PROFILED_SLOWDOWN
    return round(START_S[preset] + COMPILE_S[preset] + updates * UPDATE_S[preset])


# ---- the parent: plans each child, runs it within its limit, keeps what it wrote

def throughput_run(name: str, common: list[str], smoke: bool, workdir: Path, env: dict, limit_s: float) -> dict:
    preset, mode = name.split("_")
    compiled = mode == "compiled"
    steady = SMOKE_STEADY if smoke else STEADY[preset]
    overrides = [f"depth={preset}", *common, f"train.compile={str(compiled).lower()}",
                 f"train.max_steps={WARMUP + steady + PROFILED}", *(SMOKE if smoke else [])]
    cfg = compose_cfg(overrides)
    preset_batch = batch_tokens(cfg)
    batch = preset_batch // BATCH_DIVISOR.get(preset, 1)
    micro_batches = batch // (cfg.train.device_batch_size * cfg.model.sequence_len)
    with torch.device("meta"):
        model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    prepare(model, cfg.trainer.precision)  # the state's dtypes count in the prediction
    predicted = predicted_peak_bytes(model, cfg.train.device_batch_size, cfg.trainer.precision, compiled,
                                     cfg.optim.matrix_algorithm == "muon")
    figures = {"run": name, "compiled": compiled, "device_batch_size": cfg.train.device_batch_size,
               "micro_batches": micro_batches, "batch_tokens": batch, "preset_batch_tokens": preset_batch,
               "predicted_peak_gb": predicted and predicted / 1e9,
               "warmup_updates": WARMUP, "steady_updates": steady, "profiled_updates": PROFILED,
               "estimated_s": estimated_s(preset) if compiled and not smoke else None, "limit_s": round(limit_s)}
    if batch != preset_batch:
        overrides.append(f"train.total_batch_tokens={batch}")
        figures["batch_note"] = (
            f"measured at {batch:,} tokens per update ({micro_batches} micro-batches), 1/{BATCH_DIVISOR[preset]} of "
            f"the preset's {preset_batch:,}: {steady} steady updates of the real batch would not fit bench/gpu.sh's "
            "budget; the micro-batches are the preset's, so tokens/s and MFU differ from the real batch's only by "
            "the optimizer step's share, which is smaller there")
    spec = {"kind": "throughput", "overrides": overrides, "steady": steady,
            "compile_backend": SMOKE_BACKEND if smoke else None}
    return {**figures, **run_child(name, spec, workdir, env, limit_s)}


def sync_check(common: list[str], smoke: bool, workdir: Path, env: dict, limit_s: float) -> dict:
    # Without CUDA there is nothing to count, so --smoke runs the check's plumbing eager: a third compilation would
    # add about a minute on a 2-core CPU and test nothing the compiled runs before it do not.
    overrides = [*common, *SYNC_RUN, *([*SMOKE, "train.compile=false"] if smoke else [])]
    cfg = compose_cfg(overrides)
    run = (f"depth=d12 n_layer={cfg.model.n_layer} n_embd={cfg.model.n_embd}, sequence {cfg.model.sequence_len}, "
           f"{batch_tokens(cfg) // (cfg.train.device_batch_size * cfg.model.sequence_len)} micro-batches of "
           f"{cfg.train.device_batch_size}, windows {cfg.model.window_pattern}, "
           f"{'compiled' if cfg.train.compile else 'eager'}, {cfg.trainer.precision}, "
           f"fused loss head {cfg.model.fused_loss_head}, data=local streamed ({cfg.data.num_workers} worker, "
           f"{cfg.data.packing} packing), "
           f"{cfg.train.max_steps} updates, a host sync every {cfg.log.print_every}")
    return {"run": run, "limit_s": round(limit_s),
            **run_child("sync_check", {"kind": "sync", "overrides": overrides}, workdir, env, limit_s)}


BY_GPU_SH = "at bench/gpu.sh's limit"  # a part's "stopped", where bench/gpu.sh's SIGTERM stopped it


class Stopped(BaseException):
    """bench/gpu.sh's time limit (SIGTERM): the child in progress is stopped, keeping what it wrote, and no part
    starts after it; the report is still written and printed. Not an Exception: a check's error handling must not
    take it for the check's failure."""


def stop(*_) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the report is written and printed after it
    raise Stopped


def run_child(name: str, spec: dict, workdir: Path, env: dict, limit_s: float) -> dict:
    """Runs one child (in its own process group, so that stopping it stops its data worker and compile workers too)
    to its end or to limit_s; returns what it wrote, its wall time, and why it stopped short if it did."""
    result, log = workdir / f"{name}.json", workdir / f"{name}.log"
    spec = {**spec, "result": str(result), "run_dir": str(workdir / name), "spawned": time.time()}
    started = time.monotonic()
    with open(log, "w") as out:
        child = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], cwd=REPO, env=env,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        stopped = None
        try:
            status = child.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            status, stopped = None, f"at its limit of {limit_s:.0f} s"
        except Stopped:
            status, stopped = None, BY_GPU_SH
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    figures = json.loads(result.read_text()) if result.exists() else {}
    figures["wall_s"] = round(time.monotonic() - started, 1)
    if stopped:
        figures["stopped"] = stopped
    elif status != 0:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        figures["error"] = lines[-1] if lines else f"exit status {status}"
        print(f"bench/gpu_runs.py: {name} failed; the end of its log:", *lines[-25:], sep="\n", file=sys.stderr)
    return figures


# ---- the child: training's own run, measured by a callback after training's callbacks

def child(spec: dict) -> None:
    from xsa_exp.training import run as training

    if spec.get("compile_backend"):  # every torch.compile of the run, training's own included
        torch.compile = functools.partial(torch.compile, backend=spec["compile_backend"])
    cfg = compose_cfg(spec["overrides"])
    result = Path(spec["result"])
    compile_log = CompileLog()
    measure = (Measure(cfg, result, spec["spawned"], compile_log, spec["steady"]) if spec["kind"] == "throughput"
               else SyncDebug())
    build_callbacks, build_trainer = training.build_callbacks, training.build_trainer
    training.build_callbacks = lambda *args: [*build_callbacks(*args), measure]
    training.build_trainer = lambda *args: without_final_checkpoint(build_trainer(*args))
    if spec["kind"] == "throughput":
        training.train(cfg, Path(spec["run_dir"]))
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        training.train(cfg, Path(spec["run_dir"]))
    write_json(result, {**measure.counted(caught), "compile": compile_counts(compile_log)})


def without_final_checkpoint(trainer: L.Trainer) -> L.Trainer:
    trainer.save_checkpoint = lambda *args, **kwargs: None  # 3-8 GB at d12-d24 that no figure needs: 5-10 s
    return trainer


def write_json(path: Path, figures: dict) -> None:
    """Whole or not at all: the parent may read it after stopping this process mid-write."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(figures, indent=1))
    partial.replace(path)


class CompileLog(logging.Handler):
    """Dynamo's recompile messages (TORCH_LOGS=recompiles: which function, which guard failed), each with the update
    that was running."""

    def __init__(self):
        super().__init__()
        self.update = 0
        self.recompiles: list[tuple[int, str]] = []
        torch._logging.set_logs(recompiles=True)
        torch._logging.getArtifactLogger("torch._dynamo.guards", "recompiles").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.recompiles.append((self.update, " ".join(record.getMessage().split())))


def compile_counts(log: CompileLog) -> dict:
    counters = torch._dynamo.utils.counters
    breaks = counters["graph_break"]
    return {"unique_graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(breaks.values()),
            "graph_break_reasons": [reason.splitlines()[0][:300] for reason in breaks],
            "recompiles": len(log.recompiles),
            "recompiles_after_first_update": sum(update > 1 for update, _ in log.recompiles),
            "recompile_reasons": list(dict.fromkeys(f"update {u}: {m[:400]}" for u, m in log.recompiles))[:20]}


def peak_gb(device: torch.device) -> float:
    """CUDA: the most memory tensors held since the last reset; CPU: the peak resident set since the last."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) * 1024 / 1e9


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident set (VmHWM) back to the current one


class Measure(L.Callback):
    """Last among training's callbacks (after the update clock): times each warm-up update, keeps the warm-up's peak
    memory and resets it; times the steady updates on one clock and keeps their peak; profiles the last updates.
    Writes what it has after each phase, so a run stopped at its limit keeps it."""

    def __init__(self, cfg: DictConfig, result: Path, spawned: float, compile_log: CompileLog, steady: int):
        self.tokens, self.configured_peak_flops, self.steady = batch_tokens(cfg), cfg.train.peak_flops, steady
        self.result, self.spawned, self.compile_log = result, spawned, compile_log
        self.figures: dict = {}
        self.last_step, self.clock = 0, 0.0
        self.profiler: torch.profiler.profile | None = None
        self.mark: torch.profiler.record_function | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.device = pl_module.device
        self.flops = pl_module.model.flops_per_token()
        self.peak_flops = device_peak_flops(self.device, self.configured_peak_flops)
        self.figures.update(start_s=round(time.time() - self.spawned, 1), warmup_update_s=[])
        self.clock = synchronized_time(self.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.compile_log.update = trainer.global_step + 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        # Lightning runs the last micro-batch's forward and backward inside optimizer.step (its closure): the
        # optimizer's own work is what the host queues from this hook (after the closure) to the update's end.
        if self.profiler is not None:
            self.mark = torch.profiler.record_function(OPTIMIZER_MARK)
            self.mark.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self.last_step:
            return  # mid-accumulation
        self.last_step = step
        if self.mark is not None:
            self.mark.__exit__(None, None, None)
            self.mark = None
        if step <= WARMUP:
            self.end_warmup_update(step)
        elif step == WARMUP + self.steady:
            self.end_steady()
        elif step == WARMUP + self.steady + PROFILED:
            self.end_profiled()

    def end_warmup_update(self, step: int) -> None:
        self.figures["warmup_update_s"].append(round(synchronized_time(self.device) - self.clock, 3))
        if step == WARMUP:
            self.figures["warmup_peak_gb"] = peak_gb(self.device)
            reset_peak(self.device)
            self.write()
        self.clock = synchronized_time(self.device)

    def end_steady(self) -> None:
        seconds = synchronized_time(self.device) - self.clock
        rate = self.steady * self.tokens / seconds
        self.figures.update(tokens_per_sec=rate, steady_update_s=seconds / self.steady,
                            steady_peak_gb=peak_gb(self.device),
                            mfu=rate * self.flops / self.peak_flops if self.peak_flops else None)
        self.write()
        cuda = self.device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        self.profiler = torch.profiler.profile(activities=activities)
        self.profiler.start()
        self.clock = synchronized_time(self.device)

    def end_profiled(self) -> None:
        window_s = synchronized_time(self.device) - self.clock
        self.profiler.stop()
        trace = self.result.with_name(f"{self.result.stem}.trace.json")
        self.profiler.export_chrome_trace(str(trace))
        self.figures["profile"] = profile_summary(trace_events(trace), PROFILED, window_s, self.device.type == "cuda")
        self.write()

    def write(self) -> None:
        write_json(self.result, {**self.figures, "compile": compile_counts(self.compile_log)})


class SyncDebug(L.Callback):
    """Last among training's callbacks: from the end of one update's hooks to the end of the next one's, CUDA's sync
    debug mode warns of every synchronizing call when that next update is past the warm-up and not a host-sync step
    (training's own HostSync, from its update clock)."""

    def __init__(self):
        self.checked: list[int] = []

    def on_train_start(self, trainer, pl_module) -> None:
        self.sync = next(c.sync for c in trainer.callbacks if isinstance(c, UpdateClock))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        upcoming = trainer.global_step + 1
        quiet = WARMUP < upcoming < trainer.max_steps and not self.sync.due(upcoming, trainer.max_steps)
        if quiet and upcoming not in self.checked:
            self.checked.append(upcoming)
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("warn" if quiet else "default")

    def counted(self, caught: list[warnings.WarningMessage]) -> dict:
        if not torch.cuda.is_available():
            return {"updates_checked": self.checked, "count": None,
                    "note": "no CUDA: the run completed, nothing to count"}
        # torch's own words for a synchronizing call (its notice that sync debug mode is a prototype is not one)
        sites = collections.Counter(f"{w.filename}:{w.lineno}" for w in caught
                                    if "called a synchronizing CUDA operation" in str(w.message))
        return {"updates_checked": self.checked, "count": sum(sites.values()), "sites": dict(sites)}


# ---- the profiler's summary

class TraceEvent(NamedTuple):
    name: str
    activity: str  # the trace's category: kernel, gpu_memcpy, cuda_runtime, cpu_op, user_annotation, ...
    start_ns: int
    end_ns: int
    correlation: int  # a kernel's and its launch's, shared
    thread: int | str


def trace_events(path: Path) -> list[TraceEvent]:
    """The profiler's events from its Chrome trace, which every torch version writes (its raw events' activity_type()
    is torch 2.12's; the GPU machine's image has 2.11)."""
    return [TraceEvent(e["name"], e.get("cat", ""), round(e["ts"] * 1e3), round((e["ts"] + e.get("dur", 0)) * 1e3),
                       e.get("args", {}).get("correlation", -1), e.get("tid", 0))
            for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def profile_summary(events: list[TraceEvent], updates: int, window_s: float, cuda: bool) -> dict:
    """Kernel time by family per update, its share, and the device's idle fraction over the window."""
    # the host's range (the profiler adds a device-side twin, gpu_user_annotation, that the launches do not follow)
    marks = [(e.start_ns, e.end_ns) for e in events if e.name == OPTIMIZER_MARK and e.activity == "user_annotation"]
    work = device_work(events, cuda)
    families, others = collections.Counter(), collections.Counter()
    for name, start, end, launched in work:
        kind = family(name)
        if kind != "communication" and any(a <= launched <= b for a, b in marks):
            kind = "optimizer"
        families[kind] += end - start
        if kind == "other":
            others[name] += end - start
    total, busy = sum(families.values()) or 1, busy_ns((start, end) for _, start, end, _ in work)

    def ms(ns: float) -> float:
        return round(ns / 1e6 / updates, 2)

    return {"activity": "CUDA kernels, copies and fills" if cuda else "leaf CPU operators (no GPU: plumbing only)",
            "updates": updates, "kernels_per_update": len(work) // updates,
            "window_ms_per_update": round(window_s * 1e3 / updates, 1), "busy_ms_per_update": ms(busy),
            "idle_fraction": round(1 - busy / 1e9 / window_s, 4),
            "families": {kind: {"ms_per_update": ms(ns), "share": round(ns / total, 4)}
                         for kind, ns in families.most_common()},
            "other_top": {name[:100]: ms(ns) for name, ns in others.most_common(3)}}


def device_work(events: list[TraceEvent], cuda: bool) -> list[tuple[str, int, int, int]]:
    """(name, start, end, queued at) in ns of each GPU kernel, copy and fill, with the host time of its launch; on a
    CPU, of each leaf operator (one that calls no other), queued when it starts."""
    if cuda:
        launched = {e.correlation: e.start_ns for e in events if e.activity in LAUNCHES}
        return [(e.name, e.start_ns, e.end_ns, launched.get(e.correlation, -1))
                for e in events if e.activity in DEVICE_WORK]
    ops = sorted((str(e.thread), e.start_ns, -e.end_ns, e.name) for e in events if e.activity == "cpu_op")
    # sorted by thread, start, then the longest first: an operator's first callee, if any, comes right after it
    return [(name, start, -neg_end, start) for (thread, start, neg_end, name), after in zip(ops, [*ops[1:], None])
            if after is None or after[0] != thread or after[1] >= -neg_end]


def family(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, pattern in FAMILIES if re.search(pattern, lowered)), "other")


def busy_ns(intervals) -> int:
    """The length of the union of (start, end) intervals."""
    total, reach = 0, 0
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


# ---- the checks, in this process

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
    all_layers = list(range(shape["n_layer"]))
    T = shape["sequence_len"]
    window = T // 4

    def op_alpha0():
        y, v = (torch.randn(2, 4, 64, 64, device=device, dtype=torch.bfloat16) for _ in range(2))
        return {"op_alpha0_returns_y_bf16": bool(torch.equal(exclusive_self_attention(y, v, 0.0), y))}

    def windows():
        q, k, v = (torch.randn(2, heads, T, 64, device=device, dtype=torch.bfloat16) for heads in (12, 4, 4))
        dense = F.scaled_dot_product_attention(q, k, v, enable_gqa=True,
                                               attn_mask=window_mask(torch.arange(T, device=device), T, window))
        block_mask = window_block_mask(T, window, q.device) if device == "cuda" else None  # the training forward's
        return {"window_attention_max_abs_diff_from_masked_sdpa_bf16":
                float((causal_attention(q, k, v, window, block_mask) - dense).abs().max())}

    def under_autocast():
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            return {"alpha0_model_equals_standard_attention_bf16": bool(
                        torch.equal(model(alpha=0.0, layers=all_layers)(idx), model(layers=[])(idx))),
                    "alpha1_max_abs_cos_z_v_bf16": largest_cos_z_v(model(alpha=1.0, layers=all_layers), idx)}

    def in_bf16_compute():
        with torch.no_grad():
            xsa0, standard = model("bf16-compute", alpha=0.0, layers=all_layers), model("bf16-compute", layers=[])
            return {"alpha0_model_equals_standard_attention_bf16_compute": bool(torch.equal(xsa0(idx), standard(idx))),
                    "alpha1_max_abs_cos_z_v_bf16_compute": largest_cos_z_v(
                        model("bf16-compute", alpha=1.0, layers=all_layers), idx)}

    def kv_cache():
        small, prompt = model(alpha=1.0, layers=all_layers), idx[0, :16].tolist()
        cached, recomputed = (generate(small, prompt, 32, num_samples=2, use_cache=c) for c in (True, False))
        return {"kv_cache_greedy_equals_recomputation_fp32": cached == recomputed}

    def loss_head():
        return loss_head_differences(device, shape["n_embd"], shape["vocab_size"])

    checks = {}
    for check in (op_alpha0, windows, loss_head, under_autocast, in_bf16_compute, kv_cache):
        try:  # one check that fails (a kernel this torch lacks) loses no other figure
            checks.update(check())
        except Exception as e:
            checks[f"{check.__name__}_error"] = error_line(e)
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



# ---- the report

def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_row(r: dict) -> str:
    if "micro_batches" not in r:  # skipped, or failed before it started
        outcome = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r['error']}"
        return f"| {r['run']} | {outcome} |" + " |" * 10
    c, p = r.get("compile", {}), r.get("profile", {})
    steady = "tokens_per_sec" in r
    cells = [r["run"], f"{r['micro_batches']} x {r['device_batch_size']}", f"{r['batch_tokens']:,}",
             r["steady_updates"] if steady else 0, fmt(r.get("tokens_per_sec"), ",.0f"), fmt(r.get("mfu"), ".1%"),
             f"{fmt(r.get('warmup_peak_gb'), '.1f')} / {fmt(r.get('steady_peak_gb'), '.1f')} "
             f"({fmt(r['predicted_peak_gb'], '.1f')})",
             " + ".join(f"{s:.1f}" for s in r.get("warmup_update_s", [])) or "-", fmt(r.get("steady_update_s"), ".2f"),
             fmt(c.get("graph_breaks"), "d"), f"{fmt(c.get('recompiles_after_first_update'), 'd')} "
             f"({fmt(c.get('recompiles'), 'd')})", fmt(p.get("idle_fraction"), ".1%")]
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def profile_line(run: str, p: dict) -> str:
    parts = ", ".join(f"{kind} {v['ms_per_update']:,.1f} ms ({v['share']:.0%})" for kind, v in p["families"].items())
    return (f"{run} profile, {p['updates']} updates of {p['window_ms_per_update']:,.0f} ms, {p['activity']}: busy "
            f"{p['busy_ms_per_update']:,.0f} ms per update ({p['kernels_per_update']:,} of them), idle "
            f"{p['idle_fraction']:.1%}: {parts}")


def print_report(figures: dict) -> None:
    print(f"{figures['device']}, torch {figures['torch']}, CUDA {figures['cuda']}, {figures['date']}, "
          f"{' '.join(figures['settings'])}")
    print("| run | micro-batches x size | tokens/update | steady updates | tokens/s | MFU "
          "| peak GB warm-up / steady (predicted) | warm-up s per update | steady s/update | graph breaks "
          "| recompiles after update 1 (all) | GPU idle |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in figures["runs"]:
        print(table_row(r))
    for r in figures["runs"]:
        c = r.get("compile", {})
        notes = [r.get("batch_note"), r.get("stopped") and f"stopped {r['stopped']}", r.get("error"),
                 *c.get("graph_break_reasons", []), *c.get("recompile_reasons", [])]
        for note in filter(None, notes):
            print(f"{r['run']}: {note}")
        if "profile" in r:
            print(profile_line(r["run"], r["profile"]))
    s = figures.get("sync_check")
    if s is None:
        print("sync check: not started (stopped before it)")
    else:
        outcome = s.get("skipped") or s.get("error") or s.get("stopped") or s.get("note") or \
            f"{s.get('count')} synchronizing CUDA calls {s.get('sites', {})}"
        print(f"sync check ({s.get('run')}), updates {s.get('updates_checked')}: {outcome}")
    for check, value in figures["checks"].items():
        print(f"{check}: {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, to test the script on any device")
    parser.add_argument("--budget-s", type=float, default=380, help="seconds for every part together")
    parser.add_argument("--out", type=Path, default=Path("gpu_runs.json"))
    runs_named = [f"{preset}_{mode}" for mode in ("compiled", "eager") for preset in PRESETS]
    parser.add_argument("--runs", nargs="*", choices=runs_named, default=runs_named[:2],
                        help="the throughput runs, in this order (default: the compiled ones; none: no runs)")
    parser.add_argument("--precision", choices=["bf16-compute", "bf16-mixed"], default="bf16-compute",
                        help="trainer.precision of the training runs (default: the presets')")
    parser.add_argument("--fused-loss-head", choices=["true", "false"], default="true",
                        help="model.fused_loss_head of the training runs (default: the presets')")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    signal.signal(signal.SIGTERM, stop)
    started = time.monotonic()
    settings = [f"trainer.precision={args.precision}", f"model.fused_loss_head={args.fused_loss_head}"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda" and not args.smoke:
        sys.exit("bench/gpu_runs.py: no CUDA device visible to torch (use --smoke to test the script on a CPU)")
    figures = {"date": str(date.today()), "device": torch.cuda.get_device_name() if device == "cuda" else "CPU",
               "memory_gb": torch.cuda.get_device_properties(0).total_memory / 1e9 if device == "cuda" else None,
               "torch": torch.__version__, "cuda": torch.version.cuda, "smoke": args.smoke,
               "budget_s": args.budget_s, "settings": settings, "runs": [], "checks": {}}
    try:
        measure_all(args, figures, device, started)
    except Stopped:
        figures["stopped"] = BY_GPU_SH
    args.out.write_text(json.dumps(figures, indent=1))
    print_report(figures)


def measure_all(args: argparse.Namespace, figures: dict, device: str, started: float) -> None:
    """The parts in order, gpu_runs.json rewritten after each; a part stopped by bench/gpu.sh ends them."""
    figures["checks"] = exactness_checks(device, args.smoke)
    if device == "cuda":
        torch.cuda.empty_cache()  # the checks' memory back to the device before the runs' children start
    args.out.write_text(json.dumps(figures, indent=1))

    def left() -> float:
        return args.budget_s - (time.monotonic() - started)

    def done(part: dict) -> bool:
        args.out.write_text(json.dumps(figures, indent=1))
        return part.get("stopped") == BY_GPU_SH

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "corpus").mkdir()
        write_corpus(workdir / "corpus", files=3, docs=300 if args.smoke else 3000)  # learns a 32,768-token BPE
        env = {**os.environ, "XSA_EXP_CACHE": str(workdir / "cache")}  # one tokenizer, learned by the first run

        def common() -> list[str]:
            return ["data=local", f"data.path={workdir / 'corpus'}", "data.tokenizer_chars=20000000",
                    "data.packing=bestfit", *figures["settings"], "stack=nanochat_2604",
                    "optim.schedule.warmup_steps=0", "xsa.alpha=1", "logger=csv", "eval.every=0", "eval.core_every=0",
                    "eval.diag_every=0"]
        # the sync check first, at its expected time and a half: what is left then is the runs', the last (d24,
        # the slowest to compile) taking whatever the ones before it leave
        figures["sync_check"] = part(lambda: sync_check(common(), args.smoke, workdir, env,
                                                        min(left(), 1.5 * SYNC_S)), {"run": "sync check"}, left())
        if done(figures["sync_check"]):
            raise Stopped
        if "error" in figures["sync_check"] and figures["settings"] != FALLBACK_SETTINGS:
            # The study's path failed on this device: the runs measure the path that ran on 2026-12-04 rather than
            # fail the same way, so that the loan still gives throughput and memory figures.
            figures["fallback"] = (f"the sync check failed with {' '.join(figures['settings'])}; the runs use "
                                   f"{' '.join(FALLBACK_SETTINGS)}")
            print(f"bench/gpu_runs.py: {figures['fallback']}", flush=True)
            figures["settings"] = FALLBACK_SETTINGS
        for i, run in enumerate(args.runs):
            limit = left() - MIN_PART_S * (len(args.runs) - 1 - i)
            figures["runs"].append(part(lambda: throughput_run(run, common(), args.smoke, workdir, env, limit),
                                        {"run": run}, limit))
            if done(figures["runs"][-1]):
                raise Stopped


def part(measure, name: dict, limit_s: float) -> dict:
    """measure()'s figures; skipped with under MIN_PART_S, or its error, so that the parts after it still run."""
    if limit_s < MIN_PART_S:
        return {**name, "skipped": "out of the time budget"}
    try:
        return measure()
    except Exception as e:
        print(f"bench/gpu_runs.py: {name['run']} failed: {error_line(e)}", flush=True)
        return {**name, "error": error_line(e)}


def error_line(e: Exception) -> str:
    """An error as one line of at most 300 characters: a table cell, a JSON value."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"[:300]


if __name__ == "__main__":
    main()
