"""xsa_exp.report on fake run directories with known numbers."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from xsa_exp import run_dir as rd
from xsa_exp.arm import Arm
from xsa_exp.report import (
    Estimate,
    ReportError,
    band,
    bootstrap_examples,
    build_report,
    holm,
    load_run,
    main,
    mean_ci,
    t_quantile,
)

REPO = Path(__file__).resolve().parents[1]
N_LAYER = 2


def make_run(root: Path, name: str, *, alpha: float = 0.0, seed: int = 1, final_bpb: float = 0.85, steps: int = 20,
             depth: str = "d12", optim: str = "muon", layers="all", learnable: bool = False, complete: bool = True,
             evals: tuple[dict, ...] = (), tokens_per_step: int = 1000, stage: str = "base",
             lr_scale: float = 1.0, n_params: int = 1000, tokens_per_sec: float | None = None,
             losses: list[float] | None = None, val_scope: dict | None = None, status: dict | None = None,
             parametrization: str = "sigmoid", config: str = "", last_row: dict | None = None,
             val_bpb: dict[int, float] | None = None, epoch_tokens: int | None = None) -> Path:
    """A run directory as train.py (+ evaluate.py) leaves it: train rows every step, val at 0, half way and the
    end (ending at final_bpb), a diagnostics row at the end; `evals`: kwargs of make_eval; losses: train/loss per
    step (train/loss_smooth then follows them); config: more of config.yaml (YAML); last_row: more columns of the
    diagnostics row; val_bpb: step -> val/bpb instead of the three default validations; epoch_tokens: run.json's
    training tokens per epoch."""
    run = root / name
    run.mkdir(parents=True)
    xsa_layers = [] if layers == "none" else list(range(N_LAYER))
    arm = Arm.run_keys(stage=stage, depth=depth, alpha=alpha, learnable=learnable, layers=layers, value_source="mixed",
                       optim=optim, lr_scale=lr_scale, seed=seed)
    info = rd.run_info(run_dir=run, max_steps=steps, tokens_per_step=tokens_per_step, grad_accumulation=1,
                       precision="32-true", precision_reason="test", ns_dtype=None, ns_dtype_reason="test",
                       float32_matmul_precision="highest",
                       xsa_layers=xsa_layers, param_counts={"total": n_params}, flops_per_token=6 * n_params, arm=arm,
                       nanochat_transfer=None)
    rd.write_run_files(run, f"depth_name: {depth}\nseed: {seed}\nxsa:\n  alpha: {alpha}\n  layers: {layers}\n"
                            f"  parametrization: {parametrization}\n{config}", info)
    if val_scope is not None:
        rd.update_run_info(run, val_scope=val_scope)
    if epoch_tokens is not None:
        rd.update_run_info(run, epoch_tokens=epoch_tokens)
    if status is not None:
        rd.write_status(run, **status)
    rows = [{"step": s, "train/loss": 5.0 - s / steps, "train/loss_smooth": 5.1 - s / steps}
            for s in range(1, steps + 1)]
    if losses is not None:
        smooth = 5.0
        for row, loss in zip(rows, losses):
            smooth = 0.9 * smooth + 0.1 * loss if math.isfinite(loss) else smooth
            row["train/loss"], row["train/loss_smooth"] = loss, smooth
    if tokens_per_sec is not None:
        for row in rows:
            row["train/tokens_per_sec"] = tokens_per_sec
    if val_bpb is None:
        val_bpb = {s: final_bpb + 0.5 * (1 - s / steps) for s in (0, steps // 2, steps)}
    rows += [{"step": s, "val/bpb": bpb} for s, bpb in val_bpb.items()]
    rows.append({"step": steps, **{f"diag/{m}/L{i}": 0.1 * (i + 1) + alpha
                                   for m in ("attn_self_cos", "out_self_cos", "diag_attn") for i in range(N_LAYER)},
                 **(last_row or {})})
    rows.sort(key=lambda r: r["step"])
    header = sorted({k for r in rows for k in r} | {"tokens_seen"})
    with open(run / rd.METRICS, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows({**r, "tokens_seen": r["step"] * tokens_per_step} for r in rows)
    if complete:
        rd.checkpoints_dir(run).mkdir()
        rd.final_checkpoint(run).write_bytes(b"")
    for kwargs in evals:
        make_eval(run, **{"step": steps, **kwargs})
    return run


def make_eval(run: Path, step: int, metrics: dict, answers: dict[str, list[bool]] | None = None,
              baselines: dict[str, float] | None = None, stamp: str = "20260101-120000",
              chat_answers: dict[str, list[bool]] | None = None) -> Path:
    """eval/final-step<N>-<stamp>/ with summary.json, and CORE / ChatCORE answers per task when given."""
    folder = rd.new_eval_dir(run, rd.final_checkpoint(run), step, stamp)
    rd.write_summary(folder, rd.eval_summary(run=run, checkpoint=rd.final_checkpoint(run), step=step, metrics=metrics))
    if answers is not None:
        with open(folder / "core_examples.jsonl", "w") as f:
            for task, correct in answers.items():
                for i, c in enumerate(correct):
                    f.write(json.dumps({"task": task, "index": i, "original_index": 7 * i, "correct": c,
                                        "pred": 0 if c else 1, "gold": 0, "losses": [1.0, 2.0]}) + "\n")
        with open(folder / "core_tasks.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["label", "task_type", "num_fewshot", "n_examples", "accuracy", "centered",
                             "random_baseline"])
            for task, correct in answers.items():
                acc, b = float(np.mean(correct)), baselines[task]
                writer.writerow([task, "multiple_choice", 0, len(correct), acc, (acc - b / 100) / (1 - b / 100), b])
    if chat_answers is not None:  # as evaluate.py writes them: baseline as a fraction, 0.25 for letters
        with open(folder / "chatcore_examples.jsonl", "w") as f:
            for task, correct in chat_answers.items():
                for i, c in enumerate(correct):
                    f.write(json.dumps({"task": task, "prediction": "A", "answer": "A" if c else "B", "correct": c,
                                        "index": 3 * i}) + "\n")
        with open(folder / "chatcore_tasks.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["task", "n", "correct", "accuracy", "baseline", "centered", "seconds"])
            for task, correct in chat_answers.items():
                acc, b = float(np.mean(correct)), 0.25 if task == "mmlu" else 0.0
                writer.writerow([task, len(correct), sum(correct), acc, b, (acc - b) / (1 - b), 1.0])
    return folder


def numbers(report: Path) -> dict[tuple[str, str, str], float]:
    """numbers.csv as (arm, metric, statistic) -> value."""
    with open(report.parent / "numbers.csv", newline="") as f:
        return {(r["arm"], r["metric"], r["statistic"]): float(r["value"]) for r in csv.DictReader(f)}


BASE, XSA = "muon · no XSA", "muon · α=1 · layers=all · value=mixed"


def table_row(report_text: str, arm: str) -> str:
    return next(line for line in report_text.splitlines() if line.startswith(f"| {arm} |"))


# -----------------------------------------------------------------------------
# Statistics


def test_t_quantile_matches_tables():
    for df, expected in [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)]:
        assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-3)
    assert t_quantile(0.975, 10_000) == pytest.approx(1.960, abs=1e-3)


def test_mean_ci_by_hand():
    values = [0.84, 0.85, 0.86, 0.845, 0.855]
    sd = math.sqrt(sum((v - 0.85) ** 2 for v in values) / 4)
    e = mean_ci(values)
    assert e.value == pytest.approx(0.85)
    assert e.high - e.value == pytest.approx(2.776 * sd / math.sqrt(5), rel=1e-3)
    assert e.value - e.low == pytest.approx(e.high - e.value)
    single = mean_ci([0.8484])
    assert (single.value, single.low, single.high, single.n, single.significant) == (0.8484, None, None, 1, "n.a.")


def test_p_value_is_the_t_test_the_interval_inverts():
    """p equals scipy's one-sample t-test, and p < 0.05 exactly where the 95% interval excludes zero, over samples
    of 2-12 values whose means fall on both sides of the interval's edge."""
    rng = np.random.default_rng(0)
    calls = set()
    for _ in range(2000):
        values = rng.normal(rng.uniform(-1, 1), 1, size=int(rng.integers(2, 13)))
        e = mean_ci(values)
        assert e.p == pytest.approx(stats.ttest_1samp(values, 0.0).pvalue, rel=1e-9, abs=1e-300)
        assert (e.p < 0.05) == (e.significant == "yes")
        calls.add(e.significant)
    assert calls == {"yes", "no"}
    assert mean_ci([0.8484]).p is None and mean_ci([0.1, math.nan]).significant == "n.a."
    assert math.isnan(mean_ci([0.1, math.nan]).p)
    assert (mean_ci([0.0, 0.0]).p, mean_ci([0.2, 0.2]).p) == (1.0, 0.0)  # an interval of one point


