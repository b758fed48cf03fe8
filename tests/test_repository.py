"""The tree itself: no unresolved merge-conflict markers in any tracked file, no private Hydra API in the code."""

import re
import subprocess

from tests.conftest import REPO

CONFLICT_MARKER = re.compile(rb"^(<<<<<<<|>>>>>>>)( |$)", re.MULTILINE)
PRIVATE_HYDRA = re.compile(r"^\s*(from|import)\s+hydra\._internal\b", re.MULTILINE)


def tracked_files() -> list:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in listed.decode().split("\0") if name]


def test_no_merge_conflict_markers_in_the_tree():
    files = tracked_files()
    assert any(f.name == "README.md" for f in files)
    marked = [str(f.relative_to(REPO)) for f in files if f.is_file() and CONFLICT_MARKER.search(f.read_bytes())]
    assert marked == []


def test_no_private_hydra_api_in_the_code():
    """Hydra's `_internal` modules can change in any release; the code and tests import its public API only (a
    multirun.yaml a test writes may still name Hydra's own sweeper class, as Hydra writes it)."""
    code = [f for f in tracked_files() if f.suffix == ".py"]
    assert any(f.name == "config.py" for f in code)
    private = [str(f.relative_to(REPO)) for f in code if PRIVATE_HYDRA.search(f.read_text())]
    assert private == []
