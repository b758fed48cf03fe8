"""report.md's sections, and numbers.csv's rows for every number they print."""

from __future__ import annotations

import hashlib
import math
import re
from collections import defaultdict

import numpy as np

from xsa_exp import run_dir as rd
from xsa_exp.report.compare import (
    RESIDUAL_SCALARS,
    ArmResult,
    OptimizerInteraction,
    SettingRow,
    StabilityRow,
    TrendPoint,
    metric_names,
)
from xsa_exp.report.runs import Problem, Run
from xsa_exp.report.stats import RELATIVE_MIN_BASELINE, SPIKE_RISE, WARMUP_FRACTION, Estimate

# The attention diagnostics the report tabulates and plots per layer (xsa_exp.eval.diagnostics has them all).
REPORTED_DIAGNOSTICS = ("attn_self_cos", "out_self_cos", "diag_attn", "attn_entropy")
# The statistics of numbers.csv that are paired t-tests of "no difference", which Holm's adjustment is over, within
# each family (stats.family_of: one metric and one of these kinds). Not tests: the Δ during training (the final Δ
# again, step by step), Muon's and AdamW's Δ beside an interaction (their arms' paired_delta), the bootstrap over
# examples (not a t-test), and a Δ of one seed pair or with a diverged seed (no interval).
PAIRED_TESTS = ("paired_delta", "delta_vs_reference_setting", "interaction")

Key = tuple[str, str, str, str]  # numbers.csv's depth, arm, metric, statistic


class Numbers(list):
    """numbers.csv's rows (depth, arm, metric, statistic, value), added by the sections as they print. holm: each
    paired test (paired_tests) -> its p adjusted by Holm's method within its family."""

    def __init__(self, holm: dict[Key, float] | None = None):
        super().__init__()
        self.holm = holm or {}

    def add(self, depth: str, arm: str, metric: str, statistic: str, value) -> None:
        if value is not None:
            self.append((depth, arm, metric, statistic, value))

    def estimate(self, depth: str, arm: str, metric: str, name: str, e: Estimate | None) -> None:
        """The estimate's value, interval and n; for a test of the family also the per-seed SD, the prediction
        interval of one new seed pair, p and Holm's p."""
        if e is None:
            return
        for statistic, value in (("", e.value), ("_ci95_low", e.low), ("_ci95_high", e.high), ("_n", e.n)):
            self.add(depth, arm, metric, name + statistic, value)
        if (depth, arm, metric, name) in self.holm:
            low, high = e.prediction
            for statistic, value in (("_sd", e.sd), ("_pi95_low", low), ("_pi95_high", high), ("_p", e.p),
                                     ("_p_holm", self.holm[depth, arm, metric, name])):
                self.add(depth, arm, metric, name + statistic, value)

    def p_text(self, depth: str, arm: str, metric: str, name: str, e: Estimate) -> str:
        """"p (Holm's p)" of a test of the family, "—" for any other estimate."""
        holm = self.holm.get((depth, arm, metric, name))
        return "—" if holm is None else f"{fmt_p(e.p)} ({fmt_p(holm)})"


def paired_tests(results: list[ArmResult], interactions: list[OptimizerInteraction],
                 settings: list[SettingRow]) -> dict[Key, Estimate]:
    """The report's paired tests (PAIRED_TESTS): each arm's paired Δ vs its baseline (every metric, and the residual
    scalars per layer), each setting's Δ − the reference's Δ and each optimizer × XSA interaction, under the keys
    the sections write them to numbers.csv with, where there is a t-test (two seed pairs or more, finite)."""
    tests = {}
    for r in results:
        tests |= {(r.depth, r.arm.label, metric, "paired_delta"): e for metric, e in r.paired.items()}
        for prefix, layers in r.layer_paired.items():
            tests |= {(r.depth, r.arm.label, f"{prefix}/L{layer}", "paired_delta"): e for layer, e in layers.items()}
    tests |= {(row.depth, row.numbers_arm, row.metric, "interaction"): row.interaction for row in interactions}
    tests |= {(row.depth, row.arm.label, "val/bpb", "delta_vs_reference_setting"): row.versus_reference
              for row in settings if row.versus_reference is not None}
    return {key: e for key, e in tests.items() if e.p is not None and math.isfinite(e.p)}


