"""Every setting of a command line checked once, on the configs Hydra composes, before anything runs.

`Preflight` is a Hydra callback (conf/train.yaml and conf/evaluate.yaml list it under hydra.callbacks): at the start
of a run it validates the run's config; at the start of a sweep it composes every job's config as the launcher will
(the basic sweeper's jobs, xsa_exp/config/sweep.py) and validates them all, so that a bad value in job 7 stops the
sweep before job 1 trains, and checks the launcher and the sweep's folder. Errors Hydra raises while composing
(an unknown key, a value of the wrong type, a group option that does not exist), before any callback runs, are
turned into the same one line by `run_app`, the entry points' wrapper. Every problem is one `config error: ...`
line naming the key, what was given and what is allowed, with exit status 2.
"""

from __future__ import annotations

import copy
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    InterpolationKeyError,
    InterpolationResolutionError,
    OmegaConfBaseException,
    ValidationError,
)

from xsa_exp import run_dir as rd
from xsa_exp.config.arithmetic import world_size
from xsa_exp.config.checks import cuda_here, validate, validate_evaluate
from xsa_exp.config.keys import allowed, bounds, fmt, leaves, type_name, unknown_key_message
from xsa_exp.config.sweep import name_wandb_group, sweep_jobs
from xsa_exp.errors import EXIT_STATUS, FAILED_JOBS, ConfigError, JobFailed, UserError, exit_on_user_error

RELAUNCH = ("once it is fixed, relaunch with resume=auto to run the failed and unfinished jobs, or into a new "
            "hydra.sweep.dir if the fix changes the config")


class Preflight(Callback):
    """The checks of a run or a whole sweep, before Hydra creates any directory. `entry` is the entry point's
    config name (train or evaluate)."""

    def __init__(self, entry: str):
        self.entry = entry

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        with stop_on_error():
            check_run(self.entry, config)
            check_output_folder(config, "hydra.run.dir")
            if self.entry == "train":
                check_launch_shares_a_folder(config, "hydra.run.dir")
                check_launch_matches_devices(config)

    def on_multirun_start(self, config: DictConfig, config_name: str | None = None, **kwargs) -> None:
        with stop_on_error():
            check_sweep(self.entry, sweep_configs(config, config_name or self.entry), config)
            check_output_folder(config, "hydra.sweep.dir")
            if self.entry == "train":
                check_launch_shares_a_folder(config, "hydra.sweep.dir")


@contextmanager
def stop_on_error() -> Iterator[None]:
    """Hydra turns a callback's Exception into a warning and runs on unchecked; a problem found is one line and exit
    status 2 (exit_on_user_error), a failing check its traceback and exit status 1 (SystemExit passes Hydra)."""
    with exit_on_user_error(label=ConfigError.label, say=speaks_for_its_node()):
        try:
            yield
        except UserError:
            raise
        except InterpolationResolutionError as e:  # a ${...} in an override that names nothing
            raise ConfigError(f"{e.full_key or 'an interpolation'}: {first_line(e)}") from None
        except Exception:
            traceback.print_exc()
            sys.exit(1)


def check_run(entry: str, cfg: DictConfig) -> None:
    """One run's config (with its hydra node): the overrides Hydra accepts but that would do nothing, then every
    value. Hydra's record of the run is set first, as Hydra sets it for a job: the group choices (depth_name, ...)
    are `${hydra:runtime.choices...}`."""
    set_hydra_record(cfg)
    check_empty_dict_overrides(as_written(cfg.hydra.overrides.task), cfg)
    (validate if entry == "train" else validate_evaluate)(cfg)
    if entry == "train":
        check_gpu_here(cfg)


def set_hydra_record(cfg: DictConfig) -> None:
    """Hydra's record of the job whose config is cfg, as Hydra sets it when the job runs, for `${hydra:...}`."""
    if not HydraConfig.initialized() or HydraConfig.get().runtime.choices != cfg.hydra.runtime.choices:
        HydraConfig.instance().set_config(copy.deepcopy(cfg))  # set_config makes the node it keeps read-only