def test_sd_and_prediction_interval_by_hand_and_recovered_from_the_interval():
    values = [-0.004, -0.003, -0.005]  # mean -0.004, sd 0.001
    e = mean_ci(values)
    assert e.sd == pytest.approx(0.001)
    low, high = e.prediction
    assert high - e.value == pytest.approx(4.302653 * 0.001 * math.sqrt(1 + 1 / 3), rel=1e-6)
    assert e.value - low == pytest.approx(high - e.value)
    again = Estimate.from_interval(e.value, e.low, e.high, e.n)  # what numbers.csv keeps of it
    assert again.sd == pytest.approx(e.sd, rel=1e-12) and again.p == pytest.approx(e.p, rel=1e-12)
    assert mean_ci([0.8484]).prediction is None


def test_holm_on_the_textbook_example():
    """Wikipedia's "Holm–Bonferroni method" example: p = 0.01, 0.04, 0.03, 0.005 for H1-H4 at α = 0.05 rejects H4
    and H1 only. The adjusted values by Holm's definition, as R's p.adjust(method="holm") gives them: sorted,
    0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, max(0.06, 0.04·1) = 0.06."""
    adjusted = holm({"H1": 0.01, "H2": 0.04, "H3": 0.03, "H4": 0.005})
    assert adjusted == pytest.approx({"H1": 0.03, "H2": 0.06, "H3": 0.06, "H4": 0.02})
    assert {h for h, p in adjusted.items() if p < 0.05} == {"H1", "H4"}
    assert holm({"a": 0.5, "b": 0.6}) == {"a": 1.0, "b": 1.0}  # at most 1
    assert holm({"a": 0.02, "b": 0.02}) == {"a": 0.04, "b": 0.04}  # ties adjust alike
    assert holm({"only": 0.03}) == {"only": 0.03} and holm({}) == {}


def core_folders(tmp_path: Path, arm: dict[str, list[bool]], base: dict[str, list[bool]], baselines: dict[str, float]):
    return [([make_eval(tmp_path / "arm", 10, {}, arm, baselines)],
             [make_eval(tmp_path / "base", 10, {}, base, baselines)])]


def test_bootstrap_finds_a_clear_difference(tmp_path):
    # Task A (chance 25%): 70% vs 50% correct -> centered difference 0.2 / 0.75; task B (chance 50%): the same answers.
    arm = {"A": [True] * 140 + [False] * 60, "B": [True, False] * 100}
    base = {"A": [True] * 100 + [False] * 100, "B": [True, False] * 100}
    pairs = core_folders(tmp_path, arm, base, {"A": 25.0, "B": 50.0})
    e = bootstrap_examples(pairs, "CORE")
    true_difference = (0.2 / 0.75 + 0.0) / 2
    assert e.value == pytest.approx(true_difference)
    assert e.low < true_difference < e.high and e.low > 0
    assert e.significant == "yes"
    assert e.n == 400
    # The interval's width matches the normal approximation: per-example differences d of task A (40 of +1).
    d = np.array([1.0] * 40 + [0.0] * 160)
    se = math.sqrt(d.var() / len(d)) / 0.75 / 2
    assert (e.high - e.low) / 2 == pytest.approx(1.96 * se, rel=0.1)
    assert bootstrap_examples(pairs, "CORE") == e  # fixed seed


