"""The tree itself: no unresolved merge-conflict markers in any tracked file, no private Hydra API in the code, no
file named in the code, configs or docs that is not there."""

import re
import subprocess
import sys

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
    assert any(f.name == "preflight.py" for f in code)
    private = [str(f.relative_to(REPO)) for f in code if PRIVATE_HYDRA.search(f.read_text())]
    assert private == []


# A path into the project's own folders as comments and docs write it; `*` stands for any name (study_*.yaml)
PROJECT_PATH = re.compile(r"\b(?:xsa_exp|bench|tests|conf|docs|hydra_plugins)/[\w./*-]*[\w*]")


def test_every_file_the_code_configs_and_docs_name_exists():
    """A renamed module leaves its old path in comments and pages that a newcomer follows. BENCHMARKS.md is exempt:
    it records what the code was when each figure was taken."""
    texts = [f for f in tracked_files()
             if f.suffix in (".py", ".md", ".yaml", ".sh", ".toml") and f.name != "BENCHMARKS.md"]
    named = {(str(f.relative_to(REPO)), path) for f in texts for path in PROJECT_PATH.findall(f.read_text())}
    assert {("README.md", "bench/gpu.sh"), ("conf/train.yaml", "xsa_exp/config/preflight.py")} <= named
    missing = sorted((where, path) for where, path in named if not any(REPO.glob(path)))
    assert missing == []


def documented_signatures():
    """(file, dotted name, parameters as written) of every `xsa_exp.module.function(...)` in the README and docs/."""
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for match in re.finditer(r"`(xsa_exp(?:\.\w+)+)\(([^`]*)\)`", path.read_text()):
            params = [p.strip() for p in " ".join(match[2].split()).split(",") if p.strip()]
            yield path.name, match[1], params


def test_every_documented_python_signature_is_the_code_s():
    import importlib
    import inspect

    found = list(documented_signatures())
    assert {name for _, name, _ in found} >= {"xsa_exp.generate.generate", "xsa_exp.generate.generate_batch"}
    for file, name, documented in found:
        module, _, function = name.rpartition(".")
        signature = inspect.signature(getattr(importlib.import_module(module), function))
        actual = [("**" if p.kind is p.VAR_KEYWORD else "*" if p.kind is p.VAR_POSITIONAL else "") + p.name
                  + ("" if p.default is p.empty else f"={p.default!r}") for p in signature.parameters.values()]
        assert documented == actual, f"{file} documents {name}({', '.join(documented)}); the code has {signature}"


def test_the_model_optimizer_and_evaluations_import_neither_hydra_nor_the_command_line_layer():
    """They read the schema's typed settings; the preflight, its checks and Hydra are the entry points' business."""
    probe = ("import sys, xsa_exp.model, xsa_exp.optim, xsa_exp.optim.schedule, xsa_exp.eval.bpb, xsa_exp.eval.core, "
             "xsa_exp.eval.chat, xsa_exp.eval.diagnostics; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'hydra' or m.startswith(("
             "'xsa_exp.config.preflight', 'xsa_exp.config.checks', 'xsa_exp.config.keys'))))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
