"""Plots (matplotlib's object API: Agg, and pyplot's global state left alone)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from xsa_exp.report.compare import RESIDUAL_SCALARS, ArmResult, TrendPoint
from xsa_exp.report.render import REPORTED_DIAGNOSTICS
from xsa_exp.report.stats import Estimate, band


def plot_band(ax, curve: pd.DataFrame, x: str, color: str, label: str | None, **line) -> None:
    """The mean over seeds as a line, the min–max over seeds as a shaded band."""
    ax.plot(curve[x], curve["mean"], color=color, label=label, **line)
    if (curve["n"] > 1).any():
        ax.fill_between(curve[x], curve["low"], curve["high"], color=color, alpha=0.2, lw=0)


def plot_curves(depth: str, results: list[ArmResult], path: Path) -> None:
    """Train loss (thin: raw, thick: smoothed) and val bpb against step and tokens seen: per arm the mean over
    seeds, shaded from the lowest to the highest seed."""
    fig = Figure(figsize=(12, 8), layout="constrained")
    axes = fig.subplots(2, 2)
    for i, result in enumerate(results):
        color = f"C{i % 10}"
        raw, smooth, val = (band(result.runs, c) for c in ("train/loss", "train/loss_smooth", "val/bpb"))
        for col, x in enumerate(("step", "tokens")):
            if not raw.empty:
                axes[0, col].plot(raw[x], raw["mean"], color=color, lw=0.6, alpha=0.3)
            if not smooth.empty:
                plot_band(axes[0, col], smooth, x, color, result.arm.label, lw=1.4)
            if not val.empty:
                plot_band(axes[1, col], val, x, color, result.arm.label, marker="o", ms=3, lw=1.2)
    fig.suptitle(f"{depth}: mean over seeds, band from the lowest to the highest seed")
    for row, name in enumerate(("train loss (thin: raw, thick: smoothed)", "val bpb")):
        for col, x in enumerate(("step", "tokens seen")):
            axes[row, col].set(title=name, xlabel=x)
            axes[row, col].grid(alpha=0.3)
    axes[1, 0].legend(fontsize=8)
    fig.savefig(path, dpi=110)


def plot_val_bpb_by_step(depth: str, results: list[ArmResult], path: Path) -> bool:
    """Δ val bpb (arm − baseline, paired over seeds) against step, its 95% CI shaded, in the colors of the
    training curves; False unless some arm validated more than once."""
    if not any(len(r.val_bpb_by_step) > 1 for r in results):
        return False
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    for i, result in enumerate(results):
        if len(result.val_bpb_by_step) < 2:
            continue
        steps = sorted(result.val_bpb_by_step)
        estimates = [result.val_bpb_by_step[step] for step in steps]
        color = f"C{i % 10}"
        ax.plot(steps, [e.value for e in estimates], "o-", color=color, ms=3, lw=1.2, label=result.arm.label)
        if any(e.low is not None for e in estimates):
            ax.fill_between(steps, [e.value if e.low is None else e.low for e in estimates],
                            [e.value if e.high is None else e.high for e in estimates], color=color, alpha=0.2, lw=0)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_title(f"{depth}: Δ val bpb during training", fontsize=10)
    ax.set(xlabel="step", ylabel="Δ val bpb (arm − baseline, paired, 95% CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return True


def plot_per_layer(depth: str, results: list[ArmResult], path: Path, panels: dict[str, str]) -> bool:
    """One panel per logged prefix (prefix -> title): <prefix>/L{i} of each run's last row that logged it
    against the layer, mean over each arm's seeds; False if none was logged."""
    fig = Figure(figsize=(4.3 * len(panels), 4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    plotted = False
    for ax, (prefix, title) in zip(axes, panels.items()):
        for i, result in enumerate(results):
            per_layer = result.last_per_layer(prefix)
            if not per_layer.empty:
                ax.plot(per_layer.index, per_layer.to_numpy(), "o-", color=f"C{i % 10}", label=result.arm.label)
                plotted = True
        ax.set(title=f"{depth}: {title}", xlabel="layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    if plotted:
        next(ax for ax in axes if ax.lines).legend(fontsize=8)  # on a panel that has lines: the first may have none
        fig.savefig(path, dpi=110)
    return plotted


def plot_diagnostics(depth: str, results: list[ArmResult], path: Path) -> bool:
    """Per-layer diagnostics of the last diagnostics row, mean over each arm's seeds; False if none were logged."""
    return plot_per_layer(depth, results, path, {f"diag/{name}": name for name in REPORTED_DIAGNOSTICS})


def plot_residual_scalars(depth: str, results: list[ArmResult], path: Path) -> bool:
    """The learned λ_resid and λ_x0 per layer at the last diagnostics row, mean over each arm's seeds; False if
    no run logged them."""
    return plot_per_layer(depth, results, path, RESIDUAL_SCALARS)


def plot_alpha(depth: str, results: list[ArmResult], path: Path) -> bool:
    """val bpb vs α (error bars: 95% CI over seeds), one line per optimizer, lr scale, layers and value source,
    the no-XSA arm at α = 0 on each; False (no plot) unless the depth has at least two distinct fixed α."""
    fixed = [r for r in results if r.arm.alpha is not None and "val/bpb" in r.values]
    if len({r.arm.alpha for r in fixed}) < 2:
        return False
    off = {(r.arm.optim, r.arm.lr_scale): r for r in fixed if r.arm.off}
    series = defaultdict(list)
    for r in fixed:
        if not r.arm.off:
            series[r.arm.optim, r.arm.lr_scale, r.arm.layers, r.arm.value_source].append(r)
    for (optim, lr_scale, _, _), points in series.items():
        points.extend([off[optim, lr_scale]] if (optim, lr_scale) in off else [])
    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.subplots()
    for (optim, lr_scale, layers, value_source), points in sorted(series.items()):
        points.sort(key=lambda r: r.arm.alpha)
        estimates = [r.values["val/bpb"] for r in points]
        errors = [0.0 if e.low is None else e.value - e.low for e in estimates]
        lr = "" if lr_scale == 1 else f" · lr×{lr_scale:g}"
        ax.errorbar([r.arm.alpha for r in points], [e.value for e in estimates], yerr=errors, fmt="o-", capsize=3,
                    label=f"{optim}{lr} · layers={layers} · value={value_source}")
    ax.set(title=f"{depth}: final val bpb vs α (95% CI over seeds)", xlabel="α", ylabel="val bpb")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return True


def plot_learned_alpha(depth: str, results: list[ArmResult], path: Path) -> bool:
    """Learnable α per layer (xsa/alpha/L<i>, the mean over heads) against step, mean over seeds with the
    min–max band, one panel per learnable arm; False if no learnable arm logged α."""
    learnable = [r for r in results if r.arm.alpha is None
                 and any(run.layer_columns("xsa/alpha") for run in r.runs)]
    if not learnable:
        return False
    fig = Figure(figsize=(6 * len(learnable), 4.5), layout="constrained")
    axes = fig.subplots(1, len(learnable), squeeze=False)[0]
    for ax, result in zip(axes, learnable):
        layers = sorted({layer for run in result.runs for layer in run.layer_columns("xsa/alpha")})
        for layer in layers:
            curve = band(result.runs, f"xsa/alpha/L{layer}")
            plot_band(ax, curve, "step", f"C{layer % 10}", f"layer {layer}", marker="o", ms=2, lw=1.2)
        ax.set(title=f"{depth}: {result.arm.label}", xlabel="step", ylabel="α (mean over heads and seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return True


def plot_trend(points: list[TrendPoint], path: Path, xlabel: str, title: str) -> None:
    """Δ val/bpb (XSA − baseline, paired over seeds, 95% CI) against a factor, one line per series; a numeric
    factor spanning 4x or more on a log axis, any other (a corpus, a pair of betas, a value taken away) as
    categories named by the value."""
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    series = defaultdict(list)
    for p in points:
        series[p.series].append(p)
    scalar = all(isinstance(p.x, (int, float, str)) for p in points)  # matplotlib places these itself
    for label, line in sorted(series.items()):
        errors = [[0.0 if p.delta.low is None else p.delta.value - p.delta.low for p in line],
                  [0.0 if p.delta.high is None else p.delta.high - p.delta.value for p in line]]
        ax.errorbar([p.x if scalar else str(p.x) for p in line], [p.delta.value for p in line], yerr=errors,
                    fmt="o-", capsize=3, label=label)
    ax.axhline(0, color="black", lw=0.8)
    xs = [p.x for p in points]
    if all(isinstance(x, (int, float)) and x > 0 for x in xs) and max(xs) >= 4 * min(xs):
        ax.set_xscale("log", base=2 if all(float(x).is_integer() and int(x) & (int(x) - 1) == 0 for x in xs) else 10)
    ax.set(title=f"{title} (95% CI over seeds)", xlabel=xlabel, ylabel="Δ val bpb")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def plot_forest(groups: dict[str, list[tuple[str, Estimate]]], path: Path, xlabel: str) -> None:
    """A forest plot: one panel per group (titled by it), its rows top to bottom, each estimate with its 95% CI as
    an error bar against a common axis, zero marked."""
    sizes = [len(rows) for rows in groups.values()]
    fig = Figure(figsize=(13, 1.0 + 0.6 * len(sizes) + 0.22 * sum(sizes)), layout="constrained")
    axes = fig.subplots(len(sizes), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": sizes})[:, 0]
    for ax, (group, rows) in zip(axes, groups.items()):
        estimates = [e for _, e in rows]
        ax.errorbar([e.value for e in estimates], range(len(rows)), fmt="o", ms=3, capsize=2, color="C0",
                    xerr=[[e.value - e.low for e in estimates], [e.high - e.value for e in estimates]])
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
        ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top
        ax.set_title(group, loc="left", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel(xlabel)
    fig.savefig(path, dpi=110)