def test_bootstrap_calls_equal_accuracy_noise(tmp_path):
    # Same accuracy, different examples right: the difference is zero but the examples disagree a lot.
    arm = {"A": [True] * 100 + [False] * 100}
    base = {"A": [False] * 100 + [True] * 100}
    e = bootstrap_examples(core_folders(tmp_path / "swap", arm, base, {"A": 25.0}), "CORE")
    assert e.value == pytest.approx(0.0)
    assert e.low < 0 < e.high and e.high - e.low > 0.1
    assert e.significant == "no"
    same = bootstrap_examples(core_folders(tmp_path / "same", arm, arm, {"A": 25.0}), "CORE")
    assert (same.value, same.significant) == (0.0, "no")


def test_bootstrap_uses_only_examples_both_arms_answered(tmp_path):
    # The arm also answered 100 extra examples (all right); they have no partner and must not count.
    arm = {"A": [True] * 50 + [False] * 50 + [True] * 100}
    base = {"A": [True] * 50 + [False] * 50}
    e = bootstrap_examples(core_folders(tmp_path, arm, base, {"A": 0.0}), "CORE")
    assert (e.value, e.n) == (0.0, 100)


# -----------------------------------------------------------------------------
# Tables


def test_table_values_and_relative_change(tmp_path):
    make_run(tmp_path / "study", "base", alpha=0.0, final_bpb=0.8484)
    make_run(tmp_path / "study", "xsa", alpha=1.0, final_bpb=0.8457)
    report = build_report([tmp_path / "study"], tmp_path / "out")
    text = report.read_text()
    assert "| 0.8484 (n=1) | baseline |" in table_row(text, BASE)
    assert "| 0.8457 (n=1) | −0.0027 (−0.32%) |" in table_row(text, XSA)
    got = numbers(report)
    assert got[XSA, "val/bpb", "delta"] == pytest.approx(-0.0027)
    assert got[XSA, "val/bpb", "delta_pct"] == pytest.approx(-0.0027 / 0.8484 * 100)
    # One shared seed: a paired difference without an interval, which is not called either way.
    assert got[XSA, "val/bpb", "paired_delta"] == pytest.approx(-0.0027)
    assert "| val/bpb | paired over seeds | −0.0027 | n=1, no interval | 1 seed | n.a. |" in text


def test_seeds_pooled_and_paired(tmp_path):
    study = tmp_path / "study"
    for seed, base, xsa in [(1, 0.850, 0.846), (2, 0.852, 0.849), (3, 0.848, 0.843)]:
        make_run(study, f"base{seed}", alpha=0.0, seed=seed, final_bpb=base)
        make_run(study, f"xsa{seed}", alpha=1.0, seed=seed, final_bpb=xsa)
    make_run(study, "xsa4", alpha=1.0, seed=4, final_bpb=0.900)  # no baseline partner: pooled, not paired
    got = numbers(build_report([study], tmp_path / "out"))

    base_sd = np.std([0.850, 0.852, 0.848], ddof=1)
    assert got[BASE, "val/bpb", "mean"] == pytest.approx(0.850)
    assert got[BASE, "val/bpb", "mean_ci95_high"] - 0.850 == pytest.approx(4.303 * base_sd / math.sqrt(3), rel=1e-3)
    assert got[XSA, "val/bpb", "mean_n"] == 4
    assert got[XSA, "val/bpb", "mean"] == pytest.approx((0.846 + 0.849 + 0.843 + 0.900) / 4)
    # Differences -0.004, -0.003, -0.005: mean -0.004, sd 0.001.
    assert got[XSA, "val/bpb", "paired_delta_n"] == 3
    assert got[XSA, "val/bpb", "paired_delta"] == pytest.approx(-0.004)
    half = 4.303 * 0.001 / math.sqrt(3)
    assert got[XSA, "val/bpb", "paired_delta_ci95_low"] == pytest.approx(-0.004 - half, rel=1e-3)
    assert got[XSA, "val/bpb", "paired_delta_ci95_high"] == pytest.approx(-0.004 + half, rel=1e-3)
    # The final table's Δ is over the seeds both arms have, as the paired Δ: seed 4 moves neither side.
    assert got[XSA, "val/bpb", "delta"] == pytest.approx(-0.004)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| val/bpb | paired over seeds | −0.0040 | [−0.0065, −0.0015] | 3 seeds | yes |" in text
    assert "| 1, 2, 3, 4 | 20 | 0.8595 ± 0.0431 (n=4) | −0.0040 (−0.47%) |" in table_row(text, XSA)


