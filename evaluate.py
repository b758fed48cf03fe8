"""Evaluate a trained run: python evaluate.py run=<run dir or checkpoint> [eval.metrics=[bpb,core,diagnostics,chatcore]]. See README."""

import sys

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from xsa_exp.evaluation import EvaluationError, evaluate

    try:
        evaluate(cfg)
    except EvaluationError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