def check_gpu_here(cfg: DictConfig) -> None:
    """A run that asks for a GPU and starts on this machine (not one submitted to SLURM, whose nodes have them)."""
    if cfg.trainer.accelerator in ("gpu", "cuda") and "SlurmLauncher" not in cfg.hydra.launcher._target_ \
            and not cuda_here():
        raise ConfigError(f"trainer.accelerator={cfg.trainer.accelerator}, but torch sees no CUDA GPU on this machine "
                          "(a CPU build of torch, or no GPU visible); use trainer=cpu here, or run it on a GPU node")


def check_output_folder(cfg: DictConfig, key: str) -> None:
    """The run's (or sweep's) folder, which Hydra makes before the job starts (and the job folders in a sweep's): not
    empty (Hydra would work in the current folder), under no file or link to nothing, and where a folder can be
    made."""
    try:
        value = str(OmegaConf.select(cfg, key))
    except OmegaConfBaseException:
        return  # resolved only inside the job (Hydra's runtime resolvers); the job checks its own
    if not value.strip():
        raise ConfigError(f"{key} is empty, and Hydra would run in the current folder; give it a folder of its own")
    path = Path(value).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    if existing.is_symlink() and not existing.exists():
        raise ConfigError(f"{key}={value}: {existing} links to {os.readlink(existing)}, which does not exist (a file "
                          f"system not mounted?); mount it, or choose another {key}")
    if not existing.is_dir():
        raise ConfigError(f"{key}={value}: {existing} is a file, not a folder; choose another {key}")
    if existing == path and key == "hydra.run.dir":
        return  # Hydra makes nothing in it (evaluate.py's `.`); a run checks that it can write there (take_lock)
    try:  # what Hydra does next (the folder, or a sweep's job folders), in a folder of our own, removed at once
        os.rmdir(tempfile.mkdtemp(prefix=".xsa-exp-check-", dir=existing))
    except OSError as e:
        raise ConfigError(f"{key}={value}: no folder can be made in {existing} ({e.strerror or e}); free space or "
                          f"make it writable there, or choose another {key}") from None


class Launch(NamedTuple):
    launcher: str  # torchrun, srun (a job step's tasks), or SLURM (a job's tasks, without srun)
    processes: int
    nodes: int

    @property
    def per_node(self) -> int:
        return self.processes // self.nodes


