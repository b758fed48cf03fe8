"""The jobs of a Hydra basic sweep, in the order Hydra's BasicSweeper numbers them: what the preflight checks
before a sweep starts and what the report expects to find in a sweep's folder. Written on Hydra's public override
parser: the sweeper's own expansion is not public API. And what a sweep adds to each job's config."""

from __future__ import annotations

import itertools
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, open_dict

from xsa_exp.errors import ConfigError


def sweep_jobs(overrides: list[str]) -> tuple[list[list[str]], set[str]]:
    """The jobs of a basic sweep over `overrides` (hydra.sweeper.params first, then the command line's), in
    Hydra's order, and the keys that vary. As Hydra's BasicSweeper: one list of "key=value" per key (a later
    override of a key replaces the earlier one in its place), then the cartesian product with the last key
    varying fastest: job 0 = first values, job 1 = the last key's second value, ... Raises ConfigError."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(str(e).strip().splitlines()[0]) from None
    choices: dict[str, list[str]] = {}
    varying = set()
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                raise ConfigError(f"{override.input_line} is not a sweep Hydra's basic sweeper can run; "
                                  "use a list of values (a,b,c) or range(start,stop[,step])")
            choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
            varying.add(key)
        else:
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
            varying.discard(key)
    return [list(job) for job in itertools.product(*choices.values())], varying


def name_wandb_group(cfg: DictConfig, sweep_dir: str) -> None:
    """A sweep's jobs share one wandb group, named like the sweep's folder, unless logger.wandb.group names one."""
    if cfg.logger.wandb is not None and cfg.logger.wandb.group is None:
        with open_dict(cfg):
            cfg.logger.wandb.group = Path(sweep_dir).name
