"""The run directory: the one place that knows its layout, writes and reads its files, and loads a run back.

    <run>/config.yaml          the resolved config (train.py writes it; a resume must match it)
    <run>/run.json             what the run is (arm, schedule, precision, parameter counts; val_scope and
                               epoch_tokens once done)
    <run>/status.json          completed | interrupted | failed, the step reached and the error if any
    <run>/metrics.csv          one row per logger call (CSVLogger), see training/metrics_log.py for the step convention
    <run>/diagnostics.jsonl    attention diagnostics per head, one line per measured step
    <run>/checkpoints/         step000123.ckpt (periodic, preemption) and final.ckpt
    <run>/tokenizer/           the tokenizer, copied so the run outlives the cache
    <run>/eval/<checkpoint>-step<N>-<YYYYmmdd-HHMMSS>/   one folder per evaluate.py:
        summary.json           every headline number (eval_summary)
        core_tasks.csv, core_examples.jsonl            CORE per task and per example (paired comparisons)
        chatcore_tasks.csv, chatcore_examples.jsonl    the same for ChatCORE (with each generated answer),
        chatcore.json          ChatCORE's tasks covered and missing, and HumanEval's sandbox mode
        diagnostics.csv        attention diagnostics per layer and head

The newest checkpoint, for resuming and for loading alike: final.ckpt, else the step checkpoint with the highest
step number in its name; one that does not load, or whose bytes fail their CRCs, is skipped with a warning.

Importing this module is cheap (no torch); what loads checkpoints imports torch when called.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pickle
import re
import secrets
import shutil
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from xsa_exp.errors import UserError, XsaExpWarning
from xsa_exp.write_failures import writing

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from xsa_exp.data.tokenizer import Tokenizer
    from xsa_exp.model import GPT

CONFIG = "config.yaml"
RUN = "run.json"
STATUS = "status.json"
METRICS = "metrics.csv"
DIAGNOSTICS = "diagnostics.jsonl"
CHECKPOINTS = "checkpoints"
FINAL = "final.ckpt"
TOKENIZER = "tokenizer"
EVAL = "eval"
SUMMARY = "summary.json"
CORE_TASKS, CORE_EXAMPLES = "core_tasks.csv", "core_examples.jsonl"
CHATCORE_TASKS, CHATCORE_EXAMPLES, CHATCORE_INFO = "chatcore_tasks.csv", "chatcore_examples.jsonl", "chatcore.json"
EVAL_DIAGNOSTICS = "diagnostics.csv"
STEP_CHECKPOINT = "step{step:06d}"  # a checkpoint's name without .ckpt (also Lightning's filename template)
STEP_NAME = re.compile(r"step(\d+)(?:-v\d+)?\.ckpt")
EVAL_TIME = re.compile(r"(\d{8}-\d{6})(?:-\d+)?$")  # eval/<checkpoint>-step<N>-<YYYYmmdd-HHMMSS>[-<n>]
STATUSES = ("completed", "interrupted", "failed")


class RunError(UserError):
    """A run or checkpoint that cannot be loaded; the message is one line naming the file and the fix."""


# -----------------------------------------------------------------------------
# Paths


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def final_checkpoint(run_dir: Path) -> Path:
    return checkpoints_dir(run_dir) / FINAL


def step_checkpoint(run_dir: Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"{STEP_CHECKPOINT.format(step=step)}.ckpt"


def is_finished(run_dir: Path) -> bool:
    """A run that trained to the end: its config and final checkpoint are there."""
    return (Path(run_dir) / CONFIG).is_file() and final_checkpoint(run_dir).is_file()


# -----------------------------------------------------------------------------
# run.json, status.json, config.yaml


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file beside path, synced, then rename: a reader, or a node that crashes, sees the old or
    the new file, never half. Its permissions are open()'s (0666 less the umask: readable by the group on a cluster),
    not mkstemp's owner-only 0600."""
    path = Path(path)
    with writing(path):
        tmp = path.with_name(f".{path.name}-{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def read_run_file(path: Path, parse: Callable[[str], Any], fix: str) -> dict:
    """A run file (config.yaml, run.json, status.json) parsed; one missing, or that does not parse as a mapping
    (written whole and synced, so only a lost disk write leaves one so), is a RunError naming it and the fix."""
    try:
        content = parse(path.read_text())
    except FileNotFoundError:
        raise RunError(f"{path} is missing; {fix}") from None
    except (ValueError, yaml.YAMLError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        problem = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    else:
        if isinstance(content, dict) and content:
            return content
        problem = "empty" if not content else f"a {type(content).__name__}, not a mapping"
    raise RunError(f"{path} is damaged ({problem}); {fix}")


def write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=1))


