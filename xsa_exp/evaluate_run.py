"""evaluate.py's work: rebuild a trained model from its run, measure it, write the results into the run.

Results go to <run>/eval/<checkpoint>-step<N>-<time>/, a new folder each time, so nothing that was
there is touched; run_dir.py names its files.
"""

from __future__ import annotations

import csv
import json
from contextlib import nullcontext
from pathlib import Path

import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from omegaconf import DictConfig, OmegaConf

from xsa_exp import run_dir as rd
from xsa_exp.console import quiet_libraries, wandb_offline
from xsa_exp.data.datamodule import TextDataModule
from xsa_exp.errors import UserError
from xsa_exp.eval.bpb import evaluate_bpb
from xsa_exp.eval.bundle import require_bundle, resolve_bundle_dir
from xsa_exp.eval.chat import evaluate_chat
from xsa_exp.eval.core import evaluate_core
from xsa_exp.eval.diagnostics import METRICS as DIAGNOSTICS
from xsa_exp.eval.diagnostics import attention_diagnostics
from xsa_exp.run_dir import (
    TOKENIZER,
    LoadedRun,
    eval_summary,
    load_trained,
    new_eval_dir,
    trained_precision,
    write_summary,
)

KNOWN_METRICS = ("bpb", "core", "diagnostics", "chatcore")


def evaluate(cfg: DictConfig) -> Path:
    quiet_libraries()
    options = cfg.eval
    metrics = list(options.metrics)
    unknown = [m for m in metrics if m not in KNOWN_METRICS]
    if unknown or not metrics:
        raise UserError(f"eval.metrics={metrics} has unknown entries {unknown}; allowed: {', '.join(KNOWN_METRICS)}")
    run = load_trained(cfg.run)
    # ChatCORE reads some of its tasks from the bundle too, but runs (with those listed as missing) without it.
    bundle = require_bundle(options.bundle_dir, "CORE", "drop core from eval.metrics") if "core" in metrics \
        else resolve_bundle_dir(options.bundle_dir)
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          "cpu" if cfg.device == "auto" else cfg.device)
    model = run.model.to(device)
    precision = options.precision or trained_precision(run.run_dir)
    autocast = forward_context(precision, device)
    out_dir = new_eval_dir(run.run_dir, run.checkpoint, run.step)
    summary = eval_summary(run=run.run_dir, checkpoint=run.checkpoint, step=run.step, precision=precision, metrics={})
    c = run.config

    data = None
    if "bpb" in metrics or "diagnostics" in metrics:
        data = TextDataModule(c.data, c.model.sequence_len, c.model.vocab_size, c.train.device_batch_size, c.seed,
                              c.cache_dir, tokenizer_dir=run.run_dir / TOKENIZER)
        data.setup("validate")
    if "bpb" in metrics:
        val_tokens = options.val_tokens or c.eval.val_tokens
        summary["metrics"]["val/bpb"] = evaluate_bpb(model, data.val_batches(val_tokens), data.token_bytes, autocast)
        summary["val_scope"] = data.val_scope(val_tokens)
    if "core" in metrics:
        name, value, summary["core"] = core(model, run, bundle, options.core_max_per_task, out_dir)
        summary["metrics"][name] = value
    if "diagnostics" in metrics:
        summary["metrics"].update(diagnostics(model, data.diagnostics_inputs(options.diag_rows or c.eval.diag_rows)
                                                .to(device), autocast, out_dir))
    if "chatcore" in metrics:
        chat_metrics, sandbox = chatcore(run, options.chatcore, bundle, out_dir)
        summary["metrics"].update(chat_metrics)
        if sandbox:
            summary["sandbox"] = sandbox
    write_summary(out_dir, summary)
    print_table(summary, out_dir)
    if cfg.wandb:
        log_to_wandb(c, run, summary)
    return out_dir


def core(model, run: LoadedRun, bundle: Path, max_per_task: int | None, out_dir: Path) -> tuple[str, float, dict]:
    """CORE (its name says how many tasks it covers), its record in summary.json; per task and example to files."""
    result = evaluate_core(model, run.tokenizer, bundle, run.config.model.sequence_len, max_per_task,
                           progress=lambda t, done, total: print(
                               f"  CORE {done}/{total} {t.label:<34} acc {t.accuracy:.4f} "
                               f"centered {t.centered:+.4f}", flush=True))
    write_csv(out_dir / rd.CORE_TASKS, [vars(t) for t in result.tasks.values()])
    write_jsonl(out_dir / rd.CORE_EXAMPLES, result.examples)
    return result.name, result.core, {"name": result.name, "n_tasks": result.n_tasks, "max_per_task": max_per_task,
                                      "bundle": str(bundle)}


