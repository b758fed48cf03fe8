"""Route every model parameter to one param group of MuonAdamW, by its role (PARAM_ROLES, next to the model)."""

from __future__ import annotations

from xsa_exp.config.arithmetic import Transfer
from xsa_exp.config.schema import OptimConfig
from xsa_exp.model.gpt import ROLE_BY_NAME
from xsa_exp.optim.muon_adamw import AdamWGroup, MuonGroup
from xsa_exp.precision import newton_schulz_dtype


def build_param_groups(model, optim_cfg: OptimConfig, transfer: Transfer | None, compiled: bool) -> list[dict]:
    """Every key of each group from the config (MuonGroup, AdamWGroup), ns_dtype=auto resolved for the device the
    model is on. transfer: nanochat's lr factor and Muon weight decay for this run (optim.nanochat_transfer), or
    None; compiled: train.compile, Muon's step as one torch.compile graph per shape group unless optim.muon.compile
    says otherwise."""
    width_scale = (model.config.n_embd / 768) ** -0.5 if optim_cfg.width_lr_scaling else 1.0
    adamw = optim_cfg.adamw
    ns_dtype, _ = newton_schulz_dtype(optim_cfg.muon.ns_dtype, cuda=next(model.parameters()).is_cuda)
    groups = []
    for role, named in model.named_param_groups().items():
        params = [p for _, p in named]
        lr = float(getattr(optim_cfg.lr, role)) * optim_cfg.lr_scale
        if transfer is not None and ROLE_BY_NAME[role].batch_scaled_lr:
            lr *= transfer.lr_factor
        if ROLE_BY_NAME[role].muon and optim_cfg.matrix_algorithm == "muon":
            muon = optim_cfg.muon
            weight_decay = muon.weight_decay if transfer is None else transfer.muon_weight_decay
            groups.append(MuonGroup(role=role, algorithm="muon", params=params, lr=lr, momentum=float(muon.momentum),
                                    nesterov=bool(muon.nesterov), ns_steps=int(muon.ns_steps),
                                    ns_coefficients=str(muon.ns_coefficients), ns_dtype=ns_dtype,
                                    sharded=bool(muon.sharded),
                                    compiled=compiled if muon.compile is None else bool(muon.compile),
                                    weight_decay=float(weight_decay),
                                    cautious_weight_decay=bool(muon.cautious_weight_decay),
                                    variance_reduction=bool(muon.variance_reduction), beta2=float(muon.beta2)))
            continue
        if ROLE_BY_NAME[role].width_scaled_lr:
            lr *= width_scale
        wd = float(adamw.role_weight_decay.get(
            role, adamw.matrix_weight_decay if ROLE_BY_NAME[role].muon else adamw.weight_decay))
        betas = tuple(float(b) for b in adamw.role_betas.get(role, adamw.betas))
        groups.append(AdamWGroup(role=role, algorithm="adamw", params=params, lr=lr, betas=betas,
                                 eps=float(adamw.eps), weight_decay=wd, fused=bool(adamw.fused)))
    return groups