def test_val_bpb_difference_at_every_validation_step_is_paired_over_the_seeds_that_logged_it(tmp_path):
    study = tmp_path / "study"
    base = {1: (1.50, 1.30, 1.20), 2: (1.52, 1.31, 1.22), 3: (1.49, 1.29, 1.21)}
    xsa = {1: (1.53, 1.31, 1.20), 2: (1.56, 1.33, 1.23), 3: (1.51, None, 1.20)}  # seed 3 skipped the step-10 validation
    for seed in (1, 2, 3):
        make_run(study, f"base{seed}", seed=seed, val_bpb=dict(zip((5, 10, 20), base[seed])))
        make_run(study, f"xsa{seed}", alpha=1.0, seed=seed,
                 val_bpb={s: v for s, v in zip((5, 10, 20), xsa[seed]) if v is not None})
    make_run(study, "xsa4", alpha=1.0, seed=4, val_bpb={5: 9.0, 10: 9.0, 20: 9.0})  # no baseline partner
    report = build_report([study], tmp_path / "out")
    got = numbers(report)

    early = [0.03, 0.04, 0.02]  # step 5: mean 0.03, sd 0.01
    assert got[XSA, "val/bpb", "paired_delta_step_5"] == pytest.approx(0.03)
    assert got[XSA, "val/bpb", "paired_delta_step_5_ci95_high"] == pytest.approx(
        0.03 + 4.303 * np.std(early, ddof=1) / math.sqrt(3), rel=1e-3)
    assert got[XSA, "val/bpb", "paired_delta_step_10_n"] == 2
    assert got[XSA, "val/bpb", "paired_delta_step_10"] == pytest.approx(0.015)
    assert got[XSA, "val/bpb", "paired_delta_step_20"] == pytest.approx(got[XSA, "val/bpb", "paired_delta"])
    assert (BASE, "val/bpb", "paired_delta_step_5") not in got
    text = report.read_text()
    assert f"| step | Δ {XSA} |" in text
    assert "| 5 | +0.0300 [+0.0052, +0.0548] (3 seeds) |" in text
    assert "| 10 | +0.0150 [−0.0485, +0.0785] (2 seeds) |" in text
    assert is_png(report.parent / "plots" / "delta_by_step_d12.png") and "](plots/delta_by_step_d12.png)" in text


def test_runs_that_validated_once_have_no_val_bpb_by_step_section(tmp_path):
    study = tmp_path / "study"
    for seed in (1, 2):
        make_run(study, f"base{seed}", seed=seed, val_bpb={20: 1.2 + 0.01 * seed})
        make_run(study, f"xsa{seed}", alpha=1.0, seed=seed, val_bpb={20: 1.21 + 0.01 * seed})
    report = build_report([study], tmp_path / "out")
    assert "during training" not in report.read_text() and not list((report.parent / "plots").glob("delta_by_step*"))
    assert numbers(report)[XSA, "val/bpb", "paired_delta"] == pytest.approx(0.01)


def test_training_length_in_tokens_per_parameter_and_epochs(tmp_path):
    study = tmp_path / "study"
    for seed in (1, 2):  # 20 steps of 1,000 tokens
        make_run(study / "d12", f"base{seed}", seed=seed, n_params=1000, epoch_tokens=8000)
        make_run(study / "d12", f"xsa{seed}", alpha=1.0, seed=seed, n_params=1000, epoch_tokens=8000)
        make_run(study / "tiny", f"base{seed}", depth="tiny", seed=seed, n_params=4000, epoch_tokens=8000)
        make_run(study / "tiny", f"xsa{seed}", depth="tiny", alpha=1.0, seed=seed, n_params=5000)  # a stream: no epochs
    report = build_report([study], tmp_path / "out")
    text, got = report.read_text(), numbers(report)

    assert ("Training length: 20,000 tokens seen, 20.00 per parameter, 2.50 epochs of the training split (every arm; "
            "median over runs, parameters: run.json's total).") in text
    assert f"- `{BASE}`: 20,000 tokens seen, 5.00 per parameter, 2.50 epochs of the training split" in text
    assert f"- `{XSA}`: 20,000 tokens seen, 4.00 per parameter\n" in text
    assert got[XSA, "tokens_per_parameter", "median"] == 4.0 and (XSA, "epochs", "median") in got  # d12's; tiny's none


def test_reruns_of_a_seed_count_once_and_are_listed(tmp_path):
    """Two sweeps that ran the same jobs (here: a copy of seeds 1-2, as an override that changes nothing makes)
    weigh each seed once in the arm's mean and interval, as in the paired difference, and the report lists them."""
    main, copy = tmp_path / "main", tmp_path / "copy"
    for seed, base, xsa in [(1, 0.850, 0.846), (2, 0.852, 0.849), (3, 0.848, 0.843)]:
        make_run(main, f"base{seed}", alpha=0.0, seed=seed, final_bpb=base)
        make_run(main, f"xsa{seed}", alpha=1.0, seed=seed, final_bpb=xsa)
    make_run(copy, "xsa1", alpha=1.0, seed=1, final_bpb=0.846)
    make_run(copy, "xsa2", alpha=1.0, seed=2, final_bpb=0.851)  # a rerun on another machine kind
    got = numbers(build_report([main, copy], tmp_path / "out"))
    assert got[XSA, "val/bpb", "mean_n"] == 3
    assert got[XSA, "val/bpb", "mean"] == pytest.approx((0.846 + 0.850 + 0.843) / 3)
    assert got[XSA, "val/bpb", "paired_delta_n"] == 3
    text = (tmp_path / "out" / "report.md").read_text()
    listed = text.split("## Runs of one seed in one cell (averaged in its statistics)\n\n")[1].splitlines()
    top = tmp_path.name  # runs are named from just above the folders given
    assert listed[:2] == [f"- d12, {XSA}, seed 1: `{top}/copy/xsa1`, `{top}/main/xsa1`: val/bpb equal to the last bit",
                          f"- d12, {XSA}, seed 2: `{top}/copy/xsa2`, `{top}/main/xsa2`: val/bpb differing"]


def test_the_bootstrap_averages_a_seeds_reruns_as_the_paired_difference_does(tmp_path):
    """A seed run twice (another sweep) counts once in both of CORE's paired differences: its reruns' answers are
    averaged per example, as their CORE is in the paired Δ, so the two estimates agree."""
    def core(correct):
        return (np.mean(correct) - 0.1) / 0.9
    runs = [("main", "base1", 0.0, 1, 5), ("main", "xsa1", 1.0, 1, 6), ("main", "base2", 0.0, 2, 5),
            ("main", "xsa2", 1.0, 2, 6), ("again", "xsa1", 1.0, 1, 9)]  # seed 1's rerun answers 9 of 10
    for sweep, name, alpha, seed, right in runs:
        answers = {"T": [True] * right + [False] * (10 - right)}
        make_run(tmp_path / sweep, name, alpha=alpha, seed=seed,
                 evals=({"metrics": {"val/bpb": 0.9, "CORE 18/22": core(answers["T"])}, "answers": answers,
                         "baselines": {"T": 10.0}},))
    got = numbers(build_report([tmp_path / "main", tmp_path / "again"], tmp_path / "out"))
    paired = ((0.75 - 0.5) + (0.6 - 0.5)) / 2 / 0.9  # seed 1: (6 + 9) / 2 of 10 right against 5; seed 2: 6 against 5
    assert got[XSA, "CORE 18/22", "paired_delta"] == pytest.approx(paired)
    assert got[XSA, "CORE 18/22", "bootstrap_delta"] == pytest.approx(paired)


