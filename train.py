"""Train one model: python train.py [depth=d12] [xsa.alpha=0] [...]; -m for sweeps. See README."""

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict

from xsa_exp.config import check_command_line
from xsa_exp.errors import exit_on_user_error

CONF_DIR = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from xsa_exp.training import train  # imported here so config errors stay fast

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN and cfg.logger.wandb is not None and cfg.logger.wandb.group is None:
        with open_dict(cfg):  # one wandb group per sweep, named like its directory
            cfg.logger.wandb.group = Path(hydra_cfg.sweep.dir).name
    with exit_on_user_error():
        train(cfg, hydra_cfg.runtime.output_dir)


if __name__ == "__main__":
    check_command_line("train", CONF_DIR)  # every key and sweep job, before Hydra creates anything
    main()
