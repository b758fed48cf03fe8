"""The eval bundle (the public ``eval_bundle.zip``): where it is, downloading it, checking it is there, reading its
files.

Layout: ``core.yaml`` (CORE's ``icl_tasks``), ``eval_meta_data.csv`` (CORE's random baselines) and
``eval_data/<category>/<task>.jsonl`` (CORE's tasks; ChatCORE's ARC, GSM8K and HumanEval files).
Location: eval.bundle_dir if set, else $XSA_EXP_EVAL_BUNDLE, else ~/.cache/xsa-exp/eval_bundle.

``python -m xsa_exp.eval.bundle download [--dest DIR]`` fetches it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Sequence

from xsa_exp.errors import UserError

BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
BUNDLE_ENV = "XSA_EXP_EVAL_BUNDLE"
DEFAULT_BUNDLE_DIR = "~/.cache/xsa-exp/eval_bundle"
CORE_TASKS_FILE = "core.yaml"
CORE_META_FILE = "eval_meta_data.csv"
DATA_DIR = "eval_data"
DOWNLOAD_COMMAND = "python -m xsa_exp.eval.bundle download"
HINT = f"run `{DOWNLOAD_COMMAND}`, or set eval.bundle_dir or ${BUNDLE_ENV} to a bundle directory"


class BundleError(UserError):
    """The eval bundle is missing or malformed; the message names the problem and the fix."""


def resolve_bundle_dir(configured: str | os.PathLike | None = None) -> Path:
    """The bundle directory: ``configured``, else $XSA_EXP_EVAL_BUNDLE, else ~/.cache/xsa-exp/eval_bundle."""
    chosen = configured or os.environ.get(BUNDLE_ENV) or DEFAULT_BUNDLE_DIR
    return Path(chosen).expanduser()


def bundle_problem(bundle_dir: Path) -> str | None:
    """What is wrong with bundle_dir as an eval bundle ("not found at ...", "incomplete at ..."), None if nothing."""
    if not bundle_dir.is_dir():
        return f"not found at {bundle_dir}"
    for name in (CORE_TASKS_FILE, CORE_META_FILE):
        if not (bundle_dir / name).is_file():
            return f"incomplete at {bundle_dir} ({name} is missing)"
    return None


def check_bundle(bundle_dir: str | os.PathLike) -> Path:
    """bundle_dir if it holds a complete bundle's index (core.yaml, eval_meta_data.csv); else BundleError."""
    bundle_dir = Path(bundle_dir)
    problem = bundle_problem(bundle_dir)
    if problem:
        raise BundleError(f"CORE eval bundle {problem}; {HINT}")
    return bundle_dir


def require_bundle(configured: str | os.PathLike | None, needed_by: str, alternative: str) -> Path:
    """The bundle directory for something that cannot run without it (CORE during training or in evaluate.py).
    Otherwise one BundleError line: what needs it, what is wrong, how to get it, and what to do instead."""
    bundle_dir = resolve_bundle_dir(configured)
    problem = bundle_problem(bundle_dir)
    if problem:
        raise BundleError(f"{needed_by} needs the eval bundle, {problem}; {HINT}, or {alternative}")
    return bundle_dir


def data_path(bundle_dir: str | os.PathLike, relative: str) -> Path:
    """A task file of the bundle (``relative`` to eval_data/)."""
    return Path(bundle_dir) / DATA_DIR / relative


def download_bundle(dest: str | os.PathLike, url: str = BUNDLE_URL) -> Path:
    """Download and unzip the eval bundle into ``dest`` (no-op if it is already there)."""
    dest = Path(dest).expanduser()
    if dest.exists() and not dest.is_dir():
        raise BundleError(f"{dest} is a file, not a folder; download the bundle into a folder (--dest DIR)")
    if (dest / CORE_TASKS_FILE).is_file():
        return dest
    if dest.exists() and any(dest.iterdir()):
        raise BundleError(f"{dest} exists but holds no core.yaml; remove it or point {BUNDLE_ENV} at a complete bundle")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Work next to dest so the final rename stays on one filesystem (atomic).
        staging = tempfile.TemporaryDirectory(dir=dest.parent, prefix=".eval_bundle-")
    except OSError as e:
        raise BundleError(f"cannot create {dest} ({e.strerror}); download the bundle into a folder that can be "
                          f"written (--dest DIR or ${BUNDLE_ENV})") from None
    with staging as tmp:
        archive, unpacked = Path(tmp) / "eval_bundle.zip", Path(tmp) / "unpacked"
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(archive, "wb") as f:
                shutil.copyfileobj(response, f)
        except OSError as e:  # URLError and socket timeouts are OSErrors
            raise BundleError(
                f"could not download the CORE eval bundle from {url} ({e}); "
                f"place the unzipped bundle at {dest} yourself or set {BUNDLE_ENV} to its path"
            ) from e
        try:
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(unpacked)
        except zipfile.BadZipFile as e:
            raise BundleError(f"{url} did not yield a valid zip ({e}); "
                              f"place the unzipped bundle at {dest} yourself") from e
        except OSError as e:  # a full disk
            raise BundleError(f"could not unpack the bundle into {dest.parent} ({e.strerror}); free space there or "
                              f"choose another --dest") from None
        root = unpacked / "eval_bundle" if (unpacked / "eval_bundle").is_dir() else unpacked
        if not (root / CORE_TASKS_FILE).is_file():
            raise BundleError(f"the archive from {url} holds no core.yaml; "
                              f"place the unzipped bundle at {dest} yourself")
        try:
            os.replace(root, dest)
        except OSError:
            if not (dest / CORE_TASKS_FILE).is_file():  # else another process placed it first
                raise
    return dest


def read_examples(path: str | os.PathLike, check: Callable[[dict, str], None]) -> list[tuple[int, dict]]:
    """(line index, example) of a JSONL file of the bundle, each a JSON object passed to check(item, where);
    blank lines are skipped."""
    path = Path(path)
    data = []
    with open(path, encoding="utf-8") as f:
        for line_index, line in enumerate(f):
            if not line.strip():
                continue
            where = f"{path} line {line_index + 1}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise BundleError(f"{where}: malformed JSON ({e.msg}); fix or remove that line") from e
            if not isinstance(item, dict):
                raise BundleError(f"{where}: expected a JSON object, got {type(item).__name__}; "
                                  "fix or remove that line")
            check(item, where)
            data.append((line_index, item))
    return data


def check_fields(item: dict, fields: Sequence[str], kind: str, where: str) -> None:
    for key in fields:
        if key not in item:
            raise BundleError(f"{where}: missing field '{key}' required by {kind} examples; fix or remove that line")


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m xsa_exp.eval.bundle download [--dest DIR]`: fetch the public eval bundle."""
    import argparse

    from xsa_exp.errors import exit_on_user_error

    parser = argparse.ArgumentParser(prog="python -m xsa_exp.eval.bundle", description="eval bundle tools")
    commands = parser.add_subparsers(dest="command", required=True)
    download = commands.add_parser("download", help=f"download {BUNDLE_URL}")
    download.add_argument("--dest", default=None,
                          help=f"target folder (default: ${BUNDLE_ENV}, else {DEFAULT_BUNDLE_DIR})")
    args = parser.parse_args(argv)
    with exit_on_user_error():
        path = download_bundle(resolve_bundle_dir(args.dest))
    print(f"eval bundle ready at {path}; point eval.bundle_dir or ${BUNDLE_ENV} at it if it is not the default")


if __name__ == "__main__":
    main()
