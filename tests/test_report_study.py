"""The report's study features on fabricated runs with known numbers: relative change, seed bands, the
optimizer × XSA interaction, learning-rate stability (divergence, spikes), Δ vs model size, step time,
validation coverage, and the sweep's job enumeration."""

from __future__ import annotations

import csv
import math
import warnings

import numpy as np
import pytest
import yaml
from scipy import stats

from tests.test_report import BASE, XSA, is_png, make_eval, make_run, numbers, table_row
from xsa_exp import run_dir as rd
from xsa_exp.report import (
    ReportError,
    band,
    build_report,
    count_spikes,
    holm,
    load_run,
    main,
    mean_ci,
    relative_change,
    sweep_jobs,
)
from xsa_exp.report.runs import reference_keys

T2, T3 = 12.7062047, 4.30265273  # t quantiles 0.975 with 1 and 2 degrees of freedom (tables)


def csv_rows(report):
    """numbers.csv as (depth, arm, metric, statistic) -> value; each key is written once."""
    with open(report.parent / "numbers.csv", newline="") as f:
        rows = [((r["depth"], r["arm"], r["metric"], r["statistic"]), number(r["value"])) for r in csv.DictReader(f)]
    assert len(dict(rows)) == len(rows), "numbers.csv holds a key twice"
    return dict(rows)


def number(value: str) -> float | str:
    """A numbers.csv value: a number, or a setting's value that is not one (False, SSSL, wiki)."""
    try:
        return float(value)
    except ValueError:
        return value


def test_relative_change_rule():
    assert relative_change(-0.0027, 0.8484) == pytest.approx(-0.0027 / 0.8484 * 100)
    assert relative_change(0.0006, -0.0137) is None  # negative baseline
    assert relative_change(0.001, 0.049) is None  # near zero
    assert relative_change(0.001, 0.05) == pytest.approx(2.0)
    assert relative_change(0.001, math.nan) is None


def test_relative_change_of_a_negative_core_baseline_is_na(tmp_path):
    study = tmp_path / "study"
    make_run(study, "base", alpha=0.0, final_bpb=0.8484, evals=({"metrics": {"CORE 18/22": -0.0137}},))
    make_run(study, "xsa", alpha=1.0, final_bpb=0.8457, evals=({"metrics": {"CORE 18/22": -0.0131}},))
    report = build_report([study], tmp_path / "out")
    text = report.read_text()
    row = table_row(text, XSA)
    assert "| −0.0027 (−0.32%) |" in row  # val/bpb keeps its percentage
    assert "| +0.0006 (n/a) |" in row and "4.71%" not in text
    assert "n/a: a relative change is printed only where the baseline mean is at least 0.05" in text
    got = numbers(report)
    assert got[XSA, "CORE 18/22", "delta"] == pytest.approx(0.0006)
    assert (XSA, "CORE 18/22", "delta_pct") not in got
    assert got[XSA, "val/bpb", "delta_pct"] == pytest.approx(-0.0027 / 0.8484 * 100)


def test_band_is_min_max_over_seeds(tmp_path):
    runs = [load_run(make_run(tmp_path, f"s{seed}", seed=seed, final_bpb=bpb), f"s{seed}")
            for seed, bpb in ((1, 0.80), (2, 0.86), (3, 0.83))]
    curve = band(runs, "val/bpb").set_index("step")
    assert list(curve.index) == [0, 10, 20]
    last = curve.loc[20]
    assert (last["low"], last["high"], last["n"]) == (pytest.approx(0.80), pytest.approx(0.86), 3)
    assert last["mean"] == pytest.approx(0.83)
    assert curve.loc[0, "low"] == pytest.approx(1.30) and curve.loc[0, "high"] == pytest.approx(1.36)
    assert curve.loc[20, "tokens"] == 20_000


# Final val/bpb per (optimizer, α) and seed 1-3: Δ under Muon per seed -0.010, -0.012, -0.008; under AdamW
# -0.002, -0.001, -0.006.
OPTIMIZER_FINALS = {("muon", 0.0): [0.850, 0.852, 0.848], ("muon", 1.0): [0.840, 0.840, 0.840],
                    ("adamw", 0.0): [0.900, 0.901, 0.906], ("adamw", 1.0): [0.898, 0.900, 0.900]}


def optimizer_study_report(tmp_path):
    """The report of OPTIMIZER_FINALS' 12 runs."""
    study = tmp_path / "study"
    for (optim, alpha), values in OPTIMIZER_FINALS.items():
        for seed, bpb in enumerate(values, 1):
            make_run(study, f"{optim}-a{alpha:g}-s{seed}", optim=optim, alpha=alpha, seed=seed, final_bpb=bpb)
    return build_report([study], tmp_path / "out")


def test_optimizer_interaction(tmp_path):
    report = optimizer_study_report(tmp_path)
    got = numbers(report)
    arm = "optimizer × α=1 · layers=all · value=mixed"
    inter = np.array([-0.010, -0.012, -0.008]) - np.array([-0.002, -0.001, -0.006])  # -0.008, -0.011, -0.002
    half = T3 * inter.std(ddof=1) / math.sqrt(3)
    assert got[arm, "val/bpb", "muon_paired_delta"] == pytest.approx(-0.010)
    assert got[arm, "val/bpb", "adamw_paired_delta"] == pytest.approx(-0.003)
    assert got[arm, "val/bpb", "interaction"] == pytest.approx(inter.mean())
    assert got[arm, "val/bpb", "interaction_ci95_low"] == pytest.approx(inter.mean() - half, rel=1e-6)
    assert got[arm, "val/bpb", "interaction_ci95_high"] == pytest.approx(inter.mean() + half, rel=1e-6)
    assert got[arm, "val/bpb", "interaction_n"] == 3
    text = report.read_text()
    assert "### Optimizer × XSA" in text
    assert "| α=1 · layers=all · value=mixed | val/bpb | −0.0100 [" in text