def run_info(*, run_dir: Path | str, max_steps: int, tokens_per_step: int, grad_accumulation: int, precision: str,
             precision_reason: str, ns_dtype: str | None, ns_dtype_reason: str, float32_matmul_precision: str,
             xsa_layers: list[int], param_counts: dict[str, int], flops_per_token: int, arm: dict,
             nanochat_transfer: dict | None, init_from: dict | None = None) -> dict:
    """run.json's content at the start of a run: `arm` is Arm.run_keys (xsa_exp/arm.py), nanochat_transfer the batch,
    lr factor and Muon weight decay nanochat's rules gave it (null without optim.nanochat_transfer); val_scope and
    epoch_tokens (training tokens per pass over a corpus held in memory, None for a stream) are added at the end
    (update_run_info)."""
    info = {"run_dir": str(run_dir), "max_steps": max_steps, "tokens_per_step": tokens_per_step,
            "grad_accumulation": grad_accumulation, "precision": precision, "precision_reason": precision_reason,
            "ns_dtype": ns_dtype, "ns_dtype_reason": ns_dtype_reason,
            "float32_matmul_precision": float32_matmul_precision, "xsa_layers": xsa_layers,
            "param_counts": param_counts, "flops_per_token": flops_per_token, "nanochat_transfer": nanochat_transfer,
            **arm}
    if init_from is not None:
        info["init_from"] = init_from
    return info


def write_run_files(run_dir: Path, config_yaml: str, info: dict) -> None:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / CONFIG, config_yaml)
    write_json(run_dir / RUN, info)


def config_differences(run_dir: Path, config: dict) -> list[str]:
    """The top-level sections in which `config` (resolved) differs from the run's config.yaml: a run continued with
    resume=auto must be the same experiment, and only `resume` itself may differ."""
    saved = read_run_config(run_dir, "resume=auto checks the command against it: restore it from a copy, or train "
                                     "the run again in a new hydra.run.dir")
    return differing_sections(saved, config)


def read_run_config(run_dir: Path, use: str) -> dict:
    """The run's config.yaml as a dict; RunError naming the file, its damage and `use` (what needs it, the fix)."""
    from omegaconf import OmegaConf

    return read_run_file(Path(run_dir) / CONFIG, lambda text: OmegaConf.to_container(OmegaConf.create(text)), use)


def differing_sections(saved: dict, config: dict) -> list[str]:
    return sorted(k for k in set(saved) | set(config) if k != "resume" and saved.get(k) != config.get(k))


def check_checkpoint_is_the_runs(checkpoint: Path, config: dict) -> None:
    """RunError where the checkpoint resume=auto chose was saved by another run (copied into checkpoints/, say):
    its weights may not even fit this run's model, and its optimizer state and step are another experiment's."""
    import torch

    saved = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)
    saved = saved.get("xsa_exp", {}).get("config") if isinstance(saved, dict) else None
    if saved is None:
        origin = "was not written by xsa-exp (it records no run config)"
    elif diff := differing_sections(saved, config):
        origin = f"was saved by a different run (sections {', '.join(diff)} differ from config.yaml)"
    else:
        return
    raise RunError(f"checkpoint {checkpoint} {origin}, so the run cannot resume from it; move it out of "
                   f"{checkpoint.parent} and resume=auto continues from the run's own checkpoints")