def slug(text: str) -> str:
    """A file name part: the text's word characters, cut to 80 with a hash of the whole when longer (a setting
    label of many keys would pass a file system's 255 bytes)."""
    name = re.sub(r"[^\w.-]+", "_", text)
    return name if len(name) <= 80 else f"{name[:71]}_{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def num(x: float, digits: int = 4, sign: bool = False) -> str:
    return f"{x:{'+' if sign else ''}.{digits}f}".replace("-", "\u2212")  # a typographic minus, as in print


def fmt_estimate(e: Estimate) -> str:
    return f"{num(e.value)} (n=1)" if e.low is None else f"{num(e.value)} ± {num(e.high - e.value)} (n={e.n})"


def fmt_delta(delta: tuple[float, float | None] | None) -> str:
    if delta is None:
        return "—"
    return f"{num(delta[0], sign=True)} ({'n/a' if delta[1] is None else num(delta[1], 2, sign=True) + '%'})"


def fmt_interval(e: Estimate) -> str:
    return f"n={e.n}, no interval" if e.low is None else f"[{num(e.low, sign=True)}, {num(e.high, sign=True)}]"


def fmt_difference(e: Estimate | None) -> str:
    return "—" if e is None else f"{num(e.value, sign=True)} {fmt_interval(e)} ({count(e.n, 'seed')})"


def count(n: int, thing: str) -> str:
    """'1 seed', '2,000 examples'."""
    return f"{n:,} {thing}" + ("" if n == 1 else "s")


def fmt_p(p: float) -> str:
    """p to 3 decimals, or to as many more as keep it on its side of 0.05 (0.0497, not 0.050 beside "yes")."""
    if p < 0.001:
        return "<0.001"
    digits = 3
    while digits < 6 and (float(f"{p:.{digits}f}") < 0.05) != (p < 0.05):
        digits += 1
    if (float(f"{p:.{digits}f}") < 0.05) != (p < 0.05):  # within 5e-7 below 0.05
        return "<0.05"
    return f"{p:.{digits}f}"


def fmt_spread(e: Estimate) -> list[str]:
    """The per-seed SD and the 95% prediction interval of one new seed pair, "—" without a t-interval."""
    if e.sd is None or not math.isfinite(e.sd):
        return ["—", "—"]
    low, high = e.prediction
    return [num(e.sd), f"[{num(low, sign=True)}, {num(high, sign=True)}]"]


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def results_numbers(results: list[ArmResult], out: Numbers) -> None:
    """The final results and the differences vs baseline (tables of depth_section)."""
    for r in results:
        for metric, estimate in r.values.items():
            out.estimate(r.depth, r.arm.label, metric, "mean", estimate)
            delta = r.delta(metric)
            if delta is not None:
                out.add(r.depth, r.arm.label, metric, "delta", delta[0])
                out.add(r.depth, r.arm.label, metric, "delta_pct", delta[1])
            for name, table in (("paired_delta", r.paired), ("bootstrap_delta", r.bootstrap)):
                out.estimate(r.depth, r.arm.label, metric, name, table.get(metric))
            for run in r.runs:
                out.add(r.depth, r.arm.label, metric, f"run:{run.label}", run.finals.get(metric))