def test_reruns_of_a_seed_count_once_in_the_diagnostics_and_the_curves(tmp_path):
    study = tmp_path / "study"
    for name, seed, cos in (("a", 1, 0.2), ("b", 1, 0.4), ("c", 2, 0.9)):  # seed means 0.3 and 0.9; run mean 0.5
        make_run(study, name, alpha=1.0, seed=seed, final_bpb=cos, last_row={"diag/attn_self_cos/L0": cos})
    report = build_report([study], tmp_path / "out")
    assert numbers(report)[XSA, "diag/attn_self_cos/L0", "last_mean"] == pytest.approx(0.6)
    runs = [load_run(path, path.name) for path in sorted(study.iterdir()) if path.is_dir()]
    last = band(runs, "val/bpb").set_index("step").loc[20]
    assert (last["mean"], last["low"], last["high"], last["n"]) == (pytest.approx(0.6), pytest.approx(0.3),
                                                                    pytest.approx(0.9), 2)


def test_p_keeps_its_side_of_0_05():
    from xsa_exp.report.render import fmt_p

    assert [fmt_p(p) for p in (0.0004, 0.027, 0.0497, 0.04999, 0.0504, 0.9, 0.0499999, 0.05)] == [
        "<0.001", "0.027", "0.0497", "0.04999", "0.050", "0.900", "<0.05", "0.050"]


def test_partial_core_chatcore_and_bootstrap_in_report(tmp_path):
    study = tmp_path / "study"
    base = {"A": [True] * 100 + [False] * 100, "B": [True, False] * 100}
    arm = {"A": [True] * 140 + [False] * 60, "B": [True, False] * 100}
    baselines = {"A": 25.0, "B": 50.0}
    for name, alpha, answers in (("base", 0.0, base), ("xsa", 1.0, arm)):
        core = np.mean([(np.mean(answers[t]) - baselines[t] / 100) / (1 - baselines[t] / 100) for t in answers])
        make_run(study, name, alpha=alpha,
                 evals=({"metrics": {"val/bpb": 0.9, "CORE 18/22": core, "ChatCORE": 0.1 + alpha},
                         "answers": answers, "baselines": baselines},))
    report = build_report([study], tmp_path / "out")
    text = report.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| arm | seeds |"))
    assert "| CORE 18/22 | Δ CORE 18/22 |" in header and "| ChatCORE | Δ ChatCORE |" in header
    assert "| CORE |" not in text
    got = numbers(report)
    assert got[XSA, "CORE 18/22", "bootstrap_delta"] == pytest.approx(0.2 / 0.75 / 2)
    assert got[XSA, "CORE 18/22", "bootstrap_delta_n"] == 400
    assert got[XSA, "ChatCORE", "delta"] == pytest.approx(1.0)
    row = next(line for line in text.splitlines() if "| paired bootstrap over examples |" in line)
    assert row.startswith(f"| {XSA} | CORE 18/22 |") and row.endswith("| 400 examples | yes | — | — | — |")  # no t-test


def test_core_and_chatcore_over_capped_examples_are_other_metrics_never_paired_with_the_whole(tmp_path):
    """evaluate.py eval.core_max_per_task=100 (summary.json's core record) or eval.chatcore.max_per_task=50
    (chatcore.json) on the XSA arms only: their scores are named for the cap, and no Δ pairs them with the
    baselines' scores over every example."""
    study = tmp_path / "study"
    for seed in (1, 2):
        for alpha in (0.0, 1.0):
            run = make_run(study, f"{alpha:g}-{seed}", alpha=alpha, seed=seed,
                           evals=({"metrics": {"val/bpb": 0.9, "CORE": 0.2 + alpha / 10, "ChatCORE": 0.1}},))
            if alpha:
                (folder,) = (run / rd.EVAL).iterdir()
                summary = json.loads((folder / rd.SUMMARY).read_text())
                rd.write_summary(folder, {**summary, "core": {"name": "CORE", "n_tasks": 22, "max_per_task": 100}})
                (folder / rd.CHATCORE_INFO).write_text(json.dumps({"name": "ChatCORE", "max_per_task": 50}))
    got = numbers(build_report([study], tmp_path / "out"))
    assert got[XSA, "CORE (100 per task)", "mean"] == pytest.approx(0.3)
    assert got[XSA, "ChatCORE (50 per task)", "mean"] == pytest.approx(0.1)
    assert got[BASE, "CORE", "mean"] == pytest.approx(0.2)
    assert not [key for key in got if key[0] == XSA and "CORE" in key[1] and key[2].startswith("paired")]
    assert got[XSA, "val/bpb", "paired_delta"] == pytest.approx(0.0)


