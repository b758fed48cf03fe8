"""Statistics: means with t-intervals, their t-tests and prediction intervals, Holm's adjustment, paired
differences over seeds, the paired bootstrap over examples, relative changes, seed bands of curves and loss
spikes."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from xsa_exp import run_dir as rd
from xsa_exp.report.runs import HEADLINE, Run

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
# A relative change is printed only when the baseline mean is at least this: below it (negative, zero or near
# zero, as centered CORE scores of small models are) a percentage of the baseline means nothing.
RELATIVE_MIN_BASELINE = 0.05
# Loss spikes: after the first WARMUP_FRACTION of the run's steps, a spike starts at a step whose train/loss
# is more than SPIKE_RISE (relative) above the lowest train/loss_smooth reached before that step; consecutive
# such steps are one spike.
SPIKE_RISE = 0.2
WARMUP_FRACTION = 0.1


@dataclass(frozen=True)
class Estimate:
    """A mean (or difference) with its 95% interval; low and high are None when there is no interval. sd: the
    standard deviation (ddof=1) of the values behind a t-interval, None for one value and for the bootstrap."""

    value: float
    low: float | None
    high: float | None
    n: int
    sd: float | None = None

    @classmethod
    def from_interval(cls, value: float, low: float, high: float, n: int) -> Estimate:
        """The Estimate of a mean ± 95% t-interval over n values, its sd recovered from the half-width
        h = t(0.975, n−1)·sd/√n: what numbers.csv keeps of a t-interval is all its t-test needs."""
        return cls(value, low, high, n, (high - low) / 2 * math.sqrt(n) / t_quantile(0.5 + CONFIDENCE / 2, n - 1))

    @property
    def p(self) -> float | None:
        """Two-sided p of the one-sample t-test of a zero mean: the test the 95% t-interval inverts, so p < 0.05
        exactly where the interval excludes zero (NaN for a non-finite value or sd; None without a t-interval)."""
        if self.sd is None:
            return None
        se = self.sd / math.sqrt(self.n)
        if not (math.isfinite(self.value) and math.isfinite(se)):
            return math.nan
        if se == 0:  # every value the same: an interval of one point, which holds zero or not
            return float(self.value == 0)
        return float(2 * stats.t.sf(abs(self.value) / se, self.n - 1))

    @property
    def prediction(self) -> tuple[float, float] | None:
        """95% prediction interval of one more value (for a paired Δ, one new seed pair): mean ± t(0.975, n−1)·sd·
        √(1 + 1/n). It is the spread a single rerun shows, where the t-interval is the mean's."""
        if self.sd is None:
            return None
        half = t_quantile(0.5 + CONFIDENCE / 2, self.n - 1) * self.sd * math.sqrt(1 + 1 / self.n)
        return self.value - half, self.value + half

    @property
    def significant(self) -> str:
        # A non-finite value (a diverged seed) gives a NaN interval, which no comparison with zero would catch.
        if self.low is None or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return "n.a."
        return "no" if self.low <= 0 <= self.high else "yes"


def t_quantile(p: float, df: int) -> float:
    return float(stats.t.ppf(p, df))


def mean_ci(values) -> Estimate:
    """Mean and 95% t-interval over the values (no interval for one value)."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return Estimate(mean, None, None, len(x))
    sd = float(x.std(ddof=1))
    half = t_quantile(0.5 + CONFIDENCE / 2, len(x) - 1) * sd / math.sqrt(len(x))
    return Estimate(mean, mean - half, mean + half, len(x), sd)


def holm(p_values: dict) -> dict:
    """Holm's step-down adjustment of a family of p-values (key -> p), as R's p.adjust(method="holm"): the i-th
    smallest of m times (m − i + 1), raised to the largest such product before it, at most 1. Calling adjusted
    p < α significant keeps the chance of any false call in the family at most α, whatever the tests' dependence."""
    adjusted, running = {}, 0.0
    for i, key in enumerate(sorted(p_values, key=p_values.get)):
        running = max(running, min(1.0, (len(p_values) - i) * p_values[key]))
        adjusted[key] = running
    return adjusted


def family_of(key: tuple) -> tuple:
    """A test's family, by its numbers.csv key (depth, arm, metric, statistic): the report's tests of one metric and
    one kind (every arm's paired Δ val/bpb; every setting's Δ − the reference's Δ; the λ_x0 change in layer 0; ...),
    the question each kind of test answers."""
    return key[2], key[3]


