"""The study's comparisons: arms and their baselines, optimizer × XSA, learning-rate stability, the trend
with model size and the measured step time."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from xsa_exp.arm import Arm
from xsa_exp.report.runs import Run
from xsa_exp.report.stats import (
    Estimate,
    aggregate_of,
    bootstrap_examples,
    by_seed,
    interaction,
    mean_ci,
    paired_difference,
    paired_difference_by_step,
    relative_change,
    run_spikes,
    seed_differences,
)

# The learned residual scalars (x = λ_resid[i]·x + λ_x0[i]·x0 before block i), as the diagnostics log them.
RESIDUAL_SCALARS = {"lambda/resid": "λ_resid", "lambda/x0": "λ_x0"}


@dataclass
class ArmResult:
    depth: str
    arm: Arm
    runs: list[Run]
    is_baseline: bool
    baseline: ArmResult | None = None  # the arm this one is compared with (None for a baseline)
    values: dict[str, Estimate] = field(default_factory=dict)  # metric -> mean ± CI over seeds
    paired: dict[str, Estimate] = field(default_factory=dict)  # metric -> paired difference over shared seeds
    bootstrap: dict[str, Estimate] = field(default_factory=dict)  # (Chat)CORE metric -> paired bootstrap over examples
    val_bpb_by_step: dict[int, Estimate] = field(default_factory=dict)  # step -> paired difference of val/bpb there
    # residual scalar prefix -> layer -> paired difference of its last value (layer_differences)
    layer_paired: dict[str, dict[int, Estimate]] = field(default_factory=dict)

    def delta(self, metric: str) -> tuple[float, float | None] | None:
        """(arm − baseline, the same relative to the baseline in % or None where that means nothing) of the means
        over the seeds both have, as the paired difference: a seed one arm lacks moves neither mean."""
        if self.baseline is None:
            return None
        arm, base = by_seed(self.runs, metric), by_seed(self.baseline.runs, metric)
        seeds = sorted(arm.keys() & base.keys())
        if not seeds:
            return None
        base_mean = float(np.mean([base[seed] for seed in seeds]))
        diff = float(np.mean([arm[seed] for seed in seeds])) - base_mean
        return diff, relative_change(diff, base_mean)

    def last_per_layer(self, prefix: str) -> pd.Series:
        """<prefix>/L{i} per layer at each run's last row that logged it, mean over the arm's seeds (reruns of a seed
        averaged first; empty if never logged)."""
        return pd.DataFrame(list(last_per_layer_by_seed(self.runs, prefix).values())).mean(skipna=False)

    def layer_differences(self, prefix: str) -> dict[int, Estimate]:
        """Per layer, <prefix>/L{i} at the last row that logged it, arm − baseline paired over the seeds both
        have (reruns of a seed averaged); {} for a baseline or without shared seeds."""
        if self.baseline is None:
            return {}
        arm, base = last_per_layer_by_seed(self.runs, prefix), last_per_layer_by_seed(self.baseline.runs, prefix)
        seeds = sorted(arm.keys() & base.keys())
        if not seeds:
            return {}
        differences = pd.DataFrame([arm[seed] - base[seed] for seed in seeds])
        return {int(layer): mean_ci(differences[layer]) for layer in differences.columns}  # a NaN seed: a NaN Δ

    @property
    def n_params(self) -> int:
        return int(np.median([run.n_params for run in self.runs]))

    @property
    def tokens_per_sec(self) -> float | None:
        """Median over the runs of each run's median train/tokens_per_sec (None if none was logged)."""
        medians = [run_throughput(run) for run in self.runs]
        medians = [m for m in medians if m is not None]
        return float(np.median(medians)) if medians else None

    @property
    def step_time_ratio(self) -> float | None:
        """Step time relative to the baseline arm: baseline tokens/s ÷ this arm's tokens/s (> 1: slower)."""
        mine = self.tokens_per_sec
        base = None if self.baseline is None else self.baseline.tokens_per_sec
        return None if mine is None or base is None or mine <= 0 else base / mine