def test_sft_runs_are_their_own_section_with_chatcore(tmp_path):
    study = tmp_path / "study"
    # MMLU (chance 0.25): 70% vs 50% correct; GSM8K (chance 0): the same answers
    answers = {0.0: {"mmlu": [True] * 100 + [False] * 100, "gsm8k": [True, False] * 50},
               1.0: {"mmlu": [True] * 140 + [False] * 60, "gsm8k": [True, False] * 50}}
    for alpha in (0.0, 1.0):
        make_run(study, f"base-a{alpha:g}", alpha=alpha, final_bpb=0.80 + alpha / 100)
        make_run(study, f"sft-a{alpha:g}", alpha=alpha, final_bpb=0.50, stage="sft",
                 evals=({"metrics": {"ChatCORE 2/5": 0.30 + alpha / 10}, "chat_answers": answers[alpha]},))
    report = build_report([study], tmp_path / "out")
    text = report.read_text()
    assert "## Depth `d12`" in text and "## Depth `d12 · SFT`" in text
    with open(report.parent / "numbers.csv", newline="") as f:
        got = {(r["depth"], r["arm"], r["metric"], r["statistic"]): float(r["value"]) for r in csv.DictReader(f)}
    # each arm pools only its own stage: the base arm keeps its bpb, the SFT arm its bpb and ChatCORE
    assert got["d12", XSA, "val/bpb", "mean"] == pytest.approx(0.81)
    assert got["d12 · SFT", XSA, "val/bpb", "mean"] == pytest.approx(0.50)
    assert got["d12 · SFT", XSA, "ChatCORE 2/5", "delta"] == pytest.approx(0.1)
    assert ("d12", XSA, "ChatCORE 2/5", "mean") not in got
    # the paired bootstrap over the examples both arms answered, centered per task as ChatCORE is
    assert got["d12 · SFT", XSA, "ChatCORE 2/5", "bootstrap_delta"] == pytest.approx((0.2 / 0.75 + 0.0) / 2)
    assert got["d12 · SFT", XSA, "ChatCORE 2/5", "bootstrap_delta_n"] == 300


def test_final_numbers_prefer_the_newest_evaluation_of_the_last_step(tmp_path):
    run = make_run(tmp_path, "run", final_bpb=0.85, steps=20, evals=(
        {"metrics": {"val/bpb": 0.70, "CORE": 0.3}, "step": 10, "stamp": "20260103-000000"},  # earlier checkpoint
        {"metrics": {"val/bpb": 0.84}, "stamp": "20260101-000000"},
        {"metrics": {"val/bpb": 0.83}, "stamp": "20260102-000000"}))
    text = build_report([run], tmp_path / "out").read_text()
    assert "val/bpb 0.8300 (eval/final-step20-20260102-000000)" in text
    assert "| 0.8300 (n=1) |" in table_row(text, BASE)
    header = next(line for line in text.splitlines() if line.startswith("| arm | seeds |"))
    assert "CORE" not in header and "CORE 0.3000" not in text  # not the final checkpoint's number


def test_a_diverged_run_shows_nan_not_an_earlier_value(tmp_path):
    run = make_run(tmp_path, "run", final_bpb=0.85, steps=20)
    lines = (run / "metrics.csv").read_text().splitlines()
    last_val = max(i for i, line in enumerate(lines) if line.endswith(",0.85"))
    lines[last_val] = lines[last_val].removesuffix("0.85") + "nan"  # as Lightning logs a NaN
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")
    text = build_report([run], tmp_path / "out").read_text()
    assert "| nan (n=1) |" in table_row(text, BASE)


def test_a_diverged_seed_makes_the_paired_difference_not_significant_but_n_a(tmp_path):
    """A NaN interval contains no zero by comparison; it must not read as a significant difference."""
    study = tmp_path / "study"
    for seed, (base, xsa) in enumerate([(0.90, 0.91), (0.92, 0.93), (0.91, float("nan"))], 1):
        make_run(study, f"b{seed}", alpha=0.0, seed=seed, final_bpb=base)
        make_run(study, f"x{seed}", alpha=1.0, seed=seed, final_bpb=xsa)
    text = build_report([study], tmp_path / "out").read_text()
    row = next(line for line in text.splitlines() if "| paired over seeds |" in line)
    assert row.endswith("| +nan | [+nan, +nan] | 3 seeds | n.a. | — | — | — |"), row  # no p, SD nor PI either
    # So is the last validation step's Δ during training, whose value the final Δ is: seed 3 is not left out there.
    assert "| 20 | +nan [+nan, +nan] (3 seeds) |" in text


def test_arms_baseline_and_alpha_option(tmp_path):
    study = tmp_path / "study"
    make_run(study, "a0", alpha=0.0, seed=1, final_bpb=0.90)
    make_run(study, "none", alpha=1.0, layers="none", seed=2, final_bpb=0.92)  # XSA in no layer: also baseline
    make_run(study, "a1", alpha=1.0, seed=1, final_bpb=0.80)
    make_run(study, "a05", alpha=0.5, seed=1, final_bpb=0.85)
    make_run(study, "learn", alpha=0.5, learnable=True, seed=1, final_bpb=0.82)
    make_run(study, "adamw", alpha=1.0, optim="adamw", seed=1, final_bpb=0.95)  # no adamw baseline
    got = numbers(build_report([study], tmp_path / "out"))
    assert got[BASE, "val/bpb", "mean"] == pytest.approx(0.91) and got[BASE, "val/bpb", "mean_n"] == 2
    assert (got["muon · learnable α (init 0.5) · layers=all · value=mixed", "val/bpb", "delta"]
            == pytest.approx(0.82 - 0.90))  # over seed 1, the one both have
    assert got[XSA, "val/bpb", "paired_delta"] == pytest.approx(0.80 - 0.90)
    assert not any(arm.startswith("adamw") and stat == "delta" for arm, _, stat in got)

    got = numbers(build_report([study], tmp_path / "out1", baseline_alpha=1.0))
    assert got["muon · α=0.5 · layers=all · value=mixed", "val/bpb", "delta"] == pytest.approx(0.85 - 0.80)
    assert got[BASE, "val/bpb", "delta"] == pytest.approx(0.90 - 0.80)
    assert (XSA, "val/bpb", "delta") not in got


