"""build_report (run directories -> report folder) and the command line."""

from __future__ import annotations

import argparse
import csv
import os
import warnings
from pathlib import Path

from xsa_exp.console import set_up_console
from xsa_exp.errors import XsaExpWarning, exit_on_user_error
from xsa_exp.report import compare as cmp
from xsa_exp.report import plots, render, seed_rule, summary
from xsa_exp.report.runs import (
    Problem,
    ReportError,
    Run,
    RunProblem,
    assign_settings,
    discover,
    incomplete_reason,
    load_run,
)
from xsa_exp.report.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, holm_by_family

DESCRIPTION = "The study's report: tables, statistics and plots from run directories."


def build_report(paths: list[Path], out_dir: Path | None = None, baseline_alpha: float = 0.0,
                 force: bool = False, reference: dict[str, str] | None = None) -> Path:
    """Write the report of the runs under `paths` into out_dir (default <paths[0]>/report); returns report.md.
    reference: the settings to take as each depth's reference (runs.assign_settings)."""
    paths = [Path(p).expanduser() for p in paths]
    if not paths:
        raise ReportError("give at least one sweep or run directory")
    out_dir = Path(out_dir).expanduser() if out_dir is not None else paths[0] / "report"
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError(f"{out_dir} is a file, not a report folder; choose another --out")
    filled = out_dir.is_dir() and any(out_dir.iterdir())
    if filled and not force:
        raise ReportError(f"{out_dir} already exists and is not empty; nothing was overwritten "
                          "(choose another --out, or pass --force)")
    if filled and not (out_dir / "report.md").is_file():
        raise ReportError(f"{out_dir} is not empty and holds no report.md: not a report folder, so --force does not "
                          "replace it; nothing was overwritten (choose another --out)")
    if not 0 <= baseline_alpha <= 1:  # NaN too
        raise ReportError(f"--baseline-alpha {baseline_alpha:g} is not an α of XSA; give one in [0, 1]")
    loaded, problems = load_runs(paths, reference)
    runs = [run for run in loaded if run.complete]
    if not runs:
        warnings.warn(f"no complete run under {', '.join(map(str, paths))}: the report lists only the "
                      f"{len(problems)} missing, failed or unreadable", XsaExpWarning, stacklevel=2)
    alphas = sorted({run.arm.alpha for run in runs if run.arm.alpha is not None})
    if baseline_alpha != 0 and baseline_alpha not in alphas:  # α = 0: the no-XSA arms too, by layers=none
        raise ReportError(f"--baseline-alpha {baseline_alpha:g}: no complete run has that α (the runs' fixed α: "
                          f"{', '.join(f'{a:g}' for a in alphas) or 'none'}); give one of them")
    results = cmp.compare(runs, baseline_alpha)
    interactions = cmp.optimizer_interactions(results)
    settings = cmp.setting_rows(results)
    tests = render.paired_tests(results, interactions, [row for rows in settings.values() for row in rows])

    plots_dir = out_dir / "plots"
    try:
        plots_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot make the report folder {out_dir} ({e.strerror}: {e.filename}); choose another "
                          "--out") from None
    for stale in plots_dir.glob("*.png"):  # --force: no plot of an earlier report may pass for this one's
        stale.unlink()
    out = render.Numbers(holm_by_family({key: e.p for key, e in tests.items()})[0])
    render.results_numbers(results, out)
    sections = depth_sections(results, interactions, cmp.stability(loaded, results), plots_dir, out)
    trends = trend_sections(results, settings, plots_dir, out)

    with open(out_dir / "numbers.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["depth", "arm", "metric", "statistic", "value"])
        writer.writerows(out)
    baseline = "no XSA (α = 0 or no XSA layers)" if baseline_alpha == 0 else f"α = {baseline_alpha:g}"
    head = ["# XSA study report", "",
            f"From {', '.join(f'`{p}`' for p in paths)}: {len(runs)} complete runs, {len(problems)} missing or failed. "
            f"Baseline: {baseline}, same depth, optimizer and lr scale. Arms pool their seeds. CIs are 95%: "
            f"t-intervals over seeds; CORE and ChatCORE also get a paired bootstrap over examples "
            f"({BOOTSTRAP_RESAMPLES} resamples within tasks, seed {BOOTSTRAP_SEED}). p: a paired t-test's, two-sided; "
            f"p (Holm): p with Holm's adjustment within its family: this report's tests of one metric and one kind "
            "(every arm's and setting's paired Δ vs baseline; every setting's Δ − the reference's Δ; every "
            f"optimizer × XSA interaction; the residual scalars' change, per layer), {len(tests)} tests in all; not "
            "the Δ at each validation step, the bootstrap, nor a Δ of one seed pair. numbers.csv holds every number "
            "below.", ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(head + sections) + "\n" + trends
                      + render.runs_section(sorted(runs, key=lambda r: r.label), problems))
    return report


def load_runs(paths: list[Path], reference: dict[str, str] | None = None) -> tuple[list[Run], list[Problem]]:
    """Every run under `paths` that could be read (complete or not, with its settings assigned), and the problems:
    sweep jobs that never became runs, unreadable and incomplete runs."""
    run_dirs, sweep_problems = discover(paths)
    if not run_dirs and not sweep_problems:
        raise ReportError(f"no run directories (config.yaml + run.json) found under {', '.join(map(str, paths))}")
    # Runs are named by their path from just above the given folders: "<sweep>/3", "<run dir>".
    base = Path(os.path.commonpath([p.resolve() for p in paths])).parent

    def label(path: Path) -> str:
        return os.path.relpath(path.resolve(), base)

    loaded, problems = [], [Problem(label(p), reason) for p, reason in sweep_problems]
    for path in run_dirs:
        try:
            run = load_run(path, label(path))
        except RunProblem as e:
            problems.append(Problem(label(path), str(e)))
            continue
        loaded.append(run)
        if not run.complete:
            problems.append(Problem(run.label, incomplete_reason(run)))
    assign_settings(loaded, reference)
    return loaded, sorted(problems, key=lambda p: p.label)


def depth_sections(results: list[cmp.ArmResult], interactions: list[cmp.OptimizerInteraction], stability: dict,
                   plots_dir: Path, out: render.Numbers) -> list[str]:
    """One section per depth (and setting): tables, statistics, diagnostics and plots."""
    sections = []
    for depth in dict.fromkeys(r.depth for r in results):
        at_depth = [r for r in results if r.depth == depth]
        name = render.slug(depth)
        plots.plot_curves(depth, at_depth, plots_dir / f"curves_{name}.png")
        made = [("Training curves (mean over seeds, band: min–max over seeds)", f"curves_{name}.png")]
        optional = (("Δ val bpb during training (paired over seeds, band: 95% CI)", "delta_by_step",
                     plots.plot_val_bpb_by_step),
                    ("Final val bpb vs α", "alpha", plots.plot_alpha),
                    ("Learned α per layer vs step (mean over seeds, band: min–max)", "learned_alpha",
                     plots.plot_learned_alpha),
                    ("Attention diagnostics per layer (last diagnostics step)", "diagnostics", plots.plot_diagnostics),
                    ("Learned residual scalars per layer (last diagnostics step)", "residual_scalars",
                     plots.plot_residual_scalars))
        for title, prefix, plot in optional:
            if plot(depth, at_depth, plots_dir / f"{prefix}_{name}.png"):
                made.append((title, f"{prefix}_{name}.png"))
        sections.append("\n".join([
            f"## Depth `{depth}`", "",
            *render.final_table(depth, at_depth),
            *render.coverage(depth, [run for r in at_depth for run in r.runs], out),
            *render.training_length(depth, at_depth, out),
            *render.differences(at_depth, out),
            *render.val_bpb_by_step_section(depth, at_depth, out),
            *render.optimizer_section(depth, [row for row in interactions if row.depth == depth], out),
            *render.stability_section(depth, stability.get(depth, []), out),
            *render.learned_alpha_section(depth, at_depth, out),
            *render.diagnostics_section(depth, at_depth, out),
            *render.residual_scalars_section(depth, at_depth, out),
            *render.mechanism_section(depth, at_depth, out),
            *render.plots_section(made)]))
    return sections


def trend_sections(results: list[cmp.ArmResult], settings: dict[str, list[cmp.SettingRow]], plots_dir: Path,
                   out: render.Numbers) -> str:
    """Δ val/bpb against model size (across depths) and against each setting that varies within a depth."""
    points = cmp.scale_trend(results)
    if points:
        plots.plot_trend(points, plots_dir / "scale.png", "total parameters",
                         "Δ val bpb (XSA − baseline) vs model size")
    text = render.scale_section(points, "scale.png" if points else None, out)
    for rows in settings.values():
        text += render.settings_table(rows, out)
    names = {key: name for r in results for key, name in r.runs[0].setting_names.items()}
    for key, points in cmp.setting_trends(results).items():
        name = names[key]
        plots.plot_trend(points, plots_dir / f"trend_{render.slug(name)}.png", name,
                         f"Δ val bpb (XSA − baseline) vs {name}")
        text += render.setting_section(key, name, points, f"trend_{render.slug(name)}.png", out)
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m xsa_exp.report", description=DESCRIPTION,
        epilog="Three modes, one per call: run directories (the report), --summary RESULTS or --seed-rule.")
    parser.add_argument("paths", nargs="*", type=Path, help="sweep or run directories, searched recursively")
    parser.add_argument("--out", type=Path, default=None,
                        help="report folder (default: <first path>/report); with --summary, the folder of its files "
                             "(default: RESULTS)")
    parser.add_argument("--baseline-alpha", type=float, default=0.0,
                        help="α of the baseline arm (default 0: standard attention)")
    parser.add_argument("--force", action="store_true", help="write into an existing non-empty report folder")
    parser.add_argument("--reference-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="where a depth's runs differ in KEY (optim.lr.x0_scalar, or its end: x0_scalar), "
                             "the setting whose Δ the others' are compared with (default: the value most of its "
                             "settings share, else none); repeatable")
    parser.add_argument("--summary", type=Path, metavar="RESULTS",
                        help="the committed questions' summary from RESULTS/summary.yaml and each question's "
                             "numbers.csv alone: summary.csv, summary.md and forest.png, replaced")
    rule = parser.add_argument_group("the seed rule's type-I error, simulated under the null")
    rule.add_argument("--seed-rule", action="store_true", help="simulate and print it")
    rule.add_argument("--sd", type=float, nargs="+",
                      help=f"per-seed SDs of Δ (default {' '.join(map(str, seed_rule.SDS))})")
    rule.add_argument("--stages", type=int, nargs="+",
                      help=f"seed counts of the rule's stages (default {' '.join(map(str, seed_rule.STAGES))})")
    rule.add_argument("--max-half-width", type=float,
                      help=f"stop early only where the interval is this narrow (default {seed_rule.MAX_HALF_WIDTH})")
    rule.add_argument("--simulations", type=int, help=f"null cells per SD (default {seed_rule.SIMULATIONS:,})")
    rule.add_argument("--seed", type=int, help=f"numpy seed (default {seed_rule.SEED})")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options, checked together; a bad one exits with argparse's usage and one line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.paths) + (args.summary is not None) + args.seed_rule != 1:
        parser.error("give run directories, --summary RESULTS or --seed-rule: one of them")
    if seed_rule_options(args) and not args.seed_rule:
        parser.error("--sd, --stages, --max-half-width, --simulations and --seed go with --seed-rule")
    for setting in args.reference_setting:
        if not setting.partition("=")[0] or "=" not in setting:
            parser.error(f"--reference-setting {setting}: give KEY=VALUE, e.g. optim.lr.x0_scalar=0.5")
    names = [setting.partition("=")[0] for setting in args.reference_setting]
    if len(set(names)) < len(names):
        parser.error(f"--reference-setting names {', '.join(sorted({n for n in names if names.count(n) > 1}))} twice")
    if args.reference_setting and not args.paths:
        parser.error("--reference-setting goes with run directories (a report)")
    return args


def seed_rule_options(args: argparse.Namespace) -> dict:
    """The --seed-rule options given, as seed_rule.describe's keywords."""
    return {name: value for name, value in (("sds", args.sd), ("stages", args.stages),
                                            ("max_half_width", args.max_half_width),
                                            ("simulations", args.simulations), ("seed", args.seed))
            if value is not None}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    set_up_console()
    with exit_on_user_error():
        if args.seed_rule:
            print(seed_rule.describe(**seed_rule_options(args)))
        elif args.summary is not None:
            for path in summary.write_summary(args.summary, args.out):
                print(f"summary: {path}")
        else:
            reference = dict(setting.partition("=")[::2] for setting in args.reference_setting)
            print(f"report: {build_report(args.paths, args.out, args.baseline_alpha, args.force, reference)}")
