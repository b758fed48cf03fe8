"""evaluate.py's work: rebuild a trained model from its run, measure it, write the results into the run.

Results go to <run>/eval/<checkpoint>-step<N>-<time>/, a new folder each time, so nothing that was
there is touched; run_dir.py names its files.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path

import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from omegaconf import DictConfig, OmegaConf

from xsa_exp import run_dir as rd
from xsa_exp.config.schema import ChatCoreConfig, EvaluateConfig, SftDataConfig, data_settings
from xsa_exp.console import set_up_console, wandb_offline
from xsa_exp.data.datamodule import TextDataModule
from xsa_exp.errors import UserError
from xsa_exp.eval.bpb import evaluate_bpb
from xsa_exp.eval.bundle import require_bundle, resolve_bundle_dir
from xsa_exp.eval.chat import evaluate_chat
from xsa_exp.eval.core import evaluate_core
from xsa_exp.eval.diagnostics import METRICS as DIAGNOSTICS
from xsa_exp.eval.diagnostics import attention_diagnostics
from xsa_exp.precision import BF16_COMPUTE, prepare
from xsa_exp.run_dir import (
    TOKENIZER,
    LoadedRun,
    eval_summary,
    load_trained,
    trained_precision,
)
from xsa_exp.training.host import keep_freed_host_memory
from xsa_exp.write_failures import WriteFailed, cause_and_fix, write_failure


def evaluate(cfg: DictConfig) -> Path | None:
    """Evaluate a run as configured; returns the results folder (None on the ranks other than 0). Under torchrun
    (WORLD_SIZE > 1) the processes share the validation rows, CORE's examples and ChatCORE's batches, each result
    the one process's (bpb to rounding: its rows are batched differently), and rank 0 writes it."""
    set_up_console()
    settings: EvaluateConfig = OmegaConf.to_object(cfg)
    options = settings.eval
    metrics = list(options.metrics)  # checked by the preflight (xsa_exp/config/checks.py)
    rank, world_size, device = join_process_group(settings.device)
    if device.type == "cpu":
        keep_freed_host_memory()
    run = load_trained(settings.run)
    precision = options.precision or trained_precision(run.run_dir)
    rd.check_eval_writable(run.run_dir)  # before the work whose results it keeps
    # ChatCORE reads some of its tasks from the bundle too, but runs (with those listed as missing) without it.
    bundle = require_bundle(options.bundle_dir, "CORE", "drop core from eval.metrics") if "core" in metrics \
        else resolve_bundle_dir(options.bundle_dir)
    say = print if rank == 0 else lambda *args, **kwargs: None
    model = run.model.to(device)
    prepare(model, precision)
    autocast = forward_context(precision, device)
    summary = eval_summary(run=run.run_dir, checkpoint=run.checkpoint, step=run.step, precision=precision, metrics={})
    files = {}  # file name in the results folder -> its rows
    c = run.config

    data = validation_data(run) if "bpb" in metrics or "diagnostics" in metrics else None
    if "bpb" in metrics:
        val_tokens = options.val_tokens or c.eval.val_tokens
        summary["metrics"]["val/bpb"] = evaluate_bpb(model, data.val_batches(val_tokens, rank, world_size),
                                                     data.token_bytes, autocast)
        summary["val_scope"] = data.val_scope(val_tokens)
    if "core" in metrics:
        with autocast():  # as during training (the Trainer's forward context), and as summary.json says
            scores, summary["core"], core_files = core(model, run, bundle, options.core_max_per_task, rank,
                                                       world_size, say)
        summary["metrics"].update(scores)
        files.update(core_files)
    if "diagnostics" in metrics and rank == 0:  # one batch: not worth sharing
        means, files[rd.EVAL_DIAGNOSTICS] = diagnostics(
            model, data.diagnostics_inputs(options.diag_rows or c.eval.diag_rows).to(device), autocast)
        summary["metrics"].update(means)
    if "chatcore" in metrics:
        with autocast():
            scores, chat_files = chatcore(run, options.chatcore, bundle, rank, world_size, say)
        summary["metrics"].update(scores)
        if chat_files[rd.CHATCORE_INFO]["sandbox"]:
            summary["sandbox"] = chat_files[rd.CHATCORE_INFO]["sandbox"]
        files.update(chat_files)
    if world_size > 1:
        torch.distributed.destroy_process_group()
    if rank != 0:
        return None
    print_table(summary)
    try:  # at the end: a failed evaluation leaves no folder
        out_dir = rd.write_evaluation(run.run_dir, run.checkpoint, run.step, files, summary)
    except Exception as e:
        if (failure := write_failure(e, run.run_dir)) is None:
            raise
        cause, fix = cause_and_fix(failure)
        raise WriteFailed(f"{cause} while writing {failure.written_file}; the results printed above were not kept; "
                          f"{fix} and evaluate again") from None
    print(f"results: {out_dir}")
    if settings.wandb:
        log_to_wandb(c, run, summary)
    return out_dir


def validation_data(run: LoadedRun) -> TextDataModule:
    """The run's validation split, through its own tokenizer."""
    c = run.config
    data = TextDataModule(data_settings(c.data), c.model.sequence_len, c.model.vocab_size, c.train.device_batch_size,
                          c.seed, c.cache_dir, tokenizer_dir=run.run_dir / TOKENIZER)
    data.setup("validate")
    return data