def test_a_sweep_without_a_baseline_is_paired_with_one_from_another_directory(tmp_path):
    """docs/report.md: a layer-selection sweep has no alpha = 0 arm; alone its report says so, given with an alpha
    sweep's directory it gets each selection's paired difference."""
    layers, alphas = tmp_path / "layers", tmp_path / "alphas"
    make_run(layers, "0", alpha=1.0, layers="all", seed=1, final_bpb=0.80)
    make_run(layers, "1", alpha=1.0, layers="ve", seed=1, final_bpb=0.83)
    make_run(alphas, "0", alpha=0.0, seed=1, final_bpb=0.90)
    alone = build_report([layers], tmp_path / "alone")
    assert "No arm shares a seed with a baseline arm" in alone.read_text()
    assert not any(stat == "paired_delta" for _, _, stat in numbers(alone))
    got = numbers(build_report([layers, alphas], tmp_path / "both"))
    assert got[XSA, "val/bpb", "paired_delta"] == pytest.approx(0.80 - 0.90)
    assert got["muon · α=1 · layers=ve · value=mixed", "val/bpb", "paired_delta"] == pytest.approx(0.83 - 0.90)


# -----------------------------------------------------------------------------
# Plots, robustness, output folder, CLI


def is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_written_and_linked(tmp_path):
    study = tmp_path / "study"
    for alpha in (0.0, 0.5, 1.0):
        for seed in (1, 2):
            make_run(study, f"a{alpha}-s{seed}", alpha=alpha, seed=seed, final_bpb=0.85 - 0.01 * alpha + 0.001 * seed)
    make_run(study, "small", depth="tiny", alpha=1.0)  # one α at this depth: no α plot
    report = build_report([study], tmp_path / "out")
    text, plots = report.read_text(), report.parent / "plots"
    for name in ("curves_d12", "diagnostics_d12", "alpha_d12", "curves_tiny", "diagnostics_tiny"):
        assert is_png(plots / f"{name}.png"), name
        assert f"](plots/{name}.png)" in text
    assert not (plots / "alpha_tiny.png").exists() and "alpha_tiny" not in text


# The parts of a Hydra multirun.yaml the report reads: 3 x 2 jobs.
MULTIRUN_YAML = """\
hydra:
  sweep:
    dir: .
    subdir: ${hydra.job.num}
  sweeper:
    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper
    params: null
  overrides:
    task:
    - depth=d12
    - xsa.alpha=0,1,0.5
    - seed=1,2
"""


def test_failed_and_missing_runs_are_listed(tmp_path):
    sweep = tmp_path / "multirun" / "12-00-00"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text(MULTIRUN_YAML)
    make_run(sweep, "0", alpha=0.0, seed=1, final_bpb=0.85)
    make_run(sweep, "1", alpha=0.0, seed=2, final_bpb=0.86)
    make_run(sweep, "2", alpha=1.0, seed=1, complete=False)  # crashed mid-training
    (sweep / "3").mkdir()
    (sweep / "3" / "train.log").write_text("config error\n")
    make_run(sweep, "5", alpha=0.5, seed=2, final_bpb=0.84)
    (sweep / "5" / "run.json").write_text("")  # a lost disk write
    report = build_report([sweep], tmp_path / "out")
    text = report.read_text()
    failed = text.split("## Missing or failed runs")[1]
    assert "- `12-00-00/2`: incomplete: no checkpoints/final.ckpt" in failed
    assert "- `12-00-00/3`: failed: sweep job 3 (xsa.alpha=1 seed=2) has no run.json" in failed
    assert "- `12-00-00/4`: missing: sweep job 4 (xsa.alpha=0.5 seed=1) has no directory" in failed
    assert (f"- `12-00-00/5`: unreadable: {sweep / '5' / 'run.json'} is damaged (JSONDecodeError: Expecting value: "
            "line 1 column 1 (char 0)); it records the run") in failed
    assert "2 complete runs, 4 missing or failed" in text
    assert "`12-00-00/0`" in text.split("## Runs")[1].split("## Missing")[0]


def test_a_completed_runs_metrics_cut_short_is_listed_as_damaged_not_reported(tmp_path):
    """A metrics.csv cut short (a lost write, a copy stopped part way) would give an earlier step's val/bpb as the
    run's final one, and a Δ that was never measured."""
    study = tmp_path / "study"
    completed = {"status": "completed", "step": 20, "error": None}
    make_run(study, "b1", seed=1, final_bpb=0.85, status=completed)
    make_run(study, "x1", alpha=1.0, seed=1, final_bpb=0.86, status=completed)
    make_run(study, "x2", alpha=1.0, seed=2, final_bpb=0.86, status=completed)
    for name, tail in (("x1", 5), ("x2", 0)):  # the header, steps 0-7, and 5 characters of step 8's row, or none
        metrics = study / name / "metrics.csv"
        lines = metrics.read_text().splitlines(keepends=True)
        metrics.write_text("".join(lines[:9]) + lines[9][:tail])
    text = build_report([study], tmp_path / "out").read_text()
    failed = text.split("## Missing or failed runs")[1]
    assert ("- `study/x1`: damaged: metrics.csv ends at step 7, its last row cut short, but the run completed step 20 "
            "(status.json); restore metrics.csv from a copy, or train the run again") in failed
    assert "- `study/x2`: damaged: metrics.csv ends at step 7, but the run completed step 20" in failed
    assert "1 complete runs, 2 missing or failed" in text


def test_different_step_counts(tmp_path):
    study = tmp_path / "study"
    make_run(study, "base", alpha=0.0, steps=100, final_bpb=0.80)
    make_run(study, "xsa1", alpha=1.0, seed=1, steps=60, final_bpb=0.90)
    make_run(study, "xsa2", alpha=1.0, seed=2, steps=100, final_bpb=0.70, tokens_per_step=500)
    report = build_report([study], tmp_path / "out")
    text = report.read_text()
    assert table_row(text, BASE).startswith(f"| {BASE} | 1 | 100 | 0.8000 (n=1) |")
    assert table_row(text, XSA).startswith(f"| {XSA} | 1, 2 | 60–100 | 0.8000 ± ")  # each run's own last value
    assert "| 60 | 60,000 |" in text and "| 100 | 50,000 |" in text
    assert is_png(report.parent / "plots" / "curves_d12.png")