def describe_val_scope(scope: dict | None) -> str:
    """'' for the whole validation split (or a scope not known), else 'over N of M tokens' (or 'over the first N
    tokens' of a split not read to its end)."""
    if not scope or scope["whole"]:
        return ""
    if scope["split_tokens"] is None:
        return f"over the first {scope['tokens']:,} tokens of the validation split"
    return f"over {scope['tokens']:,} of {scope['split_tokens']:,} tokens"


def read_run_info(run_dir: Path) -> dict:
    return read_run_file(Path(run_dir) / RUN, json.loads, "it records the run (its precision, counts, wandb id): "
                         "restore it from a copy, or train the run again in a new hydra.run.dir")


def update_run_info(run_dir: Path, **entries) -> None:
    """Add what is known only after training (e.g. how much of the validation split val/bpb covers)."""
    write_json(Path(run_dir) / RUN, {**read_run_info(run_dir), **entries})


def trained_precision(run_dir: Path) -> str:
    """The precision the run trained with (run.json; 32-true for a run without one)."""
    if not (Path(run_dir) / RUN).is_file():
        return "32-true"
    info = read_run_file(Path(run_dir) / RUN, json.loads, "it records the precision the run trained in: restore it "
                         "from a copy, or give the evaluation's with eval.precision=...")
    if (precision := info.get("precision")) is None:
        raise RunError(f"{Path(run_dir) / RUN} records no precision; give the evaluation's with eval.precision=...")
    return precision


def write_status(run_dir: Path, status: str, step: int, error: str | None = None) -> None:
    """status.json: completed | interrupted | failed, with the step reached and the error if any."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {STATUSES}")
    write_json(Path(run_dir) / STATUS, {"status": status, "step": step, "error": error})


def read_status(run_dir: Path) -> dict:
    """status.json, or {} when the run has none (still running, or killed without a word)."""
    path = Path(run_dir) / STATUS
    return read_run_file(path, json.loads, "delete it, and resume=auto continues from the newest checkpoint as after "
                         "a kill") if path.is_file() else {}


# -----------------------------------------------------------------------------
# metrics.csv and diagnostics.jsonl


def read_metric_rows(run_dir: Path, up_to_step: int | None = None) -> list[dict[str, str]]:
    """metrics.csv's rows (only the cells a row logged), those after up_to_step left out. A last row without its
    line end was cut short (a full disk, a kill) and is left out: its step may be cut short too."""
    with open(Path(run_dir) / METRICS, newline="") as f:
        lines = f.read().splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
    return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(lines)
            if up_to_step is None or int(row["step"]) <= up_to_step]


def metrics_header(path: Path) -> list[str]:
    """metrics.csv's columns ([] without the file)."""
    try:
        with open(path, newline="") as f:
            return next(csv.reader(f), [])
    except FileNotFoundError:
        return []


def write_metric_rows(path: Path, header: list[str], rows: list[dict]) -> None:
    """metrics.csv replaced whole, as Lightning's CSV writer lays it out: a kill or a full disk leaves the old file or
    the new one."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=header)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, text.getvalue())


def keep_metric_rows(run_dir: Path, step: int) -> None:
    """Cut metrics.csv to its rows up to step (a resumed run logs the later ones again), columns kept."""
    path = Path(run_dir) / METRICS
    write_metric_rows(path, metrics_header(path), read_metric_rows(run_dir, up_to_step=step))


def append_diagnostics(run_dir: Path, record: dict) -> None:
    with writing(Path(run_dir) / DIAGNOSTICS), open(Path(run_dir) / DIAGNOSTICS, "a") as f:
        f.write(json.dumps(record) + "\n")


def diagnostics_step(line: str) -> float:
    """The step of a diagnostics.jsonl line; a line cut short by a kill counts as after any checkpoint."""
    try:
        return json.loads(line)["step"]
    except ValueError:
        return float("inf")


def truncate_diagnostics(run_dir: Path, step: int) -> None:
    """Keep the diagnostics.jsonl lines up to step (a resumed run measures the later ones again)."""
    path = Path(run_dir) / DIAGNOSTICS
    if path.is_file():
        kept = [line for line in path.read_text().splitlines() if diagnostics_step(line) <= step]
        atomic_write_text(path, "".join(line + "\n" for line in kept))


def read_diagnostics(run_dir: Path) -> list[dict]:
    """diagnostics.jsonl's records; a line cut short by a crash is skipped. [] without the file."""
    records = []
    try:
        with open(Path(run_dir) / DIAGNOSTICS) as f:
            for line in filter(str.strip, f):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        return []
    return records