def final_table(depth: str, results: list[ArmResult]) -> list[str]:
    metrics = metric_names([run for r in results for run in r.runs])
    header = ["arm", "seeds", "steps"] + [cell for m in metrics for cell in (m, f"Δ {m}")]
    rows, not_relative = [], False
    for r in results:
        steps = sorted({run.steps for run in r.runs})
        span = f"{steps[0]:,}" + (f"–{steps[-1]:,}" if len(steps) > 1 else "")
        cells = [r.arm.label, ", ".join(str(run.seed) for run in r.runs), span]
        for m in metrics:
            cells.append(fmt_estimate(r.values[m]) if m in r.values else "—")
            delta = r.delta(m)
            not_relative |= delta is not None and delta[1] is None
            cells.append("baseline" if r.is_baseline else fmt_delta(delta))
        rows.append(cells)
    parts = ["### Final results", "",
             "Mean ± 95% CI over seeds; Δ: arm mean − baseline mean over the seeds both have, as paired below "
             "(relative to that baseline mean). Lower val/bpb is better, higher CORE and ChatCORE are better.", "",
             md_table(header, rows), ""]
    if not_relative:
        parts += [f"n/a: a relative change is printed only where the baseline mean is at least "
                  f"{RELATIVE_MIN_BASELINE:g}; below that (negative, zero or near zero, as centered CORE scores "
                  "of small models are) a percentage of the baseline means nothing.", ""]
    return parts


def coverage(depth: str, runs: list[Run], out: Numbers) -> list[str]:
    """"val/bpb over N of M tokens" for runs that did not cover the whole validation split: once when all runs
    of the depth share it, else per run; nothing when every run covers the whole split."""
    partial = {run.label: rd.describe_val_scope(run.val_scope) for run in sorted(runs, key=lambda r: r.label)
               if rd.describe_val_scope(run.val_scope)}
    for run in runs:
        if run.label in partial:
            out.add(depth, run.arm.label, "val/bpb", f"val_tokens:{run.label}", run.val_scope["tokens"])
            out.add(depth, run.arm.label, "val/bpb", f"val_split_tokens:{run.label}", run.val_scope.get("split_tokens"))
    if not partial:
        return []
    if len(partial) == len(runs) and len(set(partial.values())) == 1:
        return [f"Validation coverage: val/bpb {next(iter(partial.values()))} (every run of this depth).", ""]
    return ["Validation coverage (the other runs cover the whole split):", "",
            *(f"- `{label}`: val/bpb {scope}" for label, scope in partial.items()), ""]


def training_length(depth: str, results: list[ArmResult], out: Numbers) -> list[str]:
    """Tokens seen, tokens per parameter and, for a corpus held in memory, epochs of its training split (run.json's
    epoch_tokens): the median over each arm's runs, in one line when every arm has the same."""
    lines = {}
    for r in results:
        tokens = float(np.median([run.tokens for run in r.runs]))
        per_parameter = tokens / r.n_params
        epochs = [run.tokens / run.info["epoch_tokens"] for run in r.runs if run.info.get("epoch_tokens")]
        epochs = float(np.median(epochs)) if len(epochs) == len(r.runs) else None
        out.add(depth, r.arm.label, "tokens_seen", "median", tokens)
        out.add(depth, r.arm.label, "tokens_per_parameter", "median", per_parameter)
        out.add(depth, r.arm.label, "epochs", "median", epochs)
        lines[r.arm.label] = (f"{tokens:,.0f} tokens seen, {per_parameter:.2f} per parameter"
                              + ("" if epochs is None else f", {epochs:.2f} epochs of the training split"))
    if len(set(lines.values())) == 1:
        return [f"Training length: {next(iter(lines.values()))} (every arm; median over runs, parameters: run.json's "
                "total).", ""]
    return ["Training length (median over each arm's runs; parameters: run.json's total):", "",
            *(f"- `{arm}`: {line}" for arm, line in lines.items()), ""]