def holm_by_family(p_values: dict) -> tuple[dict, dict]:
    """Holm's adjustment within each family (family_of); returns key -> adjusted p and key -> its family's size."""
    families = defaultdict(dict)
    for key, p in p_values.items():
        families[family_of(key)][key] = p
    adjusted, size = {}, {}
    for members in families.values():
        adjusted |= holm(members)
        size |= dict.fromkeys(members, len(members))
    return adjusted, size


def by_seed(runs: list[Run], metric: str) -> dict[int, float]:
    """The metric per seed (reruns of a seed averaged)."""
    values = defaultdict(list)
    for run in runs:
        if metric in run.finals:
            values[run.seed].append(run.finals[metric])
    return {seed: float(np.mean(v)) for seed, v in values.items()}


def seed_differences(runs: list[Run], baseline: list[Run], metric: str) -> dict[int, float]:
    """seed -> arm − baseline, for the seeds both have."""
    arm, base = by_seed(runs, metric), by_seed(baseline, metric)
    return {s: arm[s] - base[s] for s in sorted(arm.keys() & base.keys())}


def paired_difference(runs: list[Run], baseline: list[Run], metric: str) -> Estimate | None:
    """Mean ± CI of (arm − baseline) over the seeds both have."""
    diffs = seed_differences(runs, baseline, metric)
    return mean_ci(list(diffs.values())) if diffs else None


def by_seed_and_step(runs: list[Run], column: str) -> pd.Series:
    """A column of metrics.csv per (step, seed) at which a seed's runs logged it, reruns of a seed averaged; a
    non-finite value logged (a diverged run) stays NaN, where a step not logged has no entry."""
    frames = [pd.DataFrame({"step": rows["step"].to_numpy(dtype=int), "seed": run.seed,
                            "value": rows[column].to_numpy(dtype=float)})
              for run in runs if not (rows := run.rows(column)).empty]
    if not frames:
        return pd.Series(dtype=float, index=pd.MultiIndex.from_arrays([[], []], names=["step", "seed"]))
    values = pd.concat(frames).replace([np.inf, -np.inf], np.nan).groupby(["step", "seed"])["value"]
    return values.mean().where(values.count() == values.size())  # NaN where any rerun logged one


def paired_difference_by_step(runs: list[Run], baseline: list[Run], column: str) -> dict[int, Estimate]:
    """step -> mean ± CI of (arm − baseline) of the column at that step, over the seeds both logged it at (NaN,
    with no interval, where one of them had diverged there)."""
    arm, base = by_seed_and_step(runs, column).align(by_seed_and_step(baseline, column), join="inner")
    return {int(step): mean_ci(differences.to_numpy()) for step, differences in (arm - base).groupby(level="step")}


def interaction(first: dict[int, float], second: dict[int, float]) -> Estimate | None:
    """Mean ± CI over the seeds both have of first[seed] − second[seed] (a difference of paired differences)."""
    shared = sorted(first.keys() & second.keys())
    return mean_ci([first[s] - second[s] for s in shared]) if shared else None


def relative_change(diff: float, base: float) -> float | None:
    """100 · diff / base in %, or None (printed "n/a") unless base ≥ RELATIVE_MIN_BASELINE."""
    if not (math.isfinite(base) and math.isfinite(diff)) or base < RELATIVE_MIN_BASELINE:
        return None
    return 100 * diff / base


def band(runs: list[Run], column: str) -> pd.DataFrame:
    """A column of metrics.csv over the seeds (reruns of a seed averaged), per step: step, tokens (mean
    tokens_seen), mean, low (min over the seeds), high (max) and n (seeds with a finite value there)."""
    values = by_seed_and_step(runs, column).unstack("seed")
    if values.empty:
        return pd.DataFrame(columns=["step", "tokens", "mean", "low", "high", "n"])
    tokens = pd.concat(run.rows(column).reindex(columns=["step", "tokens_seen"]) for run in runs)
    tokens = tokens.groupby("step")["tokens_seen"].mean()
    return pd.DataFrame({"tokens": tokens, "mean": values.mean(axis=1), "low": values.min(axis=1),
                         "high": values.max(axis=1), "n": values.count(axis=1)}).rename_axis("step").reset_index()


def count_spikes(steps, loss, smooth, warmup_steps: float) -> int:
    """Loss spikes (see SPIKE_RISE): steps after warmup_steps where loss > (1 + SPIKE_RISE) × the lowest smoothed
    loss of the earlier steps, consecutive ones counted once. Non-finite losses are divergence, not spikes."""
    lowest, spikes, in_spike = math.inf, 0, False
    for step, raw, smoothed in zip(steps, loss, smooth):
        rising = step > warmup_steps and math.isfinite(raw) and raw > (1 + SPIKE_RISE) * lowest
        spikes += rising and not in_spike
        in_spike = rising
        if math.isfinite(smoothed):
            lowest = min(lowest, smoothed)
    return int(spikes)


