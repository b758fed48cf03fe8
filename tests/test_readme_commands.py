"""Every `python train.py` and `python evaluate.py` (or `torchrun ... evaluate.py`) command in the code blocks and
inline code of the README, of the reference pages (docs/*.md) and of the study's results (docs/results/README.md),
and in the experiment presets' comments, composes and passes the preflight (every key, value and sweep job checked,
data files included), with local stand-ins for what a user's machine has: a ClimbMix mirror (empty shard files under
the real names), a folder of jsonl files, a finished run for the SFT and evaluation commands. So a documented command
cannot drift from the configs. Hydra composes about 1,400 sweep jobs at 0.1 s each, most of this module's time; the
module runs on one xdist worker, which composes each command's base config once for both tests."""

import functools
import os
import re
import shlex
import zipfile
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from tests.conftest import CONF_DIR, REPO
from tests.hydra_app import check_runs, compose_base, run_configs
from xsa_exp.config import checks, preflight
from xsa_exp.eval.bundle import BundleError
from xsa_exp.report.cli import build_parser, parse_args

pytestmark = pytest.mark.xdist_group("readme")  # one process, so base_config below composes each command once

BUNDLE = Path(os.environ.get("XSA_EXP_EVAL_BUNDLE") or REPO.parent / "shared" / "eval_bundle")

COMMAND = re.compile(r"(?:python|torchrun(?: --\S+)*) (train|evaluate)\.py((?:[^;#`]|#(?=\S))*)")


def documented_lines() -> list[str]:
    """Each command line of the code blocks and inline code of the two READMEs and the reference pages, and of the
    experiment presets' comments ("#   python ..."), continuation lines joined, comments dropped."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "docs" / "results" / "README.md"]
    text = "".join(page.read_text() for page in pages)
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    blocks += re.findall(r"(?<!`)`((?:python|torchrun) [^`\n]*)`", re.sub(r"```.*?```", "", text, flags=re.S))
    for preset in sorted((CONF_DIR / "experiment").glob("*.yaml")):
        blocks.append("\n".join(line[4:] for line in preset.read_text().splitlines() if line.startswith("#   ")))
    return [line.split("  #")[0] for block in blocks for line in block.replace("\\\n", " ").splitlines()]


def readme_commands() -> list[tuple[str, str]]:
    """(entry point, argument string) of each training and evaluation command."""
    commands = []
    for line in documented_lines():
        commands += [(m.group(1), " ".join(m.group(2).split())) for m in COMMAND.finditer(line)
                     if m.group(1) == "train" or m.group(2).strip()]  # `python evaluate.py` names the entry point
    return list(dict.fromkeys(commands))  # a preset and the docs may show the same command


COMMANDS = readme_commands()


def make_stand_ins(root: Path) -> dict[str, str]:
    """What a command's placeholders and paths stand for here, made under root."""
    mirror = root / "climbmix"
    mirror.mkdir()
    for i in range(6543):  # ClimbMix's shard names; the preflight checks that each file is there, whole
        (mirror / f"shard_{i:05d}.parquet").write_bytes(b"PAR1" * 3)
    jsonl = root / "jsonl"
    jsonl.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (jsonl / name).write_text('{"content": "In the beginning"}\n')
    return {"/data/climbmix": str(mirror), "$HOME/.cache/nanochat/base_data_climbmix": str(mirror),
            "/data/*.jsonl": str(jsonl / "*.jsonl"), "<partition>": "gpu", "<date>": "2026-12-01", "<time>": "00-00-00",
            "<run or .ckpt>": "runs/2026-12-01/run", "$d": "runs/d24_sft/0"}


def make_finished_runs(entry: str, runs: list, root: Path) -> None:
    """The finished runs a command starts from, relative to root: each SFT job's base run (init_from=<run>), each
    evaluation's run (run=<run>)."""
    for cfg in runs:
        path = cfg.get("init_from") if entry == "train" else cfg.run
        if path:
            (root / path / "checkpoints").mkdir(parents=True, exist_ok=True)
            zipfile.ZipFile(root / path / "checkpoints" / "final.ckpt", "w").close()  # a checkpoint is a zip
            if entry == "train":  # the SFT checks compare the base run's model and XSA settings with the job's
                OmegaConf.save({"model": cfg.model, "xsa": cfg.xsa}, root / path / "config.yaml")


@pytest.fixture(scope="session")  # the paths are part of each base config's key, kept across the module's setups
def stand_ins(tmp_path_factory):
    return make_stand_ins(tmp_path_factory.mktemp("readme"))


base_config = functools.cache(lambda entry, argv: compose_base(entry, list(argv)))  # (config, multirun)

PRINT_FLAGS = {"--cfg": 1, "--resolve": 0, "--package": 1}  # Hydra's flags printing a run's config: (values taken)


