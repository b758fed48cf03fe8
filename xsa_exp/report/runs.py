"""Runs: finding run directories, loading them, and the arm each belongs to."""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from xsa_exp import run_dir as rd
from xsa_exp.arm import Arm
from xsa_exp.errors import UserError
from xsa_exp.report.sweep import expected_jobs

# summary.json's names (CORE, CORE 18/22, ChatCORE, ChatCORE 3/5), with the cap on examples per task where one was set
HEADLINE = re.compile(r"(Chat)?CORE( \d+/\d+)?( \(\d+ per task\))?")


class ReportError(UserError):
    """Nothing to report or nowhere to write it; the message is one line."""


class RunProblem(Exception):
    """Why a run directory cannot be read at all."""


# Config keys whose values, where they differ between runs of one depth, make those runs different settings (e.g.
# "tiny · sequence_len=512"), compared and trended apart: the stack, the model's shape and switches, the optimizer's
# hyperparameters, the training length (by the key that set it: see load_run), batch and micro-batch (with the
# sequence length and the devices it sets the micro-batches per update: with several loader workers a rank's updates
# then read other rows, and SFT weighs each micro-batch's mean alike; the devices are not a setting), clipping and
# the non-finite updates a run may skip, the corpus and its files, shards, order and tokenizer, the precision,
# Newton-Schulz dtype and compilation (each moves the last bits), and what the final val/bpb covers (VAL_SCOPE). The
# arm's keys (xsa.* but its eps, the optimizer) and the seed are not settings, nor is a key that only the optimizer
# arm changes (optim=adamw's matrix lr).
LENGTH_KEYS = ("train.max_steps", "train.target_tokens", "train.epochs", "train.param_data_ratio")
VAL_SCOPE = "val_scope"  # a bpb over other tokens is another measurement: runs that differ in it are never paired
SETTING_KEYS = ("stack_name", "model.", "xsa.eps", "optim.width_lr_scaling", "optim.muon.", "optim.lr.",
                "optim.adamw.", "optim.schedule.", "optim.transfer.", *LENGTH_KEYS, "train.total_batch_tokens",
                "train.device_batch_size", "train.grad_clip", "train.skip_nonfinite_steps",
                "train.compile", "data.name", "data.repo", "data.num_shards", "data.num_train_shards", "data.path",
                "data.val_path", "data.text_column", "data.txt_sample_by", "data.tokenizer_chars",
                "data.tokenizer_doc_chars", "data.packing", "data.shuffle_rows", "data.num_workers",
                "trainer.precision", VAL_SCOPE)


@dataclass
class Run:
    path: Path
    label: str
    depth: str  # the depth preset (and " · SFT"), then each setting that varies: "tiny · sequence_len=512"
    arm: Arm
    seed: int
    n_params: int
    metrics: pd.DataFrame  # metrics.csv as numbers (no rows when the run wrote none)
    logged: pd.DataFrame  # which cells of metrics.csv a row logged (the others are empty)
    info: dict = field(default_factory=dict)  # run.json
    complete: bool = True  # metrics.csv and checkpoints/final.ckpt
    status: dict = field(default_factory=dict)  # status.json ({} when absent)
    finals: dict[str, float] = field(default_factory=dict)  # "val/bpb", "CORE 18/22", "ChatCORE", ... -> value
    sources: dict[str, str | Path] = field(default_factory=dict)  # metric -> "metrics.csv step N" or eval folder
    val_scope: dict | None = None  # what the final val/bpb covers: {"tokens", "split_tokens", "whole"}
    final_alpha: np.ndarray | None = None  # α per layer and head at the last diagnostics step (learnable runs)
    config: dict = field(default_factory=dict)  # config.yaml's leaves, by dotted key, and VAL_SCOPE
    settings: dict = field(default_factory=dict)  # the SETTING_KEYS leaves that vary among its depth's runs
    shown: dict = field(default_factory=dict)  # those of them its label names (see assign_settings)
    setting_names: dict = field(default_factory=dict)  # setting key -> its short name in labels (setting_names)

    @property
    def base_depth(self) -> str:
        return stage_depth(self.info)

    @property
    def steps(self) -> int:
        return int(self.metrics["step"].max()) if len(self.metrics) else 0

    @property
    def tokens(self) -> int:
        return int(self.metrics["tokens_seen"].max()) if "tokens_seen" in self.metrics and len(self.metrics) else 0

    @property
    def max_steps(self) -> int:
        return int(self.info["max_steps"])

    def rows(self, column: str) -> pd.DataFrame:
        """The rows of metrics.csv that logged `column` (each row holds one logger call's keys)."""
        if column in self.metrics:
            return self.metrics[self.logged[column]]
        return pd.DataFrame(columns=[*self.metrics.columns, column], dtype=float)  # no rows, the column named

    def layer_columns(self, prefix: str) -> dict[int, str]:
        """Layer -> column for the per-layer columns "<prefix>/L<i>" of metrics.csv."""
        found = {int(m.group(1)): c for c in self.metrics.columns
                 if (m := re.fullmatch(rf"{re.escape(prefix)}/L(\d+)", c))}
        return dict(sorted(found.items()))

    def last_per_layer(self, prefix: str) -> pd.Series:
        """<prefix>/L{i} of the last row that logged them (diag/attn_self_cos, lambda/x0, ...), indexed by layer
        (empty if never logged)."""
        layers = self.layer_columns(prefix)
        columns = list(layers.values())
        rows = self.metrics[columns][self.logged[columns].any(axis=1)]
        if rows.empty:
            return pd.Series(dtype=float)
        return pd.Series(rows.iloc[-1].to_numpy(), index=list(layers))

    @property
    def diverged(self) -> bool:
        """A non-finite train/loss or val/bpb logged in metrics.csv (NaN or ±inf, also a step that was skipped
        and survived), a non-finite final val/bpb, or a run that stopped on a non-finite loss or gradient
        (status.json "failed" with a non-finite / FloatingPointError error)."""
        for column in ("train/loss", "val/bpb"):
            if not np.isfinite(self.rows(column)[column].to_numpy(dtype=float)).all():
                return True
        if not math.isfinite(self.finals.get("val/bpb", 0.0)):
            return True
        error = str(self.status.get("error") or "")
        return self.status.get("status") == "failed" and ("non-finite" in error or "FloatingPointError" in error)


