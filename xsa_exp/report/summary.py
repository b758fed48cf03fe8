"""The study's summary from its committed numbers alone: every question's selected paired Δ val/bpb in one forest
plot and one table, with p and Holm's p within the question's family (the tests of one kind in all of the question's
folders), read from each question's numbers.csv (the run directories behind them are not kept).

<results>/summary.yaml, the manifest, names the question folders:

    <folder>:                  # <results>/<folder>/numbers.csv, as python -m xsa_exp.report wrote it
      question: 11b            # its number, and title
      title: The stack, one group of differences taken away at a time
      recipe: nanochat_2604 stack   # the forest plot's group
      cells:                   # optional, default: every paired Δ val/bpb with an interval
        - {depth: "tiny · smear=False", arm: "muon · α=1 · layers=all · value=mixed", label: "no smear"}
      skip:                    # optional: cells left out
        - {depth: tiny}

A selector matches the paired Δ val/bpb rows whose depth (the depth and setting label) and arm equal the ones it
gives (a key left out matches any); label names the cell instead of its depth label."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from xsa_exp.report.plots import plot_forest
from xsa_exp.report.render import PAIRED_TESTS, Key, fmt_p, md_table, num
from xsa_exp.report.runs import ReportError
from xsa_exp.report.stats import Estimate, holm_by_family

MANIFEST = "summary.yaml"
SELECTOR_KEYS = {"depth", "arm", "label"}
DEFAULT_FORM = " · layers=all · value=mixed"  # an arm label's tail where XSA has its default layers and value
PLOT_LABEL_CHARS = 60  # a setting label of many keys is cut to this in the plot (the table keeps it whole)


@dataclass(frozen=True)
class Cell:
    """One plotted paired Δ val/bpb: its question, cell and test."""

    folder: str
    question: str
    title: str
    recipe: str
    depth: str
    arm: str
    label: str  # the manifest's name of the cell, else its depth label
    delta: Estimate
    p_holm: float
    family: int  # the number of tests in the question's family (all its folders)


def read_numbers(path: Path) -> dict[Key, float | str]:
    """numbers.csv as (depth, arm, metric, statistic) -> value (a number where it is one)."""
    if not path.is_file():
        raise ReportError(f"{path} not found: the manifest names a folder without a report's numbers.csv")
    with open(path, newline="") as f:
        return {(r["depth"], r["arm"], r["metric"], r["statistic"]): number(r["value"]) for r in csv.DictReader(f)}


def number(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value


def family(numbers: dict[Key, float | str]) -> dict[Key, Estimate]:
    """The question's paired t-tests, as the report defines them (render.PAIRED_TESTS: every paired Δ, Δ − reference
    Δ and interaction with an interval of two seed pairs or more), each as its Estimate: with the SD the
    report wrote (<statistic>_sd), or, in a numbers.csv written before it did, the SD its interval implies."""
    tests = {}
    for key, value in numbers.items():
        if key[3] not in PAIRED_TESTS:
            continue
        low, high, n, sd = (numbers.get((*key[:3], key[3] + end)) for end in ("_ci95_low", "_ci95_high", "_n", "_sd"))
        if low is None or high is None or n is None or n < 2 or not math.isfinite(high - low):
            continue
        e = Estimate.from_interval(value, low, high, int(n))
        tests[key] = e if sd is None else Estimate(value, low, high, int(n), sd)
    return tests


def matches(selector: dict, key: Key) -> bool:
    return all(selector.get(name, value) == value for name, value in zip(("depth", "arm"), key))


def selected(folder: str, entry: dict, deltas: list[Key]) -> list[tuple[Key, str | None]]:
    """The paired Δ val/bpb keys the manifest entry selects, in its cells' order (else numbers.csv's), each with its
    label; a selector that matches none is an error (a label mistyped or a cell not run)."""
    cells = entry.get("cells") or [{}]
    for selector in [*cells, *entry.get("skip", [])]:
        if not isinstance(selector, dict) or not set(selector) <= SELECTOR_KEYS:
            raise ReportError(f"{MANIFEST}, {folder}: a selector is a mapping of {sorted(SELECTOR_KEYS)}, "
                              f"not {selector!r}")
        if not any(matches(selector, key) for key in deltas):
            raise ReportError(f"{MANIFEST}, {folder}: {selector!r} matches no paired Δ val/bpb with an interval in "
                              "its numbers.csv")
    chosen = {}
    for selector in cells:
        for key in deltas:
            if matches(selector, key) and not any(matches(skip, key) for skip in entry.get("skip", [])):
                chosen.setdefault(key, selector.get("label"))
    return list(chosen.items())


def question_holm(questions: dict[str, str], tests: dict[str, dict[Key, Estimate]]) -> dict[tuple[str, Key], tuple]:
    """(folder, key) -> (Holm's p, family size) within the test's question: holm_by_family over the tests of every
    folder of its question (questions: folder -> question), a test that two folders hold alike (the same cell, value
    and seeds) counted once; the same cell at another n (more seeds) counts again, which only makes Holm stricter."""
    by_question = defaultdict(dict)
    test_of = {}
    for folder, folder_tests in tests.items():
        for key, e in folder_tests.items():
            test = (*key, e.value, e.n)  # family_of reads its metric and statistic, key[2:4]
            by_question[questions[folder]][test] = e.p
            test_of[folder, key] = questions[folder], test
    adjusted = {question: holm_by_family(p_values) for question, p_values in by_question.items()}
    return {where: (adjusted[question][0][test], adjusted[question][1][test])
            for where, (question, test) in test_of.items()}


def question_cells(manifest: dict, tests: dict[str, dict[Key, Estimate]]) -> list[Cell]:
    questions = {folder: str(entry["question"]) for folder, entry in manifest.items()}
    adjusted = question_holm(questions, tests)
    cells = []
    for folder, entry in manifest.items():
        deltas = [key for key in tests[folder] if key[2:] == ("val/bpb", "paired_delta")]
        cells += [Cell(folder, questions[folder], entry["title"], entry["recipe"], key[0], key[1], label or key[0],
                       tests[folder][key], *adjusted[folder, key]) for key, label in selected(folder, entry, deltas)]
    return cells


def read_manifest(results: Path) -> dict:
    path = results / MANIFEST
    if not path.is_file():
        raise ReportError(f"{path} not found: the summary's manifest (docs/report.md says what it holds)")
    try:
        manifest = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ReportError(f"{path} is not valid YAML ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(manifest, dict) or not manifest:
        raise ReportError(f"{path}: a mapping of question folders")
    for folder, entry in manifest.items():
        missing = {"question", "title", "recipe"} - set(entry if isinstance(entry, dict) else {})
        if missing:
            raise ReportError(f"{MANIFEST}, {folder}: give {', '.join(sorted(missing))}")
    return manifest


def write_summary(results: Path, out_dir: Path | None = None) -> list[Path]:
    """summary.csv, summary.md and forest.png of the committed questions under `results` (default out_dir: results,
    where they are replaced); returns their paths."""
    results = Path(results).expanduser()
    out_dir = results if out_dir is None else Path(out_dir).expanduser()
    manifest = read_manifest(results)
    tests = {folder: family(read_numbers(results / folder / "numbers.csv")) for folder in manifest}
    cells = question_cells(manifest, tests)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = {}
    for cell in cells:
        groups.setdefault(cell.recipe, []).append(cell)
    paths = [out_dir / "summary.csv", out_dir / "summary.md", out_dir / "forest.png"]
    write_csv(cells, paths[0])
    paths[1].write_text(markdown(groups))
    plot_forest({recipe: [(plot_label(cell), cell.delta) for cell in group] for recipe, group in groups.items()},
                paths[2], "Δ val bpb (XSA − baseline), paired over seeds, 95% CI; XSA in every layer on the mixed "
                "value unless the label says otherwise")
    return paths


def write_csv(cells: list[Cell], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "title", "folder", "recipe", "depth", "arm", "label", "delta", "ci95_low",
                         "ci95_high", "n", "sd", "pi95_low", "pi95_high", "p", "p_holm", "family_tests"])
        for c in cells:
            e = c.delta
            writer.writerow([c.question, c.title, c.folder, c.recipe, c.depth, c.arm, c.label, e.value, e.low, e.high,
                             e.n, e.sd, *e.prediction, e.p, c.p_holm, c.family])


def markdown(groups: dict[str, list[Cell]]) -> str:
    parts = ["# The study's paired Δ val/bpb at a glance", "",
             "Written by `python -m xsa_exp.report --summary docs/results` from the questions' numbers.csv alone, the "
             "cells that summary.yaml selects; forest.png plots them. Δ: XSA arm − its baseline arm, paired over n "
             "seeds, 95% t-interval. SD: of the per-seed Δ; 95% PI: where one new seed pair's Δ would fall "
             "(Δ ± t·SD·√(1 + 1/n)). p: the paired t-test's, two-sided; Holm: p adjusted within the question's family, "
             "the paired Δ val/bpb tests of all its report folders (their number in \"tests\"; a cell that two "
             "folders hold alike counts once), so a Holm p below 0.05 stays a call at 5% however many cells the "
             "question tested, at seeds fixed in advance (a cell given seeds 6-10 by the "
             "seed rule errs more often: docs/results/README.md, \"Multiplicity and the seed rule\"). Where a "
             "numbers.csv predates p-values, p and SD are recovered from its interval exactly.", ""]
    for recipe, cells in groups.items():
        rows = [[c.question, c.title, f"`{c.label}`", c.arm, num(c.delta.value, sign=True),
                 f"[{num(c.delta.low, sign=True)}, {num(c.delta.high, sign=True)}]", str(c.delta.n), num(c.delta.sd),
                 "[{}, {}]".format(*(num(x, sign=True) for x in c.delta.prediction)), fmt_p(c.delta.p),
                 fmt_p(c.p_holm), str(c.family)] for c in cells]
        parts += [f"## {recipe}", "",
                  md_table(["question", "title", "cell", "arm", "Δ val/bpb", "95% CI", "n", "SD per seed",
                            "95% PI, one new pair", "p", "Holm", "tests"], rows), ""]
    return "\n".join(parts)


def plot_label(cell: Cell) -> str:
    label = cell.label if len(cell.label) <= PLOT_LABEL_CHARS else cell.label[:PLOT_LABEL_CHARS - 1] + "…"
    arm = cell.arm.replace(DEFAULT_FORM, "")  # XSA's default form, said once in the x label
    return f"{cell.question} · {label} · {arm} (n={cell.delta.n}, Holm p {fmt_p(cell.p_holm)})"
