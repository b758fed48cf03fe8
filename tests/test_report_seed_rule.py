"""The seed rule's type-I error under the null (python -m xsa_exp.report --seed-rule)."""

from __future__ import annotations

import math

import pytest

from xsa_exp.report import ReportError, main
from xsa_exp.report.seed_rule import simulate


def test_a_fixed_number_of_seeds_keeps_its_five_percent():
    simulations = 20_000
    errors = simulate(sds=(0.001, 0.01), stages=(5, 10), simulations=simulations, seed=1)
    tolerance = 4 * math.sqrt(0.05 * 0.95 / simulations)  # 4 binomial standard errors
    assert all(abs(e.fixed - 0.05) < tolerance for e in errors)
    # Optional stopping: stopping at 5 seeds on an early "excludes zero" adds false calls; with a per-seed SD small
    # beside the half-width bound nearly every early call stops, and the rate is well above 5%.
    assert errors[0].rule > 0.05 + tolerance and 5 < errors[0].mean_seeds < 10
    one_stage = simulate(sds=(0.001,), stages=(10,), simulations=simulations, seed=1)[0]
    assert one_stage.rule == one_stage.fixed and one_stage.mean_seeds == 10


def test_the_simulation_is_deterministic_given_its_seed(capsys):
    first = simulate(sds=(0.002, 0.005), simulations=5_000, seed=7)
    assert simulate(sds=(0.002, 0.005), simulations=5_000, seed=7) == first
    assert simulate(sds=(0.002, 0.005), simulations=5_000, seed=8) != first
    main(["--seed-rule", "--sd", "0.002", "--simulations", "5000", "--seed", "7", "--stages", "3", "5"])
    out = capsys.readouterr().out
    assert "5,000 simulated cells per SD, numpy seed 7" in out and "Rule: 3, then 5 seeds" in out
    assert "| SD of Δ | fixed 5 seeds | the rule | seeds used (mean) |" in out
    for kwargs, message in [({"stages": (5, 5)}, r"--stages 5 5: give increasing seed counts from 2 up, e.g. 5 10"),
                            ({"sds": (0.002, float("nan"))}, r"--sd 0.002 nan: every per-seed SD must be a positive"),
                            ({"simulations": 0}, r"--simulations 0: give at least 1"),
                            ({"max_half_width": -1.0}, r"--max-half-width -1: give a positive number")]:
        with pytest.raises(ReportError, match=f"^{message}"):
            simulate(**kwargs)
