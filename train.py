"""Train one model: python train.py [depth=d12] [xsa.alpha=0] [...]; -m for sweeps. See README."""

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from xsa_exp.config.preflight import run_app
from xsa_exp.config.sweep import name_wandb_group
from xsa_exp.errors import one_line_per_job


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from xsa_exp.training.run import train  # imported here so config errors stay fast

    hydra_cfg = HydraConfig.get()
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    if in_sweep:
        name_wandb_group(cfg, hydra_cfg.sweep.dir)
    with one_line_per_job(in_sweep):  # a failed sweep job is one line, and the sweep goes on
        train(cfg, hydra_cfg.runtime.output_dir)


if __name__ == "__main__":
    run_app(main, "train")  # the preflight callback (conf/train.yaml) checks every run and sweep job first
