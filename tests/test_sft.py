"""The SFT stage: chat data through datasets, the loss mask in packed rows, and the stage's checks."""

import csv
import json
import os
import re
import subprocess
import sys
import zipfile

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import REPO, SMALL, compose_config
from tests.test_core import REAL_BUNDLE as BUNDLE
from xsa_exp.config.checks import validate
from xsa_exp.config.schema import ModelConfig, XSAConfig, data_settings, typed
from xsa_exp.console import set_up_console
from xsa_exp.data.chat import render_conversation
from xsa_exp.data.conversations import gsm8k_conversation, mmlu_conversation
from xsa_exp.data.packing import inputs_and_targets
from xsa_exp.data.sft import conversation_rows, load_conversations
from xsa_exp.data.sources import DataError
from xsa_exp.data.tokenizer import Tokenizer
from xsa_exp.errors import ConfigError
from xsa_exp.eval.chat import BASELINES
from xsa_exp.eval.sandbox import isolation_mode
from xsa_exp.model import GPT, GPTConfig
from xsa_exp.training.run import load_base_run, train

FIXTURES = REPO / "tests" / "fixtures" / "chat"
SFT_DATA = [f"data.train_sources.smoltalk.data_files={FIXTURES / 'smoltalk_train.jsonl'}",
            f"data.train_sources.mmlu_auxiliary.data_files={FIXTURES / 'mmlu_auxiliary_train.jsonl'}",
            f"data.train_sources.gsm8k.data_files={FIXTURES / 'gsm8k_train.jsonl'}",
            f"data.val_sources.smoltalk.data_files={FIXTURES / 'smoltalk_test.jsonl'}"]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train(["Multiple Choice question: What is 7 times 8? Respond only with the letter. "
                            "12 + 3 = 15."] * 20, 300)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    return train(compose_config(*SMALL, "train.max_steps=2", "eval.every=0", "eval.diag_every=0"),
                 tmp_path_factory.mktemp("sft") / "base")


def sft_cfg(base_run, *overrides):
    return compose_config(*SMALL, "stage=sft", f"init_from={base_run}", *SFT_DATA, *overrides)


def test_mmlu_rows_become_letter_answers_and_auxiliary_rows_are_unwrapped():
    row = {"question": "2 + 2?", "choices": ["3", "4", "5", "6"], "answer": 1}
    plain, nested = mmlu_conversation(row, False), mmlu_conversation({"train": row}, False)
    assert plain == nested
    assert plain[0]["content"].startswith("Multiple Choice question: 2 + 2?\n- 3=A\n- 4=B\n")
    assert plain[1] == {"role": "assistant", "content": "B"}


def test_gsm8k_calculator_notes_become_tool_calls_or_are_dropped():
    row = {"question": "3 boxes of 4?", "answer": "3 * 4 = <<3*4=12>>12 apples.\n#### 12"}
    plain = gsm8k_conversation(row, tool_calls=False)[1]["content"]
    assert "".join(p["text"] for p in plain) == "3 * 4 = 12 apples.\n#### 12" and {p["type"] for p in plain} == {"text"}
    with_tools = gsm8k_conversation(row, tool_calls=True)[1]["content"]
    assert with_tools == [{"type": "text", "text": "3 * 4 = "}, {"type": "python", "text": "3*4"},
                          {"type": "python_output", "text": "12"}, {"type": "text", "text": "12 apples.\n#### 12"}]
    # nanochat's split of a note: at its last "=", a note without one all expression; "<<>>" is text
    odd = {"question": "?", "answer": "<<a=b=3>> <<7*2>> <<>>"}
    assert [p for p in gsm8k_conversation(odd, tool_calls=True)[1]["content"] if p["type"] != "text"] == [
        {"type": "python", "text": "a=b"}, {"type": "python_output", "text": "3"},
        {"type": "python", "text": "7*2"}, {"type": "python_output", "text": ""}]
    assert "<<>>" in "".join(p["text"] for p in gsm8k_conversation(odd, tool_calls=True)[1]["content"])


