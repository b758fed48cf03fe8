"""Train one model: python train.py [depth=d12] [xsa.alpha=0] [...]; -m for sweeps. See README."""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from xsa_exp.config import check_group_options

CONF_DIR = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from xsa_exp.training import train  # imported here so config errors stay fast

    train(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    check_group_options(sys.argv[1:], CONF_DIR)
    main()
