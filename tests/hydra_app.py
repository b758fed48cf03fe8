"""What `python <entry>.py <argv>` composes and checks before anything runs, done in this process: Hydra composes the
command line as its run or multirun does (each job of a basic sweep as the launcher will), and the preflight
callback's checks run on the result, raising the ConfigError that the entry point prints as one line. argv holds
overrides and at most -m (Hydra's argument parser is private API)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from tests.conftest import CONF_DIR
from xsa_exp.config.preflight import check_run, check_sweep, composition_error, sweep_configs
from xsa_exp.errors import ConfigError


def compose_base(entry: str, argv: list[str]) -> tuple[DictConfig, bool]:
    """The config Hydra composes from the command line (a sweep's base config) and whether it is a sweep."""
    multirun = "-m" in argv
    overrides = [arg for arg in argv if arg != "-m"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        mode = RunMode.MULTIRUN if multirun else RunMode.RUN
        try:
            return GlobalHydra.instance().hydra.compose_config(entry, overrides, run_mode=mode), multirun
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(composition_error(e, overrides, lambda rest: compose(entry, rest))) from None


def run_configs(entry: str, base: DictConfig, multirun: bool) -> list[DictConfig]:
    """The configs of the runs a command line starts: one per sweep job."""
    if not multirun:
        return [base]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return sweep_configs(base, entry)


def check_runs(entry: str, base: DictConfig, runs: list[DictConfig], multirun: bool) -> None:
    """The preflight callback's checks of a command's runs (base: its base config)."""
    if multirun:
        check_sweep(entry, runs, base)
    else:
        check_run(entry, runs[0])


def preflight(entry: str, argv: list[str]) -> list[DictConfig]:
    base, multirun = compose_base(entry, argv)
    runs = run_configs(entry, base, multirun)
    check_runs(entry, base, runs, multirun)
    return runs