def test_packed_rows_train_only_assistant_tokens(tokenizer):
    conversations = [[{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"Answer {i}."}]
                     for i in range(30)]
    rows = conversation_rows(tokenizer, conversations, 33, seed=0)
    inputs, targets = inputs_and_targets(rows.long())
    assert inputs.min() >= 0  # every input is a real token
    trained = tokenizer.decode(targets[targets >= 0].tolist())
    assert "Answer" in trained and "Question" not in trained
    end = tokenizer.special_tokens["<|assistant_end|>"]
    assert (targets == end).sum() >= 25  # the closing token is learned (a few may sit across row boundaries)
    # a row of plain documents is unchanged by the decoding
    plain = torch.arange(10).view(2, 5)
    assert torch.equal(inputs_and_targets(plain)[1], plain[:, 1:])


def test_conversations_load_through_datasets_from_local_files():
    data = data_settings(compose_config(*SMALL, "stage=sft", "init_from=x", *SFT_DATA).data)
    conversations, counts = load_conversations(data, "train_sources")
    assert counts == {"smoltalk": 24, "mmlu_auxiliary": 8, "gsm8k": 6} and len(conversations) == 38
    data.train_sources["gsm8k"].max_rows = 2
    assert load_conversations(data, "train_sources")[1]["gsm8k"] == 2


def test_hub_sources_offline_name_the_local_fix(base_run, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose_config(*SMALL, "stage=sft", f"init_from={base_run}")
    # train.py stops before the run directory exists ...
    with pytest.raises(ConfigError, match=r"data.train_sources.smoltalk is the hub dataset "
                                          r"HuggingFaceTB/smol-smoltalk, but HF_HUB_OFFLINE is set; "
                                          r"set data.train_sources.smoltalk.data_files"):
        validate(cfg)
    # ... and the loader says the same to anyone calling it directly
    with pytest.raises(DataError, match=r"hub dataset HuggingFaceTB/smol-smoltalk .* HF_HUB_OFFLINE is set; set "
                                        r"data.train_sources.smoltalk.data_files"):
        load_conversations(data_settings(cfg.data), "train_sources")


def test_a_local_file_datasets_cannot_read_names_it_and_no_connection(tmp_path, capfd):
    """A corrupt parquet file given in data_files: the fix is the file, not the network, in one line (datasets' own
    line about it, logged before it raises, is silenced as the console is set up)."""
    set_up_console()
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not a parquet file PAR1")
    data = data_settings(compose_config(*SMALL, "stage=sft", "init_from=x", *SFT_DATA,
                                        f"data.train_sources.smoltalk.data_files={bad}").data)
    with pytest.raises(DataError, match=rf"^cannot load {re.escape(str(bad))} \(.*\); replace them with readable "
                                        r"copies, or leave them out of data.train_sources.smoltalk.data_files$"):
        load_conversations(data, "train_sources")
    assert "Failed to read" not in capfd.readouterr().err


def test_rows_that_do_not_fit_the_format_are_one_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "no messages here"}) + "\n")
    data = compose_config(*SMALL, "stage=sft", "init_from=x", *SFT_DATA,
                          f"data.train_sources.smoltalk.data_files={bad}").data
    data = data_settings(data)
    with pytest.raises(DataError, match=r"data.train_sources.smoltalk: a row does not fit format=messages "
                                        r".* columns are text"):
        load_conversations(data, "train_sources")


