"""Every configuration key, found by walking the composed configs, gets a wrong-typed value and (where
its schema has a range or options) a value outside them: each must end in one line that names the key,
before anything is created. A key added later is covered without editing this file.

In-process: every value through check_override() (the override applied to the composed config, then
validation), and one value per config node through preflight(), which train.py and evaluate.py run
before Hydra (it recomposes every group, a quarter second each). A few subprocess runs check the
end-to-end path (stderr, exit status 2, an unchanged file system)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import typing
import zipfile
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tests.conftest import CONF_DIR, REPO, compose_config
from tests.hydra_app import preflight
from xsa_exp.config.checks import SAMPLE_CORPUS_MAX_VOCAB, validate, validate_evaluate
from xsa_exp.config.docs import KEYS_BEGIN, KEYS_END, markdown
from xsa_exp.config.keys import Leaf, _optional, leaves
from xsa_exp.config.preflight import composition_error
from xsa_exp.errors import ConfigError

FIXTURES = REPO / "tests" / "fixtures" / "chat"


def tree(*roots: Path) -> set[str]:
    return {str(p) for root in roots if root.exists() for p in root.rglob("*")}


@pytest.fixture
def bases(tmp_path, monkeypatch):
    """Command lines that validate, which together hold every key: (config name, overrides)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    shards = tmp_path / "shards"  # a local mirror of one training shard and the validation shard
    shards.mkdir()
    for name in ("shard_00000.parquet", "shard_06542.parquet"):
        (shards / name).write_bytes(b"PAR1" * 3)  # what the preflight reads of a parquet file: its markers
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (corpus / name).write_text('{"text": "In the beginning."}\n')
    base_run = tmp_path / "base"
    (base_run / "checkpoints").mkdir(parents=True)
    zipfile.ZipFile(base_run / "checkpoints" / "final.ckpt", "w").close()  # a checkpoint is a zip
    (base_run / "config.yaml").write_text(OmegaConf.to_yaml(compose_config(), resolve=True))
    sft = [f"data.train_sources.{name}.data_files={FIXTURES / f'{name}_train.jsonl'}"
           for name in ("smoltalk", "mmlu_auxiliary", "gsm8k")]
    sft.append(f"data.val_sources.smoltalk.data_files={FIXTURES / 'smoltalk_test.jsonl'}")
    bundle = tmp_path / "bundle"  # the index files the check of CORE's bundle looks for (evaluate.py's default metrics)
    bundle.mkdir()
    for name in ("core.yaml", "eval_meta_data.csv"):
        (bundle / name).touch()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a run directory would be created here
    return {
        "train": ("train", []),
        "train data=wiki": ("train", ["data=wiki"]),
        "train data=climbmix": ("train", ["data=climbmix", f"data.local_dir={shards}", "data.num_train_shards=1"]),
        "train data=local": ("train", ["data=local", f"data.path={corpus}"]),
        "train stage=sft": ("train", ["stage=sft", f"init_from={base_run}", *sft]),
        "evaluate": ("evaluate", [f"run={base_run}", f"eval.bundle_dir={bundle}"]),
    }


def bad_values(leaf: Leaf) -> list[str]:
    """A value of the wrong type, then values outside the key's range or options."""
    inner, _ = _optional(leaf.type)
    meta = leaf.meta
    if inner is typing.Any:
        wrong = "{a:1}"
    elif inner is str:
        wrong = "[1,2]"
    else:  # int, float, bool, list
        wrong = "abc"
    values = [wrong]
    if "choices" in meta:
        values.append("not_an_option")
    step = 1 if inner is int else 0.5
    if "ge" in meta:
        values.append(str(meta["ge"] - step))
    if "gt" in meta:
        values.append(str(meta["gt"]))
    if "le" in meta:
        values.append(str(meta["le"] + step))
    if "lt" in meta:
        values.append(str(meta["lt"]))
    if leaf.key == "xsa.layers":
        values.append("[99]")
    if leaf.key == "trainer.devices":
        values.append("0")
    return values


