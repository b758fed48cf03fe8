"""The arithmetic of a run: how many processes train it, how many micro-batches make one update, and how
many updates it takes. Used by the checks (before a run starts) and by training (which records the results in
run.json)."""

from __future__ import annotations

from omegaconf import DictConfig

from xsa_exp.errors import ConfigError


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


def max_steps(train_cfg: DictConfig, model, datamodule) -> int:
    """The run's length in updates: the first set of train.max_steps, target_tokens, epochs (of a corpus held in
    memory), else param_data_ratio x (hidden-matrix + lm_head parameters) tokens."""
    if train_cfg.max_steps:
        return int(train_cfg.max_steps)
    if train_cfg.target_tokens:
        return max(1, int(train_cfg.target_tokens) // train_cfg.total_batch_tokens)
    if train_cfg.epochs:
        datamodule.setup()
        return max(1, train_cfg.epochs * datamodule.epoch_tokens // train_cfg.total_batch_tokens)
    counts = model.param_counts()
    scaling_params = counts["hidden matrices"] + model.lm_head.weight.numel()
    return max(1, round(train_cfg.param_data_ratio * scaling_params / train_cfg.total_batch_tokens))
