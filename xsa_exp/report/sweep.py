"""The jobs a Hydra sweep was to run, from its multirun.yaml, numbered as Hydra's basic sweeper numbers them."""

from __future__ import annotations

import itertools
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException


def sweep_jobs(overrides: list[str]) -> tuple[list[list[str]], set[str]]:
    """The jobs of a basic sweep over `overrides` (hydra.sweeper.params first, then the command line's), in
    Hydra's order, and the keys that vary. As Hydra's BasicSweeper: one list of "key=value" per key (a later
    override of a key replaces the earlier one in its place), then the cartesian product with the last key
    varying fastest: job 0 = first values, job 1 = the last key's second value, ..."""
    choices: dict[str, list[str]] = {}
    varying = set()
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.get_key_element()
        if override.is_sweep_override():
            if not override.is_discrete_sweep():  # range() and interval() sweeps: not the basic sweeper's
                raise HydraException(f"the basic sweeper cannot sweep {key}")
            choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
            varying.add(key)
        else:
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
            varying.discard(key)
    return [list(job) for job in itertools.product(*choices.values())], varying


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
    except (OSError, OmegaConfBaseException, HydraException):
        return {}
    return {num: " ".join(o for o in job if o.split("=", 1)[0] in varying) for num, job in enumerate(jobs)}
