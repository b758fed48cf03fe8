"""End to end: the smoke experiment as a Hydra sweep with two seeds, then the report over it."""

import subprocess
import sys

import pytest

from tests.conftest import REPO, SMALL

pytestmark = pytest.mark.slow


def test_smoke_sweep_with_two_seeds_then_report(tmp_path):
    sweep = tmp_path / "sweep"
    model = [o for o in SMALL if o.startswith("model.") or o.startswith("train.")]
    train = subprocess.run([sys.executable, "train.py", "-m", "experiment=smoke", "seed=1,2", f"hydra.sweep.dir={sweep}",
                            *model, "train.max_steps=3", "eval.every=3", "eval.diag_every=3", "eval.val_tokens=512"],
                           cwd=REPO, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0", "1", "2", "3"]  # xsa.alpha=0,1 x seed=1,2
    assert all((sweep / j / "status.json").is_file() for j in jobs)

    report = subprocess.run([sys.executable, "-m", "xsa_exp.report", str(sweep)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    text = (sweep / "report" / "report.md").read_text()
    assert "no XSA" in text and "α=1" in text
    assert "(n=2)" in text  # two seeds pooled per arm
    assert (sweep / "report" / "numbers.csv").is_file()
    assert any(p.suffix == ".png" and p.stat().st_size > 0 for p in (sweep / "report" / "plots").iterdir())