def external_launch() -> Launch | None:
    """Where torchrun or SLURM gives this run's ranks (Lightning then takes them from it, and starts none itself):
    who, how many, on how many nodes; None where Lightning starts the ranks."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return Launch("torchrun", world, max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    # Lightning's SLURMEnvironment.detect(), without importing it: a job's tasks unless it is an interactive shell
    if "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return Launch("srun" if "SLURM_STEP_ID" in os.environ else "SLURM", int(os.environ["SLURM_NTASKS"]),
                      int(os.environ.get("SLURM_NNODES", "1")))
    return None


def speaks_for_its_node() -> bool:
    """Whether this process prints a refused command line: the processes torchrun or srun starts on one node check
    the same command line against the same files, so its local rank 0 prints the line for them all (each node's:
    a problem of one node's files is still said); the others exit with the same status in silence."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return os.environ.get("LOCAL_RANK", "0") == "0"
    if "SLURM_STEP_ID" in os.environ and "SLURM_NTASKS" in os.environ:
        return os.environ.get("SLURM_LOCALID", "0") == "0"
    return True


def check_launch_shares_a_folder(cfg: DictConfig, key: str) -> None:
    """The processes of torchrun or srun each compose the command line: Hydra's default folder, named by each one's
    own clock (${now:...}), would be another for each of them, and the ranks would wait for a lock in folders rank 0
    never takes. (Lightning's own ranks are given rank 0's folder; a job's one process without srun, a sweep's
    driver say, composes alone.)"""
    launch = external_launch()
    if launch is None or launch.launcher == "SLURM" or launch.processes == 1:
        return
    section, name = key.removeprefix("hydra.").split(".")
    if "${now:" in str(as_written(cfg.hydra[section])[name]):
        raise ConfigError(f"this is one of {launch.processes} processes started by {launch.launcher}, and {key} is "
                          "named by the clock, which each process reads for itself; give them all the same "
                          f"{key}=<folder> (with resume=auto, a requeue continues it)")


def check_launch_matches_devices(cfg: DictConfig) -> None:
    """torchrun's or SLURM's processes are the run's ranks, one per device: a count other than trainer.devices x
    trainer.num_nodes would train copies of the run on one GPU, or one rank with the others' share of the batch
    (or, a job's tasks without srun, wait for ranks that never start)."""
    launch = external_launch()
    if launch is None:
        return
    nodes = int(cfg.trainer.num_nodes)
    devices = world_size(cfg.trainer) // nodes
    if launch.launcher == "SLURM" and launch.processes > 1:
        raise ConfigError(f"this SLURM job has {launch.processes} tasks (SLURM_NTASKS), but this process was not "
                          f"started by srun: Lightning would wait for {launch.processes - 1} more ranks that never "
                          "start; start the run with srun (one task per device)")
    if (launch.processes, launch.nodes) == (devices * nodes, nodes):
        return
    on_nodes = f"on {launch.nodes} node{'s' * (launch.nodes != 1)}"
    asked = (f"trainer.devices={cfg.trainer.devices} and trainer.num_nodes={nodes} ask for {devices * nodes} on "
             f"{nodes} node{'s' * (nodes != 1)}")
    matching = (f"set trainer.devices={launch.per_node} trainer.num_nodes={launch.nodes}"
                if launch.processes % launch.nodes == 0 else "give every node the same number of tasks")
    if launch.launcher == "SLURM":  # without srun, one process runs, and Lightning would wait for the others
        raise ConfigError(f"this SLURM job has {launch.processes} task{'s' * (launch.processes != 1)} (SLURM_NTASKS) "
                          f"{on_nodes}, but {asked}; give the job {devices} tasks per node and start the run with "
                          f"srun, or {matching}")
    raise ConfigError(f"{launch.launcher} started {launch.processes} process{'es' * (launch.processes != 1)} "
                      f"{on_nodes}, but {asked}; {matching} (one process per device)")


def sweep_configs(cfg: DictConfig, config_name: str, compose: Callable = hydra.compose) -> list[DictConfig]:
    """Each job's config as the launcher will compose it (the base config for a sweeper other than the basic one,
    which expands its jobs itself)."""
    if not cfg.hydra.sweeper._target_.endswith("BasicSweeper"):
        return [cfg]
    params = [f"{key}={value}" for key, value in (as_written(cfg.hydra.sweeper.params) or {}).items()]
    jobs, _ = sweep_jobs([*params, *as_written(cfg.hydra.overrides.task)])
    return [compose_job(config_name, [*as_written(cfg.hydra.overrides.hydra), *job], compose) for job in jobs]


def as_written(node):
    """Overrides as the command line gave them: an interpolation in one (init_from=runs/a${xsa.alpha}) is each job's
    to resolve, not the base config's."""
    return OmegaConf.to_container(node, resolve=False) if node is not None else None


def compose_job(config_name: str, overrides: list[str], compose: Callable = hydra.compose) -> DictConfig:
    try:
        return compose(config_name, overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(composition_error(e, overrides, lambda args: compose(config_name, args))) from None


def check_sweep(entry: str, runs: list[DictConfig], base: DictConfig) -> None:
    """A sweep's jobs (runs), composed from its base config (base: the command line without its swept values)."""
    if entry == "train":
        # Lightning's DDP re-launches the script once per device, which a local Hydra sweep cannot host.
        in_process = ("BasicLauncher", "JoblibLauncher")  # jobs run in this process or a joblib worker
        if any(cfg.hydra.launcher._target_.endswith(in_process) and _devices_known(cfg) and world_size(cfg.trainer) > 1
               for cfg in runs):
            raise ConfigError("multi-device training inside a local Hydra sweep is not supported; run each multi-GPU "
                              "job as its own `python train.py ...`, sweep with hydra/launcher=submitit_local "
                              "hydra.launcher.tasks_per_node=<devices> (and gpus_per_node=<devices> on GPUs), or on a "
                              "cluster with hydra/launcher=slurm")
        for cfg in runs:
            check_submitit_job(cfg)
        check_one_array(base, runs)
        check_sweep_directory(runs)
    for cfg in runs:
        check_run(entry, cfg)


def run_app(main: Callable[[], None], config_name: str) -> None:
    """Call an entry point's @hydra.main function, with Hydra's composition errors (raised before any callback) as
    one `config error:` line and exit status 2. Hydra prints an error over several lines and exits itself unless
    HYDRA_FULL_ERROR is set; with it set, the error reaches us. Any other error keeps its traceback."""
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        main()
    except JobFailed as e:  # Hydra raises a sweep's first failed job again once every job has run
        print(f"{e} (the sweep's first failed job; its other jobs ran, each failed one printing its line (under "
              f"submitit, into its job's log); {RELAUNCH})", file=sys.stderr)
        sys.exit(EXIT_STATUS)
    except SystemExit as e:  # a signal stopped the sweep (training/preemption.py) after a job had failed
        if e.code not in (0, None) or not FAILED_JOBS:
            raise
        print(f"{FAILED_JOBS[0]} (the sweep's first failed job, before a signal stopped the sweep; {RELAUNCH})",
              file=sys.stderr)
        sys.exit(EXIT_STATUS)
    except (HydraException, OmegaConfBaseException) as e:
        with exit_on_user_error(label=ConfigError.label, say=speaks_for_its_node()):
            if isinstance(e, InterpolationKeyError) and prints_hydra_node_resolved(sys.argv[1:]):
                raise ConfigError(f"--cfg hydra --resolve: {first_line(e)}: Hydra resolves its node alone, without "
                                  "the run's keys that hydra.run.dir and hydra.sweep.dir name; print it resolved with "
                                  "--cfg all --resolve (add -p hydra for Hydra's node only)") from None
            raise ConfigError(command_line_error(e, config_name)) from None


def prints_hydra_node_resolved(args: list[str]) -> bool:
    """Whether the command line is Hydra's `--cfg hydra --resolve` (or -c hydra, --cfg=hydra)."""
    return "--resolve" in args and re.search(r"(?:^| )(?:--cfg|-c)[ =]hydra(?: |$)", " ".join(args)) is not None


def command_line_error(error: Exception, config_name: str) -> str:
    """A composition error of this process's command line as one line. Its overrides are the arguments Hydra's
    override parser reads as overrides (a flag, or a flag's value such as --cfg's `job`, is not one)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()

    def is_override(arg: str) -> bool:
        try:
            parser.parse_override(arg)
        except HydraException:
            return False
        return True

    overrides = [arg for arg in sys.argv[1:] if is_override(arg)]
    conf_dir = Path(sys.argv[0]).resolve().parent / "conf"
    GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return composition_error(error, overrides, lambda rest: hydra.compose(config_name, rest))


def check_empty_dict_overrides(args: list[str], cfg: DictConfig) -> None:
    """Raise ConfigError for `key={}` on a dict that has entries: Hydra merges a dict given on the command line
    into the one there, so the entries stay and the run would silently be the one without the override."""
    for arg in args:
        key, sep, value = arg.lstrip("+").partition("=")
        if not sep or key.startswith("~") or re.fullmatch(r"\{\s*\}", value) is None:
            continue
        node = OmegaConf.select(cfg, key)
        if isinstance(node, DictConfig) and len(node):
            removals = " ".join(f"'~{key}.{name}'" for name in node)
            raise ConfigError(f"{key}={{}} removes nothing: Hydra merges a dict override into the one there "
                              f"({', '.join(map(str, node))}); to take its entries away, pass {removals}")


def composition_error(error: Exception, overrides: list[str], compose) -> str:
    """Hydra's composition error as one line that names the key, what was given and what is allowed."""
    if isinstance(error, MissingConfigException) and error.options:  # a group option that does not exist
        group, _, option = str(error.missing_cfg_file).rpartition("/")
        return f"{group}={option} is not an option; allowed: {', '.join(sorted(error.options))}"
    if isinstance(error, OverrideParseException):  # e.g. data.local_dir=~/data: a leading ~ is the grammar's
        key, _, value = error.override.partition("=")
        reason = first_line(error).replace(f": {error.override}", "")
        return (f"cannot parse the override {error.override} ({reason}); Hydra's override grammar reserves some "
                f"characters (a leading ~, brackets, braces, commas, quotes): quote such a value, '{key}=\"{value}\"'")
    cause = error
    while cause is not None and not (isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None)):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        line = first_line(error)
        ambiguous = re.fullmatch(r"Ambiguous value for argument '([^=]*)=(.*)'", line)
        if ambiguous:
            line += f"; to sweep, add -m; for a list, write {ambiguous[1]}=[{ambiguous[2]}]"
        swept_hydra_key = re.fullmatch(r"Sweeping over Hydra's configuration is not supported : '(.*)'", line)
        if swept_hydra_key:
            line = f"{swept_hydra_key[1]}: Hydra's own settings cannot be swept; run one sweep per value"
        return line
    key = cause.full_key
    given = {}
    for arg in overrides:
        name, sep, value = arg.lstrip("+~").partition("=")
        if sep:
            given[name] = value
    others = [a for a in overrides if not (a.lstrip("+~").partition("=")[0] + ".").startswith(key + ".")]
    try:
        base = compose(others) if len(others) < len(overrides) else None
    except (HydraException, OmegaConfBaseException):
        base = None
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        parent_key, _, _ = key.rpartition(".")
        parent = base if base is None or not parent_key else OmegaConf.select(base, parent_key)
        siblings = [k for k in parent.keys() if k != "hydra"] if isinstance(parent, DictConfig) else []
        return unknown_key_message(key, siblings)
    if isinstance(cause, ValidationError):
        value = given.get(key, fmt(getattr(cause, "value", None)))
        what = "a value of the wrong type"
        if base is not None:
            leaf = next((leaf for leaf in leaves(base) if leaf.key == key), None)
            if leaf is not None:
                about = "" if bounds(leaf.meta) or "choices" in leaf.meta else f" ({leaf.meta['help']})"
                return (f"{key}={value} is not of type {type_name(leaf.type)}; "
                        f"allowed: {allowed(leaf.type, leaf.meta)}{about}")
        return f"{key}={value} is {what}: {first_line(cause)}"
    return f"{key}: {first_line(cause)}"


def first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def check_sweep_directory(runs: list[DictConfig]) -> None:
    """A sweep started again into a directory that holds its finished or running jobs: refused whole before Hydra
    launches anything or rewrites the folder's multirun.yaml, instead of each job refusing its own directory (the
    runs are never touched). With resume=auto each job continues the run it finds, which must be the same job."""
    for num, cfg in enumerate(runs):
        with open_dict(cfg):  # the job's own config, composed for this check: a subdir may name its keys
            cfg.hydra.job.num = num  # Hydra numbers a sweep's jobs in the order the basic sweeper makes them
        try:  # resolved once: a ${now:...} in the directory would give another name each time
            sweep_dir, subdir = cfg.hydra.sweep.dir, str(cfg.hydra.sweep.subdir)
        except OmegaConfBaseException:
            return  # a directory resolved only inside the job (Hydra's runtime resolvers); the job checks it
        job_dir = Path(sweep_dir) / subdir
        if not (job_dir / rd.CONFIG).exists():
            continue
        if cfg.resume != "auto":
            raise ConfigError(f"hydra.sweep.dir={sweep_dir} already holds runs (job {num}'s directory "
                              f"{job_dir} is one); nothing was overwritten — choose a new hydra.sweep.dir, or add "
                              "resume=auto to continue them")
        if diff := rd.config_differences(job_dir, job_config(cfg, sweep_dir)):
            raise ConfigError(f"hydra.sweep.dir={sweep_dir} holds another sweep's runs: job {num}'s directory "
                              f"{job_dir} was started with a different config (sections {', '.join(diff)} differ); "
                              f"nothing was overwritten — continue it with the overrides in {Path(sweep_dir)}/"
                              "multirun.yaml (hydra.overrides.task), or choose a new hydra.sweep.dir")


def job_config(cfg: DictConfig, sweep_dir: str) -> dict:
    """A sweep job's config, resolved, as the job will save it (train.py): without Hydra's node, with the sweep's
    wandb group. Hydra's record is this job's own, its number included (`${hydra:job.num}`)."""
    HydraConfig.instance().set_config(copy.deepcopy(cfg))
    job = copy.deepcopy(cfg)
    with open_dict(job):
        del job["hydra"]
    name_wandb_group(job, sweep_dir)
    return OmegaConf.to_container(job, resolve=True)


def check_one_array(base: DictConfig, runs: list[DictConfig]) -> None:
    """hydra-submitit-launcher submits a sweep as one job array, with the resources of the sweep's base config: a job
    whose own config needs others (a swept trainer.devices or trainer.num_nodes) would start with the base's."""
    if "hydra_submitit_launcher" not in base.hydra.launcher._target_:
        return
    # The launcher's keys that take a job's value (tasks_per_node: ${trainer.devices}); Hydra's own cannot be swept.
    raw = OmegaConf.to_container(base.hydra.launcher, resolve=False)
    keys = [k for k, v in raw.items() if isinstance(v, str) and re.search(r"\$\{(?!hydra\.)[\w.]+\}", v)]
    given = {k: base.hydra.launcher[k] for k in keys}
    for num, cfg in enumerate(runs):
        needed = {k: cfg.hydra.launcher[k] for k in keys}
        key = next((k for k in keys if needed[k] != given[k]), None)
        if key is not None:
            launcher = cfg.hydra.runtime.choices["hydra/launcher"]
            raise ConfigError(f"hydra/launcher={launcher} submits a sweep as one job array with one set of resources, "
                              f"hydra.launcher.{key}={fmt(given[key])} from the command line's fixed values, but "
                              f"job {num} ({' '.join(as_written(cfg.hydra.overrides.task))}) needs "
                              f"hydra.launcher.{key}={fmt(needed[key])}; sweep trainer.devices and trainer.num_nodes "
                              "in separate sweeps, one per value")


def check_submitit_job(cfg: DictConfig) -> None:
    """Under hydra-submitit-launcher a requeued job must continue its run, and the launcher starts the ranks
    (one task per device): Lightning must not start more."""
    launcher = cfg.hydra.launcher
    if "hydra_submitit_launcher" not in launcher._target_:
        return
    if cfg.resume != "auto":
        raise ConfigError("hydra/launcher=submitit_* requeues a job at its time limit or preemption, and the requeued "
                          "job must continue its run; add resume=auto")
    per_node = cfg.trainer.devices
    if not isinstance(per_node, int) or isinstance(per_node, bool) or per_node < 1:
        if cfg.trainer.accelerator == "cpu" and launcher._target_.endswith("LocalLauncher"):
            return  # one CPU process, as the one task
        raise ConfigError(f"trainer.devices={per_node}: submitit starts one process per device and must know how many "
                          "before the job starts; set trainer.devices=<devices per node> (hydra/launcher=slurm takes "
                          "its tasks and GPUs per node from it)")
    devices = world_size(cfg.trainer)
    if launcher.tasks_per_node * launcher.nodes != devices or launcher.nodes != cfg.trainer.num_nodes:
        raise ConfigError(f"trainer.devices x trainer.num_nodes = {devices} devices, but hydra.launcher.tasks_per_node="
                          f"{launcher.tasks_per_node} x hydra.launcher.nodes={launcher.nodes} tasks; submitit starts "
                          f"one process per device, so set hydra.launcher.tasks_per_node={per_node} and "
                          f"hydra.launcher.nodes={cfg.trainer.num_nodes} (hydra/launcher=slurm sets both)")
    # submitit's local executor shows a job only gpus_per_node GPUs (none when unset: CUDA_VISIBLE_DEVICES=""), where
    # trainer.accelerator=auto would then train on the CPU.
    if launcher._target_.endswith("LocalLauncher") and (launcher.gpus_per_node or 0) < per_node \
            and (cfg.trainer.accelerator in ("gpu", "cuda") or cfg.trainer.accelerator == "auto" and cuda_here()):
        raise ConfigError(f"hydra/launcher=submitit_local shows each job hydra.launcher.gpus_per_node="
                          f"{launcher.gpus_per_node} GPUs, and trainer.devices={per_node} GPUs are needed "
                          f"(trainer.accelerator={cfg.trainer.accelerator}); add hydra.launcher.gpus_per_node="
                          f"{per_node}, or trainer.accelerator=cpu to train on the CPU")


def _devices_known(cfg: DictConfig) -> bool:
    devices = cfg.trainer.devices
    return devices in ("auto", -1) or isinstance(devices, int) and not isinstance(devices, bool)