def test_a_malformed_line_of_chat_data_is_named_as_an_editor_numbers_it(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    bad.write_text("\n".join([good] * 17 + ['{"messages": [}'] + [good] * 3) + "\n")
    data = compose_config(*SMALL, "stage=sft", "init_from=x", *SFT_DATA,
                          f"data.train_sources.smoltalk.data_files={bad}").data
    data = data_settings(data)
    with pytest.raises(DataError) as e:
        load_conversations(data, "train_sources")
    assert str(e.value) == (f"cannot load {bad}: line 18 is not valid JSON (Expecting value at column 15); correct it, "
                            "or leave it out of data.train_sources.smoltalk.data_files")


def unreadable_run(run_dir, config_text):
    """A finished run's files, its config.yaml replaced by config_text."""
    (run_dir / "checkpoints").mkdir(parents=True)
    zipfile.ZipFile(run_dir / "checkpoints" / "final.ckpt", "w").close()  # a checkpoint is a zip
    (run_dir / "config.yaml").write_text(config_text)
    return run_dir


def test_stage_checks(base_run, tmp_path):
    validate(sft_cfg(base_run))  # the base run's own settings pass
    cases = [
        (compose_config(*SMALL, "stage=sft"), "stage=sft needs init_from=<base run directory>"),
        (compose_config(*SMALL, f"init_from={base_run}"), "init_from=.* is for the SFT stage; add stage=sft"),
        (compose_config(*SMALL, "data=sft"), "data=sft is the SFT stage's data; use stage=sft"),
        (sft_cfg(tmp_path), "is not a finished run .*config.yaml and checkpoints/final.ckpt"),
        (sft_cfg(unreadable_run(tmp_path / "garbled", "model: [")),
         r"its config.yaml is not a run's \(ParserError: .*\); point it at a completed base run directory"),
        (sft_cfg(unreadable_run(tmp_path / "empty", "")), r"its config.yaml is not a run's \(it lacks model or xsa\)"),
        (sft_cfg(base_run, "xsa.alpha=0.5"),
         r"other model/XSA settings \(xsa.alpha differ\); pass the base run's: xsa.alpha=1.0"),
        (sft_cfg(base_run, "model.n_layer=3"), r"model.n_layer differ\); pass the base run's: model.n_layer=2"),
        (compose_config("stage=sft", f"init_from={base_run}", "depth=d12", *SFT_DATA),
         r"pass the base run's: depth=tiny"),
        (sft_cfg(base_run, f"data.train_sources.gsm8k.data_files={tmp_path}/none.jsonl"),
         r"data.train_sources.gsm8k.data_files=.*none.jsonl matches no .parquet"),
        (sft_cfg(base_run, "data.train_sources.gsm8k.format=csv"),
         r"data.train_sources.gsm8k.format='csv' is not an option"),
        (compose_config(*SMALL, "train.max_steps=null", "train.epochs=1", "data=local", "data.path=x"),
         "train.epochs needs a corpus held in memory"),
    ]
    for cfg, message in cases:
        with pytest.raises(ConfigError, match=message):
            validate(cfg)


def test_sft_starts_from_the_base_runs_final_weights(base_run):
    cfg = sft_cfg(base_run)
    model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    base = load_base_run(cfg, model)
    for name, tensor in base.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert load_base_run(compose_config(*SMALL), model) is None


def test_an_unreadable_final_checkpoint_of_the_base_run_is_refused_not_replaced_by_an_earlier_one(tmp_path):
    base = train(compose_config(*SMALL, "train.max_steps=3", "train.checkpoint_every=2", "eval.every=0",
                                "eval.diag_every=0"), tmp_path / "base")
    final = base / "checkpoints" / "final.ckpt"
    final.write_bytes(final.read_bytes()[:5000])  # cut short; step000002.ckpt still loads
    cfg = sft_cfg(base)
    with pytest.raises(ConfigError, match=rf"^init_from={base}: its checkpoints/final.ckpt does not load "
                                          r"\(BadZipFile: File is not a zip file\); restore it from a copy, or point "
                                          "init_from at another completed base run$"):
        validate(cfg)  # the preflight: before Hydra makes the SFT run's directory
    model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    with pytest.raises(ConfigError, match=rf"init_from: checkpoint {final} is truncated, corrupt or unreadable"):
        load_base_run(cfg, model)



def test_rows_without_a_trained_target_are_left_out(tokenizer):
    """A prompt longer than a row fills rows with masked tokens only: a micro-batch of them would have a loss of 0/0."""
    conversations = [[{"role": "user", "content": "a long prompt " * 40}, {"role": "assistant", "content": "ok"}]] * 3
    tokens = sum(len(render_conversation(tokenizer, c)[0]) for c in conversations)
    rows = conversation_rows(tokenizer, conversations, 17, seed=0)
    assert 0 < len(rows) < tokens // 17  # rows inside the prompts are gone
    assert (inputs_and_targets(rows.long())[1] >= 0).any(dim=1).all()
    assert "ok" in tokenizer.decode(inputs_and_targets(rows.long())[1].flatten().clamp_min(0).tolist())


@pytest.mark.parametrize("message", [{"role": "assistant", "content": None},
                                     {"role": "assistant", "content": [{"type": "text"}]}, {"content": "hi"}],
                         ids=["no-content", "part-without-text", "no-role"])
def test_a_conversation_that_cannot_be_rendered_is_one_data_error(tokenizer, message):
    conversation = [{"role": "user", "content": "hi"}, message] if "role" in message else [message]
    with pytest.raises(DataError) as info:
        conversation_rows(tokenizer, [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                                      conversation], 17, seed=0)
    assert str(info.value).startswith("SFT conversation 1 (of all sources, in source order) cannot be rendered (")
    assert "\n" not in str(info.value)

@pytest.mark.slow
def test_sft_stage_trains_one_epoch_of_the_mixture_and_records_its_base(base_run, tmp_path):
    cfg = sft_cfg(base_run, "train.max_steps=null", "eval.every=2")
    run = train(cfg, tmp_path / "sft")
    info = json.loads((run / "run.json").read_text())
    assert info["stage"] == "sft" and info["init_from"]["run"] == str(base_run) and info["init_from"]["step"] == 2
    # one epoch: every packed row once (rows x sequence_len tokens, in whole updates of 512 tokens)
    conversations, _ = load_conversations(data_settings(cfg.data), "train_sources")
    rows = conversation_rows(Tokenizer.load(base_run / "tokenizer"), conversations, 65, cfg.seed)
    assert info["max_steps"] == len(rows) * 64 // 512 > 1
    assert (run / "status.json").read_text().count("completed") == 1
    assert (run / "tokenizer").is_dir() and (run / "checkpoints" / "final.ckpt").is_file()
    saved = OmegaConf.load(run / "config.yaml")
    assert saved.stage_name == "sft" and saved.data.name == "sft"


@pytest.fixture(scope="module")
def sft_run(base_run, tmp_path_factory):
    """An SFT run made by the command a user runs: train.py stage=sft init_from=<base>."""
    if not (BUNDLE / "eval_data").is_dir():
        pytest.skip(f"ChatCORE's ARC, GSM8K and HumanEval data come from the eval bundle, not found at {BUNDLE}")
    sft = tmp_path_factory.mktemp("sft_run") / "sft"
    subprocess.run([sys.executable, "train.py", *SMALL, "stage=sft", f"init_from={base_run}", *SFT_DATA,
                    "train.max_steps=3", f"hydra.run.dir={sft}"], cwd=REPO, env=EVAL_ENV, check=True,
                   capture_output=True)
    return sft


EVAL_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}


