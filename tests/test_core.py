"""Tests for xsa_exp.eval.core (CORE evaluation as nanochat computes it)."""

import csv
import json
import math
import os
import random
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml

from tests import gloo
from xsa_exp.eval import bundle, core
from xsa_exp.eval.bundle import BundleError
from xsa_exp.eval.core import CoreResult, TaskResult

BOS = 256


class ByteTokenizer:
    bos_id = BOS

    def encode(self, text):
        return list(text.encode("utf-8"))


class BigramModel(torch.nn.Module):
    """Logits at position t depend only on the token at t, so every CE is known in closed form."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(table)
        self.calls = []  # (input shape, training flag) per forward

    def forward(self, idx):
        self.calls.append((tuple(idx.shape), self.training))
        return self.table[idx]


def bigram(pairs):
    """Logit table, zero except {(prev, next): logit}: after character `prev`, favour `next`."""
    table = torch.zeros(257, 257)
    for (prev, nxt), logit in pairs.items():
        table[ord(prev), ord(nxt)] = logit
    return table


TABLE = bigram({
    (" ", "b"): 5.0,  # multiple_choice: after the delimiter, answer "b" is favoured
    ("y", "b"): 4.0,  # multiple_choice: after a shared "y", "b" is favoured
    ("B", " "): 5.0,  # schema: an option ending in "B" predicts the continuation's space
    ("i", " "): 5.0,  # language_modeling: greedy "hi" -> " " -> "y" -> "o"
    (" ", "y"): 6.0,
    ("y", "o"): 5.0,
})


def shuffled(n):
    order = list(range(n))
    random.Random(1337).shuffle(order)
    return order


def ce(prev, nxt, table=TABLE):
    """Cross-entropy of token `nxt` after token `prev` under the bigram table."""
    p = BOS if prev == "BOS" else ord(prev)
    return -torch.log_softmax(table[p], -1)[ord(nxt)].item()


def write_bundle(root, tasks, baselines):
    """tasks: (label, dataset_uri, task_type, num_fewshot, delimiter, rows or None for no file)."""
    root.mkdir(parents=True, exist_ok=True)
    icl = []
    for label, uri, task_type, k, delim, rows in tasks:
        icl.append({"label": label, "dataset_uri": uri, "num_fewshot": [k],
                    "icl_task_type": task_type, "continuation_delimiter": delim})
        if rows is not None:
            path = root / "eval_data" / uri
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    (root / "core.yaml").write_text(yaml.safe_dump({"icl_tasks": icl}))
    with open(root / "eval_meta_data.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Eval Task", "Task Category", "Random baseline"])
        for label, b in baselines.items():
            w.writerow([label, "x", b])
    return root


MC_ROWS = [
    {"query": "Q", "choices": ["a", "b", "c"], "gold": 1},  # " b" is favoured -> pred 1, correct
    {"query": "Q", "choices": ["ya", "yb"], "gold": 0},  # shared "y" is context; "b" after "y" -> pred 1
    {"query": "Q", "choices": ["b", "aaaa"], "gold": 0},  # different lengths; pred 0, correct
]
SCHEMA_ROWS = [
    {"context_options": ["xA", "xB"], "continuation": "z", "gold": 1},  # "B" -> " " favoured: pred 1
    {"context_options": ["B", "A"], "continuation": "z", "gold": 1},  # pred 0, wrong
]
LM_ROWS = [
    {"context": "hi  ", "continuation": "yo"},  # greedy: i->" ", " "->y, y->o: correct
    {"context": "hi", "continuation": "yz"},  # greedy gives "yo": wrong
]
TINY_TASKS = [
    ("mc", "cat/mc.jsonl", "multiple_choice", 0, " ", MC_ROWS),
    ("sch", "cat/sch.jsonl", "schema", 0, " ", SCHEMA_ROWS),
    ("absent", "cat/absent.jsonl", "multiple_choice", 0, " ", None),
    ("lm", "cat/lm.jsonl", "language_modeling", 0, " ", LM_ROWS),
]
TINY_BASELINES = {"mc": 25, "sch": 50, "absent": 25, "lm": 0}


@pytest.fixture
def tiny_bundle(tmp_path):
    return write_bundle(tmp_path / "bundle", TINY_TASKS, TINY_BASELINES)


# -----------------------------------------------------------------------------
# End to end on hand-made tasks with a model whose answers are known


def test_evaluate_core_tiny_bundle(tiny_bundle):
    model = BigramModel(TABLE.clone())
    model.train()
    seen = []
    result = core.evaluate_core(model, ByteTokenizer(), tiny_bundle, max_seq_len=64,
                                progress=lambda r, done, total: seen.append((r.label, done, total)))
    by_task = {}
    for rec in result.examples:
        by_task.setdefault(rec["task"], {})[rec["original_index"]] = rec

    mc = by_task["mc"]
    assert [mc[i]["pred"] for i in range(3)] == [1, 1, 0]
    assert [mc[i]["correct"] for i in range(3)] == [True, False, True]
    assert mc[0]["losses"] == pytest.approx([ce(" ", "a"), ce(" ", "b"), ce(" ", "c")], abs=1e-5)
    assert mc[1]["losses"] == pytest.approx([ce("y", "a"), ce("y", "b")], abs=1e-5)  # shared "y" not scored
    assert mc[2]["losses"] == pytest.approx([ce(" ", "b"), (ce(" ", "a") + 3 * ce("a", "a")) / 4], abs=1e-5)

    sch = by_task["sch"]
    assert [sch[i]["pred"] for i in range(2)] == [1, 0]
    # span = the shared suffix " z": CE(" " | last option char) and CE("z" | " ")
    assert sch[0]["losses"] == pytest.approx([(ce("A", " ") + ce(" ", "z")) / 2, (ce("B", " ") + ce(" ", "z")) / 2],
                                             abs=1e-5)

    lm = by_task["lm"]
    assert [lm[i]["correct"] for i in range(2)] == [True, False]
    assert [(lm[i]["pred"], lm[i]["gold"]) for i in range(2)] == [(0, 0), (-1, 0)]
    # context is stripped; the span is " yo": the delimiter space joins the continuation
    assert lm[0]["losses"] == pytest.approx([(ce("i", " ") + ce(" ", "y") + ce("y", "o")) / 3], abs=1e-5)

    acc = {label: t.accuracy for label, t in result.tasks.items()}
    assert acc == pytest.approx({"mc": 2 / 3, "sch": 0.5, "lm": 0.5})
    centered = {"mc": (2 / 3 - 0.25) / 0.75, "sch": 0.0, "lm": 0.5}
    assert {k: t.centered for k, t in result.tasks.items()} == pytest.approx(centered)
    assert result.core == pytest.approx(sum(centered.values()) / 3)
    assert (result.n_tasks, result.n_total, result.name) == (3, 22, "CORE 3/22")
    assert "absent" not in result.tasks
    assert seen == [("mc", 1, 3), ("sch", 2, 3), ("lm", 3, 3)]

    # records follow the shuffled order
    assert [r["original_index"] for r in result.examples if r["task"] == "mc"] == shuffled(3)
    assert [r["index"] for r in result.examples if r["task"] == "mc"] == [0, 1, 2]

    # one forward per example, all choices batched, in eval mode; training mode restored after
    mc_batches = [len(MC_ROWS[i]["choices"]) for i in shuffled(3)]
    assert [shape[0] for shape, _ in model.calls] == mc_batches + [2, 2] + [1, 1]
    assert not any(training for _, training in model.calls)
    assert model.training
    json.dumps(result.examples)  # core_examples.jsonl's lines


def test_tasks_filter_max_per_task_and_eval_mode_kept(tiny_bundle):
    model = BigramModel(TABLE.clone()).eval()
    result = core.evaluate_core(model, ByteTokenizer(), tiny_bundle, max_seq_len=64, max_per_task=1, tasks=["lm", "mc"])
    assert list(result.tasks) == ["mc", "lm"]  # core.yaml order
    assert [t.n_examples for t in result.tasks.values()] == [1, 1]
    assert result.name == "CORE 2/22"
    assert not model.training
    with pytest.raises(BundleError, match="nope"):
        core.evaluate_core(model, ByteTokenizer(), tiny_bundle, max_seq_len=64, tasks=["nope"])


# -----------------------------------------------------------------------------
# Prompts, string for string


def test_prompts_multiple_choice_fewshot():
    shots = [{"query": "Q1", "choices": ["no", "yes"], "gold": 1}, {"query": "Q2", "choices": ["x", "y"], "gold": 0}]
    item = {"query": "Q3", "choices": ["A", "B"], "gold": 0}
    assert core.render_prompts_mc(item, "\nAnswer: ", shots) == [
        "Q1\nAnswer: yes\n\nQ2\nAnswer: x\n\nQ3\nAnswer: A",
        "Q1\nAnswer: yes\n\nQ2\nAnswer: x\n\nQ3\nAnswer: B",
    ]
    assert core.render_prompts_mc(item, " ") == ["Q3 A", "Q3 B"]


def test_prompts_schema_fewshot():
    shot = {"context_options": ["The cat", "The dog"], "continuation": "barked.", "gold": 1}
    item = {"context_options": ["Ann", "Bob"], "continuation": "won.", "gold": 0}
    assert (core.render_prompts_schema(item, " ", [shot])
            == ["The dog barked.\n\nAnn won.", "The dog barked.\n\nBob won."])


def test_prompts_language_modeling_fewshot():
    shots = [{"context": " 2+2= \n", "continuation": "4"}, {"context": "3+3=", "continuation": "6"}]
    item = {"context": "1+1=  ", "continuation": "2"}
    without, with_ = core.render_prompts_lm(item, " ", shots)
    assert with_ == "2+2= 4\n\n3+3= 6\n\n1+1= 2"
    assert without == "2+2= 4\n\n3+3= 6\n\n1+1="  # trailing delimiter space stripped
    assert core.render_prompts_lm(item, "\nAnswer: ") == ["1+1=\nAnswer:", "1+1=\nAnswer: 2"]


def test_token_spans():
    tok = ByteTokenizer()
    tokens, starts, ends = core.token_spans("multiple_choice", ["Q ab", "Q ac", "Q ad!"], tok)
    assert starts == [4, 4, 4] and ends == [5, 5, 6]  # BOS Q " " a | b / c / d!
    tokens, starts, ends = core.token_spans("schema", ["xA z.", "yyB z."], tok)
    assert (starts, ends) == ([3, 4], [6, 7])  # span = " z."
    tokens, starts, ends = core.token_spans("language_modeling", ["ab", "ab cd"], tok)
    assert tokens == [[BOS, 97, 98, 32, 99, 100]] and (starts, ends) == ([3], [6])


# -----------------------------------------------------------------------------
# Sampling and shuffling


def test_fewshot_sampling_excludes_item_and_uses_seed():
    for idx in range(12):
        picked = core.sample_fewshot(12, idx, 5)
        assert idx not in picked and len(set(picked)) == 5
        others = [i for i in range(12) if i != idx]
        assert picked == random.Random(1234 + idx).sample(others, 5)
    assert core.sample_fewshot(12, 3, 0) == []
    assert core.sample_fewshot(2, 0, 10) == [1]  # capped task smaller than the shot count


def test_fewshot_examples_reach_the_prompt(tmp_path):
    rows = [{"query": f"q{i}", "choices": ["a", "b"], "gold": i % 2} for i in range(6)]
    bundle = write_bundle(tmp_path / "b", [("mc", "c/mc.jsonl", "multiple_choice", 2, ": ", rows)], {"mc": 50})
    data = core.load_task_data(bundle / "eval_data/c/mc.jsonl", "multiple_choice")
    items = [it for _, it in data]
    shots = [items[i] for i in random.Random(1234 + 4).sample([0, 1, 2, 3, 5], 2)]
    expected = "".join(f"{s['query']}: {s['choices'][s['gold']]}\n\n" for s in shots) + f"{items[4]['query']}: a"

    prompts = []
    tok = ByteTokenizer()
    model = BigramModel(TABLE.clone())
    model.forward = lambda idx: (prompts.append(bytes(idx[0, 1:].tolist()).decode()), TABLE[idx])[1]
    core.evaluate_core(model, tok, bundle, max_seq_len=512)
    assert prompts[4] == expected


def test_shuffle_uses_seed_1337_and_keeps_line_index(tmp_path):
    path = tmp_path / "lm.jsonl"
    path.write_text("".join(json.dumps({"context": f"c{i}", "continuation": "x"}) + "\n" for i in range(9)))
    data = core.load_task_data(path, "language_modeling")
    assert [i for i, _ in data] == shuffled(9)
    assert all(item["context"] == f"c{i}" for i, item in data)


# -----------------------------------------------------------------------------
# Cropping


def test_crop_left_shifts_spans():
    tokens, starts, ends = core.crop_left([list(range(10)), [0, 1, 2]], [7, 1], [10, 3], 5)
    assert tokens == [[5, 6, 7, 8, 9], [0, 1, 2]] and starts == [2, 1] and ends == [5, 3]
    assert core.crop_left([list(range(10))], [2], [10], 3) == ([[7, 8, 9]], [1], [3])  # span longer than window


def test_cropped_lm_example_scores_like_uncropped(tmp_path):
    rows = [{"context": "z" * 40 + " hi", "continuation": "yo"}]
    bundle = write_bundle(tmp_path / "b", [("lm", "c/lm.jsonl", "language_modeling", 0, " ", rows)], {"lm": 0})
    full = core.evaluate_core(BigramModel(TABLE.clone()), ByteTokenizer(), bundle, max_seq_len=512)
    model = BigramModel(TABLE.clone())
    cropped = core.evaluate_core(model, ByteTokenizer(), bundle, max_seq_len=6)
    assert model.calls[0][0] == (1, 6)
    # a bigram model sees the same predecessors, so the span loss and the greedy match are unchanged
    assert cropped.examples[0]["losses"] == pytest.approx(full.examples[0]["losses"])
    assert cropped.examples[0]["correct"] and full.examples[0]["correct"]


# -----------------------------------------------------------------------------
# Arithmetic and naming


def _task(label, acc, baseline):
    return TaskResult(label, "multiple_choice", 0, 10, acc, core.centered_accuracy(acc, baseline), baseline)


def test_centered_and_core_name():
    assert core.centered_accuracy(0.5, 25) == pytest.approx(1 / 3)
    assert core.centered_accuracy(0.62, 62) == pytest.approx(0.0)
    assert core.centered_accuracy(1.0, 9.1) == pytest.approx(1.0)
    partial = CoreResult.from_tasks([_task(f"t{i}", 0.3 + 0.01 * i, 25) for i in range(18)])
    expected = sum((0.3 + 0.01 * i - 0.25) / 0.75 for i in range(18)) / 18
    assert partial.core == pytest.approx(expected)
    assert partial.name == "CORE 18/22"
    assert CoreResult.from_tasks([_task(f"t{i}", 0.5, 50) for i in range(22)]).name == "CORE"


# -----------------------------------------------------------------------------
# Errors


def test_malformed_json_line_names_file_and_line(tiny_bundle):
    path = tiny_bundle / "eval_data/cat/mc.jsonl"
    path.write_text(json.dumps(MC_ROWS[0]) + "\n" + json.dumps(MC_ROWS[1]) + "\n{oops\n")
    with pytest.raises(BundleError) as err:
        core.evaluate_core(BigramModel(TABLE.clone()), ByteTokenizer(), tiny_bundle, max_seq_len=64)
    assert str(path) in str(err.value) and "line 3" in str(err.value) and "\n" not in str(err.value)


def test_missing_field_names_file_line_and_field(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(SCHEMA_ROWS[0]) + "\n" + json.dumps({"context_options": ["a"], "gold": 0}) + "\n")
    with pytest.raises(BundleError, match=r"s\.jsonl line 2: missing field 'continuation'"):
        core.load_task_data(path, "schema")
    path.write_text(json.dumps({"query": "q", "choices": ["a"], "gold": 3}) + "\n")
    with pytest.raises(BundleError, match=r"line 1: field 'gold'"):
        core.load_task_data(path, "multiple_choice")


def test_missing_bundle_and_files(tmp_path, tiny_bundle):
    with pytest.raises(BundleError, match="not found at .*XSA_EXP_EVAL_BUNDLE"):
        core.load_task_specs(tmp_path / "nowhere")
    (tiny_bundle / "eval_meta_data.csv").unlink()
    with pytest.raises(BundleError, match="eval_meta_data.csv is missing"):
        core.load_task_specs(tiny_bundle)
    write_bundle(tiny_bundle, TINY_TASKS, {"mc": 25, "sch": 50, "absent": 25})
    with pytest.raises(BundleError, match="'lm' .* has no row in"):
        core.load_task_specs(tiny_bundle)
    write_bundle(tiny_bundle, TINY_TASKS, {"mc": 25, "sch": 50, "lm": 25})
    for damage in (b"icl_tasks:\n\t- label: mc\n", b"\xff\xfe"):  # a tab YAML refuses; bytes that are not UTF-8
        (tiny_bundle / "core.yaml").write_bytes(damage)
        with pytest.raises(BundleError, match=r"core.yaml is not readable YAML \((ScannerError|UnicodeDecodeError): "
                                              r".*\); restore it from the public bundle$"):
            core.load_task_specs(tiny_bundle)
    (tiny_bundle / "core.yaml").unlink()
    with pytest.raises(BundleError, match="core.yaml is missing"):
        core.load_task_specs(tiny_bundle)


def test_a_download_into_a_file_is_one_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(BundleError, match=r"a-file is a file, not a folder; download the bundle into a folder"):
        bundle.download_bundle(tmp_path / "a-file", url="http://127.0.0.1:9/never")
    under_a_file = (r"^cannot create .*a-file/sub/eval_bundle \(Not a directory\); download the bundle into a folder "
                    r"that can be written \(--dest DIR or \$XSA_EXP_EVAL_BUNDLE\)$")
    with pytest.raises(BundleError, match=under_a_file):
        bundle.download_bundle(tmp_path / "a-file" / "sub" / "eval_bundle", url="http://127.0.0.1:9/never")


def test_resolve_bundle_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XSA_EXP_EVAL_BUNDLE", str(tmp_path / "env"))
    assert bundle.resolve_bundle_dir(str(tmp_path / "arg")) == tmp_path / "arg"
    assert bundle.resolve_bundle_dir(None) == tmp_path / "env"
    monkeypatch.delenv("XSA_EXP_EVAL_BUNDLE")
    assert bundle.resolve_bundle_dir(None) == Path.home() / ".cache/xsa-exp/eval_bundle"


def test_download_offline_is_one_clear_line(monkeypatch, tmp_path):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    dest = tmp_path / "cache" / "eval_bundle"
    with pytest.raises(BundleError) as err:
        bundle.download_bundle(dest)
    msg = str(err.value)
    assert "\n" not in msg and str(dest) in msg and "XSA_EXP_EVAL_BUNDLE" in msg and "could not download" in msg
    assert not dest.exists() and os.listdir(dest.parent) == []  # no partial bundle or temp file left


# -----------------------------------------------------------------------------
# The real bundle (18 of 22 tasks ship in ../shared/eval_bundle)

REAL_BUNDLE = Path(os.environ.get("XSA_EXP_EVAL_BUNDLE")
                   or Path(__file__).resolve().parents[2] / "shared" / "eval_bundle")
ABSENT_FROM_SHARED = {"hellaswag_zeroshot", "hellaswag", "squad", "coqa"}


@pytest.fixture
def real_bundle():
    if not REAL_BUNDLE.is_dir():
        pytest.skip(f"eval bundle not found at {REAL_BUNDLE}; CORE data tests need ../shared/eval_bundle")
    return REAL_BUNDLE


def test_real_bundle_loads(real_bundle):
    specs = core.load_task_specs(real_bundle)
    assert len(specs) == 22
    present = [s for s in specs if core.task_path(real_bundle, s).is_file()]
    assert len(present) == 18 and {s.label for s in specs} - {s.label for s in present} == ABSENT_FROM_SHARED
    for spec in present:
        data = core.load_task_data(core.task_path(real_bundle, spec), spec.task_type)
        assert len(data) > spec.num_fewshot, spec.label


def test_real_bundle_end_to_end_tiny_model(real_bundle):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(257, 16), torch.nn.Linear(16, 257))
    result = core.evaluate_core(model, ByteTokenizer(), real_bundle, max_seq_len=256, max_per_task=2)
    assert result.n_tasks == 18 and result.name == "CORE 18/22"
    assert len(result.examples) == 36
    assert all(t.accuracy in (0.0, 0.5, 1.0) and t.n_examples == 2 for t in result.tasks.values())
    assert math.isfinite(result.core)
    assert all(all(math.isfinite(x) for x in r["losses"]) for r in result.examples)


def _tiny_core(bundle_dir, rank: int = 0, world_size: int = 1) -> CoreResult:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(257, 16), torch.nn.Linear(16, 257))
    return core.evaluate_core(model, ByteTokenizer(), bundle_dir, max_seq_len=256, max_per_task=5,
                              tasks=["arc_easy", "copa", "lambada_openai", "winograd"], rank=rank,
                              world_size=world_size)


def _core_worker(rank: int, world: int, bundle_dir: str, out: str) -> None:
    result = _tiny_core(bundle_dir, rank, world)
    torch.save({"core": result.core, "examples": result.examples}, f"{out}.{rank}")


@pytest.mark.slow
def test_two_gloo_ranks_share_the_examples_and_give_the_one_process_score_exactly(real_bundle, tmp_path):
    out = str(tmp_path / "core")
    gloo.spawn(_core_worker, str(real_bundle), out)
    alone = _tiny_core(real_bundle)
    assert len(alone.examples) == 20
    for rank in (0, 1):  # every rank has the whole result, each example scored by one of them
        shared = torch.load(f"{out}.{rank}")
        assert shared["core"] == alone.core and shared["examples"] == alone.examples
