"""The study's report: tables, statistics and plots from run directories.

    python -m xsa_exp.report <sweep or run dirs...> [--out DIR] [--baseline-alpha 0] [--force]

Writes report.md (tables, linked plots, the runs included, the runs missing or failed), numbers.csv (every
number of the tables, long format: depth, arm, metric, statistic, value) and plots/*.png into --out
(default <first dir>/report), which must be new or empty unless --force.

Runs are the directories holding config.yaml + run.json, found recursively. A run is complete with
metrics.csv and checkpoints/final.ckpt; others are listed as failed, never fatal, as are the jobs of a
Hydra sweep (multirun.yaml) that have no directory or no run.json.

An arm is optimizer + α (or learnable α) + XSA layers + value source; seeds are pooled within it. XSA
that changes nothing (α = 0 or no XSA layers) is standard attention whatever its other settings, so all
such runs form one arm, "no XSA". Each arm is compared with the baseline arm of its depth and optimizer:
the one with α = --baseline-alpha (the no-XSA arm for the default 0). SFT runs (stage=sft) form their own
depth section, "<depth> · SFT", where ChatCORE is reported.

Final numbers per run: val/bpb from the last val row of metrics.csv, and val/bpb, CORE (under its own
name, e.g. "CORE 18/22" for a partial set) and ChatCORE from the newest evaluation (eval/*/summary.json)
of the run's last step, which wins over the log.

Statistics (all 95%): mean ± t-interval over seeds (none for n=1); paired differences over the seeds an
arm shares with its baseline; for CORE and ChatCORE, a paired bootstrap over the examples both arms
answered (core_examples.jsonl, chatcore_examples.jsonl), resampled within tasks. A difference whose interval includes zero is "not
distinguishable from noise" (significant? no); n.a. where there is no interval.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # its enumeration numbers the jobs
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from matplotlib.figure import Figure  # the object API renders with Agg and leaves pyplot's global state alone
from matplotlib.ticker import MaxNLocator
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
PLOTTED_DIAGNOSTICS = ("attn_self_cos", "out_self_cos", "diag_attn")
HEADLINE = re.compile(r"(Chat)?CORE( \d+/\d+)?")  # summary.json names: CORE, CORE 18/22, ChatCORE, ChatCORE 3/5
EVAL_TIME = re.compile(r"(\d{8}-\d{6})$")  # eval/<checkpoint>-step<N>-<YYYYmmdd-HHMMSS>


class ReportError(Exception):
    """Nothing to report or nowhere to write it; the message is one line."""


class RunProblem(Exception):
    """Why a run directory cannot be in the tables."""


# -----------------------------------------------------------------------------
# Runs: discovery and loading


@dataclass(frozen=True)
class Arm:
    optim: str
    alpha: float | None  # None: learnable α
    layers: str  # "" when XSA is off
    value_source: str  # "" when XSA is off

    @classmethod
    def of(cls, run: dict) -> Arm:
        if (not run["learnable"] and float(run["alpha"]) == 0) or not run["xsa_layers"]:
            return cls(run["optim"], 0.0, "", "")
        layers = run["layers"]
        if not isinstance(layers, str):  # a list of layer indices, or one index
            layers = ",".join(map(str, layers if isinstance(layers, list) else [layers]))
        return cls(run["optim"], None if run["learnable"] else float(run["alpha"]), layers, run["value_source"])

    @property
    def off(self) -> bool:
        return self.layers == ""

    @property
    def label(self) -> str:
        if self.off:
            return f"{self.optim} · no XSA"
        alpha = "learnable α" if self.alpha is None else f"α={self.alpha:g}"
        return f"{self.optim} · {alpha} · layers={self.layers} · value={self.value_source}"


@dataclass
class Run:
    path: Path
    label: str
    depth: str
    arm: Arm
    seed: int
    n_params: int
    metrics: pd.DataFrame  # metrics.csv as numbers
    logged: pd.DataFrame  # which cells of metrics.csv a row logged (the others are empty)
    finals: dict[str, float] = field(default_factory=dict)  # "val/bpb", "CORE 18/22", "ChatCORE", ... -> value
    sources: dict[str, str | Path] = field(default_factory=dict)  # metric -> "metrics.csv step N" or eval folder

    @property
    def steps(self) -> int:
        return int(self.metrics["step"].max())

    @property
    def tokens(self) -> int:
        return int(self.metrics["tokens_seen"].max())

    def rows(self, column: str) -> pd.DataFrame:
        """The rows of metrics.csv that logged `column` (each row holds one logger call's keys)."""
        return self.metrics[self.logged[column]] if column in self.metrics else self.metrics.iloc[:0]

    def diagnostics(self, name: str) -> pd.Series:
        """diag/{name}/L{i} of the last diagnostics row, indexed by layer (empty if never measured)."""
        columns = [c for c in self.metrics.columns if re.fullmatch(rf"diag/{name}/L\d+", c)]
        rows = self.metrics[columns][self.logged[columns].any(axis=1)]
        if rows.empty:
            return pd.Series(dtype=float)
        return pd.Series(rows.iloc[-1].to_numpy(), index=[int(c.rsplit("L", 1)[1]) for c in columns]).sort_index()


@dataclass
class Problem:
    label: str
    reason: str


def discover(paths: list[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Run directories under `paths`, and (directory, reason) for sweep jobs that never became runs."""
    runs, problems = set(), []
    for root in paths:
        if not root.is_dir():
            raise ReportError(f"no such directory: {root}")
        runs |= {p.parent.resolve() for p in root.rglob("run.json") if (p.parent / "config.yaml").is_file()}
        for sweep in sorted({m.parent for m in root.rglob("multirun.yaml")}):
            jobs = expected_jobs(sweep)
            numbered = {int(d.name) for d in sweep.iterdir() if d.is_dir() and d.name.isdigit()}
            for num in sorted(set(jobs) | numbered):
                job, name = sweep / str(num), f"sweep job {num}" + (f" ({jobs[num]})" if jobs.get(num) else "")
                if not job.is_dir():
                    problems.append((job, f"missing: {name} has no directory (never started, or queued)"))
                elif not (job / "run.json").is_file():
                    problems.append((job, f"failed: {name} has no run.json (stopped before training)"))
    return sorted(runs), problems


def expected_jobs(sweep: Path) -> dict[int, str]:
    """Job number -> the overrides that vary, as Hydra's basic sweeper enumerates them from multirun.yaml
    ({} when another sweeper ran it, job folders are not named by number, or the file cannot be read: then
    only the job folders tell)."""
    try:
        hydra = OmegaConf.load(sweep / "multirun.yaml").hydra
        numbered = OmegaConf.to_container(hydra.sweep)["subdir"] == "${hydra.job.num}"
        if not numbered or not str(hydra.sweeper._target_).endswith(".BasicSweeper"):
            return {}
        params = hydra.sweeper.get("params") or {}
        overrides = OverridesParser.create().parse_overrides(
            [*hydra.overrides.task, *(f"{key}={value}" for key, value in params.items())])
        jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
    except (OSError, OmegaConfBaseException, HydraException):
        return {}
    varying = {o.get_key_element() for o in overrides if o.is_sweep_override()}
    return {num: " ".join(o for o in job if o.split("=", 1)[0] in varying) for num, job in enumerate(jobs)}


def load_run(path: Path, label: str) -> Run:
    lacking = [name for name in ("metrics.csv", "checkpoints/final.ckpt") if not (path / name).is_file()]
    if lacking:
        raise RunProblem(f"incomplete: no {' and no '.join(lacking)} (failed, or still running)")
    try:
        info = json.loads((path / "run.json").read_text())
        # Empty cells are keys a row did not log; "nan" is a logged NaN (a diverged run) and must stay visible.
        raw = pd.read_csv(path / "metrics.csv", dtype=str, keep_default_na=False)
        arm, depth, seed = Arm.of(info), stage_depth(info), int(info["seed"])
    except (OSError, ValueError) as e:  # JSONDecodeError and pandas' parser errors are ValueErrors
        raise RunProblem(f"unreadable: {type(e).__name__}: {e}") from None
    except KeyError as e:
        raise RunProblem(f"run.json lacks {e}") from None
    if raw.empty or "step" not in raw:
        raise RunProblem("metrics.csv has no rows")
    n_params = int(info.get("param_counts", {}).get("total", 0))
    run = Run(path, label, depth, arm, seed, n_params, raw.apply(pd.to_numeric, errors="coerce"), raw != "")
    add_final_values(run)
    return run


def stage_depth(info: dict) -> str:
    """SFT runs are their own section ("d24 · SFT"): their val/bpb is over assistant tokens, and they
    compare with the SFT runs of the baseline arm, not with base runs."""
    return info["depth"] + (" · SFT" if info.get("stage", "base") == "sft" else "")


def add_final_values(run: Run) -> None:
    """val/bpb of the last val row, then the evaluations of the run's last step (newest last) on top."""
    val = run.rows("val/bpb")
    if not val.empty:
        run.finals["val/bpb"] = float(val["val/bpb"].iloc[-1])
        run.sources["val/bpb"] = f"metrics.csv step {int(val['step'].iloc[-1])}"
    for folder, summary in evaluations(run.path):
        if summary["step"] < run.steps:  # an earlier checkpoint: not the run's final numbers
            continue
        for name, value in summary["metrics"].items():
            if name == "val/bpb" or HEADLINE.fullmatch(name):
                run.finals[name], run.sources[name] = float(value), folder


def evaluations(path: Path) -> list[tuple[Path, dict]]:
    """(folder, summary.json) of the run's evaluations, oldest first: by checkpoint step, then time."""
    found = []
    for summary_path in (path / "eval").glob("*/summary.json"):
        try:
            summary = json.loads(summary_path.read_text())
        except (OSError, ValueError):  # an evaluation that crashed while writing; the others still count
            continue
        folder = summary_path.parent
        stamp = EVAL_TIME.search(folder.name)
        found.append(((summary["step"], stamp.group(1) if stamp else "", folder.stat().st_mtime), folder, summary))
    return [(folder, summary) for _, folder, summary in sorted(found, key=lambda f: f[0])]


# -----------------------------------------------------------------------------
# Statistics


@lru_cache
def t_quantile(p: float, df: int) -> float:
    """Student-t quantile for p > 1/2, without scipy. With x = √df·tan θ the CDF is
    1/2 + c·∫₀^θ cos^(df-1)(u) du, a smooth integral on [0, π/2) that bisection inverts."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)

    def cdf(theta: float) -> float:
        u = np.linspace(0.0, theta, 4001)
        return 0.5 + c * np.trapezoid(np.cos(u) ** (df - 1), u)

    lo, hi = 0.0, math.pi / 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return math.sqrt(df) * math.tan((lo + hi) / 2)


@dataclass(frozen=True)
class Estimate:
    """A mean (or difference) with its 95% interval; low and high are None when there is no interval."""

    value: float
    low: float | None
    high: float | None
    n: int

    @property
    def significant(self) -> str:
        if self.low is None:
            return "n.a."
        return "no" if self.low <= 0 <= self.high else "yes"


def mean_ci(values) -> Estimate:
    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return Estimate(mean, None, None, len(x))
    half = t_quantile(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return Estimate(mean, mean - half, mean + half, len(x))


def by_seed(runs: list[Run], metric: str) -> dict[int, float]:
    """The metric per seed (reruns of a seed averaged)."""
    values = defaultdict(list)
    for run in runs:
        if metric in run.finals:
            values[run.seed].append(run.finals[metric])
    return {seed: float(np.mean(v)) for seed, v in values.items()}


def paired_difference(runs: list[Run], baseline: list[Run], metric: str) -> Estimate | None:
    """Mean ± CI of (arm − baseline) over the seeds both have."""
    arm, base = by_seed(runs, metric), by_seed(baseline, metric)
    shared = sorted(arm.keys() & base.keys())
    return mean_ci([arm[s] - base[s] for s in shared]) if shared else None


# Per-example results of each aggregate: files, the tasks file's task column, and its baseline as a fraction
# (CORE's tasks file keeps the bundle's percent).
EXAMPLE_FILES = {
    "CORE": ("core_examples.jsonl", "core_tasks.csv", "label", lambda row: float(row["random_baseline"]) / 100),
    "ChatCORE": ("chatcore_examples.jsonl", "chatcore_tasks.csv", "task", lambda row: float(row["baseline"])),
}


def aggregate_of(metric: str) -> str | None:
    """"CORE" or "ChatCORE" for their headline metrics (also "CORE 18/22", "ChatCORE 4/5"), else None."""
    match = HEADLINE.fullmatch(metric)
    return None if match is None else ("ChatCORE" if match.group(1) else "CORE")


def example_answers(folder: Path, aggregate: str) -> tuple[dict[tuple[str, int], bool], dict[str, float]] | None:
    """(task, index) -> correct from the evaluation's examples file, and task -> baseline (fraction)."""
    examples, tasks, task_column, baseline = EXAMPLE_FILES[aggregate]
    if not (folder / examples).is_file() or not (folder / tasks).is_file():
        return None
    with open(folder / examples) as f:
        answers = {(e["task"], e["index"]): bool(e["correct"]) for e in map(json.loads, filter(str.strip, f))}
    with open(folder / tasks, newline="") as f:
        baselines = {row[task_column]: baseline(row) for row in csv.DictReader(f)}
    return answers, baselines


def bootstrap_examples(pairs: list[tuple[Path, Path]], aggregate: str, resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> Estimate | None:
    """Paired bootstrap of a CORE or ChatCORE difference (arm − baseline) over its examples.

    pairs: (arm eval folder, baseline eval folder) for each shared seed. The difference is the mean over
    tasks of the centered accuracy difference, averaged over the pairs, on the examples (task + index)
    that every folder answered; examples are resampled within tasks, the same draw for every pair."""
    loaded = [(example_answers(a, aggregate), example_answers(b, aggregate)) for a, b in pairs]
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


# -----------------------------------------------------------------------------
# The study: arms, baselines, comparisons


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

    def delta(self, metric: str) -> tuple[float, float | None] | None:
        """(arm − baseline, the same relative to the baseline in %) of the means, when both have the metric."""
        if self.baseline is None or metric not in self.values or metric not in self.baseline.values:
            return None
        base = self.baseline.values[metric].value
        diff = self.values[metric].value - base
        return diff, 100 * diff / abs(base) if base else None


def metric_names(runs: list[Run]) -> list[str]:
    return sorted({name for run in runs for name in run.finals}, key=lambda name: (name != "val/bpb", name))


def compare(runs: list[Run], baseline_alpha: float) -> list[ArmResult]:
    """One ArmResult per depth and arm, baselines first, with its statistics and its comparison."""
    groups = defaultdict(list)
    for run in runs:
        groups[run.depth, run.arm].append(run)
    depth_size = {depth: min(r.n_params for r in runs if r.depth == depth) for depth, _ in groups}

    def order(key):
        depth, arm = key
        return (depth_size[depth], depth, arm.alpha != baseline_alpha, arm.optim, arm.alpha is None,
                arm.alpha or 0.0, arm.layers, arm.value_source)

    results = []
    for depth, arm in sorted(groups, key=order):
        arm_runs = sorted(groups[depth, arm], key=lambda r: (r.seed, r.label))
        values = {m: mean_ci([r.finals[m] for r in arm_runs if m in r.finals]) for m in metric_names(arm_runs)}
        results.append(ArmResult(depth, arm, arm_runs, arm.alpha == baseline_alpha, values=values))
    for result in results:
        result.baseline = find_baseline(result, results)
        if result.baseline is None:
            continue
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
    if result.is_baseline:
        return None
    candidates = [b for b in results if b.depth == result.depth and b.arm.optim == result.arm.optim and b.is_baseline]
    # With an XSA baseline (α ≠ 0), compare like with like: same layers and value source when there is one.
    same = [b for b in candidates if (b.arm.layers, b.arm.value_source) == (result.arm.layers, result.arm.value_source)]
    return (same or candidates or [None])[0]


def eval_pairs(runs: list[Run], baseline: list[Run], metric: str) -> list[tuple[Path, Path]]:
    """(arm, baseline) eval folders that produced `metric`, one pair per shared seed (first run of a seed)."""
    def folders(group):
        out = {}
        for run in group:
            if isinstance(run.sources.get(metric), Path):
                out.setdefault(run.seed, run.sources[metric])
        return out

    arm, base = folders(runs), folders(baseline)
    return [(arm[s], base[s]) for s in sorted(arm.keys() & base.keys())]


# -----------------------------------------------------------------------------
# Outputs: numbers.csv, plots, report.md


def numbers(results: list[ArmResult]) -> list[tuple[str, str, str, str, float]]:
    """Every number of the tables as (depth, arm, metric, statistic, value)."""
    rows = []
    for r in results:
        for metric, estimate in r.values.items():
            stats = estimate_stats("mean", estimate)
            delta = r.delta(metric)
            if delta is not None:
                stats += [("delta", delta[0]), ("delta_pct", delta[1])]
            for name, table in (("paired_delta", r.paired), ("bootstrap_delta", r.bootstrap)):
                if metric in table:
                    stats += estimate_stats(name, table[metric])
            stats += [(f"run:{run.label}", run.finals.get(metric)) for run in r.runs]
            rows += [(r.depth, r.arm.label, metric, stat, value) for stat, value in stats if value is not None]
    return rows


def estimate_stats(name: str, e: Estimate) -> list[tuple[str, float | None]]:
    return [(name, e.value), (f"{name}_ci95_low", e.low), (f"{name}_ci95_high", e.high), (f"{name}_n", e.n)]


def slug(text: str) -> str:
    return re.sub(r"[^\w.-]+", "_", text)


def plot_curves(depth: str, results: list[ArmResult], path: Path) -> None:
    """Train loss (thin: raw, thick: smoothed) and val bpb, each vs step and vs tokens seen, every run."""
    fig = Figure(figsize=(12, 8), layout="constrained")
    axes = fig.subplots(2, 2)
    for color, result in enumerate(results):
        for i, run in enumerate(result.runs):
            label = result.arm.label if i == 0 else None
            train, smooth, val = run.rows("train/loss"), run.rows("train/loss_smooth"), run.rows("val/bpb")
            for col, x in enumerate(("step", "tokens_seen")):
                if not train.empty:
                    axes[0, col].plot(train[x], train["train/loss"], color=f"C{color}", lw=0.6, alpha=0.3)
                if not smooth.empty:
                    axes[0, col].plot(smooth[x], smooth["train/loss_smooth"], color=f"C{color}", lw=1.4, label=label)
                if not val.empty:
                    axes[1, col].plot(val[x], val["val/bpb"], "o-", color=f"C{color}", ms=3, lw=1.2, label=label)
    for row, name in enumerate(("train loss (thin: raw, thick: smoothed)", "val bpb")):
        for col, x in enumerate(("step", "tokens seen")):
            axes[row, col].set(title=f"{depth}: {name}", xlabel=x)
            axes[row, col].grid(alpha=0.3)
    axes[1, 0].legend(fontsize=8)
    fig.savefig(path, dpi=110)


def plot_diagnostics(depth: str, results: list[ArmResult], path: Path) -> bool:
    """Per-layer diagnostics of the last diagnostics row, mean over each arm's seeds; False if none were logged."""
    fig = Figure(figsize=(13, 4), layout="constrained")
    axes = fig.subplots(1, len(PLOTTED_DIAGNOSTICS))
    plotted = False
    for ax, name in zip(axes, PLOTTED_DIAGNOSTICS):
        for color, result in enumerate(results):
            per_layer = pd.DataFrame([run.diagnostics(name) for run in result.runs]).mean()
            if not per_layer.empty:
                ax.plot(per_layer.index, per_layer.to_numpy(), "o-", color=f"C{color}", label=result.arm.label)
                plotted = True
        ax.set(title=f"{depth}: {name}", xlabel="layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    if plotted:
        axes[0].legend(fontsize=8)
        fig.savefig(path, dpi=110)
    return plotted


def plot_alpha(depth: str, results: list[ArmResult], path: Path) -> bool:
    """val bpb vs α (error bars: 95% CI over seeds), one line per optimizer, layers and value source, the no-XSA
    arm at α = 0 on each; False (no plot) unless the depth has at least two distinct fixed α."""
    fixed = [r for r in results if r.arm.alpha is not None and "val/bpb" in r.values]
    if len({r.arm.alpha for r in fixed}) < 2:
        return False
    off = {r.arm.optim: r for r in fixed if r.arm.off}
    series = defaultdict(list)
    for r in fixed:
        if not r.arm.off:
            series[r.arm.optim, r.arm.layers, r.arm.value_source].append(r)
    for (optim, _, _), points in series.items():
        points.extend([off[optim]] if optim in off else [])
    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.subplots()
    for (optim, layers, value_source), points in sorted(series.items()):
        points.sort(key=lambda r: r.arm.alpha)
        estimates = [r.values["val/bpb"] for r in points]
        errors = [0.0 if e.low is None else e.value - e.low for e in estimates]
        ax.errorbar([r.arm.alpha for r in points], [e.value for e in estimates], yerr=errors, fmt="o-", capsize=3,
                    label=f"{optim} · layers={layers} · value={value_source}")
    ax.set(title=f"{depth}: final val bpb vs α (95% CI over seeds)", xlabel="α", ylabel="val bpb")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return True


def num(x: float, digits: int = 4, sign: bool = False) -> str:
    return f"{x:{'+' if sign else ''}.{digits}f}".replace("-", "\u2212")  # a typographic minus, as in print


def fmt_estimate(e: Estimate) -> str:
    return f"{num(e.value)} (n=1)" if e.low is None else f"{num(e.value)} ± {num(e.high - e.value)} (n={e.n})"


def fmt_delta(delta: tuple[float, float | None] | None) -> str:
    if delta is None:
        return "—"
    return f"{num(delta[0], sign=True)} ({'n.a.' if delta[1] is None else num(delta[1], 2, sign=True) + '%'})"


def fmt_interval(e: Estimate) -> str:
    return f"n={e.n}, no interval" if e.low is None else f"[{num(e.low, sign=True)}, {num(e.high, sign=True)}]"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def depth_section(depth: str, results: list[ArmResult], plots: list[tuple[str, str]]) -> str:
    metrics = metric_names([run for r in results for run in r.runs])
    header = ["arm", "seeds", "steps"] + [cell for m in metrics for cell in (m, f"Δ {m}")]
    rows = []
    for r in results:
        steps = sorted({run.steps for run in r.runs})
        span = f"{steps[0]:,}" + (f"–{steps[-1]:,}" if len(steps) > 1 else "")
        cells = [r.arm.label, ", ".join(str(run.seed) for run in r.runs), span]
        for m in metrics:
            cells.append(fmt_estimate(r.values[m]) if m in r.values else "—")
            cells.append("baseline" if r.is_baseline else fmt_delta(r.delta(m)))
        rows.append(cells)
    tests = []
    for r in results:
        for m in metrics:
            for test, table, unit in (("paired over seeds", r.paired, "seeds"),
                                      ("paired bootstrap over examples", r.bootstrap, "examples")):
                if m in table:
                    e = table[m]
                    tests.append([r.arm.label, m, test, num(e.value, sign=True), fmt_interval(e), f"{e.n:,} {unit}",
                                  e.significant])
    parts = [f"## Depth `{depth}`", "", "### Final results", "",
             "Mean ± 95% CI over seeds; Δ: arm mean − baseline mean (relative to the baseline). "
             "Lower val/bpb is better, higher CORE and ChatCORE are better.", "", md_table(header, rows), ""]
    parts += ["### Differences vs baseline", ""]
    if tests:
        parts += ["significant? no: the 95% interval includes zero, so the difference is not distinguishable "
                  "from noise; n.a.: a single seed pair gives no interval. The bootstrap covers the sampling of "
                  "the (Chat)CORE examples only; the seeds' spread is in the paired test.", "",
                  md_table(["arm", "metric", "test", "Δ", "95% CI", "n", "significant?"], tests), ""]
    else:
        parts += ["No arm shares a seed with a baseline arm of its depth and optimizer.", ""]
    for title, file in plots:
        parts += [f"### {title}", "", f"![{title}](plots/{file})", ""]
    return "\n".join(parts)


def runs_section(runs: list[Run], problems: list[Problem]) -> str:
    rows = []
    for run in runs:
        by_source = defaultdict(list)
        for m in metric_names([run]):
            by_source[source_text(run, m)].append(f"{m} {num(run.finals[m])}")
        finals = "; ".join(f"{', '.join(values)} ({source})" for source, values in by_source.items())
        rows.append([f"`{run.label}`", run.depth, run.arm.label, str(run.seed), f"{run.steps:,}", f"{run.tokens:,}",
                     finals or "—"])
    parts = ["## Runs", "", md_table(["run", "depth", "arm", "seed", "steps", "tokens", "final numbers (source)"], rows)
             if rows else "No complete runs.", "", "## Missing or failed runs", ""]
    parts += [f"- `{p.label}`: {p.reason}" for p in problems] or ["None."]
    return "\n".join(parts) + "\n"


def source_text(run: Run, metric: str) -> str:
    source = run.sources[metric]
    return source if isinstance(source, str) else source.relative_to(run.path).as_posix()


# -----------------------------------------------------------------------------
# Entry points


def build_report(paths: list[Path], out_dir: Path | None = None, baseline_alpha: float = 0.0,
                 force: bool = False) -> Path:
    """Write the report of the runs under `paths` into out_dir (default <paths[0]>/report); returns report.md."""
    paths = [Path(p).expanduser() for p in paths]
    if not paths:
        raise ReportError("give at least one sweep or run directory")
    out_dir = Path(out_dir).expanduser() if out_dir is not None else paths[0] / "report"
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError(f"{out_dir} is a file, not a report folder; choose another --out")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ReportError(f"{out_dir} already exists and is not empty; nothing was overwritten "
                          "(choose another --out, or pass --force)")
    run_dirs, sweep_problems = discover(paths)
    if not run_dirs and not sweep_problems:
        raise ReportError(f"no run directories (config.yaml + run.json) found under {', '.join(map(str, paths))}")
    # Runs are named by their path from just above the given folders: "<sweep>/3", "<run dir>".
    base = Path(os.path.commonpath([p.resolve() for p in paths])).parent

    def label(path: Path) -> str:
        return os.path.relpath(path.resolve(), base)

    runs, problems = [], [Problem(label(p), reason) for p, reason in sweep_problems]
    for path in run_dirs:
        try:
            runs.append(load_run(path, label(path)))
        except RunProblem as e:
            problems.append(Problem(label(path), str(e)))
    problems.sort(key=lambda p: p.label)
    results = compare(runs, baseline_alpha)

    plots_dir = out_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    for stale in plots_dir.glob("*.png"):  # --force: no plot of an earlier report may pass for this one's
        stale.unlink()
    sections = []
    for depth in dict.fromkeys(r.depth for r in results):
        at_depth = [r for r in results if r.depth == depth]
        plots = [("Training curves", f"curves_{slug(depth)}.png")]
        plot_curves(depth, at_depth, plots_dir / plots[0][1])
        optional = (("Attention diagnostics per layer (last diagnostics step)", "diagnostics", plot_diagnostics),
                    ("Final val bpb vs α", "alpha", plot_alpha))
        for title, name, plot in optional:
            if plot(depth, at_depth, plots_dir / f"{name}_{slug(depth)}.png"):
                plots.append((title, f"{name}_{slug(depth)}.png"))
        sections.append(depth_section(depth, at_depth, plots))

    with open(out_dir / "numbers.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["depth", "arm", "metric", "statistic", "value"])
        writer.writerows(numbers(results))
    baseline = "no XSA (α = 0 or no XSA layers)" if baseline_alpha == 0 else f"α = {baseline_alpha:g}"
    head = ["# XSA study report", "",
            f"From {', '.join(f'`{p}`' for p in paths)}: {len(runs)} complete runs, {len(problems)} missing or failed. "
            f"Baseline: {baseline}, same depth and optimizer. Arms pool their seeds. CIs are 95%: t-intervals over "
            f"seeds; CORE and ChatCORE also get a paired bootstrap over examples ({BOOTSTRAP_RESAMPLES} resamples within tasks, "
            f"seed {BOOTSTRAP_SEED}). numbers.csv holds every number below.", ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(head + sections) + "\n" + runs_section(sorted(runs, key=lambda r: r.label), problems))
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m xsa_exp.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="sweep or run directories, searched recursively")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: <first path>/report)")
    parser.add_argument("--baseline-alpha", type=float, default=0.0,
                        help="α of the baseline arm (default 0: standard attention)")
    parser.add_argument("--force", action="store_true", help="write into an existing non-empty report folder")
    args = parser.parse_args(argv)
    try:
        report = build_report(args.paths, args.out, args.baseline_alpha, args.force)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"report: {report}")


if __name__ == "__main__":
    main()