def last_per_layer_by_seed(runs: list[Run], prefix: str) -> dict[int, pd.Series]:
    """seed -> <prefix>/L{i} per layer at the run's last row that logged it (reruns of a seed averaged; seeds
    whose runs never logged it left out; a rerun's non-finite value makes its seed's NaN)."""
    per_seed = defaultdict(list)
    for run in runs:
        values = run.last_per_layer(prefix)
        if not values.empty:
            per_seed[run.seed].append(values)
    return {seed: pd.DataFrame(values).mean(skipna=False) for seed, values in per_seed.items()}  # NaN: diverged


def run_throughput(run: Run) -> float | None:
    rows = run.rows("train/tokens_per_sec")["train/tokens_per_sec"].to_numpy(dtype=float)
    rows = rows[np.isfinite(rows) & (rows > 0)]
    return float(np.median(rows)) if len(rows) else None


def metric_names(runs: list[Run]) -> list[str]:
    return sorted({name for run in runs for name in run.finals}, key=lambda name: (name != "val/bpb", name))


def compare(runs: list[Run], baseline_alpha: float) -> list[ArmResult]:
    """One ArmResult per depth and arm, baselines first, with its statistics and its comparison."""
    groups = defaultdict(list)
    for run in runs:
        groups[run.depth, run.arm].append(run)
    size = {base: min(r.n_params for r in runs if r.base_depth == base) for base in {r.base_depth for r in runs}}
    # Depths by size, then their settings by value (numbers as numbers: 128 before 1024).
    depth_key = {r.depth: (size[r.base_depth], r.base_depth, tuple((k, sortable(v)) for k, v in r.settings.items()))
                 for r in runs}

    def order(key):
        depth, arm = key
        return (depth_key[depth], arm.lr_scale, arm.alpha != baseline_alpha, arm.optim, arm.alpha is None,
                arm.alpha or 0.0, arm.alpha_init or 0.0, arm.parametrization, arm.layers, arm.value_source)

    results = []
    for depth, arm in sorted(groups, key=order):
        arm_runs = sorted(groups[depth, arm], key=lambda r: (r.seed, r.label))
        values = {m: mean_ci(list(by_seed(arm_runs, m).values())) for m in metric_names(arm_runs)}
        results.append(ArmResult(depth, arm, arm_runs, arm.alpha == baseline_alpha, values=values))
    for result in results:
        result.baseline = find_baseline(result, results)
        if result.baseline is None:
            continue
        result.val_bpb_by_step = paired_difference_by_step(result.runs, result.baseline.runs, "val/bpb")
        result.layer_paired = {prefix: result.layer_differences(prefix) for prefix in RESIDUAL_SCALARS}
        for metric in result.values:
            paired = paired_difference(result.runs, result.baseline.runs, metric)
            if paired is not None:
                result.paired[metric] = paired
            aggregate = aggregate_of(metric)
            if aggregate is not None:
                bootstrap = bootstrap_examples(eval_pairs(result.runs, result.baseline.runs, metric), aggregate)
                if bootstrap is not None:
                    result.bootstrap[metric] = bootstrap
    return results


def find_baseline(result: ArmResult, results: list[ArmResult]) -> ArmResult | None:
    """The baseline arm of the same depth, optimizer and learning rate scale."""
    if result.is_baseline:
        return None
    candidates = [b for b in results if b.is_baseline and b.depth == result.depth and b.arm.optim == result.arm.optim
                  and b.arm.lr_scale == result.arm.lr_scale]
    # With an XSA baseline (α ≠ 0), compare like with like: same layers and value source when there is one.
    same = [b for b in candidates if (b.arm.layers, b.arm.value_source) == (result.arm.layers, result.arm.value_source)]
    return (same or candidates or [None])[0]