def set_aside_unfinished_logs(run_dir: Path) -> None:
    """A run restarted without any checkpoint keeps its earlier partial logs under other names, never deletes them."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in (METRICS, DIAGNOSTICS):
        path = Path(run_dir) / name
        if path.is_file():
            path.rename(path.with_name(f"{path.stem}.unfinished-{stamp}{path.suffix}"))


def copy_tokenizer(source: Path, run_dir: Path) -> None:
    """Copy the tokenizer's files into the run (file by file: copytree reports a full disk as a list of strings)."""
    target = Path(run_dir) / TOKENIZER
    target.mkdir(exist_ok=True)
    for file in Path(source).iterdir():
        with writing(target / file.name):
            shutil.copy2(file, target / file.name)


# -----------------------------------------------------------------------------
# Checkpoints


def checkpoint_step(path: Path) -> int | None:
    """The step in a step checkpoint's name (step000123.ckpt, or Lightning's step000123-v1.ckpt); None otherwise."""
    m = STEP_NAME.fullmatch(Path(path).name)
    return int(m.group(1)) if m else None


def checkpoints_newest_first(run_dir: Path) -> list[Path]:
    """final.ckpt, then the step checkpoints by the step in their names, highest first. Other *.ckpt files
    (not written by a run) are not candidates."""
    folder = checkpoints_dir(run_dir)
    steps = [(checkpoint_step(p), p.name, p) for p in folder.glob("step*.ckpt") if checkpoint_step(p) is not None]
    final = [final_checkpoint(run_dir)] if final_checkpoint(run_dir).is_file() else []
    return final + [p for _, _, p in sorted(steps, reverse=True)]


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that loads (see checkpoints_newest_first); an unreadable newer one is skipped with a
    warning. None where the run has none; RunError where it has some and none loads."""
    candidates = checkpoints_newest_first(run_dir)
    skipped = []
    for path in candidates:
        try:
            check_loads(path)
        except Exception as e:  # truncated or corrupt: any load error means "not this one"
            skipped.append(f"{path} ({type(e).__name__})")
            continue
        if skipped:
            warnings.warn(f"checkpoint {' and '.join(skipped)} {'is' if len(skipped) == 1 else 'are'} unreadable; "
                          f"falling back to {path.name}", XsaExpWarning, stacklevel=2)
        return path
    if candidates:
        names = ", ".join(p.name for p in candidates)
        raise RunError(f"run directory {run_dir} has no checkpoint that loads ({names}: truncated, corrupt or "
                       "unreadable); restore its checkpoints from a copy, or train the run again in a new directory")
    return None


def check_loads(path: Path) -> None:
    """Any exception where the checkpoint does not load whole: torch.load's (mapped, so cheap), then its CRCs."""
    import torch

    torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    check_crcs(path)


def check_crcs(path: Path) -> None:
    """BadZipFile where a record of the checkpoint (a zip) does not match its CRC: torch.load does not check them, so
    bits a disk flipped would load, and a resumed run would go on from wrong weights."""
    with zipfile.ZipFile(path) as archive:
        record = archive.testzip()
    if record is not None:
        raise zipfile.BadZipFile(f"{record} does not match its CRC")