def differences(results: list[ArmResult], out: Numbers) -> list[str]:
    metrics = metric_names([run for r in results for run in r.runs])
    tests = []
    for r in results:
        for m in metrics:
            for test, name, table, unit in (("paired over seeds", "paired_delta", r.paired, "seed"),
                                            ("paired bootstrap over examples", "bootstrap_delta", r.bootstrap,
                                             "example")):
                if m in table:
                    e = table[m]
                    tests.append([r.arm.label, m, test, num(e.value, sign=True), fmt_interval(e), count(e.n, unit),
                                  e.significant, out.p_text(r.depth, r.arm.label, m, name, e), *fmt_spread(e)])
    parts = ["### Differences vs baseline", ""]
    if not tests:
        return parts + ["No arm shares a seed with a baseline arm of its depth, optimizer and lr scale.", ""]
    return parts + ["significant? no: the 95% interval includes zero, so the difference is not distinguishable "
                    "from noise; n.a.: a single seed pair gives no interval. The bootstrap covers the sampling of "
                    "the (Chat)CORE examples only; the seeds' spread is in the paired test. p: the paired t-test's, "
                    "two-sided (below 0.05 exactly where the interval excludes zero); in brackets, Holm's adjustment "
                    "within its family (the report's tests of one metric and kind). SD: of the per-seed differences; "
                    "95% PI: where one new seed pair's difference would fall (Δ ± t·SD·√(1 + 1/n)).", "",
                    md_table(["arm", "metric", "test", "Δ", "95% CI", "n", "significant?", "p (Holm)", "SD per seed",
                              "95% PI, one new pair"], tests), ""]


def val_bpb_by_step_section(depth: str, results: list[ArmResult], out: Numbers) -> list[str]:
    """Δ val/bpb at every validation step of the runs, where they validated more than once: when in training a
    difference arises or closes."""
    arms = [r for r in results if len(r.val_bpb_by_step) > 1]
    if not arms:
        return []
    for r in arms:
        for step, e in r.val_bpb_by_step.items():
            out.estimate(depth, r.arm.label, "val/bpb", f"paired_delta_step_{step}", e)
    steps = sorted({step for r in arms for step in r.val_bpb_by_step})
    rows = [[f"{step:,}", *(fmt_difference(r.val_bpb_by_step.get(step)) for r in arms)] for step in steps]
    return ["### Δ val/bpb during training", "",
            "At each validation step: arm − baseline, paired over the seeds whose runs both logged val/bpb there, "
            "with its 95% CI.", "",
            md_table(["step", *(f"Δ {r.arm.label}" for r in arms)], rows), ""]


def optimizer_section(depth: str, rows: list[OptimizerInteraction], out: Numbers) -> list[str]:
    if not rows:
        return []
    table = []
    for row in rows:
        table.append([row.label, row.metric, fmt_difference(row.muon), fmt_difference(row.adamw),
                      fmt_difference(row.interaction), row.interaction.significant,
                      out.p_text(depth, row.numbers_arm, row.metric, "interaction", row.interaction)])
        for name, e in (("muon_paired_delta", row.muon), ("adamw_paired_delta", row.adamw),
                        ("interaction", row.interaction)):
            out.estimate(depth, row.numbers_arm, row.metric, name, e)
    return ["### Optimizer × XSA", "",
            "Does XSA's effect carry over from AdamW to Muon? Δ: XSA arm − the no-XSA arm of the same optimizer and "
            "lr scale, paired over seeds (95% t-CI); interaction: per seed, Δ under Muon − Δ under AdamW, over the "
            "seeds all four arms share. significant? and p (Holm-adjusted p) are the interaction's; the Δs' are "
            "under Differences vs baseline.", "",
            md_table(["XSA arm", "metric", "Δ under Muon", "Δ under AdamW", "interaction (Muon − AdamW)",
                      "significant?", "p (Holm)"], table), ""]


