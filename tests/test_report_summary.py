"""The summary of committed questions (python -m xsa_exp.report --summary), read from numbers.csv alone."""

from __future__ import annotations

import csv
import shutil

import pytest
import yaml

from tests.test_report import XSA, is_png, make_run
from xsa_exp.report import ReportError, build_report, main
from xsa_exp.report.stats import holm
from xsa_exp.report.summary import write_summary

pytestmark = pytest.mark.xdist_group("report_summary")  # one worker builds the reports for every test

ADAMW_XSA = "adamw · α=1 · layers=all · value=mixed"
NEW_STATISTICS = ("_sd", "_pi95_low", "_pi95_high", "_p", "_p_holm")  # what the report writes since p-values


def optimizer_question(runs, out):
    """Question "optim": XSA's Δ under Muon and AdamW and their interaction, 4 seeds."""
    finals = {("muon", 0.0): [0.850, 0.852, 0.848, 0.851], ("muon", 1.0): [0.840, 0.841, 0.840, 0.843],
              ("adamw", 0.0): [0.900, 0.901, 0.906, 0.903], ("adamw", 1.0): [0.898, 0.900, 0.900, 0.904]}
    for (optim, alpha), values in finals.items():
        for seed, bpb in enumerate(values, 1):
            make_run(runs, f"{optim}-a{alpha:g}-s{seed}", optim=optim, alpha=alpha, seed=seed, final_bpb=bpb)
    build_report([runs], out)


def ablation_question(runs, out):
    """Question "ablation": a reference and two settings that each take one thing away (so two Δ − reference Δ
    tests), 3 seeds, the residual scalars logged (their changes per layer are in the family too)."""
    deltas = {("SSSL", True): [-0.010, -0.012, -0.007], ("L", True): [0.004, 0.001, 0.006],
              ("SSSL", False): [-0.002, -0.009, 0.003]}
    for (pattern, smear), diffs in deltas.items():
        config = yaml.safe_dump({"model": {"window_pattern": pattern, "smear": smear}})
        for seed, diff in enumerate(diffs, 1):
            scalars = {f"lambda/{name}/L{layer}": start + 0.01 * seed * (layer + 1)
                       for name, start in (("x0", 0.2), ("resid", 1.0)) for layer in range(2)}
            make_run(runs, f"{pattern}-{smear}-b{seed}", seed=seed, final_bpb=0.9 + seed / 100, config=config,
                     last_row=scalars)
            make_run(runs, f"{pattern}-{smear}-x{seed}", alpha=1.0, seed=seed, final_bpb=0.9 + seed / 100 + diff,
                     config=config, last_row={key: value + 0.1 * seed for key, value in scalars.items()})
    build_report([runs], out)


MANIFEST = {"optim": {"question": 1, "title": "Optimizer × XSA", "recipe": "classic"},
            "ablation": {"question": "11b", "title": "Taken away", "recipe": "nanochat_2604 stack",
                         "cells": [{"depth": "d12 · window_pattern=L", "label": "− windows"}, {"arm": XSA}],
                         "skip": [{"depth": "d12 · smear=False"}]}}


@pytest.fixture(scope="module")
def built_results(tmp_path_factory):
    """A results folder as docs/results: two questions' reports (their plots take seconds) and the manifest."""
    root = tmp_path_factory.mktemp("summary")
    results = root / "results"
    optimizer_question(root / "runs" / "optim", results / "optim")
    ablation_question(root / "runs" / "ablation", results / "ablation")
    (results / "summary.yaml").write_text(yaml.safe_dump(MANIFEST, allow_unicode=True, sort_keys=False))
    return results


@pytest.fixture
def results(built_results, tmp_path):
    """Each test's own copy of the results folder, which it may change."""
    return shutil.copytree(built_results, tmp_path / "results")


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def report_numbers(folder) -> dict[tuple[str, str, str, str], str]:
    return {(r["depth"], r["arm"], r["metric"], r["statistic"]): r["value"] for r in read_csv(folder / "numbers.csv")}