def find_checkpoint(path: Path) -> Path:
    """A checkpoint file as given, or a run directory's newest checkpoint."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise RunError(f"no such run directory or checkpoint: {path}")
    found = newest_checkpoint(path)
    if found is not None:
        return found
    if path.name == CHECKPOINTS and (path.parent / CONFIG).is_file():
        raise RunError(f"{path} is a run's checkpoints folder; give the run directory {path.parent}, or one "
                       "checkpoint in it")
    if not (path / CONFIG).is_file() and (path / "multirun.yaml").is_file():
        raise RunError(f"{path} is a sweep's folder (multirun.yaml); give one of its runs' directories, e.g. "
                       f"{path / '0'}")
    raise RunError(f"run directory {path} has no checkpoints/*.ckpt; was the run finished?")


def checkpoint_meta(config: dict | None, skipped_steps: int) -> dict:
    """What a checkpoint carries beyond Lightning's state: enough to rebuild the model without the run directory."""
    return {"config": config, "tokenizer_dir": TOKENIZER, "skipped_steps": skipped_steps}


@dataclass
class LoadedRun:
    run_dir: Path
    checkpoint: Path
    config: DictConfig
    model: GPT
    tokenizer: Tokenizer
    step: int


def load_trained(path: str | Path, map_location="cpu") -> LoadedRun:
    """The model, config and tokenizer of a run directory (its newest checkpoint) or of one checkpoint file."""
    import torch
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
    from xsa_exp.data.tokenizer import Tokenizer
    from xsa_exp.model import GPT, GPTConfig

    given = Path(path).expanduser().resolve()
    checkpoint_path = find_checkpoint(given)
    run_dir = checkpoint_path.parent.parent
    try:
        checkpoint = torch.load(checkpoint_path, map_location=map_location, weights_only=False)
        if checkpoint_path == given:  # a run directory's newest checkpoint had its CRCs checked when it was chosen
            check_crcs(checkpoint_path)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as e:
        raise RunError(f"checkpoint {checkpoint_path} is truncated, corrupt or unreadable ({type(e).__name__}: "
                       f"{' '.join(str(e).split())[:120]}); use another checkpoint of the run") from None
    meta = checkpoint.get("xsa_exp") if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict) or "state_dict" not in checkpoint:
        raise RunError(f"{checkpoint_path} is not an xsa-exp checkpoint (no xsa_exp metadata with its config, or no "
                       "state_dict)")
    if (run_dir / CONFIG).is_file():  # its results go into run_dir/eval: they must be that run's
        saved = read_run_config(run_dir, "evaluate.py checks the checkpoint against it: restore it from a copy")
        if diff := differing_sections(saved, meta["config"]):
            raise RunError(f"checkpoint {checkpoint_path} was saved by a different run (sections {', '.join(diff)} "
                           f"differ from {run_dir / CONFIG}), so its results would be filed under {run_dir}; move it "
                           "out of the run's checkpoints/, or evaluate it in the run it came from")
    try:  # a config saved by another version of xsa-exp: a key it has and this one lacks, or another type
        config = OmegaConf.create(meta["config"])
        model = GPT(GPTConfig.of(typed(config.model, ModelConfig), typed(config.xsa, XSAConfig)))
    except OmegaConfBaseException as e:
        raise RunError(f"checkpoint {checkpoint_path} holds a config this version of xsa-exp cannot read "
                       f"({type(e).__name__}: {str(e).splitlines()[0]}); use the version that trained it") from None
    state = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise RunError(f"checkpoint {checkpoint_path} does not match its config: {detail}") from None
    try:
        tokenizer = Tokenizer.load(run_dir / meta["tokenizer_dir"])
    except (FileNotFoundError, ValueError) as e:
        raise RunError(f"cannot load the run's tokenizer: {e}; put the run's own tokenizer folder back (a copy of it, "
                       "or the one in the tokenizer cache it was copied from)") from None
    if tokenizer.vocab_size != config.model.vocab_size:  # a run trains with exactly its model's vocabulary
        raise RunError(f"the tokenizer at {run_dir / meta['tokenizer_dir']} has {tokenizer.vocab_size} tokens and the "
                       f"run's model {config.model.vocab_size}: it is not the one the run trained with; put the run's "
                       "own tokenizer folder back")
    model.eval()
    return LoadedRun(run_dir, checkpoint_path, config, model, tokenizer, int(checkpoint.get("global_step", 0)))