def stability_section(depth: str, rows: list[StabilityRow], out: Numbers) -> list[str]:
    if not rows:
        return []
    table = []
    for row in rows:
        table.append([row.arm.optim, row.arm.xsa_label, f"{row.arm.lr_scale:g}", str(row.runs), str(row.diverged),
                      str(row.spikes), "—" if row.val_bpb is None else fmt_estimate(row.val_bpb),
                      fmt_difference(row.paired)])
        label = row.arm.label
        for statistic, value in (("runs", row.runs), ("diverged", row.diverged), ("spikes", row.spikes)):
            out.add(depth, label, "stability", statistic, value)
        out.estimate(depth, label, "val/bpb", "finite_mean", row.val_bpb)  # its paired Δ: results_numbers'
    return ["### Learning-rate stability", "",
            "Every run of each optimizer × α × lr scale, failed and unfinished ones included. diverged: a non-finite "
            "train/loss or val/bpb in metrics.csv (a skipped step included), or a run stopped on a non-finite loss "
            f"or gradient (status.json). spikes: after the first {WARMUP_FRACTION:.0%} of the steps, a step whose "
            f"train/loss exceeds the lowest smoothed loss so far by more than {SPIKE_RISE:.0%} (consecutive steps "
            "count once), summed over the runs. val/bpb: mean ± 95% CI over the seeds of the complete runs with a "
            "finite value (a seed's reruns averaged); "
            "Δ: paired vs the no-XSA arm at the same optimizer and lr scale.", "",
            md_table(["optimizer", "XSA", "lr scale", "runs", "diverged", "spikes", "final val/bpb",
                      "Δ val/bpb vs baseline"], table), ""]


def learned_alpha_section(depth: str, results: list[ArmResult], out: Numbers) -> list[str]:
    """Final α per layer and head of each learnable arm: the last diagnostics.jsonl line, mean over seeds."""
    parts = []
    for r in results:
        per_seed = defaultdict(list)
        for run in r.runs:
            if run.final_alpha is not None:
                per_seed[run.seed].append(run.final_alpha)
        shapes = {a.shape for alphas in per_seed.values() for a in alphas}
        if r.arm.alpha is not None or not per_seed or len(shapes) != 1 or len(next(iter(shapes))) != 2:
            continue
        alphas = [np.mean(reruns, axis=0) for reruns in per_seed.values()]  # each seed once
        mean = np.mean(alphas, axis=0)
        n_heads = mean.shape[1]
        table = []
        for layer, heads in enumerate(mean):
            table.append([str(layer), *(num(a, 3) for a in heads), num(heads.mean(), 3)])
            out.add(depth, r.arm.label, f"alpha/L{layer}", "final_mean", float(heads.mean()))
            for head, a in enumerate(heads):
                out.add(depth, r.arm.label, f"alpha/L{layer}/H{head}", "final_mean", float(a))
        parts += [f"Final learned α of `{r.arm.label}`: the last diagnostics step's α per layer and head, mean "
                  f"over {count(len(alphas), 'seed')} (0 in layers without XSA):", "",
                  md_table(["layer", *(f"head {h}" for h in range(n_heads)), "mean"], table), ""]
    return ["### Learned α", "", *parts] if parts else []


def diagnostics_section(depth: str, results: list[ArmResult], out: Numbers) -> list[str]:
    """Per arm and layer, each reported diagnostic at the runs' last diagnostics step, mean over seeds."""
    table = []
    for r in results:
        per_layer = {name: r.last_per_layer(f"diag/{name}") for name in REPORTED_DIAGNOSTICS}
        if all(values.empty for values in per_layer.values()):
            continue
        cells = [r.arm.label]
        for name, values in per_layer.items():
            if values.empty:
                cells.append("—")
                continue
            out.add(depth, r.arm.label, f"diag/{name}", "last_mean", float(values.mean()))
            for layer, value in values.items():
                out.add(depth, r.arm.label, f"diag/{name}/L{layer}", "last_mean", float(value))
            cells.append(" / ".join(num(v, 3) for v in values) + f" (mean {num(values.mean(), 3)})")
        table.append(cells)
    if not table:
        return []
    return ["### Attention diagnostics", "",
            "At each run's last diagnostics step, per layer (0 / 1 / ...; mean over layers in brackets), mean over "
            "seeds: attn_self_cos = cos(y_i, v_i), out_self_cos = cos(z_i, v_i) (≈ 0 where α = 1), diag_attn = a_ii, "
            "attn_entropy in nats.", "",
            md_table(["arm", *REPORTED_DIAGNOSTICS], table), ""]