def test_summary_reads_the_numbers_the_report_wrote_and_recovers_them_without_p_values(results, tmp_path):
    written = {folder: report_numbers(results / folder) for folder in MANIFEST}
    paths = write_summary(results)
    assert [p.name for p in paths] == ["summary.csv", "summary.md", "forest.png"] and paths[0].parent == results
    rows = read_csv(results / "summary.csv")
    assert [(r["folder"], r["depth"], r["arm"], r["label"]) for r in rows] == [
        ("optim", "d12", ADAMW_XSA, "d12"), ("optim", "d12", XSA, "d12"),
        ("ablation", "d12 · window_pattern=L", XSA, "− windows"), ("ablation", "d12", XSA, "d12")]
    # Each cell's family: its report's paired Δ val/bpb, 2 in optim (Muon's and AdamW's), 3 in the ablation (one per
    # setting). The summary's p and Holm's p are the report's own.
    assert [r["family_tests"] for r in rows] == ["2", "2", "3", "3"]
    for row in rows:
        numbers = written[row["folder"]]
        key = (row["depth"], row["arm"], "val/bpb")
        for column, statistic in (("delta", ""), ("ci95_low", "_ci95_low"), ("ci95_high", "_ci95_high"),
                                  ("n", "_n"), ("sd", "_sd"), ("pi95_low", "_pi95_low"), ("pi95_high", "_pi95_high"),
                                  ("p", "_p"), ("p_holm", "_p_holm")):
            assert float(row[column]) == float(numbers[(*key, "paired_delta" + statistic)]), column

    # A numbers.csv written before the report wrote p-values: p, the SD, the prediction interval and Holm's p are
    # recovered from each interval, equal to the ones the report computed from the runs.
    for folder in MANIFEST:
        kept = [r for r in read_csv(results / folder / "numbers.csv") if not r["statistic"].endswith(NEW_STATISTICS)]
        with open(results / folder / "numbers.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["depth", "arm", "metric", "statistic", "value"])
            writer.writeheader()
            writer.writerows(kept)
    write_summary(results, tmp_path / "recovered")
    recovered = read_csv(tmp_path / "recovered" / "summary.csv")
    assert len(recovered) == len(rows)
    for old, new in zip(rows, recovered):
        assert old["family_tests"] == new["family_tests"]
        for column in ("sd", "pi95_low", "pi95_high", "p", "p_holm"):
            assert float(new[column]) == pytest.approx(float(old[column]), abs=1e-9, rel=1e-9), column


def test_a_question_of_several_folders_is_one_holm_family(results):
    """The tests of a question whose cells fill several report folders are adjusted together, and a cell that two of
    its folders hold alike (the same Δ over the same seeds: a reference run once, reported twice) counts once."""
    shutil.copytree(results / "ablation", results / "ablation_again")
    manifest = {"optim": {**MANIFEST["optim"], "question": "11b"}, "ablation": MANIFEST["ablation"],
                "ablation_again": MANIFEST["ablation"]}
    (results / "summary.yaml").write_text(yaml.safe_dump(manifest, allow_unicode=True, sort_keys=False))
    write_summary(results)
    rows = read_csv(results / "summary.csv")
    assert [r["folder"] for r in rows] == ["optim", "optim", "ablation", "ablation", "ablation_again",
                                          "ablation_again"]
    tests = {(r["folder"], r["depth"], r["arm"]): float(r["p"]) for r in rows if r["folder"] != "ablation_again"}
    tests["ablation", "d12 · smear=False", XSA] = float(report_numbers(results / "ablation")[
        ("d12 · smear=False", XSA, "val/bpb", "paired_delta_p")])  # plotted or not, each test counts
    adjusted = holm(tests)  # the question's 2 + 3 tests, each once
    for row in rows:
        folder = "ablation" if row["folder"] == "ablation_again" else row["folder"]
        assert row["family_tests"] == "5"
        assert float(row["p_holm"]) == pytest.approx(adjusted[folder, row["depth"], row["arm"]], rel=1e-12)


def test_summary_table_and_forest_plot(results):
    write_summary(results)
    text = (results / "summary.md").read_text()
    assert text.index("## classic") < text.index("## nanochat_2604 stack")
    row = next(line for line in text.splitlines() if "`− windows`" in line)
    assert row.startswith(f"| 11b | Taken away | `− windows` | {XSA} | +0.0037 | [")
    assert row.endswith("| 3 |")
    assert is_png(results / "forest.png")


def test_manifest_mistakes_are_one_line_errors(results, capsys):
    def broken(entry):
        (results / "summary.yaml").write_text(yaml.safe_dump({"optim": entry}, allow_unicode=True))
        with pytest.raises(ReportError) as error:
            write_summary(results)
        return str(error.value)

    base = MANIFEST["optim"]
    assert "matches no paired Δ val/bpb" in broken({**base, "cells": [{"depth": "d24"}]})
    assert "matches no paired Δ val/bpb" in broken({**base, "skip": [{"arm": "muon · α=2"}]})
    assert "a selector is a mapping of" in broken({**base, "cells": [{"setting": "d12"}]})
    assert "give recipe" in broken({"question": 1, "title": "t"})
    assert "give question, recipe, title" in broken(1)
    (results / "summary.yaml").write_text("optim: [")
    with pytest.raises(ReportError, match=r"summary.yaml is not valid YAML \(while parsing"):
        write_summary(results)
    (results / "summary.yaml").write_text(yaml.safe_dump({"missing": base}))
    with pytest.raises(SystemExit) as exit_info:
        main(["--summary", str(results)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "numbers.csv not found" in err and len(err.strip().splitlines()) == 1


def test_cli_summary_and_its_mode_checks(results, tmp_path, capsys):
    main(["--summary", str(results), "--out", str(tmp_path / "elsewhere")])
    assert capsys.readouterr().out.splitlines()[0] == f"summary: {tmp_path / 'elsewhere' / 'summary.csv'}"
    assert not (results / "summary.csv").exists()
    for argv in (["--summary", str(results), str(results)], [], ["--seed-rule", "--summary", str(results)],
                 ["--summary", str(results), "--sd", "0.01"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