def core(model, run: LoadedRun, bundle: Path, max_per_task: int | None, rank: int, world_size: int,
         say) -> tuple[dict[str, float], dict, dict]:
    """CORE (its name says how many tasks it covers), its record in summary.json, and its rows per task and per
    example by file name."""
    result = evaluate_core(model, run.tokenizer, bundle, model.config.max_input_len, max_per_task,
                           progress=lambda t, done, total: say(f"  CORE {done}/{total} {t.label:<34} acc "
                                                               f"{t.accuracy:.4f} centered {t.centered:+.4f}",
                                                               flush=True), rank=rank, world_size=world_size)
    record = {"name": result.name, "n_tasks": result.n_tasks, "max_per_task": max_per_task, "bundle": str(bundle)}
    return ({result.name: result.core}, record,
            {rd.CORE_TASKS: [vars(t) for t in result.tasks.values()], rd.CORE_EXAMPLES: result.examples})


def join_process_group(device_setting: str) -> tuple[int, int, torch.device]:
    """This process's rank, the world size and its device: under torchrun (WORLD_SIZE > 1) it joins the process
    group (NCCL on CUDA, gloo on a CPU) and takes the GPU of its LOCAL_RANK; alone, rank 0 of 1."""
    cuda = device_setting.startswith("cuda") or device_setting == "auto" and torch.cuda.is_available()
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        device = torch.device(device_setting if device_setting != "auto" else "cuda" if cuda else "cpu")
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # Triton's kernels (Liger's loss head) launch on the current device
        return 0, 1, device
    torch.distributed.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), device


def diagnostics(model, inputs: torch.Tensor, autocast) -> tuple[dict[str, float], list[dict]]:
    """The attention diagnostics' means for summary.json, and their rows per layer and head."""
    diag = attention_diagnostics(model, inputs, autocast)
    n_layer, n_head = diag[DIAGNOSTICS[0]].shape
    rows = [{"layer": layer, "head": head, **{m: diag[m][layer, head].item() for m in DIAGNOSTICS}}
            for layer in range(n_layer) for head in range(n_head)]
    return {f"diag/{m}": diag[m].mean().item() for m in DIAGNOSTICS}, rows


def forward_context(precision: str, device: torch.device):
    """The forward context Lightning's Trainer uses for this precision (autocast for the mixed ones)."""
    if precision in ("bf16-mixed", "16-mixed"):
        return MixedPrecision(precision, device.type).forward_context
    if precision in ("32-true", "32", "64-true", BF16_COMPUTE):
        return nullcontext
    raise UserError(f"eval.precision={precision} is not supported for evaluation; use 32-true, bf16-compute, "
                    "bf16-mixed or 16-mixed")


def chatcore(run: LoadedRun, settings: ChatCoreConfig, bundle: Path, rank: int, world_size: int,
             say) -> tuple[dict[str, float], dict]:
    """ChatCORE (or "ChatCORE k/5") and per-task accuracies, and by file name chatcore.json's record (with the
    sandbox mode HumanEval ran in, None without HumanEval) and the rows per task and per example; tasks without data
    are named, not fatal."""
    if run.config.stage_name != "sft":
        say(f"note: {run.run_dir} is a {run.config.stage_name} run; ChatCORE measures a chat (stage=sft) model")
    data = data_settings(run.config.data)
    tool_use = settings.tool_use if settings.tool_use is not None else \
        isinstance(data, SftDataConfig) and data.gsm8k_tool_calls
    result = evaluate_chat(run.model, run.tokenizer, bundle, settings, tool_use,
                           progress=lambda t: say(f"  ChatCORE {t.task:<14} acc {t.accuracy:.4f} ({t.correct}/{t.n}) "
                                                  f"centered {t.centered:+.4f}  {t.seconds:.0f}s", flush=True),
                           rank=rank, world_size=world_size)
    for task, reason in result.missing.items():
        say(f"  ChatCORE {task:<14} not evaluated: {reason}")
    if result.sandbox:
        say(f"  ChatCORE humaneval sandbox: {result.sandbox}")
    if not result.tasks:
        raise UserError(f"ChatCORE has no task data: {'; '.join(result.missing.values())}; set eval.bundle_dir "
                        "(ARC, GSM8K, HumanEval) and eval.chatcore.mmlu.data_files, or drop chatcore from eval.metrics")
    info = {"name": result.name, "n_tasks": len(result.tasks), "missing": result.missing, "tool_use": tool_use,
            "max_per_task": settings.max_per_task, "bundle": str(bundle), "sandbox": result.sandbox}
    scores = {result.name: result.score, **{f"chat/{t.task}": t.accuracy for t in result.tasks.values()}}
    return scores, {rd.CHATCORE_TASKS: [vars(t) for t in result.tasks.values()], rd.CHATCORE_EXAMPLES: result.examples,
                    rd.CHATCORE_INFO: info}


def print_table(summary: dict) -> None:
    print(f"\n{summary['run']}  (step {summary['step']}, {summary['precision']})")
    for name, value in summary["metrics"].items():
        scope = rd.describe_val_scope(summary["val_scope"]) if name == "val/bpb" else ""
        print(f"  {name:<28}{value:>10.4f}" + (f"  ({scope})" if scope else ""))


def log_to_wandb(config: DictConfig, run: LoadedRun, summary: dict) -> None:
    import wandb

    w = config.logger.wandb or {"project": "xsa-exp", "group": None}
    offline = wandb_offline()
    with wandb.init(project=w["project"], group=w["group"], name=f"{run.run_dir.name}-eval", job_type="eval",
                    dir=str(run.run_dir), mode="offline" if offline else None,
                    config=OmegaConf.to_container(config, resolve=True)) as wb:
        wb.log({**summary["metrics"], "trainer/global_step": summary["step"]})