def test_single_run_default_out_dir(tmp_path):
    run = make_run(tmp_path, "only", alpha=1.0, final_bpb=0.8457)
    report = build_report([run])
    assert report == run / "report" / "report.md"
    assert table_row(report.read_text(), XSA).startswith(f"| {XSA} | 1 | 20 | 0.8457 (n=1) | — |")
    assert "No arm shares a seed with a baseline" in report.read_text()


def test_never_overwrites_a_report(tmp_path):
    make_run(tmp_path / "study", "base")
    out = tmp_path / "out"
    build_report([tmp_path / "study"], out)
    (out / "plots" / "stale.png").write_bytes(b"old")
    before = (out / "report.md").read_text()
    with pytest.raises(ReportError, match="already exists and is not empty"):
        build_report([tmp_path / "study"], out)
    assert (out / "report.md").read_text() == before and (out / "plots" / "stale.png").exists()
    build_report([tmp_path / "study"], out, force=True)
    assert not (out / "plots" / "stale.png").exists()
    mine = tmp_path / "mine"  # a folder of the user's, not a report: --force replaces reports only
    (mine / "plots").mkdir(parents=True)
    (mine / "plots" / "holiday.png").write_bytes(b"mine")
    with pytest.raises(ReportError, match=r"mine is not empty and holds no report.md: not a report folder, so --force "
                                          r"does not replace it; nothing was overwritten \(choose another --out\)$"):
        build_report([tmp_path / "study"], mine, force=True)
    assert (mine / "plots" / "holiday.png").read_bytes() == b"mine"
    for where in (out / "report.md" / "sub", Path("/proc/xsa-exp-report")):  # under a file; where none can be made
        with pytest.raises(ReportError, match=rf"^cannot make the report folder {re.escape(str(where))} \(.*\); "
                                              "choose another --out$"):
            build_report([tmp_path / "study"], where)


def test_a_sweep_whose_multirun_yaml_is_damaged_is_read_from_its_job_folders(tmp_path):
    sweep = tmp_path / "sweep"
    make_run(sweep, "0", seed=1)
    make_run(sweep, "1", alpha=1.0, seed=1)
    for damage in (b"hydra: {sweep: [", b"\xff\xfe not text"):  # YAML cut short; bytes that are not UTF-8
        (sweep / "multirun.yaml").write_bytes(damage)
        text = build_report([sweep], tmp_path / "out", force=True).read_text()
        assert "2 complete runs, 0 missing or failed" in text


def test_a_baseline_alpha_that_no_run_has_or_that_is_not_an_alpha_is_refused(tmp_path):
    make_run(tmp_path / "study", "base")
    make_run(tmp_path / "study", "xsa", alpha=1.0)
    for alpha, message in ((0.5, r"--baseline-alpha 0.5: no complete run has that α \(the runs' fixed α: 0, 1\); "
                                 "give one of them$"),
                           (2.0, r"--baseline-alpha 2 is not an α of XSA; give one in \[0, 1\]$"),
                           (float("nan"), r"--baseline-alpha nan is not an α of XSA")):
        with pytest.raises(ReportError, match=message):
            build_report([tmp_path / "study"], tmp_path / "out", baseline_alpha=alpha)
    assert not (tmp_path / "out").exists()


def test_errors_when_nothing_to_report(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no run directories"):
        build_report([tmp_path / "empty"])
    with pytest.raises(ReportError, match="no such directory"):
        build_report([tmp_path / "nope"])
    assert not (tmp_path / "empty" / "report").exists()


def test_cli(tmp_path, capsys):
    make_run(tmp_path / "study", "base", alpha=0.0, final_bpb=0.8484)
    make_run(tmp_path / "study", "xsa", alpha=1.0, final_bpb=0.8457)
    command = [sys.executable, "-m", "xsa_exp.report", str(tmp_path / "study"), "--out", str(tmp_path / "out")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"report: {tmp_path / 'out' / 'report.md'}"
    assert "−0.0027 (−0.32%)" in (tmp_path / "out" / "report.md").read_text()
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 2
    assert again.stderr.startswith("error: ") and "already exists" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    # The same entry point in-process (a subprocess costs seconds of imports).
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "out" / "plots")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no run directories") and len(err.strip().splitlines()) == 1
    # Nothing complete to report (every job failed): the report lists the failures, and the console says so.
    make_run(tmp_path / "failed", "0", complete=False)
    command = [sys.executable, "-m", "xsa_exp.report", str(tmp_path / "failed"), "--out", str(tmp_path / "out2")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == (f"warning: no complete run under {tmp_path / 'failed'}: the report "
                                                    "lists only the 1 missing, failed or unreadable\n"), done.stderr


def test_attention_diagnostics_are_tabulated_per_layer_as_the_mean_over_seeds(tmp_path):
    study = tmp_path / "study"
    for seed in (1, 2):  # make_run logs diag/{metric}/L{i} = 0.1 (i + 1) + alpha at the last step
        make_run(study, f"base{seed}", alpha=0.0, seed=seed)
        make_run(study, f"xsa{seed}", alpha=1.0, seed=seed)
    report = build_report([study])
    got = numbers(report)
    for arm, alpha in ((BASE, 0.0), (XSA, 1.0)):
        for layer in range(N_LAYER):
            assert got[arm, f"diag/attn_self_cos/L{layer}", "last_mean"] == pytest.approx(0.1 * (layer + 1) + alpha)
        assert got[arm, "diag/diag_attn", "last_mean"] == pytest.approx(0.15 + alpha)
    assert "0.100 / 0.200 (mean 0.150)" in table_row(report.read_text().split("### Attention diagnostics\n")[1], BASE)


def test_plot_file_names_stay_short_and_distinct_for_long_setting_labels():
    from xsa_exp.report.render import slug

    long_a, long_b = "tiny · " + "backout=False · " * 20 + "a", "tiny · " + "backout=False · " * 20 + "b"
    assert slug("tiny · sequence_len=512") == "tiny_sequence_len_512"
    assert len(slug(long_a)) == 80 and slug(long_a) != slug(long_b)