def residual_scalars_section(depth: str, results: list[ArmResult], out: Numbers) -> list[str]:
    """Per arm and layer, the learned λ_resid and λ_x0 at the runs' last diagnostics step (mean over seeds),
    and each arm's change from its baseline, paired over seeds."""
    values, changes = [], []
    for r in results:
        for prefix, name in RESIDUAL_SCALARS.items():
            per_layer = r.last_per_layer(prefix)
            if per_layer.empty:
                continue
            for layer, value in per_layer.items():
                out.add(depth, r.arm.label, f"{prefix}/L{layer}", "last_mean", float(value))
            values.append([r.arm.label, name, *(num(v, 3) for v in per_layer)])
            differences = r.layer_paired.get(prefix, {})
            for layer, e in differences.items():
                out.estimate(depth, r.arm.label, f"{prefix}/L{layer}", "paired_delta", e)
            if differences:
                changes.append([r.arm.label, name, *(
                    f"{fmt_difference(e)}, p {out.p_text(depth, r.arm.label, f'{prefix}/L{layer}', 'paired_delta', e)}"
                    for layer, e in differences.items())])
    if not values:
        return []
    layers = max(len(row) for row in values) - 2
    parts = ["### Learned residual scalars", "",
             "x = λ_resid[i]·x + λ_x0[i]·x0 before block i (x0: the normed token embedding): each run's values at "
             "its last diagnostics step, mean over seeds.", "",
             md_table(["arm", "scalar", *(f"layer {i}" for i in range(layers))], values), ""]
    if changes:
        parts += ["Change from the arm's baseline, paired over seeds (95% CI; p: the paired t-test's, Holm's "
                  "adjustment in brackets):", "",
                  md_table(["arm", "scalar", *(f"Δ layer {i}" for i in range(layers))], changes), ""]
    return parts


def mechanism_section(depth: str, results: list[ArmResult], out: Numbers) -> list[str]:
    table = []
    for r in results:
        tps, ratio = r.tokens_per_sec, r.step_time_ratio
        if tps is None:
            continue
        out.add(depth, r.arm.label, "train/tokens_per_sec", "median", tps)
        out.add(depth, r.arm.label, "train/tokens_per_sec", "step_time_ratio", ratio)
        table.append([r.arm.label, f"{tps:,.0f}", "baseline" if r.is_baseline else
                      "—" if ratio is None else f"{ratio:.3f}"])
    if not table:
        return []
    return ["### Step time", "",
            "tokens/s: the median over the arm's runs of each run's median train/tokens_per_sec; step-time ratio: "
            "baseline tokens/s ÷ arm tokens/s (above 1: the arm's steps take longer). Measured in the runs, so "
            "runs on different machines or sharing one are not comparable.", "",
            md_table(["arm", "tokens/s", "step-time ratio vs baseline"], table), ""]


def scale_section(points: list[TrendPoint], plot: str | None, out: Numbers) -> str:
    if not points:
        return ""
    table = []
    for p in points:
        table.append([p.arm.label, p.depth, f"{p.n_params:,}", num(p.delta.value, sign=True), fmt_interval(p.delta),
                      str(p.delta.n), p.delta.significant,
                      out.p_text(p.depth, p.arm.label, "val/bpb", "paired_delta", p.delta)])
        out.add(p.depth, p.arm.label, "val/bpb", "n_params", p.n_params)
    parts = ["## Scale: Δ val/bpb vs model size", "",
             "Δ: XSA arm − its baseline arm (same depth, optimizer and lr scale), paired over seeds, 95% t-CI; "
             "p: the paired t-test's, Holm's adjustment in brackets; parameters: run.json's total.", "",
             md_table(["arm", "depth", "parameters", "Δ val/bpb", "95% CI", "seeds", "significant?", "p (Holm)"],
                      table), ""]
    if plot:
        parts += [f"![Δ val bpb vs model size](plots/{plot})", ""]
    return "\n".join(parts) + "\n"


