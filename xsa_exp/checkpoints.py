"""Load a trained model back from a run directory or a checkpoint file."""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from xsa_exp.data.tokenizer import Tokenizer
from xsa_exp.model import GPT, GPTConfig


class RunError(Exception):
    """A run or checkpoint that cannot be loaded; the message is one line naming the file and the fix."""


@dataclass
class LoadedRun:
    run_dir: Path
    checkpoint: Path
    config: DictConfig
    model: GPT
    tokenizer: Tokenizer
    step: int


def find_checkpoint(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise RunError(f"no such run directory or checkpoint: {path}")
    final = path / "checkpoints" / "final.ckpt"
    if final.is_file():
        return final
    candidates = sorted((path / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise RunError(f"run directory {path} has no checkpoints/*.ckpt; was the run finished?")
    return candidates[-1]


def load_run(path: str | Path, map_location: str | torch.device = "cpu") -> LoadedRun:
    checkpoint_path = find_checkpoint(Path(path).expanduser().resolve())
    run_dir = checkpoint_path.parent.parent
    try:
        checkpoint = torch.load(checkpoint_path, map_location=map_location, weights_only=False)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as e:
        raise RunError(f"checkpoint {checkpoint_path} is truncated, corrupt or unreadable ({type(e).__name__}: "
                       f"{' '.join(str(e).split())[:120]}); use another checkpoint of the run") from None
    meta = checkpoint.get("xsa_exp") if isinstance(checkpoint, dict) else None
    if not meta or "state_dict" not in checkpoint:
        raise RunError(f"{checkpoint_path} is not an xsa-exp checkpoint (no xsa_exp metadata or state_dict)")
    config = OmegaConf.create(meta["config"])
    model = GPT(GPTConfig.from_config(config.model, config.xsa))
    state = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise RunError(f"checkpoint {checkpoint_path} does not match its config: {detail}") from None
    tokenizer_dir = run_dir / meta["tokenizer_dir"]
    try:
        tokenizer = Tokenizer.load(tokenizer_dir)
    except (FileNotFoundError, ValueError) as e:
        raise RunError(f"cannot load the run's tokenizer: {e}") from None
    model.eval()
    return LoadedRun(run_dir, checkpoint_path, config, model, tokenizer, int(checkpoint.get("global_step", 0)))
