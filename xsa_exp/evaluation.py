"""Former name of xsa_exp.evaluate_run, kept only while evaluate.py imports it from here
(the one-line change there: `from xsa_exp.evaluate_run import EvaluationError, evaluate`); then delete this file."""

from xsa_exp.evaluate_run import EvaluationError, evaluate  # noqa: F401
