"""ChatCORE's pieces: answer extraction, categorical scoring, HumanEval programs, the calculator tool."""

import json

import pytest
import torch

from tests.conftest import REPO
from tests.test_core import REAL_BUNDLE as BUNDLE
from xsa_exp.config.schema import ChatCoreConfig
from xsa_exp.data.sources import DataError
from xsa_exp.data.tokenizer import Tokenizer
from xsa_exp.eval.bundle import BundleError
from xsa_exp.eval.chat import (
    BUNDLE_FILES,
    TASKS,
    ChatCoreResult,
    ChatTaskResult,
    categorical_predictions,
    evaluate_chat,
    final_number,
    run_humaneval,
    same_answer,
)
from xsa_exp.generate import CalculatorTool, calculate, generate
from xsa_exp.model import GPTConfig

FIXTURES = REPO / "tests" / "fixtures" / "chat"
LIMITS = (ChatCoreConfig().humaneval_timeout_s, ChatCoreConfig().humaneval_memory_mb)  # the schema's, per program


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train(["Multiple Choice question: What is 7 times 8? Respond only with the letter. "
                            "12 * 3 = 36."] * 20, 300)


class ScriptedModel(torch.nn.Module):
    """Logits that put all mass on favourite(position) at each position (no cache): enough model for the scorers."""

    def __init__(self, favourite, vocab_size: int = 300, sequence_len: int = 128):
        super().__init__()
        self.config = GPTConfig(sequence_len=sequence_len, vocab_size=vocab_size, n_layer=1, n_head=1, n_embd=8)
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the model a device
        self.favourite = favourite

    def forward(self, idx, kv_cache=None):
        assert kv_cache is None
        logits = torch.zeros(*idx.shape, self.config.vocab_size)
        for t in range(idx.size(1)):
            logits[:, t, self.favourite(t)] = 10.0
        return logits


def test_final_number_is_the_marked_answer():
    assert final_number("so 3 + 4 = 7 apples\n#### 1,234") == "1234"
    assert final_number("#### 1,234.") == "1234."  # the marked text, as nanochat reads it
    assert final_number("#### -5 and later #### 7") == "-5"
    assert final_number("first 3, then 12 and finally 18") is None  # unmarked numbers never count
    assert final_number("no digits at all") is None
    assert same_answer("1234", "1,234") and not same_answer("17", "18")
    assert not same_answer("18.0", "18") and not same_answer("18.", "18")  # nanochat compares the text
    assert not same_answer(None, "18")


def test_categorical_picks_the_best_valid_letter(tokenizer):
    letter = {c: tokenizer.encode(c)[0] for c in "ABCDE"}
    four = {"question": "q", "choices": ["w", "x", "y", "z"], "gold": 2}
    two = {"question": "q", "choices": ["w", "x"], "gold": 0}
    # the model prefers C everywhere: four-choice examples answer C, two-choice ones must stay within A/B
    model = ScriptedModel(lambda position: letter["C"])
    assert categorical_predictions(model, tokenizer, [four, two, four], batch_size=2) == [2, 0, 2]
    model = ScriptedModel(lambda position: letter["B"])
    assert categorical_predictions(model, tokenizer, [four, two], batch_size=8) == [1, 1]


def test_chatcore_name_says_how_many_tasks_it_covers():
    tasks = {t: ChatTaskResult(t, 4, 2, 0.5, 0.25, 1 / 3, 0.0) for t in TASKS[:4]}
    partial = ChatCoreResult(tasks, {"humaneval": "missing"})
    assert partial.name == "ChatCORE 4/5" and partial.score == pytest.approx(1 / 3)
    tasks["humaneval"] = ChatTaskResult("humaneval", 4, 1, 0.25, 0.0, 0.25, 0.0)
    assert ChatCoreResult(tasks, {}).name == "ChatCORE"


def humaneval_examples(n: int | None = 3) -> list[dict]:
    path = BUNDLE / "eval_data" / BUNDLE_FILES["humaneval"]
    if not path.is_file():
        pytest.skip(f"needs the eval bundle's HumanEval file ({path}); set XSA_EXP_EVAL_BUNDLE")
    return [json.loads(line) for line in path.read_text().splitlines()[:n]]


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail():
    for example in humaneval_examples():
        whole = example["prompt"] + example["canonical_solution"]
        fenced = f"Here you go:\n```python\n{whole}\n```\nDone."
        for reply in (whole, fenced):
            assert run_humaneval(example, reply, *LIMITS).passed, example["task_id"]
        # nanochat's rule: the reply defines the function; the body alone is not continued from the prompt
        assert not run_humaneval(example, example["canonical_solution"], *LIMITS).passed
        wrong = example["prompt"] + "    return None\n"
        assert not run_humaneval(example, wrong, *LIMITS).passed
        no_newline = f"{whole}\nprint('no newline', end='')\n"
        assert run_humaneval(example, no_newline, *LIMITS).passed  # the marker still found


def test_a_humaneval_program_that_exits_before_its_tests_fails():
    """Exit status 0 alone would pass code that leaves before check() runs."""
    example = humaneval_examples(1)[0]
    wrong = example["prompt"] + "    return None\n"
    for ending in ("exit()", "import sys\nsys.exit(0)", "import os\nos._exit(0)",
                   "if __name__ == '__main__':\n    import unittest\n    unittest.main()"):
        outcome = run_humaneval(example, f"{wrong}\n{ending}\n", *LIMITS)
        assert (outcome.status, outcome.detail) == ("failed", "exited before its tests ran"), ending