def run_spikes(run: Run) -> int:
    rows = run.rows("train/loss")
    if rows.empty or "train/loss_smooth" not in rows:
        return 0
    return count_spikes(rows["step"], rows["train/loss"], rows["train/loss_smooth"], WARMUP_FRACTION * run.max_steps)


# -----------------------------------------------------------------------------
# The paired bootstrap over (Chat)CORE examples

# Per-example results of each aggregate: files, the tasks file's task column, and its baseline as a fraction
# (CORE's tasks file keeps the bundle's percent).
EXAMPLE_FILES = {
    "CORE": (rd.CORE_EXAMPLES, rd.CORE_TASKS, "label", lambda row: float(row["random_baseline"]) / 100),
    "ChatCORE": (rd.CHATCORE_EXAMPLES, rd.CHATCORE_TASKS, "task", lambda row: float(row["baseline"])),
}


def aggregate_of(metric: str) -> str | None:
    """"CORE" or "ChatCORE" for their headline metrics (also "CORE 18/22", "ChatCORE 4/5"), else None."""
    match = HEADLINE.fullmatch(metric)
    return None if match is None else ("ChatCORE" if match.group(1) else "CORE")


def example_answers(folder: Path, aggregate: str) -> tuple[dict[tuple[str, int], float], dict[str, float]] | None:
    """(task, index) -> correct (0 or 1) from the evaluation's examples file, and task -> baseline (fraction)."""
    examples, tasks, task_column, baseline = EXAMPLE_FILES[aggregate]
    if not (folder / examples).is_file() or not (folder / tasks).is_file():
        return None
    with open(folder / examples) as f:
        answers = {(e["task"], e["index"]): float(bool(e["correct"])) for e in map(json.loads, filter(str.strip, f))}
    with open(folder / tasks, newline="") as f:
        baselines = {row[task_column]: baseline(row) for row in csv.DictReader(f)}
    return answers, baselines


def seed_answers(folders: list[Path], aggregate: str) -> tuple[dict[tuple[str, int], float], dict[str, float]] | None:
    """example_answers of one seed: its reruns' correctness averaged per example (on the examples all answered), as
    the paired Δ averages the reruns' metrics."""
    loaded = [example_answers(folder, aggregate) for folder in folders]
    if not loaded or any(one is None for one in loaded):
        return None
    if len(loaded) == 1:
        return loaded[0]
    shared = set.intersection(*(set(answers) for answers, _ in loaded))
    return {key: sum(answers[key] for answers, _ in loaded) / len(loaded) for key in shared}, loaded[0][1]


def bootstrap_examples(pairs: list[tuple[list[Path], list[Path]]], aggregate: str,
                       resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Estimate | None:
    """Paired bootstrap of a CORE or ChatCORE difference (arm − baseline) over its examples.

    pairs: (arm eval folders, baseline eval folders) for each shared seed, the seed's reruns each. The difference
    is the mean over tasks of the centered accuracy difference, averaged over the pairs, on the examples (task +
    index) that every folder answered; examples are resampled within tasks, the same draw for every pair."""
    loaded = [(seed_answers(a, aggregate), seed_answers(b, aggregate)) for a, b in pairs]
    if not loaded or any(a is None or b is None for a, b in loaded):
        return None
    baselines = loaded[0][0][1]
    by_task = defaultdict(list)
    for task, index in sorted(set.intersection(*(set(a[0]) & set(b[0]) for a, b in loaded))):
        if task in baselines:
            by_task[task].append(index)
    if not by_task:
        return None
    rng = np.random.default_rng(seed)
    observed, draws, n_examples = 0.0, np.zeros(resamples), 0
    for task, index in by_task.items():
        # Per example: the correctness difference, averaged over the seed pairs.
        diff = np.mean([[a[0][task, i] - b[0][task, i] for i in index] for a, b in loaded], axis=0)
        scale = 1 - baselines[task]  # centered accuracy = (acc - b) / (1 - b)
        # A resample's mean depends only on how often each distinct value is drawn, so drawing those counts
        # (multinomial) is the same bootstrap as drawing examples, without a resamples x examples array.
        values, counts = np.unique(diff, return_counts=True)
        draws += rng.multinomial(len(diff), counts / len(diff), size=resamples) @ values / len(diff) / scale
        observed += diff.mean() / scale
        n_examples += len(diff)
    low, high = np.percentile(draws / len(by_task), [2.5, 97.5])
    return Estimate(observed / len(by_task), float(low), float(high), n_examples)
