"""The seed rule's type-I error: how often a cell with no true difference ends on a 95% interval that excludes zero,
when seeds are added only where the first ones left the answer open (optional stopping), against a fixed number.

The study ran 5 seeds per cell and added seeds 6–10 where the 5-seed paired interval included zero or was wider
than ±0.005 bpb (a few cells ran 3, then 4–5 by the same rule). Under the null (true Δ = 0, per-seed Δ normal with
standard deviation sd) the simulation draws each cell's seeds once and applies the rule to the first 5, then 10."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from xsa_exp.report.runs import ReportError
from xsa_exp.report.stats import CONFIDENCE, t_quantile

SDS = (0.001, 0.002, 0.005, 0.01)  # per-seed SD of Δ val/bpb: the study's cells span about this
STAGES = (5, 10)
MAX_HALF_WIDTH = 0.005
SIMULATIONS = 100_000
SEED = 0


@dataclass(frozen=True)
class RuleError:
    """Type-I error rates at one per-seed SD: with stages[-1] seeds always, and with the rule."""

    sd: float
    fixed: float
    rule: float
    mean_seeds: float  # the seeds the rule used, on average


def interval_excludes_zero(deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of per-seed Δs: whether its 95% t-interval excludes zero, and the interval's half-width."""
    n = deltas.shape[1]
    half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * deltas.std(axis=1, ddof=1) / math.sqrt(n)
    return np.abs(deltas.mean(axis=1)) > half, half


def under_rule(deltas: np.ndarray, stages: tuple[int, ...], max_half_width: float) -> tuple[np.ndarray, np.ndarray]:
    """Per cell (a row of per-seed Δs): whether the rule ends on an interval that excludes zero, and the seeds it
    used. At each stage but the last a cell stops where its interval excludes zero and its half-width is at most
    max_half_width; the others go on to the next stage's seeds, the first ones kept."""
    rejected, seeds, running = (np.zeros(len(deltas), dtype=bool), np.zeros(len(deltas), dtype=int),
                                np.ones(len(deltas), dtype=bool))
    for n in stages:
        excludes, half = interval_excludes_zero(deltas[:, :n])
        stop = running & ((excludes & (half <= max_half_width)) | (n == stages[-1]))
        rejected |= stop & excludes
        seeds[stop] = n
        running &= ~stop
    return rejected, seeds


def simulate(sds=SDS, stages=STAGES, max_half_width: float = MAX_HALF_WIDTH, simulations: int = SIMULATIONS,
             seed: int = SEED) -> list[RuleError]:
    """The type-I error of "the 95% interval excludes zero" at each per-seed SD, over `simulations` null cells."""
    stages = tuple(stages)
    if stages[0] < 2 or any(a >= b for a, b in zip(stages, stages[1:])):
        raise ReportError(f"--stages {' '.join(map(str, stages))}: give increasing seed counts from 2 up, e.g. 5 10")
    if not all(sd > 0 for sd in sds):  # NaN too
        raise ReportError(f"--sd {' '.join(f'{sd:g}' for sd in sds)}: every per-seed SD must be a positive number")
    if simulations < 1:
        raise ReportError(f"--simulations {simulations}: give at least 1")
    if not max_half_width > 0:
        raise ReportError(f"--max-half-width {max_half_width:g}: give a positive number")
    # The same standard normal draws at every SD (common random numbers): the fixed design's rate, which no scale
    # changes, is then the same number in every row, and the rows differ by the rule alone.
    z = np.random.default_rng(seed).standard_normal((simulations, stages[-1]))
    fixed = float(interval_excludes_zero(z)[0].mean())
    errors = []
    for sd in sds:
        rejected, seeds = under_rule(sd * z, stages, max_half_width)
        errors.append(RuleError(sd, fixed, float(rejected.mean()), float(seeds.mean())))
    return errors


def describe(sds=SDS, stages=STAGES, max_half_width: float = MAX_HALF_WIDTH, simulations: int = SIMULATIONS,
             seed: int = SEED) -> str:
    """The simulation's result as printed by python -m xsa_exp.report --seed-rule."""
    errors = simulate(sds, stages, max_half_width, simulations, seed)
    stages = tuple(stages)
    steps = ", then ".join(map(str, stages))

    def rate(p: float) -> str:  # with 1.96 binomial standard errors: the simulation's own uncertainty
        return f"{p:.4f} ± {1.96 * math.sqrt(p * (1 - p) / simulations):.4f}"

    rows = [f"| {e.sd:g} | {rate(e.fixed)} | {rate(e.rule)} | {e.mean_seeds:.2f} |" for e in errors]
    return "\n".join([
        f"The seed rule under the null (true Δ = 0, per-seed Δ normal with the given SD): {simulations:,} simulated "
        f"cells per SD, numpy seed {seed}. Type-I error: the share of cells whose final 95% t-interval excludes zero "
        f"(nominal 0.05). Rule: {steps} seeds, stopping at a stage where the interval excludes zero and its "
        f"half-width is at most {max_half_width:g}.", "",
        f"| SD of Δ | fixed {stages[-1]} seeds | the rule | seeds used (mean) |",
        "| --- | --- | --- | --- |", *rows])