@pytest.mark.slow
@pytest.mark.xdist_group("sft_run")  # one worker makes the SFT run for both tests
def test_smoke_pipeline_base_then_sft_then_chatcore(sft_run):
    """The commands a user runs: train.py stage=sft init_from=<base>, then evaluate.py eval.metrics=[chatcore]."""
    env, sft = EVAL_ENV, sft_run
    common = [f"run={sft}", f"eval.bundle_dir={BUNDLE}", "eval.chatcore.max_per_task=2"]
    done = subprocess.run([sys.executable, "evaluate.py", *common, "eval.metrics=[bpb,chatcore]",
                           f"eval.chatcore.mmlu.data_files={FIXTURES / 'mmlu_test.jsonl'}"],
                          cwd=REPO, env=env, check=True, capture_output=True, text=True)
    [summary_path] = (sft / "eval").glob("*/summary.json")
    metrics = json.loads(summary_path.read_text())["metrics"]
    assert "ChatCORE" in metrics and "ChatCORE" in done.stdout
    # bpb over the assistant tokens of the validation conversations, as the SFT run logged it
    with open(sft / "metrics.csv") as f:
        logged = [float(r["val/bpb"]) for r in csv.DictReader(f) if r["val/bpb"]]
    assert metrics["val/bpb"] == pytest.approx(logged[-1], rel=1e-6)
    centered = [(metrics[f"chat/{t}"] - b) / (1 - b) for t, b in BASELINES.items()]
    assert metrics["ChatCORE"] == pytest.approx(sum(centered) / 5)
    examples = [json.loads(line) for line in (summary_path.parent / "chatcore_examples.jsonl").read_text().splitlines()]
    assert [e["task"] for e in examples] == [t for t in BASELINES for _ in range(2)]
    assert all("reply" in e for e in examples if e["task"] in ("gsm8k", "humaneval"))
    # the sandbox mode HumanEval ran in is recorded and printed
    assert json.loads(summary_path.read_text())["sandbox"] == isolation_mode()
    assert json.loads((summary_path.parent / "chatcore.json").read_text())["sandbox"] == isolation_mode()
    assert f"sandbox: {isolation_mode()}" in done.stdout
    # without MMLU data (the hub is offline) the score says it covers four tasks
    subprocess.run([sys.executable, "evaluate.py", *common, "eval.metrics=[chatcore]"], cwd=REPO, env=env, check=True,
                   capture_output=True)
    newest = max(set((sft / "eval").glob("*/summary.json")) - {summary_path}, key=lambda p: p.stat().st_mtime_ns)
    metrics = json.loads(newest.read_text())["metrics"]
    assert "ChatCORE 4/5" in metrics and "ChatCORE" not in metrics and "chat/mmlu" not in metrics


