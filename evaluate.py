"""Evaluate a trained run: python evaluate.py run=<run dir or checkpoint>
[eval.metrics=[bpb,core,diagnostics,chatcore]]. See README."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from xsa_exp.config import check_command_line
from xsa_exp.errors import exit_on_user_error

CONF_DIR = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from xsa_exp.evaluate_run import evaluate

    with exit_on_user_error():
        evaluate(cfg)


if __name__ == "__main__":
    check_command_line("evaluate", CONF_DIR)  # every key, before anything is loaded
    main()