def diagnostics(model, inputs: torch.Tensor, autocast, out_dir: Path) -> dict[str, float]:
    """The attention diagnostics' means for summary.json; per layer and head to a file."""
    diag = attention_diagnostics(model, inputs, autocast)
    n_layer, n_head = diag[DIAGNOSTICS[0]].shape
    write_csv(out_dir / rd.EVAL_DIAGNOSTICS,
              [{"layer": layer, "head": head, **{m: diag[m][layer, head].item() for m in DIAGNOSTICS}}
               for layer in range(n_layer) for head in range(n_head)])
    return {f"diag/{m}": diag[m].mean().item() for m in DIAGNOSTICS}


def forward_context(precision: str, device: torch.device):
    """The forward context Lightning's Trainer uses for this precision (autocast for the mixed ones)."""
    if precision in ("bf16-mixed", "16-mixed"):
        return MixedPrecision(precision, device.type).forward_context
    if precision in ("32-true", "32", "64-true"):
        return nullcontext
    raise UserError(f"eval.precision={precision} is not supported for evaluation; use 32-true, bf16-mixed or 16-mixed")


def chatcore(run: LoadedRun, cfg: DictConfig, bundle: Path, out_dir: Path) -> tuple[dict[str, float], str | None]:
    """ChatCORE (or "ChatCORE k/5") and per-task accuracies, and the sandbox mode HumanEval ran in (None
    without HumanEval); tasks without data are named, not fatal."""
    c = run.config
    if c.stage_name != "sft":
        print(f"note: {run.run_dir} is a {c.get('stage_name', 'base')} run; ChatCORE measures a chat (stage=sft) model")
    tool_use = cfg.tool_use if cfg.tool_use is not None else bool(c.data.get("gsm8k_tool_calls", False))
    result = evaluate_chat(run.model, run.tokenizer, bundle, cfg.mmlu, cfg.max_per_task, cfg.max_new_tokens, tool_use,
                           cfg.batch_size, cfg.humaneval_timeout_s, cfg.humaneval_memory_mb,
                           progress=lambda t: print(f"  ChatCORE {t.task:<14} acc {t.accuracy:.4f} ({t.correct}/{t.n}) "
                                                    f"centered {t.centered:+.4f}  {t.seconds:.0f}s", flush=True))
    for task, reason in result.missing.items():
        print(f"  ChatCORE {task:<14} not evaluated: {reason}")
    if result.sandbox:
        print(f"  ChatCORE humaneval sandbox: {result.sandbox}")
    if not result.tasks:
        raise UserError(f"ChatCORE has no task data: {'; '.join(result.missing.values())}; set eval.bundle_dir "
                        "(ARC, GSM8K, HumanEval) and eval.chatcore.mmlu.data_files, or drop chatcore from eval.metrics")
    write_csv(out_dir / rd.CHATCORE_TASKS, [vars(t) for t in result.tasks.values()])
    write_jsonl(out_dir / rd.CHATCORE_EXAMPLES, result.examples)
    (out_dir / rd.CHATCORE_INFO).write_text(json.dumps(
        {"name": result.name, "n_tasks": len(result.tasks), "missing": result.missing, "tool_use": tool_use,
         "max_per_task": cfg.max_per_task, "bundle": str(bundle), "sandbox": result.sandbox}, indent=1))
    return {result.name: result.score, **{f"chat/{t.task}": t.accuracy for t in result.tasks.values()}}, result.sandbox


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def print_table(summary: dict, out_dir: Path) -> None:
    print(f"\n{summary['run']}  (step {summary['step']}, {summary['precision']})")
    for name, value in summary["metrics"].items():
        scope = rd.describe_val_scope(summary["val_scope"]) if name == "val/bpb" else ""
        print(f"  {name:<28}{value:>10.4f}" + (f"  ({scope})" if scope else ""))
    print(f"results: {out_dir}")


def log_to_wandb(config: DictConfig, run: LoadedRun, summary: dict) -> None:
    import wandb

    w = config.logger.wandb or {"project": "xsa-exp", "group": None}
    offline = wandb_offline()
    with wandb.init(project=w["project"], group=w["group"], name=f"{run.run_dir.name}-eval", job_type="eval",
                    dir=str(run.run_dir), mode="offline" if offline else None,
                    config=OmegaConf.to_container(config, resolve=True)) as wb:
        wb.log({**summary["metrics"], "trainer/global_step": summary["step"]})