def check_override(config_name: str, base: DictConfig, override: str) -> None:
    """What preflight() does with one plain `key=value`, on a config already composed (as Hydra applies overrides
    after composing the groups: OmegaConf.update with the parsed value), then validation; the same path without
    recomposing the groups for each of hundreds of values."""
    cfg = copy.deepcopy(base)
    parsed = OverridesParser.create().parse_override(override)
    try:
        OmegaConf.update(cfg, parsed.key_or_group, parsed.value(), merge=True)
    except OmegaConfBaseException as e:
        raise ConfigError(composition_error(e, [override], lambda rest: base)) from None
    (validate if config_name == "train" else validate_evaluate)(cfg)


def refusal(config_name: str, overrides: list[str], base=None) -> str:
    with pytest.raises(ConfigError) as info:
        if base is None:
            preflight(config_name, overrides)
        else:
            check_override(config_name, base, overrides[-1])
    return str(info.value)


def test_every_key_refuses_wrong_types_and_out_of_range_values_in_one_line(bases, cache_dir, tmp_path, capsys):
    before = tree(tmp_path, cache_dir)
    keys, values, unknown, composed, failures = set(), 0, 0, 0, []
    for label, (config_name, base) in bases.items():
        cfg = preflight(config_name, base)[0]  # the base itself is valid
        found = list(leaves(cfg))
        assert all(leaf.type is not None for leaf in found)
        nodes = set()
        for leaf in found:
            scope = label if leaf.key.startswith("data.") else config_name  # each data option has its own schema
            if (scope, leaf.key) in keys:
                continue  # the same key of the same schema: once is enough
            keys.add((scope, leaf.key))
            parent = leaf.key.rpartition(".")[0]
            for value in bad_values(leaf):
                values += 1
                end_to_end = parent not in nodes  # the first value under each node also through preflight
                nodes.add(parent)
                composed += end_to_end
                message = refusal(config_name, [*base, f"{leaf.key}={value}"], None if end_to_end else cfg)
                if "\n" in message or leaf.key not in message:
                    failures.append(f"[{label}] {leaf.key}={value}: {message!r}")
        for parent in sorted({leaf.key.rpartition(".")[0] for leaf in found}):  # a misspelt key under every node
            key = f"{parent}.no_such_key" if parent else "no_such_key"
            message = refusal(config_name, [*base, f"{key}=1"], cfg)
            unknown += 1
            if "\n" in message or f"{key} is not a key" not in message:
                failures.append(f"[{label}] {key}=1: {message!r}")
    assert not failures, "\n".join(failures)
    assert tree(tmp_path, cache_dir) == before  # nothing created: no run directory, no cache entry
    assert len(keys) >= 140 and values >= 240  # the walk found the schema (it has grown, never shrunk)
    with capsys.disabled():
        print(f"\nconfig fuzz: {len(keys)} keys, {values} bad values ({composed} through the full composition), "
              f"{unknown} misspelt keys, all refused in one line")


def test_a_sweep_checks_every_job_before_the_first(bases):
    config_name, base = bases["train"]
    assert len(preflight(config_name, ["-m", "xsa.alpha=0,1", "seed=1,2"])) == 4
    assert refusal(config_name, ["-m", "xsa.alpha=0,1,2"]).startswith("xsa.alpha=2 is outside [0, 1]")
    assert refusal(config_name, ["-m", "experiment=smoke", "seed=1,abc"]).startswith("seed=abc is not of type int")


