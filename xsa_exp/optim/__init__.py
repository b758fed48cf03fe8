from xsa_exp.optim.groups import build_param_groups
from xsa_exp.optim.muon_adamw import MuonAdamW, orthogonalize
from xsa_exp.optim.schedule import OptimizerSchedule

__all__ = ["MuonAdamW", "OptimizerSchedule", "build_param_groups", "orthogonalize"]