def eval_pairs(runs: list[Run], baseline: list[Run], metric: str) -> list[tuple[list[Path], list[Path]]]:
    """(arm, baseline) eval folders that produced `metric`, per shared seed: all of a seed's reruns, which
    bootstrap_examples averages as the paired Δ averages their metrics."""
    def folders(group):
        out = defaultdict(list)
        for run in group:
            if isinstance(run.sources.get(metric), Path):
                out[run.seed].append(run.sources[metric])
        return out

    arm, base = folders(runs), folders(baseline)
    return [(arm[s], base[s]) for s in sorted(arm.keys() & base.keys())]


# -----------------------------------------------------------------------------
# Optimizer × XSA


@dataclass
class OptimizerInteraction:
    """Does XSA's effect carry over from AdamW to Muon? The paired Δ (XSA − baseline) under each optimizer and
    the interaction: per seed, Δ under Muon − Δ under AdamW, mean ± t-interval over the seeds both have."""

    depth: str
    arm: Arm  # the Muon arm (its XSA settings and lr scale name the row)
    metric: str
    muon: Estimate
    adamw: Estimate
    interaction: Estimate

    @property
    def label(self) -> str:
        return f"{self.arm.xsa_label}{self.arm.lr_label}"

    @property
    def numbers_arm(self) -> str:
        """The row's arm in numbers.csv."""
        return f"optimizer × {self.label}"


def optimizer_interactions(results: list[ArmResult]) -> list[OptimizerInteraction]:
    rows = []
    for muon in results:
        if muon.arm.optim != "muon" or muon.baseline is None:
            continue
        for adamw in results:
            if (adamw.depth, adamw.arm.optim, adamw.arm.xsa_key, adamw.arm.lr_scale) != \
                    (muon.depth, "adamw", muon.arm.xsa_key, muon.arm.lr_scale) or adamw.baseline is None:
                continue
            for metric in muon.values:
                d_muon = seed_differences(muon.runs, muon.baseline.runs, metric)
                d_adamw = seed_differences(adamw.runs, adamw.baseline.runs, metric)
                both = interaction(d_muon, d_adamw)
                if both is not None:
                    rows.append(OptimizerInteraction(muon.depth, muon.arm, metric, muon.paired[metric],
                                                     adamw.paired[metric], both))
    return rows


# -----------------------------------------------------------------------------
# Learning-rate stability


@dataclass
class StabilityRow:
    """One optimizer × α × lr scale at a depth, over ALL its runs, failed and diverged ones included."""

    depth: str
    arm: Arm
    runs: int
    diverged: int
    spikes: int
    val_bpb: Estimate | None  # over the seeds of the complete runs with a finite final val/bpb (reruns averaged)
    paired: Estimate | None  # paired Δ val/bpb vs the baseline arm at the same lr scale (complete runs)


def stability(all_runs: list[Run], results: list[ArmResult]) -> dict[str, list[StabilityRow]]:
    """depth -> rows, for the depths that have more than one lr scale or a diverged run."""
    groups = defaultdict(list)
    for run in all_runs:
        groups[run.depth, run.arm].append(run)
    by_key = {(r.depth, r.arm): r for r in results}
    out = defaultdict(list)
    for (depth, arm), runs in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1].optim, g[0][1].lr_scale,
                                                                     g[0][1].alpha is None, g[0][1].alpha or 0.0)):
        finite = by_seed([r for r in runs if r.complete and math.isfinite(r.finals.get("val/bpb", math.nan))],
                         "val/bpb")  # each seed once, its reruns averaged
        result = by_key.get((depth, arm))
        out[depth].append(StabilityRow(depth, arm, len(runs), sum(r.diverged for r in runs),
                                       sum(run_spikes(r) for r in runs),
                                       mean_ci(list(finite.values())) if finite else None,
                                       None if result is None else result.paired.get("val/bpb")))
    return {depth: rows for depth, rows in out.items()
            if len({row.arm.lr_scale for row in rows}) > 1 or any(row.diverged for row in rows)}