@pytest.mark.slow
@pytest.mark.xdist_group("sft_run")
def test_evaluate_py_under_torchrun_gives_the_one_process_results(sft_run, monkeypatch):
    """Two gloo processes (torchrun) share bpb's rows, CORE's examples and ChatCORE's batches (one prompt each, so
    both ranks answer some of every task) and write one results folder: the one process's (here, evaluate.py's
    function in this process), example for example."""
    from hydra import compose, initialize_config_dir

    from xsa_exp.evaluate_run import evaluate
    from xsa_exp.model import GPT

    common = [f"run={sft_run}", f"eval.bundle_dir={BUNDLE}", "eval.metrics=[bpb,core,chatcore]",
              "eval.core_max_per_task=2", "eval.chatcore.max_per_task=3", "eval.chatcore.batch_size=1",
              "eval.chatcore.max_new_tokens=24", f"eval.chatcore.mmlu.data_files={FIXTURES / 'mmlu_test.jsonl'}"]
    for name in ("HF_HUB_OFFLINE", "WANDB_MODE"):
        monkeypatch.setenv(name, EVAL_ENV[name])
    generated_to = []  # where each cached forward ends: ChatCORE's replies pass the 64-token training length
    record = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, kwargs, output: generated_to.append(kwargs["kv_cache"].pos)
        if isinstance(module, GPT) and kwargs.get("kv_cache") else None, with_kwargs=True)
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            folders = [evaluate(compose(config_name="evaluate", overrides=common))]
    finally:
        record.remove()
    assert max(generated_to) > 64  # as nanochat generates: its model takes 10x its training length
    before = set((sft_run / "eval").glob("*"))
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "evaluate.py",
                    *common], cwd=REPO, env={**EVAL_ENV, "OMP_NUM_THREADS": "1"}, check=True, capture_output=True)
    [folder] = set((sft_run / "eval").glob("*")) - before  # rank 1 writes nothing
    folders.append(folder)
    alone, shared = ({name: (folder / name).read_text() for name in
                      ("summary.json", "core_examples.jsonl", "core_tasks.csv", "chatcore_examples.jsonl")}
                     for folder in folders)
    metrics = [json.loads(files.pop("summary.json"))["metrics"] for files in (alone, shared)]
    assert metrics[1].pop("val/bpb") == pytest.approx(metrics[0].pop("val/bpb"), rel=1e-6)  # other batches, other sums
    assert metrics[1] == metrics[0] and "ChatCORE" in metrics[0] and any(k.startswith("CORE") for k in metrics[0])
    assert shared == alone
    tasks = [[{k: v for k, v in row.items() if k != "seconds"}
              for row in csv.DictReader((f / "chatcore_tasks.csv").read_text().splitlines())] for f in folders]
    assert tasks[1] == tasks[0] and [row["n"] for row in tasks[0]] == ["3"] * 5