def test_every_paired_test_has_p_holm_sd_and_prediction_interval(tmp_path):
    """The report's paired tests here: XSA's paired Δ under Muon and under AdamW (one family: paired Δ val/bpb) and
    their interaction (a family of its own); the Δ during training and the Δs beside the interaction are not tests.
    Each gets p, Holm's p within its family, the per-seed SD and the prediction interval of one new pair, in
    numbers.csv and the tables."""
    report = optimizer_study_report(tmp_path)
    got, text = csv_rows(report), report.read_text()
    adamw_xsa, inter = "adamw · α=1 · layers=all · value=mixed", "optimizer × α=1 · layers=all · value=mixed"
    diffs = {(XSA, "paired_delta"): np.subtract(OPTIMIZER_FINALS["muon", 1.0], OPTIMIZER_FINALS["muon", 0.0]),
             (adamw_xsa, "paired_delta"): np.subtract(OPTIMIZER_FINALS["adamw", 1.0], OPTIMIZER_FINALS["adamw", 0.0])}
    diffs[inter, "interaction"] = diffs[XSA, "paired_delta"] - diffs[adamw_xsa, "paired_delta"]
    p = {key: stats.ttest_1samp(d, 0.0).pvalue for key, d in diffs.items()}  # 0.013, 0.19, 0.12
    # Holm by hand within each family: of the two paired Δ, the smaller p (Muon's) × 2, the larger × 1; the
    # interaction alone, unadjusted.
    expected = {(XSA, "paired_delta"): 2 * p[XSA, "paired_delta"],
                (adamw_xsa, "paired_delta"): p[adamw_xsa, "paired_delta"],
                (inter, "interaction"): p[inter, "interaction"]}
    assert holm({key: p[key] for key in p if key[1] == "paired_delta"}) == pytest.approx(
        {key: expected[key] for key in p if key[1] == "paired_delta"})
    for (arm, name), d in diffs.items():
        key = ("d12", arm, "val/bpb", name)
        half = T3 * np.std(d, ddof=1) * math.sqrt(1 + 1 / 3)
        assert got[(*key[:3], name + "_p")] == pytest.approx(p[arm, name], rel=1e-9)
        assert got[(*key[:3], name + "_p_holm")] == pytest.approx(expected[arm, name], rel=1e-9)
        assert got[(*key[:3], name + "_sd")] == pytest.approx(np.std(d, ddof=1), rel=1e-9)
        assert got[(*key[:3], name + "_pi95_low")] == pytest.approx(d.mean() - half, rel=1e-6)
        assert got[(*key[:3], name + "_pi95_high")] == pytest.approx(d.mean() + half, rel=1e-6)
    assert sum(key[3].endswith("_p_holm") for key in got) == 3
    assert "3 tests in all" in text
    assert ("d12", inter, "val/bpb", "muon_paired_delta_p") not in got
    assert ("d12", XSA, "val/bpb", "paired_delta_step_10_p") not in got  # the Δ during training: not in the family
    sd = np.std(diffs[XSA, "paired_delta"], ddof=1)
    low, high = (got["d12", XSA, "val/bpb", f"paired_delta_pi95_{end}"] for end in ("low", "high"))
    assert (f"| {XSA} | val/bpb | paired over seeds | −0.0100 | [−0.0150, −0.0050] | 3 seeds | yes | "
            f"{p[XSA, 'paired_delta']:.3f} ({expected[XSA, 'paired_delta']:.3f}) | {sd:.4f} | "
            f"[{low:+.4f}, {high:+.4f}] |").replace("-", "−") in text
    optimizer_row = next(line for line in text.splitlines() if line.startswith("| α=1 · layers=all · value=mixed |"))
    assert optimizer_row.endswith(f"| no | {p[inter, 'interaction']:.3f} ({expected[inter, 'interaction']:.3f}) |")


def test_no_optimizer_table_with_one_optimizer(tmp_path):
    make_run(tmp_path / "study", "base", alpha=0.0)
    make_run(tmp_path / "study", "xsa", alpha=1.0)
    assert "Optimizer × XSA" not in build_report([tmp_path / "study"], tmp_path / "out").read_text()