@pytest.mark.slow
def test_every_humaneval_canonical_solution_passes_in_the_sandbox():
    """The program assembly and the sandbox together must not fail a correct answer."""
    examples = humaneval_examples(None)
    failed = [e["task_id"] for e in examples
              if not run_humaneval(e, e["prompt"] + e["canonical_solution"], 20, LIMITS[1]).passed]
    assert len(examples) == 164 and failed == []


def test_the_calculator_answers_what_nanochats_answers():
    """nanochat's use_calculator (engine.py): Python's value of + - * / // arithmetic, ** and % refused, commas
    dropped; a string's .count(); nothing else."""
    answers = {"3*4": "12", "1,000 / 8": "125.0", "10/2": "5.0", "1/3": "0.3333333333333333",
               "80000*1.5": "120000.0", "-7 // 2": "-4", "(2+3)*-1": "-5", " 12 - 0.5 ": "11.5",
               "'strawberry'.count('r')": "3", '"banana".count("an")': "2", "'Mississippi'.lower().count('s')": "4"}
    for expression, answer in answers.items():
        assert calculate(expression) == answer, expression
    for refused in ("2**3", "7%3", "2 ** 64", "__import__('os').system('true')", "open('x').read()",
                    "'a'.__class__", "x + 1", "1 / 0", "", "'a' * 3", "'abc'.upper()", "count('a')",
                    "'x'.center(9999999999).count('x')", "'a'.center(9000).replace('a', 'aaaaaaaaaa').count('a')",
                    "99999999*" * 600 + "9"):
        assert calculate(refused) is None, refused[:40]


def test_tool_calls_get_their_result_forced_into_the_answer(tokenizer):
    s = tokenizer.special_tokens
    script = [s["<|python_start|>"], *tokenizer.encode("12*3"), s["<|python_end|>"]]
    # the model would continue with "9" forever; after the call the rows must take the tool's tokens
    nine = tokenizer.encode("9")[0]
    model = ScriptedModel(lambda position: script[position] if position < len(script) else nine)
    prompt = [tokenizer.bos_id]
    forced = [s["<|output_start|>"], *tokenizer.encode("36"), s["<|output_end|>"]]
    with_tool = generate(model, prompt, len(script) + len(forced) + 2, use_cache=False, tool_use=tokenizer)[0]
    assert with_tool == script + forced + [nine, nine]
    without = generate(model, prompt, len(script) + 2, use_cache=False)[0]
    assert without == script + [nine, nine]
    # a call that is not arithmetic gets no output
    tool = CalculatorTool(tokenizer, 1)
    bad = [s["<|python_start|>"], *tokenizer.encode("x"), s["<|python_end|>"], nine]
    assert [tool.next_tokens([t])[0] for t in bad] == bad


def test_missing_task_data_is_named_not_fatal(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bundle = tmp_path / "bundle"
    arc = bundle / "eval_data" / BUNDLE_FILES["arc_easy"]
    arc.parent.mkdir(parents=True)
    arc.write_text("\n".join(json.dumps({"query": f"Question: q{i}?", "choices": ["a", "b", "c", "d"], "gold": i % 4})
                             for i in range(8)))
    letter_c = tokenizer.encode("C")[0]
    settings = ChatCoreConfig()  # the schema's defaults: MMLU from the hub
    result = evaluate_chat(ScriptedModel(lambda position: letter_c), tokenizer, bundle, settings, tool_use=False)
    assert list(result.tasks) == ["arc_easy"] and result.name == "ChatCORE 1/5"
    assert result.tasks["arc_easy"].accuracy == 0.25 and result.tasks["arc_easy"].centered == 0.0
    assert "HF_HUB_OFFLINE" in result.missing["mmlu"] and "missing" in result.missing["gsm8k"]
    assert [e["prediction"] for e in result.examples] == ["C"] * 8
    assert result.sandbox is None  # no HumanEval, so no sandbox was used
    # MMLU from local files through the same loader
    settings.mmlu.data_files = str(FIXTURES / "mmlu_test.jsonl")
    result = evaluate_chat(ScriptedModel(lambda position: letter_c), tokenizer, bundle, settings, tool_use=False)
    assert result.tasks["mmlu"].n == 8 and result.tasks["mmlu"].correct == 2  # two fixture answers are C


def test_malformed_task_data_stops_with_the_file_and_line(tokenizer, tmp_path):
    arc = tmp_path / "eval_data" / BUNDLE_FILES["arc_easy"]
    arc.parent.mkdir(parents=True)
    arc.write_text(json.dumps({"query": "Question: q?", "choices": ["a", "b"], "gold": 0}) + "\n{not json\n")
    settings = ChatCoreConfig()
    with pytest.raises(BundleError, match=r"arc_easy.jsonl line 2: malformed JSON"):
        evaluate_chat(ScriptedModel(lambda position: 0), tokenizer, tmp_path, settings, tool_use=False)
    # the user's own MMLU file with other columns is an error too, not a silently missing task, and it stops the
    # evaluation before ARC (earlier in TASKS) is scored
    arc.write_text(json.dumps({"query": "Question: q?", "choices": ["a", "b"], "gold": 0}) + "\n")
    settings.mmlu.data_files = str(FIXTURES / "gsm8k_train.jsonl")
    with pytest.raises(DataError, match=r"eval.chatcore.mmlu rows need question, choices and answer"):
        evaluate_chat(ScriptedModel(lambda position: pytest.fail("a task was scored before every task loaded")),
                      tokenizer, tmp_path, settings, tool_use=False)
