"""Train one model: python train.py [depth=d12] [xsa.alpha=0] [...]; -m for sweeps. See README."""

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from xsa_exp.config.preflight import run_app
from xsa_exp.config.sweep import name_wandb_group
from xsa_exp.errors import exit_on_user_error


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from xsa_exp.training.run import train  # imported here so config errors stay fast

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        name_wandb_group(cfg, hydra_cfg.sweep.dir)
    with exit_on_user_error():
        train(cfg, hydra_cfg.runtime.output_dir)


if __name__ == "__main__":
    run_app(main, "train")  # the preflight callback (conf/train.yaml) checks every run and sweep job first