def arguments(args: str, stand_ins: dict) -> list[str]:
    """The command's overrides and -m; a command that prints its config (--cfg job) composes the run it prints."""
    for placeholder, value in stand_ins.items():
        args = args.replace(placeholder, value)
    args = re.sub(r"<([^>]+)>", lambda m: m.group(1).replace(" ", "_"), args)  # <base run> -> base_run
    argv, words = [], iter(shlex.split(args))
    for word in words:
        if word in PRINT_FLAGS:
            for _ in range(PRINT_FLAGS[word]):
                next(words)
        elif word != "...":  # "..." stands for the user's other overrides
            argv.append(word)
    return argv


def test_the_readme_has_the_commands_this_test_reads():
    """The sections the test is for: GPU, corpora, checkpoints, the study, SLURM, SFT, evaluation."""
    joined = [f"{entry}.py {args}" for entry, args in COMMANDS]
    for expected in ("experiment=xsa_d12", "train.py depth=d24", "depth=nanochat", "data=climbmix", "data=local",
                     "resume=auto",
                     "experiment=xsa_d24", "hydra/launcher=slurm", "stage=sft", "evaluate.py run="):
        assert any(expected in command for command in joined), expected


@pytest.mark.parametrize("entry,args", COMMANDS, ids=[f"{e}.py {a}"[:80] for e, a in COMMANDS])
def test_readme_command_passes_the_preflight(entry, args, stand_ins, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative run and sweep directories land here
    argv = arguments(args, stand_ins)
    base, multirun = base_config(entry, tuple(argv))
    runs = run_configs(entry, base, multirun)
    make_finished_runs(entry, runs, tmp_path)
    if BUNDLE.is_dir():  # CORE needs it: the d12/d24 presets' training, evaluate.py's default metrics
        monkeypatch.setenv("XSA_EXP_EVAL_BUNDLE", str(BUNDLE))
    for module in (preflight, checks):  # the GPU commands' machine
        monkeypatch.setattr(module, "cuda_here", lambda: True)
    try:
        check_runs(entry, base, runs, multirun)
    except BundleError:
        if BUNDLE.is_dir():
            raise
        pytest.skip(f"this command runs CORE, which needs the eval bundle, not found at {BUNDLE}")
    assert runs, "the command composed no run"


def test_documented_commands_that_differ_run_different_jobs(stand_ins):
    """Two documented training commands whose overrides differ (Hydra's own settings aside) compose different
    jobs. An override that changes nothing makes its command a copy of another's: the study once ran a group
    `'optim.adamw.role_betas={}'` that Hydra merged into the dict it was meant to empty, six runs equal to the
    reference's to the bit."""
    parser = OverridesParser.create()
    seen = {}
    for entry, args in COMMANDS:
        if entry != "train" or PRINT_FLAGS.keys() & set(args.split()):  # a config printed runs no job
            continue
        argv = arguments(args, stand_ins)
        overrides = parser.parse_overrides([a for a in argv if a != "-m" and not a.startswith("hydra")])
        fixed = [o.input_line for o in overrides if not o.is_sweep_override()]
        swept = sorted(o.input_line for o in overrides if o.is_sweep_override())
        cfg, _ = base_config(entry, tuple(argv))  # a sweep's base config: the command's fixed overrides
        HydraConfig.instance().set_config(cfg)  # depth_name and the other group names read Hydra's choices
        jobs = (OmegaConf.to_yaml(cfg.hydra.sweeper), tuple(swept),
                OmegaConf.to_yaml({k: v for k, v in cfg.items() if k != "hydra"}))
        given = frozenset(fixed + swept)
        other = seen.setdefault(jobs, (given, args))
        assert other[0] == given, f"these commands run the same jobs:\n  {other[1]}\n  {args}"


REPORT_COMMAND = re.compile(r"python -m xsa_exp\.report( (?:[^;#`]|#(?=\S))*)")
REPORT_COMMANDS = sorted({" ".join(m.group(1).split()) for line in documented_lines()
                          for m in REPORT_COMMAND.finditer(line)})


def test_the_docs_show_report_commands_of_each_mode():
    assert any("--reference-setting" in args for args in REPORT_COMMANDS)
    assert any(args.startswith("--summary") for args in REPORT_COMMANDS)
    assert any(args.startswith("--seed-rule") for args in REPORT_COMMANDS)


@pytest.mark.parametrize("args", REPORT_COMMANDS, ids=[args[:80] for args in REPORT_COMMANDS])
def test_documented_report_command_parses(args):
    """Each `python -m xsa_exp.report` command of the docs passes the report's own option checks (the runs it reads
    are not here); a synopsis, whose [optional] parts stand for values, names only options the report has."""
    if "[" in args:
        described = build_parser().format_help()
        assert all(option in described for option in re.findall(r"--[a-z][a-z-]*", args)), args
    else:
        parse_args(shlex.split(args))