# -----------------------------------------------------------------------------
# Settings of one depth side by side


@dataclass
class SettingRow:
    """One XSA arm's paired Δ val/bpb at one setting of a depth, and how it differs from the Δ at the reference
    setting (the one whose every value is the common one or the given reference, when there is such a setting): per
    seed, Δ here − Δ there, mean ± t-interval over the seeds both have."""

    base_depth: str
    setting: str  # the depth label's settings part ("" for the reference)
    arm: Arm
    delta: Estimate
    versus_reference: Estimate | None

    @property
    def depth(self) -> str:
        return f"{self.base_depth} · {self.setting}" if self.setting else self.base_depth


def setting_rows(results: list[ArmResult]) -> dict[str, list[SettingRow]]:
    """base depth -> one row per setting and XSA arm, for the depths run at more than one setting."""
    out = {}
    by_base = defaultdict(list)
    for r in results:
        if r.baseline is not None and "val/bpb" in r.paired and not r.depth.endswith(" · SFT"):
            by_base[r.runs[0].base_depth].append(r)
    for base, at_base in by_base.items():
        if len({r.depth for r in at_base}) < 2:
            continue
        reference = {r.arm: r for r in at_base if r.depth == base}  # every setting at its common value
        rows = []
        for r in at_base:
            ref = reference.get(r.arm)
            versus = None if ref is None or ref is r else interaction(
                seed_differences(r.runs, r.baseline.runs, "val/bpb"),
                seed_differences(ref.runs, ref.baseline.runs, "val/bpb"))
            rows.append(SettingRow(base, r.depth[len(base) + 3:], r.arm, r.paired["val/bpb"], versus))
        out[base] = sorted(rows, key=lambda row: (row.arm.label, row.setting != "", row.delta.value))
    return out


# -----------------------------------------------------------------------------
# Scale: Δ val/bpb against model size


def sortable(value) -> tuple:
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


@dataclass
class TrendPoint:
    """One XSA arm's paired Δ val/bpb at one value of a factor: model size across depths, or a setting."""
    depth: str
    x: float | str  # parameters, or the setting's value
    arm: Arm
    series: str  # the line it belongs to: the arm, and any other setting of its depth
    delta: Estimate  # paired Δ val/bpb over seeds
    n_params: int


def scale_trend(results: list[ArmResult]) -> list[TrendPoint]:
    """Paired Δ val/bpb per base depth and XSA arm, by size; [] unless at least two base depths have one."""
    points = [TrendPoint(r.depth, r.n_params, r.arm, r.arm.label, r.paired["val/bpb"], r.n_params) for r in results
              if "val/bpb" in r.paired and not r.depth.endswith(" · SFT") and not r.runs[0].settings]
    if len({p.depth for p in points}) < 2:
        return []
    return sorted(points, key=lambda p: (p.arm.label, p.n_params))


def setting_trends(results: list[ArmResult]) -> dict[str, list[TrendPoint]]:
    """Setting key -> paired Δ val/bpb of each XSA arm at each of its values. A line holds the settings that differ
    in this key alone (the arm, and the other settings its label names, are the line's name); a line of one point
    is left out, and a key without a line of two."""
    trends = defaultdict(list)
    for r in results:
        if "val/bpb" not in r.paired:
            continue
        run = r.runs[0]
        for key, value in run.settings.items():
            others = [f"{run.setting_names[k]}={v}" for k, v in run.shown.items() if k != key]
            series = " · ".join([r.arm.label, run.base_depth, *others])
            trends[key].append(TrendPoint(r.depth, value, r.arm, series, r.paired["val/bpb"], r.n_params))
    out = {}
    for key, points in trends.items():
        per_series = defaultdict(set)
        for p in points:
            per_series[p.series].add(repr(p.x))
        points = [p for p in points if len(per_series[p.series]) > 1]
        if points:
            out[key] = sorted(points, key=lambda p: (p.series, sortable(p.x)))
    return out
