"""The jobs a Hydra sweep was to run, from its multirun.yaml, numbered as Hydra's basic sweeper numbers them."""

from __future__ import annotations

from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from xsa_exp.config.sweep import sweep_jobs
from xsa_exp.errors import ConfigError


def expected_jobs(sweep: Path) -> dict[int, str]:
    """Job number -> the overrides that vary, as Hydra's basic sweeper enumerates them from multirun.yaml
    ({} when another sweeper ran it, job folders are not named by number, or the file cannot be read: then
    only the job folders tell)."""
    try:
        hydra = OmegaConf.load(sweep / "multirun.yaml").hydra
        numbered = OmegaConf.to_container(hydra.sweep)["subdir"] == "${hydra.job.num}"
        if not numbered or not str(hydra.sweeper._target_).endswith(".BasicSweeper"):
            return {}
        params = hydra.sweeper.get("params") or {}
        jobs, varying = sweep_jobs([*(f"{key}={value}" for key, value in params.items()), *hydra.overrides.task])
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException, ConfigError):  # ValueError: not UTF-8
        return {}
    return {num: " ".join(o for o in job if o.split("=", 1)[0] in varying) for num, job in enumerate(jobs)}
