"""Evaluate a trained run: python evaluate.py run=<run dir or checkpoint>
[eval.metrics=[bpb,core,diagnostics,chatcore]]. See README."""

import hydra
from omegaconf import DictConfig

from xsa_exp.config.preflight import run_app
from xsa_exp.errors import exit_on_user_error


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from xsa_exp.evaluate_run import evaluate

    with exit_on_user_error():
        evaluate(cfg)


if __name__ == "__main__":
    run_app(main, "evaluate")  # the preflight callback (conf/evaluate.yaml) checks the settings first
