"""The study's report: tables, statistics and plots from run directories.

    python -m xsa_exp.report <sweep or run dirs...> [--out DIR] [--baseline-alpha 0] [--force]
    python -m xsa_exp.report --summary docs/results [--out DIR]
    python -m xsa_exp.report --seed-rule [--sd 0.001 0.01] [--stages 5 10] [--simulations N] [--seed 0]

Writes report.md (tables, linked plots, the runs included, the runs missing or failed), numbers.csv (every
number of report.md, long format: depth, arm, metric, statistic, value) and plots/*.png into --out
(default <first dir>/report), which must be new or empty unless --force. --summary: the committed questions'
paired Δ val/bpb in one forest plot and table, from docs/results/summary.yaml and their numbers.csv alone;
--seed-rule: the study's seed rule's type-I error, simulated under the null (docs/report.md).

Modules: runs (finding and loading runs, Arm), sweep (the jobs a Hydra sweep was to run), stats
(statistics), compare (arms, baselines and the study's comparisons), plots, render (report.md and
numbers.csv), summary (--summary), seed_rule (--seed-rule), cli (build_report and the command line).

Runs are the directories holding config.yaml + run.json, found recursively. A run is complete with
metrics.csv and checkpoints/final.ckpt; others are listed as failed, never fatal, as are the jobs of a
Hydra sweep (multirun.yaml) that have no directory or no run.json; failed runs with a run.json still count
in the learning-rate stability table.

An arm is optimizer + α (or learnable α) + XSA layers + value source + lr scale; seeds are pooled within
it. XSA that changes nothing (α = 0 or no XSA layers) is standard attention whatever its other settings, so
all such runs of an optimizer and lr scale form one arm, "no XSA". Each arm is compared with the baseline
arm of its depth, optimizer and lr scale: the one with α = --baseline-alpha. SFT runs (stage=sft) form
their own depth section, "<depth> · SFT", where ChatCORE is reported.

Statistics (all 95%): mean ± t-interval over seeds (none for n=1); paired differences over the seeds an
arm shares with its baseline, each with its t-test's p, Holm's p over the report's paired tests, the per-seed
SD and the prediction interval of one new seed pair; for CORE and ChatCORE, a paired bootstrap over the
examples both arms answered, resampled within tasks. The rules (relative change, loss spikes, divergence)
are in stats and runs.
"""

from xsa_exp.report.cli import build_report, main
from xsa_exp.report.compare import ArmResult, compare, optimizer_interactions, scale_trend, setting_trends, stability
from xsa_exp.report.runs import ReportError, Run, load_run
from xsa_exp.report.stats import (
    Estimate,
    band,
    bootstrap_examples,
    count_spikes,
    holm,
    mean_ci,
    relative_change,
    t_quantile,
)
from xsa_exp.report.sweep import expected_jobs, sweep_jobs

__all__ = ["ArmResult", "Estimate", "ReportError", "Run", "band", "bootstrap_examples", "build_report",
           "compare", "count_spikes", "expected_jobs", "holm", "load_run", "main", "mean_ci", "optimizer_interactions",
           "relative_change", "scale_trend", "setting_trends", "stability", "sweep_jobs", "t_quantile"]
