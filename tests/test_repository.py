"""The tree itself: no unresolved merge-conflict markers in any tracked file."""

import re
import subprocess

from tests.conftest import REPO

CONFLICT_MARKER = re.compile(rb"^(<<<<<<<|>>>>>>>)( |$)", re.MULTILINE)


def tracked_files() -> list:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in listed.decode().split("\0") if name]


def test_no_merge_conflict_markers_in_the_tree():
    files = tracked_files()
    assert any(f.name == "README.md" for f in files)
    marked = [str(f.relative_to(REPO)) for f in files if f.is_file() and CONFLICT_MARKER.search(f.read_bytes())]
    assert marked == []