# -----------------------------------------------------------------------------
# Evaluations: eval/<checkpoint>-step<N>-<time>/


def new_directory(path: Path) -> Path:
    """Create path, or path-2, path-3, ... if it exists: results never land in an existing folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = path, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1
            candidate = path.with_name(f"{path.name}-{n}")


def eval_dir_name(checkpoint: Path | str, step: int, stamp: str | None = None) -> str:
    return f"{Path(checkpoint).stem}-step{step}-{stamp or time.strftime('%Y%m%d-%H%M%S')}"


def new_eval_dir(run_dir: Path, checkpoint: Path | str, step: int, stamp: str | None = None) -> Path:
    """A new folder for one evaluation of checkpoint (at step) of the run; nothing that was there is touched."""
    return new_directory(Path(run_dir) / EVAL / eval_dir_name(checkpoint, step, stamp))


def eval_summary(*, run: Path | str, checkpoint: Path | str, step: int, metrics: dict[str, float],
                 precision: str | None = None, **extra) -> dict:
    """summary.json's content: the evaluated run, checkpoint and step, every headline number, and extras
    (val_scope, core, sandbox)."""
    summary = {"run": str(run), "checkpoint": str(checkpoint), "step": step}
    if precision is not None:
        summary["precision"] = precision
    return {**summary, "metrics": metrics, **extra}


def write_summary(folder: Path, summary: dict) -> None:
    atomic_write_text(Path(folder) / SUMMARY, json.dumps(summary, indent=1))


def check_eval_writable(run_dir: Path) -> None:
    """Before an evaluation's work: its results go into <run>/eval/, which must take a file."""
    folder = Path(run_dir) / EVAL
    if folder.exists() and not folder.is_dir():
        raise RunError(f"{folder} is a file, where evaluate.py keeps its results in a folder; move it away, or "
                       "evaluate a copy of the run")
    try:
        folder.mkdir(exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise RunError(f"cannot write into {folder} ({e.strerror}), where evaluate.py keeps its results; make it "
                       "writable or free space there, or evaluate a copy of the run") from None


def write_evaluation(run_dir: Path, checkpoint: Path | str, step: int, files: dict[str, list | dict],
                     summary: dict) -> Path:
    """One evaluation's folder (new_eval_dir) with its results files and summary.json, whole or not at all: written
    in a hidden folder beside it, then renamed into place, so a full disk leaves nothing half-written."""
    staging = new_directory(Path(run_dir) / EVAL / f".writing-{os.getpid()}")  # the umask's mode, as its final one
    try:
        for name, rows in {**files, SUMMARY: summary}.items():
            with writing(staging / name):
                write_rows(staging / name, rows)
        folder = new_eval_dir(run_dir, checkpoint, step)
        os.replace(staging, folder)  # onto the empty folder just made for its name
        return folder
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_rows(path: Path, rows: list[dict] | dict) -> None:
    """A results file by its name: .csv (rows with the same keys), .jsonl (a row a line) or .json (one record)."""
    if path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=1))
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def evaluations(run_dir: Path) -> list[tuple[Path, dict]]:
    """(folder, summary.json) of the run's evaluations, oldest first: by checkpoint step, then time. A summary
    that cannot be read or lacks its step or metrics, or one in a hidden folder (write_evaluation's staging, left by
    a killed evaluate.py), is left out."""
    found = []
    for summary_path in (Path(run_dir) / EVAL).glob(f"*/{SUMMARY}"):
        if summary_path.parent.name.startswith("."):
            continue
        try:
            summary = json.loads(summary_path.read_text())
        except (OSError, ValueError):
            continue
        if not (isinstance(summary, dict) and isinstance(summary.get("step"), int)
                and isinstance(summary.get("metrics"), dict)):  # valid JSON, but not a summary: edited by hand
            continue
        folder = summary_path.parent
        stamp = EVAL_TIME.search(folder.name)
        found.append(((summary["step"], stamp.group(1) if stamp else "", folder.stat().st_mtime), folder, summary))
    return [(folder, summary) for _, folder, summary in sorted(found, key=lambda f: f[0])]
