"""The arithmetic of a run: how many processes train it, how many tokens make one update (given, or derived by
nanochat's batch rule), how many micro-batches that is, how many updates the run takes and whether the lr schedule's
warmup and warmdown fit in them, and the learning-rate factor and Muon weight decay nanochat derives with the batch.
Used by the checks (before a run starts) and by training (which prints the results and records them in run.json).
Works on the composed config or its typed settings alike.

nanochat's hyperparameter transfer, as its scripts/base_train.py (94b73ad) does it from its d12 reference:
  horizon      D     = int(param_data_ratio x scaling parameters)   (transformer matrices + lm_head)
  reference    D_ref = param_data_ratio x scaling parameters of nanochat's d12 (768 wide, 6 heads of 128)
  batch        B     = 2^round(log2(2^19 x (D / D_ref)^0.383))      (Power Lines), unless given
  learning rates     x sqrt(B / 2^19)                                (every AdamW and Muon lr but the smear gate's)
  Muon weight decay  x sqrt(B / 2^19) x D_ref / D                    (constant T_epoch)
  length             D // B updates
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xsa_exp.errors import ConfigError
from xsa_exp.model.layout import value_embedding_layers

NANOCHAT_B_REF = 2**19        # tokens per update at which nanochat tuned its d12
NANOCHAT_REF_DEPTH = 12       # its reference model
NANOCHAT_ASPECT_RATIO = 64    # width = depth x 64, ...
NANOCHAT_HEAD_DIM = 128       # ... rounded up to heads of 128
NANOCHAT_VE_GATE_CHANNELS = 12
NANOCHAT_VOCAB_MULTIPLE = 64  # nanochat pads its vocabulary to a multiple of 64


def world_size(trainer_cfg) -> int:
    devices = trainer_cfg.devices
    if devices in ("auto", -1):
        import torch

        devices = max(1, torch.cuda.device_count()) if trainer_cfg.accelerator in ("auto", "gpu", "cuda") else 1
    return int(devices) * int(trainer_cfg.num_nodes)


def nanochat_shape(n_layer: int) -> tuple[int, int]:
    """(width, heads) of nanochat's depth-n_layer model: n_layer x 64 rounded up to heads of 128."""
    width = -(-n_layer * NANOCHAT_ASPECT_RATIO // NANOCHAT_HEAD_DIM) * NANOCHAT_HEAD_DIM
    return width, width // NANOCHAT_HEAD_DIM


def scaling_params(n_layer: int, n_embd: int, n_head: int, n_kv_head: int | None, vocab_size: int,
                   value_embeds: bool, ve_gate_channels: int) -> int:
    """The parameters nanochat's scaling laws count: every matrix of the transformer blocks (attention, MLP and the
    value-embedding gates) and lm_head. GPT.param_counts()'s hidden matrices + lm_head, without building the model."""
    kv_heads = n_kv_head or n_head
    kv_dim = kv_heads * (n_embd // n_head)
    per_layer = 2 * n_embd * n_embd + 2 * n_embd * kv_dim + 8 * n_embd * n_embd  # q, proj; k, v; MLP in and out
    gates = len(value_embedding_layers(n_layer, value_embeds)) * ve_gate_channels * kv_heads
    return n_layer * per_layer + gates + vocab_size * n_embd


def model_scaling_params(model_cfg) -> int:
    m = model_cfg
    return scaling_params(m.n_layer, m.n_embd, m.n_head, m.n_kv_head, m.vocab_size, m.value_embeds, m.ve_gate_channels)


def nanochat_reference_params(model_cfg) -> int:
    """nanochat's d12 at this run's vocabulary (padded as nanochat pads it)."""
    width, heads = nanochat_shape(NANOCHAT_REF_DEPTH)
    vocab = -(-model_cfg.vocab_size // NANOCHAT_VOCAB_MULTIPLE) * NANOCHAT_VOCAB_MULTIPLE
    return scaling_params(NANOCHAT_REF_DEPTH, width, heads, heads, vocab, True, NANOCHAT_VE_GATE_CHANNELS)


@dataclass(frozen=True)
class Transfer:
    """What nanochat's rules give a run: its batch (derived, or as given), the factor on the learning rates and the
    Muon weight decay."""
    batch_tokens: int
    batch_derived: bool
    lr_factor: float
    muon_weight_decay: float
    horizon_tokens: int      # D
    reference_tokens: float  # D_ref

    def describe(self) -> str:
        ratio = self.horizon_tokens / self.reference_tokens
        batch = f"{self.batch_tokens:,} tokens ({'derived' if self.batch_derived else 'as given'})"
        return (f"nanochat transfer: horizon {self.horizon_tokens:,} tokens = {ratio:.3f} x d12's; batch {batch}; "
                f"lr x {self.lr_factor:.4f} (sqrt(batch / 2^19)); Muon weight decay {self.muon_weight_decay:.6f}")

    def as_dict(self) -> dict:
        return {"batch_tokens": self.batch_tokens, "batch_derived": self.batch_derived, "lr_factor": self.lr_factor,
                "muon_weight_decay": self.muon_weight_decay, "horizon_tokens": self.horizon_tokens,
                "reference_tokens": self.reference_tokens}


def nanochat_transfer(cfg) -> Transfer | None:
    """nanochat's hyperparameter transfer for this run (optim.nanochat_transfer), else None."""
    if not cfg.optim.nanochat_transfer:
        return None
    horizon = int(cfg.train.param_data_ratio * model_scaling_params(cfg.model))
    reference = cfg.train.param_data_ratio * nanochat_reference_params(cfg.model)
    given = cfg.train.total_batch_tokens
    batch = given or 2 ** round(math.log2(NANOCHAT_B_REF * (horizon / reference) ** 0.383))
    ratio = batch / NANOCHAT_B_REF
    lr_factor = ratio**0.5 if ratio != 1.0 else 1.0
    weight_decay = cfg.optim.muon.weight_decay * math.sqrt(ratio) * (reference / horizon)
    return Transfer(batch, given is None, lr_factor, weight_decay, horizon, reference)


def transfer_figure(name: str, *, _root_):
    """optim.transfer's keys (the resolver ${nanochat_transfer:<name>}): one figure of nanochat_transfer(cfg)."""
    return getattr(nanochat_transfer(_root_), name, None)


def batch_tokens(cfg) -> int:
    """Tokens per update: train.total_batch_tokens, or nanochat's batch rule's where that is null."""
    if cfg.train.total_batch_tokens is not None:
        return int(cfg.train.total_batch_tokens)
    transfer = nanochat_transfer(cfg)
    if transfer is None:
        raise ConfigError("train.total_batch_tokens is not set; give it (e.g. 524288), or derive it by nanochat's "
                          "rule with optim.nanochat_transfer=true (stack=nanochat_2604 sets it)")
    return transfer.batch_tokens


def grad_accumulation(cfg) -> int:
    tokens = batch_tokens(cfg)
    per_micro_batch = cfg.train.device_batch_size * cfg.model.sequence_len * world_size(cfg.trainer)
    if tokens % per_micro_batch:
        raise ConfigError(
            f"train.total_batch_tokens={tokens} is not a multiple of train.device_batch_size x "
            f"model.sequence_len x devices = {per_micro_batch}; change one of them")
    return tokens // per_micro_batch


def max_steps(cfg, datamodule) -> int:
    """The run's length in updates: the first set of train.max_steps, target_tokens, epochs (of a corpus held in
    memory), else param_data_ratio x scaling parameters tokens (nanochat's compute-optimal horizon)."""
    train, tokens = cfg.train, batch_tokens(cfg)
    if train.max_steps:
        return int(train.max_steps)
    if train.target_tokens:
        return max(1, int(train.target_tokens) // tokens)
    if train.epochs:
        datamodule.setup()
        return max(1, train.epochs * datamodule.epoch_tokens // tokens)
    return max(1, int(train.param_data_ratio * model_scaling_params(cfg.model)) // tokens)


def check_schedule(total_steps: int, warmup_steps: int, warmdown_frac: float) -> int:
    """The lr warmup and warmdown must fit in the run's updates; returns the warmdown's length in updates."""
    warmdown_steps = round(warmdown_frac * total_steps)
    if warmup_steps + warmdown_steps > total_steps:
        raise ConfigError(f"optim.schedule.warmup_steps={warmup_steps} + the warmdown ({warmdown_steps} steps) "
                          f"exceed the run's {total_steps} steps; shorten the warmup (e.g. "
                          "optim.schedule.warmup_steps=0)")
    return warmdown_steps