def settings_table(rows: list[SettingRow], out: Numbers) -> str:
    """The settings of one depth side by side: XSA's Δ at each, and its change from the reference setting."""
    base = rows[0].base_depth
    reference = any(row.setting == "" for row in rows)
    table = []
    for row in rows:
        versus = [fmt_difference(row.versus_reference), row.versus_reference.significant,
                  out.p_text(row.depth, row.arm.label, "val/bpb", "delta_vs_reference_setting", row.versus_reference)] \
            if row.versus_reference is not None else ["reference" if row.setting == "" else "—", "—", "—"]
        table.append([row.arm.label, row.setting or "(reference)", num(row.delta.value, sign=True),
                      fmt_interval(row.delta), str(row.delta.n), row.delta.significant,
                      out.p_text(row.depth, row.arm.label, "val/bpb", "paired_delta", row.delta),
                      *(versus if reference else [])])
        out.estimate(row.depth, row.arm.label, "val/bpb", "delta_vs_reference_setting", row.versus_reference)
    note = (" Against the reference: per seed, Δ at the setting − Δ at the reference setting (whose every value is "
            "the one most of the settings share, or the one --reference-setting gave), over the seeds both have, 95% "
            "t-CI; significant? and p there are this difference's." if reference else "")
    return "\n".join([
        f"## Settings of `{base}` side by side", "",
        "Δ: XSA arm − its baseline arm (same depth and settings, optimizer and lr scale), paired over seeds, 95% "
        f"t-CI; p: the paired t-test's, Holm's adjustment in brackets; rows by arm, then Δ.{note}", "",
        md_table(["arm", "setting", "Δ val/bpb", "95% CI", "seeds", "significant?", "p (Holm)",
                  *(["Δ − Δ at the reference", "significant?", "p (Holm)"] if reference else [])], table), ""]) + "\n"


def setting_section(key: str, name: str, points: list[TrendPoint], plot: str | None, out: Numbers) -> str:
    table = []
    for p in points:
        table.append([p.series, str(p.x), f"{p.n_params:,}", num(p.delta.value, sign=True), fmt_interval(p.delta),
                      str(p.delta.n), p.delta.significant,
                      out.p_text(p.depth, p.arm.label, "val/bpb", "paired_delta", p.delta)])
        out.add(p.depth, p.arm.label, "val/bpb", name, p.x)
    parts = [f"## Δ val/bpb vs {name} (`{key}`)", "",
             "Δ: XSA arm − its baseline arm (same depth and settings, optimizer and lr scale), paired over seeds, "
             "95% t-CI; p: the paired t-test's, Holm's adjustment in brackets; one line per arm (and any other "
             "setting that varies).", "",
             md_table(["line", name, "parameters", "Δ val/bpb", "95% CI", "seeds", "significant?", "p (Holm)"],
                      table), ""]
    if plot:
        parts += [f"![Δ val bpb vs {name}](plots/{plot})", ""]
    return "\n".join(parts) + "\n"


def plots_section(plots: list[tuple[str, str]]) -> list[str]:
    return [line for title, file in plots for line in (f"### {title}", "", f"![{title}](plots/{file})", "")]


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
    same_seed = defaultdict(list)
    for run in runs:
        same_seed[run.depth, run.arm.label, run.seed].append(run)
    reruns = [(key, group) for key, group in same_seed.items() if len(group) > 1]
    if reruns:
        # A cell's statistics average a seed's reruns; listed so that a copy (an override that changed nothing)
        # or a rerun on another machine kind shows.
        parts += ["", "## Runs of one seed in one cell (averaged in its statistics)", ""]
        for (depth, arm, seed), group in reruns:
            bpb = {run.finals.get("val/bpb") for run in group}
            agree = "equal to the last bit" if len(bpb) == 1 else "differing"
            parts.append(f"- {depth}, {arm}, seed {seed}: {', '.join(f'`{r.label}`' for r in group)}: "
                         f"val/bpb {agree}")
    return "\n".join(parts) + "\n"


def source_text(run: Run, metric: str) -> str:
    source = run.sources[metric]
    return source if isinstance(source, str) else source.relative_to(run.path).as_posix()