def test_count_spikes():
    steps = list(range(1, 11))
    smooth = [5.0, 4.0, 3.5, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    loss = [5.0, 4.0, 3.5, 3.0, 3.7, 3.7, 3.0, 3.5, 3.0, 3.61]
    # threshold 1.2 x 3.0 = 3.6: steps 5-6 (one spike), step 10; step 8 (3.5) is noise
    assert count_spikes(steps, loss, smooth, warmup_steps=1) == 2
    assert count_spikes(steps, loss, smooth, warmup_steps=6) == 1  # steps 5-6 are in the warm-up
    assert count_spikes(steps, [*loss[:9], math.nan], smooth, warmup_steps=1) == 1  # NaN: divergence, no spike


def test_lr_stability_counts_diverged_and_failed_runs(tmp_path):
    study = tmp_path / "study"
    spiky = [3.0] * 20
    spiky[14] = spiky[15] = spiky[18] = 4.5  # two spikes (steps 15-16 and 19)
    for seed in (1, 2):
        make_run(study, f"b1-s{seed}", alpha=0.0, seed=seed, final_bpb=0.90 + seed / 100)
        make_run(study, f"x1-s{seed}", alpha=1.0, seed=seed, lr_scale=1.0, final_bpb=0.89 + seed / 100)
        make_run(study, f"b8-s{seed}", alpha=0.0, seed=seed, lr_scale=8.0, final_bpb=0.95,
                 losses=spiky if seed == 1 else None)
    nan_loss = [3.0] * 20
    nan_loss[10] = math.nan  # a skipped non-finite step: the run finished
    make_run(study, "x8-s1", alpha=1.0, seed=1, lr_scale=8.0, final_bpb=0.93, losses=nan_loss)
    make_run(study, "x8-s2", alpha=1.0, seed=2, lr_scale=8.0, final_bpb=0.92)
    make_run(study, "x8-s3", alpha=1.0, seed=3, lr_scale=8.0, complete=False,  # stopped on a NaN loss
             status={"status": "failed", "step": 7, "error": "FloatingPointError: non-finite loss at step 7"})
    report = build_report([study], tmp_path / "out")
    text = report.read_text()
    got = numbers(report)
    csv_rows(report)  # the stability table's paired Δ is the results' row, not a second copy of it
    x8, b8 = f"{XSA} · lr×8", "muon · no XSA · lr×8"
    assert got[x8, "stability", "runs"] == 3 and got[x8, "stability", "diverged"] == 2
    assert got[b8, "stability", "runs"] == 2 and got[b8, "stability", "diverged"] == 0
    assert got[b8, "stability", "spikes"] == 2
    assert got[XSA, "stability", "diverged"] == 0 and got[XSA, "stability", "runs"] == 2
    # val/bpb over the seeds of the complete runs with a finite value; Δ paired against the baseline at the same lr
    assert got[x8, "val/bpb", "finite_mean"] == pytest.approx(0.925) and got[x8, "val/bpb", "finite_mean_n"] == 2
    assert got[x8, "val/bpb", "paired_delta"] == pytest.approx((0.93 - 0.95 + 0.92 - 0.95) / 2)
    assert got[XSA, "val/bpb", "paired_delta"] == pytest.approx(-0.01)
    assert "| muon | α=1 · layers=all · value=mixed | 8 | 3 | 2 | 0 |" in text
    assert "- `study/x8-s3`: incomplete: no checkpoints/final.ckpt (failed at step 7: FloatingPointError" in text
    assert "### Learning-rate stability" in text


def test_the_stability_table_counts_each_seed_once(tmp_path):
    """Three runs of seed 1 and one each of seeds 2 and 3: the final val/bpb's mean and interval are over 3 seeds,
    seed 1's runs averaged, as in the results."""
    study = tmp_path / "study"
    for name, seed, bpb in (("a", 1, 0.90), ("b", 1, 0.91), ("c", 1, 0.92), ("d", 2, 0.95), ("e", 3, 0.97)):
        make_run(study, name, alpha=1.0, seed=seed, lr_scale=8.0, final_bpb=bpb)
    for seed in (1, 2, 3):
        make_run(study, f"base{seed}", seed=seed, final_bpb=0.9)
    got = numbers(build_report([study], tmp_path / "out"))
    x8 = f"{XSA} · lr×8"
    assert got[x8, "stability", "runs"] == 5 and got[x8, "val/bpb", "finite_mean_n"] == 3
    assert got[x8, "val/bpb", "finite_mean"] == pytest.approx(mean_ci([0.91, 0.95, 0.97]).value)
    assert got[x8, "val/bpb", "finite_mean_ci95_high"] == pytest.approx(mean_ci([0.91, 0.95, 0.97]).high)


def test_arms_split_by_lr_scale(tmp_path):
    study = tmp_path / "study"
    make_run(study, "b1", alpha=0.0, final_bpb=0.90)
    make_run(study, "b2", alpha=0.0, lr_scale=2.0, final_bpb=0.80)
    make_run(study, "x2", alpha=1.0, lr_scale=2.0, final_bpb=0.78)
    got = numbers(build_report([study], tmp_path / "out"))
    assert got[f"{XSA} · lr×2", "val/bpb", "delta"] == pytest.approx(-0.02)  # vs the lr×2 baseline, not lr×1
    assert got["muon · no XSA", "val/bpb", "mean"] == pytest.approx(0.90)


def test_scale_trend_rows_and_plot(tmp_path):
    study = tmp_path / "study"
    deltas = {"d12": (1_000_000, [-0.010, -0.014]), "d24": (8_000_000, [-0.020, -0.022])}
    for depth, (size, diffs) in deltas.items():
        for seed, diff in enumerate(diffs, 1):
            make_run(study, f"{depth}-b{seed}", depth=depth, seed=seed, n_params=size, final_bpb=0.9)
            make_run(study, f"{depth}-x{seed}", depth=depth, alpha=1.0, seed=seed, n_params=size, final_bpb=0.9 + diff)
    report = build_report([study], tmp_path / "out")
    got = csv_rows(report)
    assert got["d12", XSA, "val/bpb", "n_params"] == 1_000_000 and got["d24", XSA, "val/bpb", "n_params"] == 8_000_000
    assert got["d24", XSA, "val/bpb", "paired_delta"] == pytest.approx(-0.021)
    half = T2 * np.std([-0.020, -0.022], ddof=1) / math.sqrt(2)
    assert got["d24", XSA, "val/bpb", "paired_delta_ci95_low"] == pytest.approx(-0.021 - half, rel=1e-6)
    text = report.read_text()
    assert f"| {XSA} | d12 | 1,000,000 | −0.0120 |" in text and f"| {XSA} | d24 | 8,000,000 | −0.0210 |" in text
    assert is_png(report.parent / "plots" / "scale.png") and "](plots/scale.png)" in text
    # one depth: no scale section
    one = build_report([study / "d12-b1", study / "d12-x1"], tmp_path / "out1").read_text()
    assert "Scale" not in one and not (tmp_path / "out1" / "plots" / "scale.png").exists()


def test_runs_trained_otherwise_are_never_pooled_into_one_arm(tmp_path):
    """Keys that change what a run computes split its depth: clipping, the updates it may skip, the micro-batch (which
    sets how the batch is split), the width lr scaling,
    XSA's eps, the tokenizer's sample, the validation files and shard, the data order, compilation, nanochat's
    transfer (its lr factor; a run from before optim.transfer reads as null), and the key that set the run's length
    (here train.epochs; SFT's epoch of rows left after dropping the untrained ones differs by a step between seeds,
    which must not split them)."""
    study = tmp_path / "study"
    others = {"train:\n  grad_clip: 1.0\n": "grad_clip=1.0", "optim:\n  width_lr_scaling: false\n":
              "width_lr_scaling=False", "  eps: 0.001\n": "eps=0.001", "train:\n  compile: true\n":
              "compile=True", "data:\n  tokenizer_chars: 1000\n": "tokenizer_chars=1000",
              "optim:\n  transfer:\n    lr_factor: 1.5\n": "lr_factor=1.5", "data:\n  val_path: /data/v.jsonl\n":
              "val_path=/data/v.jsonl", "data:\n  num_shards: 100\n": "num_shards=100",  # another validation shard
              "data:\n  shuffle_rows: 64\n": "shuffle_rows=64", "data:\n  num_workers: 2\n": "num_workers=2",
              "train:\n  skip_nonfinite_steps: 3\n": "skip_nonfinite_steps=3",
              "train:\n  device_batch_size: 2\n": "device_batch_size=2"}
    for seed in (1, 2):
        make_run(study, f"b{seed}", seed=seed, final_bpb=0.9)
        make_run(study, f"x{seed}", alpha=1.0, seed=seed, final_bpb=0.91)
        epochs = "train:\n  max_steps: null\n  epochs: 2\n"
        make_run(study, f"long-b{seed}", seed=seed, final_bpb=0.8, steps=40 + seed, config=epochs)
        make_run(study, f"long-x{seed}", alpha=1.0, seed=seed, final_bpb=0.79, steps=40 + seed, config=epochs)
        for i, config in enumerate(others):  # an indented line continues make_run's xsa: node
            make_run(study, f"o{i}-b{seed}", seed=seed, final_bpb=0.9, config=config)
            make_run(study, f"o{i}-x{seed}", alpha=1.0, seed=seed, final_bpb=0.95, config=config)
    got = csv_rows(build_report([study], tmp_path / "out"))
    depths = {depth for depth, *_ in got}
    assert depths == {"d12", "d12 · epochs=2", *(f"d12 · {label}" for label in others.values())}, depths
    assert got["d12", XSA, "val/bpb", "paired_delta"] == pytest.approx(0.01)
    assert got["d12 · epochs=2", XSA, "val/bpb", "paired_delta"] == pytest.approx(-0.01)  # both seeds, paired


def test_a_given_reference_setting_is_the_one_the_others_are_compared_with(tmp_path, capsys):
    """Two settings run alike (no value the most common) get no reference unless --reference-setting names one, by
    config key or the end of it, with the value as labels write it or YAML reads it, in every depth that has it;
    each other setting's Δ is then compared with the reference's, seed by seed. A name that matches no varying key or
    several, a value no run has, a name given twice or no KEY=VALUE is one line."""
    study = tmp_path / "study"
    for seed, (d_windows, d_full) in enumerate([(0.010, 0.014), (0.012, 0.015), (0.011, 0.017)], 1):
        for depth, lrs in (("d12", (0.5, 1.0)), ("d24", (1.0, 2.0))):
            for lr, delta in zip(lrs, (d_windows, d_full)):
                config = f"optim:\n  lr:\n    x0_scalar: {lr}\n    embedding: 0.3\n"
                make_run(study, f"{depth}-{lr}-b{seed}", depth=depth, seed=seed, final_bpb=0.9, config=config)
                make_run(study, f"{depth}-{lr}-x{seed}", depth=depth, alpha=1.0, seed=seed, final_bpb=0.9 + delta,
                         config=config)
    alike = csv_rows(build_report([study], tmp_path / "alike"))
    assert {depth for depth, *_ in alike} == {"d12 · x0_scalar=0.5", "d12 · x0_scalar=1.0", "d24 · x0_scalar=1.0",
                                              "d24 · x0_scalar=2.0"}
    assert not [key for key in alike if key[3] == "delta_vs_reference_setting"]
    for given in ({"x0_scalar": "1.0"}, {"optim.lr.x0_scalar": "1"}, {"lr.x0_scalar": "1e0"}):
        got = csv_rows(build_report([study], tmp_path / "given", reference=given, force=True))
        assert {depth for depth, *_ in got} == {"d12", "d12 · x0_scalar=0.5", "d24", "d24 · x0_scalar=2.0"}, given
        assert got["d24 · x0_scalar=2.0", XSA, "val/bpb", "delta_vs_reference_setting"] == pytest.approx(
            np.mean([0.004, 0.003, 0.006]))  # d24: 2.0 against 1.0
        assert got["d12 · x0_scalar=0.5", XSA, "val/bpb", "delta_vs_reference_setting"] == pytest.approx(
            -np.mean([0.004, 0.003, 0.006]))  # d12: 0.5 against 1.0
    only_d12 = csv_rows(build_report([study], tmp_path / "d12", reference={"x0_scalar": "5e-1"}))
    assert {depth for depth, *_ in only_d12} == {"d12", "d12 · x0_scalar=1.0", "d24 · x0_scalar=1.0",
                                                 "d24 · x0_scalar=2.0"}  # d24 has no 0.5: its labels as without
    for argv, message in ((["--reference-setting", "sequence_len=256"], "--reference-setting sequence_len: not a "
                           "setting that varies among the runs (they vary in optim.lr.x0_scalar)"),
                          (["--reference-setting", "x0_scalar=0.25"], "--reference-setting optim.lr.x0_scalar=0.25: "
                           "no run has that value (its values: 0.5, 1.0, 2.0)"),
                          (["--reference-setting", "x0_scalar=1", "--reference-setting", "optim.lr.x0_scalar=2"],
                           "--reference-setting names optim.lr.x0_scalar twice"),
                          (["--reference-setting", "x0_scalar=1", "--reference-setting", "x0_scalar=2"],
                           "--reference-setting names x0_scalar twice"),
                          (["--reference-setting", "x0_scalar"], "--reference-setting x0_scalar: give KEY=VALUE")):
        with pytest.raises(SystemExit):
            main([str(study), "--out", str(tmp_path / "refused"), *argv])
        assert message in capsys.readouterr().err, message
        assert not (tmp_path / "refused").exists()


def test_a_reference_name_that_ends_several_varying_keys_is_refused():
    keys = {"optim.lr.embedding", "optim.adamw.role_betas.embedding"}
    with pytest.raises(ReportError, match=r"--reference-setting embedding names optim.adamw.role_betas.embedding, "
                                          r"optim.lr.embedding: give the whole key"):
        reference_keys({"embedding": "0.2"}, keys)
    assert reference_keys({"lr.embedding": "0.2"}, keys) == {"optim.lr.embedding": "0.2"}


def test_runs_that_computed_in_another_precision_are_never_paired_though_their_configs_say_auto(tmp_path):
    """config.yaml says trainer.precision=auto and optim.muon.ns_dtype=auto wherever a run trained; run.json says
    what each machine made of it (a GPU's bf16-compute, a CPU's 32-true; Newton-Schulz in bf16 or fp32 by the CPU)."""
    study = tmp_path / "study"
    auto = "trainer:\n  precision: auto\noptim:\n  muon:\n    ns_dtype: auto\n"
    for seed in (1, 2):
        for name, alpha, resolved in (("b", 0.0, ("32-true", "float32")), ("x", 1.0, ("bf16-compute", "float32")),
                                      ("nb", 0.0, ("32-true", "bfloat16")), ("nx", 1.0, ("32-true", "bfloat16"))):
            run = make_run(study, f"{name}{seed}", alpha=alpha, seed=seed, final_bpb=0.9 + alpha / 100, config=auto)
            rd.update_run_info(run, precision=resolved[0], ns_dtype=resolved[1])
    got = csv_rows(build_report([study], tmp_path / "out"))
    assert {depth for depth, *_ in got} == {"d12", "d12 · precision=bf16-compute", "d12 · ns_dtype=bfloat16"}
    paired = [key for key in got if key[1] == XSA and key[3] == "paired_delta"]
    assert {depth for depth, *_ in paired} == {"d12 · ns_dtype=bfloat16"}
    assert got["d12 · ns_dtype=bfloat16", XSA, "val/bpb", "paired_delta"] == pytest.approx(0.01)


def test_a_setting_that_varies_within_a_depth_splits_it_and_gets_its_own_trend(tmp_path):
    """Runs of one depth preset at sequence lengths 128, 512 and 1024 (an optimizer varying too, which is an arm, not a
    setting): compared within each length, in numeric order, and a Δ-vs-sequence_len table and plot per optimizer."""
    study = tmp_path / "study"
    deltas = {128: [0.020, 0.024], 512: [0.010, 0.012], 1024: [-0.004, -0.002]}
    for seq, diffs in deltas.items():
        for seed, diff in enumerate(diffs, 1):
            config = f"model:\n  sequence_len: {seq}\n  n_head: 4\ntrain:\n  max_steps: 20\n  cpu_threads: {seed}\n"
            make_run(study, f"{seq}-b{seed}", seed=seed, final_bpb=0.9, config=config)
            make_run(study, f"{seq}-x{seed}", alpha=1.0, seed=seed, final_bpb=0.9 + diff, config=config)
    config = "model:\n  sequence_len: 128\n  n_head: 4\ntrain:\n  max_steps: 20\n  cpu_threads: 1\n"
    make_run(study, "adamw-b1", optim="adamw", final_bpb=0.9, config=config)
    make_run(study, "adamw-x1", optim="adamw", alpha=1.0, final_bpb=0.95, config=config)
    report = build_report([study], tmp_path / "out")
    got = csv_rows(report)
    for seq, diffs in deltas.items():
        depth = f"d12 · sequence_len={seq}"
        assert got[depth, XSA, "val/bpb", "paired_delta"] == pytest.approx(np.mean(diffs))
        assert got[depth, XSA, "val/bpb", "sequence_len"] == seq
    assert (got["d12 · sequence_len=128", "adamw · α=1 · layers=all · value=mixed", "val/bpb", "delta"]
            == pytest.approx(0.05))
    text = report.read_text()
    sections = [line for line in text.splitlines() if line.startswith("## Depth")]
    assert sections == ["## Depth `d12 · sequence_len=128`", "## Depth `d12 · sequence_len=512`",
                        "## Depth `d12 · sequence_len=1024`"]  # n_head and cpu_threads (not a setting) do not split
    assert "## Δ val/bpb vs sequence_len (`model.sequence_len`)" in text
    assert f"| {XSA} · d12 | 1024 | 1,000 | −0.0030 |" in text and "Scale" not in text
    assert is_png(report.parent / "plots" / "trend_sequence_len.png")


def test_an_ablation_names_only_what_each_setting_changes_and_compares_it_with_the_reference(tmp_path):
    """From a reference recipe, settings that each change one or several keys (an optimizer key among them, whose
    last name collides with another's): the labels name only the changed keys, the settings table gives each Δ and
    its per-seed difference from the reference's Δ, and only a key changed alone gets a Δ-vs-key trend."""
    study = tmp_path / "study"

    def recipe(window_pattern="SSSL", smear=True, embedding_lr=0.3, embedding_betas=(0.8, 0.995)) -> str:
        return yaml.safe_dump({"model": {"window_pattern": window_pattern, "smear": smear},
                               "optim": {"lr": {"embedding": embedding_lr},
                                         "adamw": {"role_betas": {"embedding": list(embedding_betas)}}}})

    changes = {"reference": (recipe(), [-0.010, -0.012, -0.008]),
               "windows": (recipe(window_pattern="L"), [0.004, 0.002, 0.006]),
               "smear": (recipe(smear=False), [-0.011, -0.013, -0.009]),
               "lrs": (recipe(embedding_lr=0.2, embedding_betas=(0.8, 0.95)), [-0.020, -0.022, -0.018])}
    for name, (config, diffs) in changes.items():
        for seed, diff in enumerate(diffs, 1):
            make_run(study, f"{name}-b{seed}", seed=seed, final_bpb=0.9 + seed / 100, config=config)
            make_run(study, f"{name}-x{seed}", alpha=1.0, seed=seed, final_bpb=0.9 + seed / 100 + diff, config=config)
    report = build_report([study], tmp_path / "out")
    text = report.read_text()
    sections = [line for line in text.splitlines() if line.startswith("## Depth")]
    lrs = "d12 · role_betas.embedding=[0.8, 0.95] · lr.embedding=0.2"  # each key named as far as it is unique
    assert sorted(sections) == sorted(["## Depth `d12`", "## Depth `d12 · window_pattern=L`",
                                       "## Depth `d12 · smear=False`", f"## Depth `{lrs}`"])
    got = csv_rows(report)
    assert got["d12 · window_pattern=L", XSA, "val/bpb", "paired_delta"] == pytest.approx(0.004)
    versus = got["d12 · window_pattern=L", XSA, "val/bpb", "delta_vs_reference_setting"]
    assert versus == pytest.approx(0.014)  # per seed 0.014, 0.014, 0.014
    assert got[lrs, XSA, "val/bpb", "delta_vs_reference_setting"] == pytest.approx(-0.010)
    assert ("d12", XSA, "val/bpb", "delta_vs_reference_setting") not in got  # the reference itself
    assert ("d12 · window_pattern=L", XSA, "val/bpb", "delta_vs_reference_setting_p_holm") in got
    assert "| seeds | significant? | p (Holm) | Δ − Δ at the reference | significant? | p (Holm) |" in text
    assert "## Settings of `d12` side by side" in text
    assert f"| {XSA} | (reference) | −0.0100 |" in text and f"| {XSA} | window_pattern=L | +0.0040 |" in text
    trends = [line for line in text.splitlines() if line.startswith("## Δ val/bpb vs")]
    assert trends == ["## Δ val/bpb vs smear (`model.smear`)",
                      "## Δ val/bpb vs window_pattern (`model.window_pattern`)"]


def test_a_list_valued_setting_taken_away_gets_a_trend_with_its_values_as_categories(tmp_path):
    """A role's betas (a list) deleted in one setting: the Δ-vs-key plot places [0.96, 0.95] and None as categories
    (matplotlib cannot place a list on an axis; the report once stopped there)."""
    study = tmp_path / "study"
    for name, roles, diffs in (("reference", {"x0_scalar": [0.96, 0.95]}, [-0.010, -0.012]),
                               ("x0", {}, [0.002, 0.000])):
        config = yaml.safe_dump({"optim": {"adamw": {"role_betas": {"embedding": [0.8, 0.995], **roles}}}})
        for seed, diff in enumerate(diffs, 1):
            make_run(study, f"{name}-b{seed}", seed=seed, final_bpb=0.9, config=config)
            make_run(study, f"{name}-x{seed}", alpha=1.0, seed=seed, final_bpb=0.9 + diff, config=config)
    report = build_report([study], tmp_path / "out")
    text = report.read_text()
    assert "## Δ val/bpb vs x0_scalar (`optim.adamw.role_betas.x0_scalar`)" in text
    assert f"| {XSA} | x0_scalar=None | +0.0010 |" in text
    assert is_png(report.parent / "plots" / "trend_x0_scalar.png")


def test_learnable_arms_differ_by_parametrization(tmp_path):
    study = tmp_path / "study"
    make_run(study, "b", final_bpb=0.9)
    make_run(study, "s", alpha=0.5, learnable=True, final_bpb=0.91, parametrization="sigmoid")
    make_run(study, "t", alpha=0.0, learnable=True, final_bpb=0.89, parametrization="tanh")
    got = numbers(build_report([study], tmp_path / "out"))
    assert got["muon · learnable α (init 0.5) · layers=all · value=mixed", "val/bpb", "delta"] == pytest.approx(0.01)
    assert got["muon · learnable α = tanh(θ) (init 0) · layers=all · value=mixed", "val/bpb", "delta"] == \
        pytest.approx(-0.01)


def test_step_time_ratio(tmp_path):
    study = tmp_path / "study"
    for seed, (base, xsa) in enumerate(((1000.0, 800.0), (1200.0, 1000.0), (900.0, 700.0)), 1):
        make_run(study, f"b{seed}", alpha=0.0, seed=seed, tokens_per_sec=base)
        make_run(study, f"x{seed}", alpha=1.0, seed=seed, tokens_per_sec=xsa)
    report = build_report([study], tmp_path / "out")
    got = numbers(report)
    assert got[XSA, "train/tokens_per_sec", "median"] == 800.0
    assert got["muon · no XSA", "train/tokens_per_sec", "median"] == 1000.0
    assert got[XSA, "train/tokens_per_sec", "step_time_ratio"] == pytest.approx(1.25)
    assert f"| {XSA} | 800 | 1.250 |" in report.read_text()


def test_validation_coverage(tmp_path):
    part = {"tokens": 1024, "split_tokens": 84096, "whole": False}
    whole = {"tokens": 84096, "split_tokens": 84096, "whole": True}
    same = tmp_path / "same"
    make_run(same, "a", val_scope=part)
    make_run(same, "b", alpha=1.0, val_scope=part)
    text = build_report([same], tmp_path / "out1").read_text()
    assert text.count("over 1,024 of 84,096 tokens") == 1 and "(every run of this depth)" in text
    mixed = tmp_path / "mixed"
    make_run(mixed, "a", val_scope=whole)
    make_run(mixed, "b", alpha=1.0, val_scope=part)
    make_run(mixed, "c", alpha=1.0, seed=2)  # an older run without val_scope: nothing said
    report = build_report([mixed], tmp_path / "out2")
    text, got = report.read_text(), csv_rows(report)
    # A bpb over other tokens is another measurement: b is its own setting, never paired with a; c (seed 2) is.
    whole_split, partial = "d12 · val_scope=the whole split", "d12 · val_scope=over 1,024 of 84,096 tokens"
    assert {depth for depth, *_ in got} == {whole_split, partial}
    assert got[partial, XSA, "val/bpb", "val_tokens:mixed/b"] == 1024 and (partial, XSA, "val/bpb", "delta") not in got
    assert "Validation coverage: val/bpb over 1,024 of 84,096 tokens (every run of this depth)." in text
    assert "`mixed/a`: val/bpb" not in text and got[whole_split, XSA, "val/bpb", "mean_n"] == 1
    # an evaluation's val_scope wins with its val/bpb
    folder = make_eval(mixed / "b", 20, {"val/bpb": 0.84}, stamp="20260102-000000")
    summary = [s for f, s in rd.evaluations(mixed / "b") if f == folder][0]
    rd.write_summary(folder, {**summary, "val_scope": whole})
    assert "over 1,024" not in build_report([mixed], tmp_path / "out3").read_text()
    whole_only = tmp_path / "whole"
    make_run(whole_only, "a", val_scope=whole)
    assert "Validation coverage" not in build_report([whole_only], tmp_path / "out4").read_text()


def test_a_residual_scalar_a_seed_logged_as_nan_makes_its_change_nan_not_a_smaller_sample(tmp_path):
    """As a diverged seed makes the final Δ val/bpb NaN: its λ is not dropped, leaving an interval over the others
    (and a test in Holm's family)."""
    for seed in (1, 2, 3):
        for alpha in (0.0, 1.0):
            value = math.nan if (alpha, seed) == (1.0, 3) else 0.1 + alpha * (0.05 + seed / 100)
            make_run(tmp_path / "runs", f"{alpha}-{seed}", alpha=alpha, seed=seed,
                     last_row={"lambda/x0/L0": value, "lambda/x0/L1": 0.2 + alpha / 10})
    with warnings.catch_warnings():  # λ_resid never logged: its panel is empty, and the legend goes on λ_x0's
        warnings.simplefilter("error")
        got = numbers(build_report([tmp_path / "runs"], tmp_path / "out"))
    assert math.isnan(got[XSA, "lambda/x0/L0", "paired_delta"])
    assert math.isnan(got[XSA, "lambda/x0/L0", "last_mean"])
    assert (XSA, "lambda/x0/L0", "paired_delta_p") not in got
    assert got[XSA, "lambda/x0/L1", "paired_delta"] == pytest.approx(0.1)


def test_residual_scalars_are_tabulated_per_layer_with_their_change_paired_over_seeds(tmp_path):
    """λ_resid and λ_x0 of the last row that logged them: the mean over seeds per arm, and the XSA arm's change
    from its baseline paired over the seeds both have (the baseline's seed 3 has no partner)."""
    x0 = {(0.0, 1): [0.10, 0.20], (0.0, 2): [0.12, 0.18], (0.0, 3): [0.50, 0.50],
          (1.0, 1): [0.15, 0.30], (1.0, 2): [0.19, 0.26]}
    for i, ((alpha, seed), values) in enumerate(x0.items()):
        make_run(tmp_path / "runs", str(i), alpha=alpha, seed=seed,
                 last_row={**{f"lambda/x0/L{layer}": v for layer, v in enumerate(values)},
                           **{f"lambda/resid/L{layer}": 1.0 + alpha for layer in range(2)}})
    report = build_report([tmp_path / "runs"], tmp_path / "out")
    got, text = numbers(report), report.read_text()
    assert got[BASE, "lambda/x0/L0", "last_mean"] == pytest.approx((0.10 + 0.12 + 0.50) / 3)
    assert got[XSA, "lambda/x0/L1", "last_mean"] == pytest.approx(0.28)
    assert got[XSA, "lambda/resid/L1", "last_mean"] == pytest.approx(2.0)
    for layer, differences in ((0, [0.05, 0.07]), (1, [0.10, 0.08])):
        expected = mean_ci(differences)
        for statistic, value in (("", expected.value), ("_ci95_low", expected.low), ("_ci95_high", expected.high),
                                 ("_n", 2)):
            assert got[XSA, f"lambda/x0/L{layer}", "paired_delta" + statistic] == pytest.approx(value)
    assert (BASE, "lambda/x0/L0", "paired_delta") not in got  # a baseline has no change from itself
    section = text.split("### Learned residual scalars\n")[1]
    assert table_row(section, XSA).startswith(f"| {XSA} | λ_resid | 2.000 | 2.000 |")
    assert "| λ_x0 | +0.0600 [" in section.split("Change from the arm's baseline")[1]
    # Each metric its own family: λ_x0 in layer 0 has one test here (one arm), so Holm leaves its p as it is;
    # λ_resid's changes are 1.0 in both seeds (p 0), val/bpb's 0 in both (p 1).
    p0 = stats.ttest_1samp([0.05, 0.07], 0.0).pvalue  # 0.105
    assert got[XSA, "lambda/x0/L0", "paired_delta_p"] == pytest.approx(p0)
    assert got[XSA, "lambda/resid/L0", "paired_delta_p"] == 0.0 and got[XSA, "val/bpb", "paired_delta_p"] == 1.0
    holm0 = p0
    assert got[XSA, "lambda/x0/L0", "paired_delta_p_holm"] == pytest.approx(holm0)
    assert f"+0.0600 [−0.0671, +0.1871] (2 seeds), p {p0:.3f} ({holm0:.3f}) |" in section
    assert is_png(report.parent / "plots" / "residual_scalars_d12.png")


def test_runs_without_residual_scalars_get_no_section(tmp_path):
    for alpha in (0.0, 1.0):
        make_run(tmp_path / "runs", str(alpha), alpha=alpha)
    report = build_report([tmp_path / "runs"], tmp_path / "out")
    assert "Learned residual scalars" not in report.read_text()
    assert not (report.parent / "plots" / "residual_scalars_d12.png").exists()


def test_sweep_jobs_in_hydra_order():
    jobs, varying = sweep_jobs(["lr=1", "xsa.alpha=0,1,0.5", "optim=muon,adamw", "xsa.alpha=0,1"])
    # a key given twice keeps its first place with its last values; the last key varies fastest
    assert jobs == [["lr=1", "xsa.alpha=0", "optim=muon"], ["lr=1", "xsa.alpha=0", "optim=adamw"],
                    ["lr=1", "xsa.alpha=1", "optim=muon"], ["lr=1", "xsa.alpha=1", "optim=adamw"]]
    assert varying == {"xsa.alpha", "optim"}


@pytest.mark.slow
def test_report_of_real_learnable_runs(tmp_path):
    """A real sweep of tiny learnable-α runs over part of the validation split: the sweep's job numbering, the
    learned-α plot and table (from metrics.csv's xsa/alpha/L<i> and diagnostics.jsonl's alpha) and the
    validation coverage (run.json's val_scope)."""
    import json as _json
    import subprocess
    import sys

    from tests.conftest import REPO
    from xsa_exp.report import expected_jobs

    sweep = tmp_path / "sweep"
    command = [sys.executable, "train.py", "-m", "logger=csv", "model.n_layer=2", "model.n_embd=64", "model.n_head=2",
               "model.sequence_len=64", "model.vocab_size=512", "train.device_batch_size=4",
               "train.total_batch_tokens=512", "train.max_steps=4", "eval.every=2", "eval.diag_every=2",
               "eval.val_tokens=1024", "xsa=learnable", "xsa.alpha=0.25,0.5", "seed=1,2",
               f"hydra.sweep.dir={sweep}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    infos = {int(d.name): _json.loads((d / "run.json").read_text()) for d in sweep.iterdir() if d.name.isdigit()}
    jobs = expected_jobs(sweep)
    assert len(jobs) == len(infos) == 4
    for num, info in infos.items():  # Hydra's own numbering matches the enumeration from multirun.yaml
        assert jobs[num] == f"xsa.alpha={info['alpha']:g} seed={info['seed']}"
    report = build_report([sweep], tmp_path / "out")
    text, got = report.read_text(), numbers(report)
    assert "4 complete runs, 0 missing or failed" in text
    assert is_png(report.parent / "plots" / "learned_alpha_tiny.png")
    scope = infos[0]["val_scope"]
    assert not scope["whole"] and scope["tokens"] == 1024
    assert f"val/bpb over 1,024 of {scope['split_tokens']:,} tokens (every run of this depth)" in text
    # the final α table: the last diagnostics line's alpha, mean over the seeds of each initial α (its own arm)
    last = {}
    for num, info in infos.items():
        lines = (sweep / str(num) / "diagnostics.jsonl").read_text().splitlines()
        last.setdefault(info["alpha"], []).append(np.asarray(_json.loads(lines[-1])["alpha"]))
    assert sorted(last) == [0.25, 0.5]
    for init, alphas in last.items():
        arm, mean = f"muon · learnable α (init {init:g}) · layers=all · value=mixed", np.mean(alphas, axis=0)
        assert mean.shape == (2, 2) and len(alphas) == 2
        for layer in range(2):
            for head in range(2):
                assert got[arm, f"alpha/L{layer}/H{head}", "final_mean"] == pytest.approx(mean[layer, head], abs=1e-12)
        assert f"Final learned α of `{arm}`" in text
    assert "### Learned α" in text and "| layer | head 0 | head 1 | mean |" in text
    assert f"| 0 | {mean[0, 0]:.3f} | {mean[0, 1]:.3f} |" in text
    # the learned α curve is read from metrics.csv's xsa/alpha/L<i> columns
    run = load_run(sweep / "0", "0")
    assert set(run.layer_columns("xsa/alpha")) == {0, 1}