def test_a_check_that_breaks_stops_the_run_instead_of_becoming_hydras_warning(tmp_path):
    """Hydra turns a callback's exception into a warning and runs on unchecked; a check that breaks (a bug, not a bad
    value) stops `python train.py` with its traceback, before the run directory exists."""
    breaks_then_trains = ("import runpy, xsa_exp.config.preflight as checks\n"
                          "def broken(entry, cfg): raise RuntimeError('a broken check')\n"
                          "checks.check_run = broken\n"
                          "runpy.run_path('train.py', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", breaks_then_trains, f"hydra.run.dir={tmp_path / 'run'}",
                             "train.max_steps=1", "logger=csv"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "RuntimeError: a broken check" in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_the_embedded_corpus_refuses_a_vocabulary_it_cannot_supply():
    message = refusal("train", ["depth=d12"])
    assert message.startswith("model.vocab_size=32768 is more than the embedded corpus supports "
                              f"(at most {SAMPLE_CORPUS_MAX_VOCAB} tokens)")
    preflight("train", [f"model.vocab_size={SAMPLE_CORPUS_MAX_VOCAB}"])


def test_sharding_strategies_are_refused_with_the_reason():
    for strategy in ("fsdp", "deepspeed"):
        message = refusal("train", [f"trainer.strategy={strategy}"])
        assert message.startswith(f"trainer.strategy={strategy!r} is not an option; allowed: auto, ddp,"), message
        assert "Muon needs whole matrices" in message and "use ddp" in message


def test_sample_corpus_vocab_cap_is_what_bpe_learns_from_it():
    from xsa_exp.data.corpus import load_sample_corpus
    from xsa_exp.data.tokenizer import Tokenizer

    assert (Tokenizer.train(load_sample_corpus()["train"], 2 * SAMPLE_CORPUS_MAX_VOCAB).vocab_size
            == SAMPLE_CORPUS_MAX_VOCAB)


def test_docs_configuration_lists_the_schema_keys():
    doc = (REPO / "docs" / "configuration.md").read_text()
    documented = doc[doc.index(KEYS_BEGIN):doc.index(KEYS_END) + len(KEYS_END)] + "\n"
    assert documented == markdown(CONF_DIR), "docs/configuration.md is stale: python -m xsa_exp.config.docs"


@pytest.mark.parametrize("script, args, message", [
    ("train.py", ["model.qk_norm=flase"],
     "config error: model.qk_norm=flase is not of type bool; allowed: true or false"),
    ("train.py", ["eval.every=abc"], "config error: eval.every=abc is not of type int"),
    ("train.py", ["xsa.alphaa=1"], "config error: xsa.alphaa is not a key; did you mean xsa.alpha?"),
    ("train.py", ["-m", "xsa.alpha=0,1,2"], "config error: xsa.alpha=2 is outside [0, 1]"),
    ("evaluate.py", ["run=.", "eval.chatcore.batch_size=0"],
     "config error: eval.chatcore.batch_size=0 must be a positive integer"),
    ("evaluate.py", ["run=.", "eval.metrics=[perplexity]"],
     "config error: eval.metrics=['perplexity'] has unknown entries ['perplexity']; allowed: bpb, core, diagnostics,"),
    ("evaluate.py", ["run=.", "eval.bundle_dir=absent"],  # CORE is in eval.metrics by default
     "config error: CORE needs the eval bundle, not found at absent; run `python -m xsa_exp.eval.bundle download`"),
])
def test_entry_points_refuse_in_one_line_and_create_nothing(script, args, message, tmp_path):
    """Each refusal comes before torch is imported, which takes longer than the checks (PYTHONPROFILEIMPORTTIME lists
    each import on stderr)."""
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(REPO), "XSA_EXP_CACHE": str(cache), "WANDB_MODE": "offline",
           "PYTHONPROFILEIMPORTTIME": "1"}
    result = subprocess.run([sys.executable, str(REPO / script), *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    timed = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    lines = [line for line in result.stderr.strip().splitlines() if line not in timed]
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), result.stderr
    imported = {line.rpartition("|")[2].strip() for line in timed}
    assert "hydra" in imported and "torch" not in imported
    assert tree(tmp_path) == set()  # no run or sweep directory, no wandb folder, no cache entry