@dataclass
class Problem:
    label: str
    reason: str


def discover(paths: list[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Run directories under `paths`, and (directory, reason) for sweep jobs that never became runs."""
    runs, problems = set(), []
    for root in paths:
        if not root.is_dir():
            raise ReportError(f"no such directory: {root}")
        runs |= {p.parent.resolve() for p in root.rglob(rd.RUN) if (p.parent / rd.CONFIG).is_file()}
        for sweep in sorted({m.parent for m in root.rglob("multirun.yaml")}):
            jobs = expected_jobs(sweep)
            numbered = {int(d.name) for d in sweep.iterdir() if d.is_dir() and d.name.isdigit()}
            for num in sorted(set(jobs) | numbered):
                job, name = sweep / str(num), f"sweep job {num}" + (f" ({jobs[num]})" if jobs.get(num) else "")
                if not job.is_dir():
                    problems.append((job, f"missing: {name} has no directory (never started, or queued)"))
                elif not (job / rd.RUN).is_file():
                    problems.append((job, f"failed: {name} has no run.json (stopped before training)"))
    return sorted(runs), problems


def load_run(path: Path, label: str) -> Run:
    """The run at `path`; run.complete is False without metrics.csv or checkpoints/final.ckpt (a failed or
    unfinished run: not in the tables of results, but counted where stability is)."""
    try:
        info = rd.read_run_info(path)
        if (path / rd.METRICS).is_file():
            # Empty cells are keys a row did not log; "nan" is a logged NaN (a diverged run) and must stay visible.
            raw = pd.read_csv(path / rd.METRICS, dtype=str, keep_default_na=False)
        else:
            raw = pd.DataFrame({"step": pd.Series(dtype=str)})
        status = rd.read_status(path)
        config = leaves(yaml.safe_load((path / rd.CONFIG).read_text()) or {})
        # The run's length is a setting by the key that set it (the first of LENGTH_KEYS given, as training reads
        # them): the others were ignored. Not the resolved step count, which an epoch of SFT rows varies by seed.
        deciding = next((k for k in LENGTH_KEYS if config.get(k)), None)
        config = {k: v for k, v in config.items() if k not in LENGTH_KEYS or k == deciding}
        # What the run computed in (run.json), not config.yaml's "auto", which each machine resolves: one config
        # trains in bf16 on a GPU and fp32 on a CPU, with Newton-Schulz in bf16 or fp32 by the CPU.
        config["trainer.precision"], config["optim.muon.ns_dtype"] = info["precision"], info["ns_dtype"]
        arm = Arm.of_run(info, str(config["xsa.parametrization"]))
        depth, seed = stage_depth(info), int(info["seed"])
    except rd.RunError as e:  # run.json or status.json missing or damaged
        raise RunProblem(f"unreadable: {e}") from None
    except (OSError, ValueError, yaml.YAMLError) as e:  # pandas' parser errors are ValueErrors
        raise RunProblem(f"unreadable: {type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    except KeyError as e:
        raise RunProblem(f"run.json lacks {e}") from None
    if "step" not in raw:
        raise RunProblem("metrics.csv has no step column")
    complete = (path / rd.METRICS).is_file() and rd.final_checkpoint(path).is_file()
    if complete and raw.empty:
        raise RunProblem("metrics.csv has no rows")
    if complete and status.get("status") == "completed":
        last_step = pd.to_numeric(raw["step"], errors="coerce").max()
        check_metrics_reach(path / rd.METRICS, last_step, status.get("step") or 0)
    n_params = int(info["param_counts"]["total"])
    run = Run(path, label, depth, arm, seed, n_params, raw.apply(pd.to_numeric, errors="coerce"), raw != "",
              info=info, complete=complete, status=status, config=config)
    add_final_values(run)
    run.config[VAL_SCOPE] = rd.describe_val_scope(run.val_scope) or "the whole split"  # a setting, as its keys are
    run.final_alpha = last_alpha(path) if arm.alpha is None else None
    return run


def leaves(tree: dict, prefix: str = "") -> dict:
    """{"model.n_head": 4, ...}: the leaves of a nested config, by dotted key."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def assign_settings(runs: list[Run], reference: dict[str, str] | None = None) -> None:
    """Give each run the SETTING_KEYS values that vary among the runs of its depth (within one optimizer), and a
    depth label naming those of them in which its setting differs from the common one: a key's value shared by
    most of the depth's settings is left out of their labels ("tiny · window_pattern=L" beside "tiny" for an
    ablation), unless no value is the most common (a sweep over sequence_len names it in every label).
    reference: setting name -> the value, as written, to take as the common one instead (--reference-setting), in
    every depth that has it; one that names no varying key, or whose value no run has, is a ReportError."""
    by_depth = defaultdict(list)
    for run in runs:
        by_depth[run.base_depth].append(run)
    varying = {base: varying_keys(group) for base, group in by_depth.items()}
    given = reference_keys(reference or {}, {k for keys in varying.values() for k in keys})
    found = set()
    for base, group in by_depth.items():
        keys = varying[base]
        settings = {run.path: {k: run.config.get(k) for k in keys} for run in group}
        distinct = list({repr(s): s for s in settings.values()}.values())
        common = {}
        for k in keys:
            values = {repr(s[k]): s[k] for s in distinct}
            chosen = [shown for shown, value in values.items() if k in given and same_value(given[k], value)]
            counts = Counter(repr(s[k]) for s in distinct).most_common()
            if chosen:
                common[k] = chosen[0]
                found.add(k)
            elif len(counts) == 1 or counts[0][1] > counts[1][1]:
                common[k] = counts[0][0]
        names = setting_names(keys)
        for run in group:
            run.settings = settings[run.path]
            run.shown = {k: v for k, v in run.settings.items() if common.get(k) != repr(v)}
            run.setting_names = names
            run.depth = " · ".join([run.base_depth, *(f"{names[k]}={v}" for k, v in run.shown.items())])
    for key in given.keys() - found:
        values = sorted({str(run.config.get(key)) for run in runs})
        raise ReportError(f"--reference-setting {key}={given[key]}: no run has that value (its values: "
                          f"{', '.join(values)})")


def varying_keys(group: list[Run]) -> list[str]:
    """The SETTING_KEYS that differ among a depth's runs of one optimizer."""
    keys = sorted({k for run in group for k in run.config if k.startswith(SETTING_KEYS)})
    by_optim = defaultdict(list)
    for run in group:
        by_optim[run.arm.optim].append(run)
    return [k for k in keys if any(len({repr(run.config.get(k)) for run in same}) > 1 for same in by_optim.values())]


def reference_keys(reference: dict[str, str], keys: set[str]) -> dict[str, str]:
    """--reference-setting's names as the full keys they name (optim.lr.x0_scalar, or its end after a dot,
    x0_scalar) -> the value given; a name that names no varying key, or several, or a key named twice is a
    ReportError."""
    out = {}
    for name, text in reference.items():
        named = sorted(k for k in keys if k == name or k.endswith("." + name))
        if not named:
            raise ReportError(f"--reference-setting {name}: not a setting that varies among the runs (they vary in "
                              f"{', '.join(sorted(keys)) or 'none'})")
        if len(named) > 1 and name not in named:
            raise ReportError(f"--reference-setting {name} names {', '.join(named)}: give the whole key")
        key = name if name in named else named[0]
        if key in out:
            raise ReportError(f"--reference-setting names {key} twice")
        out[key] = text
    return out


def same_value(text: str, value) -> bool:
    """Whether a value given on the command line is a run's: as labels write it (1e-05, None, L), as YAML reads it
    (null, [1.0, 1.0]), or a number by its value (5e-1 is 0.5, 1 is 1.0)."""
    if text == str(value):
        return True
    if isinstance(value, bool):
        return as_config_value(text) is value
    if isinstance(value, (int, float)):
        try:
            return float(text) == value
        except ValueError:
            return False
    return as_config_value(text) == value


def as_config_value(text: str):
    """A value given on the command line as config.yaml holds it: 0.5 a float, L a string, null None."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def setting_names(keys: list[str]) -> dict[str, str]:
    """Each setting key's name in labels: its last part (model.sequence_len -> sequence_len, data.name -> data),
    with the parts above it while that is shared with another key (optim.lr.embedding -> lr.embedding beside
    optim.adamw.role_betas.embedding -> role_betas.embedding)."""
    def name(key: str, parts: int) -> str:
        return "data" if key == "data.name" else ".".join(key.split(".")[-parts:])

    names = {}
    for key in keys:
        parts = 1
        while parts < key.count(".") and any(name(other, parts) == name(key, parts) for other in keys if other != key):
            parts += 1
        names[key] = name(key, parts)
    return names


def check_metrics_reach(path: Path, last_step: float, final_step: int) -> None:
    """A completed run's metrics.csv ends with a whole row (the writer ends each with a newline) at the run's last
    step; one cut short (a lost write, a copy stopped part way) would report an earlier step's numbers as final."""
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        whole = f.read(1) == b"\n"
    if not whole or not last_step >= final_step:
        cut = "" if whole else ", its last row cut short"
        raise RunProblem(f"damaged: metrics.csv ends at step {last_step:.0f}{cut}, but the run completed step "
                         f"{final_step} (status.json); restore metrics.csv from a copy, or train the run again")


def incomplete_reason(run: Run) -> str:
    lacking = [str(p.relative_to(run.path)) for p in (run.path / rd.METRICS, rd.final_checkpoint(run.path))
               if not p.is_file()]
    status = run.status.get("status")
    why = (f"{status} at step {run.status.get('step')}"
           + (f": {run.status['error']}" if run.status.get("error") else "")
           if status in ("failed", "interrupted") else "failed, or still running")
    return f"incomplete: no {' and no '.join(lacking)} ({why})"


def stage_depth(info: dict) -> str:
    """SFT runs are their own section ("d24 · SFT"): their val/bpb is over assistant tokens, and they
    compare with the SFT runs of the baseline arm, not with base runs."""
    return info["depth"] + (" · SFT" if info["stage"] == "sft" else "")


def add_final_values(run: Run) -> None:
    """val/bpb of the last val row, then the evaluations of the run's last step (newest last) on top; the
    val_scope of whichever gave val/bpb (run.json's for the log)."""
    val = run.rows("val/bpb")
    if not val.empty:
        run.finals["val/bpb"] = float(val["val/bpb"].iloc[-1])
        run.sources["val/bpb"] = f"metrics.csv step {int(val['step'].iloc[-1])}"
        run.val_scope = run.info.get("val_scope")
    if not run.complete:
        return
    for folder, summary in rd.evaluations(run.path):
        if summary["step"] < run.steps:  # an earlier checkpoint: not the run's final numbers
            continue
        for name, value in summary["metrics"].items():
            if name == "val/bpb" or HEADLINE.fullmatch(name):
                name = name if name == "val/bpb" else with_example_cap(name, folder, summary)
                run.finals[name], run.sources[name] = float(value), folder
        if "val/bpb" in summary["metrics"]:
            run.val_scope = summary.get("val_scope")


def with_example_cap(name: str, folder: Path, summary: dict) -> str:
    """A CORE or ChatCORE over at most N examples per task (eval.core_max_per_task, eval.chatcore.max_per_task) is
    another measurement than over every example, never paired with it: "CORE (100 per task)"."""
    if name.startswith("Chat"):
        record = json.loads((folder / rd.CHATCORE_INFO).read_text()) if (folder / rd.CHATCORE_INFO).is_file() else {}
    else:
        record = summary.get("core") or {}
    cap = record.get("max_per_task")
    return f"{name} ({cap} per task)" if cap else name


def last_alpha(path: Path) -> np.ndarray | None:
    """α per layer and head from the last diagnostics.jsonl line that has it (None without one)."""
    alphas = [record["alpha"] for record in rd.read_diagnostics(path) if "alpha" in record]
    return np.asarray(alphas[-1], dtype=float) if alphas else None
