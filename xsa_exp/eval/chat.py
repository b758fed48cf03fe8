"""ChatCORE: the chat model's score on five tasks, as nanochat's chat evaluation computes it.

- ARC-Easy, ARC-Challenge, MMLU (categorical): the question in the multiple-choice format the SFT
  data teaches (data/sft.py), then <|assistant_start|>; the prediction is the answer letter whose token
  has the highest logit at that position, among the example's letters.
- GSM8K (generative): greedy answer up to <|assistant_end|> (prompts batched, left-padded; see
  generate.py); the number the answer marks with "#### " (the format the SFT data teaches), commas removed,
  must read as the reference does (nanochat's rule: "18.0" is not "18").
- HumanEval (generative): the code of the answer (its first ```python block, else all of it) with the
  prompt's imports, the task's tests and check(entry_point) runs in the sandbox (sandbox.py), in the
  strongest isolation mode the machine allows (recorded as ``sandbox``); it passes when the tests do. An
  answer that does not define the entry point is read as the function's body and appended to the prompt.

ChatCORE = mean over tasks of the centered accuracy (acc - b) / (1 - b), b = 0.25 for the
multiple-choice tasks (four options) and 0 for GSM8K and HumanEval. With a task missing the result
is "ChatCORE k/5", never the bare name.

Data: ARC, GSM8K (test) and HumanEval from the eval bundle (eval_data/world_knowledge/arc_*.jsonl,
symbolic_problem_solving/gsm8k.jsonl, programming/human_eval.jsonl); MMLU (test) from the hub
(cais/mmlu, all) or local files through `datasets`. Examples are shuffled with Random(1337) before a
max_per_task cap, as CORE's are.
"""

from __future__ import annotations

import random
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from xsa_exp.config.schema import ChatCoreConfig, MmluConfig
from xsa_exp.data.chat import render_prompt
from xsa_exp.data.conversations import LETTERS, multiple_choice_prompt
from xsa_exp.data.sft import load_rows
from xsa_exp.data.sources import DataError
from xsa_exp.data.tokenizer import Tokenizer
from xsa_exp.eval.bundle import check_fields, data_path, read_examples
from xsa_exp.eval.core import SHUFFLE_SEED, check_example
from xsa_exp.eval.sandbox import ExecutionResult, isolation_mode, run_program
from xsa_exp.generate import generate_batch
from xsa_exp.model import evaluating

TASKS = ("arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval")
BASELINES = {"arc_easy": 0.25, "arc_challenge": 0.25, "mmlu": 0.25, "gsm8k": 0.0, "humaneval": 0.0}
BUNDLE_FILES = {"arc_easy": "world_knowledge/arc_easy.jsonl", "arc_challenge": "world_knowledge/arc_challenge.jsonl",
                "gsm8k": "symbolic_problem_solving/gsm8k.jsonl", "humaneval": "programming/human_eval.jsonl"}
GENERATIVE_FIELDS = {"gsm8k": ("context", "answer"), "humaneval": ("prompt", "test", "entry_point")}
FINAL_ANSWER = re.compile(r"#### (-?[0-9.,]+)")


class TaskDataMissing(DataError):
    """A task's data is not there (a file absent from the bundle, the hub out of reach): the task is
    skipped and named. Data that is there but malformed is a DataError, which stops the evaluation."""


@dataclass
class ChatTaskResult:
    task: str
    n: int
    correct: int
    accuracy: float
    baseline: float
    centered: float
    seconds: float


@dataclass
class ChatCoreResult:
    tasks: dict[str, ChatTaskResult]
    missing: dict[str, str]  # task -> why it was not evaluated
    examples: list[dict] = field(default_factory=list)
    sandbox: str | None = None  # the isolation mode HumanEval's programs ran in (sandbox.MODES); None: not run

    @property
    def name(self) -> str:
        return "ChatCORE" if len(self.tasks) == len(TASKS) else f"ChatCORE {len(self.tasks)}/{len(TASKS)}"

    @property
    def score(self) -> float:
        return sum(t.centered for t in self.tasks.values()) / len(self.tasks)


# -----------------------------------------------------------------------------
# Data


def load_task(task: str, bundle_dir: Path, mmlu_source: MmluConfig) -> list[dict]:
    """The task's examples in one shape: multiple choice {question, choices, gold}; GSM8K {question,
    answer}; HumanEval {prompt, test, entry_point}."""
    if task == "mmlu":
        try:
            rows = load_rows("eval.chatcore.mmlu", mmlu_source)
        except DataError as e:
            if mmlu_source.data_files:  # the user's own files: a problem there is theirs to fix
                raise
            raise TaskDataMissing(str(e)) from None
        try:
            return [{"question": r["question"], "choices": list(r["choices"]), "gold": int(r["answer"])} for r in rows]
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"eval.chatcore.mmlu rows need question, choices and answer (an index); "
                            f"got columns {', '.join(rows.column_names)} ({type(e).__name__}: {e})") from None
    path = data_path(bundle_dir, BUNDLE_FILES[task])
    if not path.is_file():
        raise TaskDataMissing(f"{path} is missing")
    if task.startswith("arc"):  # CORE's multiple-choice files, checked as CORE checks them
        rows = read_examples(path, lambda item, where: check_example(item, "multiple_choice", where))
        return [{"question": r["query"].removeprefix("Question:").strip(), "choices": r["choices"], "gold": r["gold"]}
                for _, r in rows]
    rows = read_examples(path, lambda item, where: check_fields(item, GENERATIVE_FIELDS[task], task, where))
    if task == "gsm8k":
        return [{"question": r["context"], "answer": r["answer"]} for _, r in rows]
    return [{"prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"]} for _, r in rows]


def subset(examples: list[dict], max_per_task: int | None) -> list[tuple[int, dict]]:
    """(index in the file, example) of the first max_per_task after a seeded shuffle."""
    order = list(range(len(examples)))
    random.Random(SHUFFLE_SEED).shuffle(order)
    return [(i, examples[i]) for i in order[:max_per_task]]


# -----------------------------------------------------------------------------
# Scoring


@torch.no_grad()
def categorical_predictions(model, tokenizer: Tokenizer, examples: list[dict], batch_size: int) -> list[int]:
    """For each example, the index of the answer letter with the highest logit after <|assistant_start|>."""
    letter_ids = []
    for letter in LETTERS:
        ids = tokenizer.encode(letter)
        if len(ids) != 1:
            raise ValueError(f"the tokenizer splits the answer letter {letter!r} into {len(ids)} tokens")
        letter_ids.append(ids[0])
    device = next(model.parameters()).device
    max_len = model.config.max_input_len
    prompts = [render_prompt(tokenizer, [{"role": "user",
                                          "content": multiple_choice_prompt(e["question"], e["choices"])}])
               [-max_len:] for e in examples]  # one longer than the model takes keeps its end (nanochat stops)
    predictions = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        width = max(map(len, batch))
        idx = torch.full((len(batch), width), tokenizer.bos_id, dtype=torch.long)
        # right padding: causal attention keeps it out of each prompt's last position
        for row, prompt in enumerate(batch):
            idx[row, :len(prompt)] = torch.tensor(prompt)
        logits = model(idx.to(device))
        last = logits[torch.arange(len(batch)), torch.tensor([len(p) - 1 for p in batch])]
        for row, example in enumerate(examples[start:start + len(batch)]):
            valid = torch.tensor(letter_ids[:len(example["choices"])], device=device)
            predictions.append(int(last[row, valid].argmax()))
    return predictions


def answer_texts(model, tokenizer: Tokenizer, user_texts: list[str], max_new_tokens: int, tool_use: bool,
                 batch_size: int) -> list[str]:
    """The model's greedy reply to each user message, batch_size at a time. Prompt and reply may pass the training
    length, as in nanochat; a prompt longer than the model takes (model.max_input_len, where nanochat stops) keeps
    its end and leaves at least half of it (or max_new_tokens) for the reply."""
    special = tokenizer.special_tokens
    max_len = model.config.max_input_len
    budget = min(max_new_tokens, max_len // 2)
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": text}])[-(max_len - budget):]
               for text in user_texts]
    replies = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        new_tokens = min(max_new_tokens, max_len - max(map(len, batch)))
        replies += generate_batch(model, batch, new_tokens,
                                  stop_tokens=[special["<|assistant_end|>"], tokenizer.bos_id],
                                  tool_use=tokenizer if tool_use else None)
    return [tokenizer.decode(reply) for reply in replies]


def final_number(text: str) -> str | None:
    """The number GSM8K's format marks as the answer, commas removed ("#### 1,234" -> "1234"), as nanochat's
    tasks/gsm8k.py extracts it (grade-school-math's rule): the first marked one; None without a mark, so a reply
    full of numbers earns nothing by chance."""
    match = FINAL_ANSWER.search(text)
    return None if match is None else match.group(1).replace(",", "")


def same_answer(predicted: str | None, reference: str) -> bool:
    """nanochat's comparison: the text of the two numbers, so "18.0" or "18." is not "18"."""
    return predicted is not None and predicted == reference.replace(",", "")


def humaneval_program(example: dict, reply: str, marker: str) -> str:
    """As nanochat's tasks/humaneval.py assembles it: the prompt's leading imports, the reply's first code block (or
    the whole reply), which must define the function itself, the task's tests and their call; then `marker`
    printed: the tests ran to their end."""
    blocks = re.findall(r"```(?:python)?\s*\n(.*?)\n```", reply, re.DOTALL)
    code = (blocks[0] if blocks else reply).strip()
    imports = []
    for line in (line.strip() for line in example["prompt"].splitlines()):
        if line.startswith(("import ", "from ")):
            imports.append(line)
        elif line and not line.startswith("#"):
            break
    header = "\n".join(imports)
    # The marker on a line of its own: the reply's code may have left its last output without a newline.
    return f"{header}\n\n{code}\n\n{example['test']}\ncheck({example['entry_point']})\nprint()\nprint({marker!r})\n"


def run_humaneval(example: dict, reply: str, timeout_s: float, memory_mb: int,
                  sandbox: str | None = None) -> ExecutionResult:
    """The reply's program in the sandbox. Exit status 0 is not enough to pass: code that exits early (`exit()`,
    `sys.exit(0)`, a `unittest.main()` under `__main__`) exits 0 without running the tests, so the program must
    also print its random marker, which follows them."""
    marker = f"humaneval-tests-ran-{secrets.token_hex(8)}"
    outcome = run_program(humaneval_program(example, reply, marker), timeout_s, memory_mb, sandbox)
    if outcome.passed and marker not in outcome.stdout:
        return replace(outcome, status="failed", detail="exited before its tests ran")
    return outcome


# -----------------------------------------------------------------------------
# The evaluation


def evaluate_chat(model, tokenizer: Tokenizer, bundle_dir: Path, settings: ChatCoreConfig, tool_use: bool,
                  progress: Callable[[ChatTaskResult], None] | None = None, rank: int = 0,
                  world_size: int = 1) -> ChatCoreResult:
    """Every task whose data is available, as eval.chatcore's settings say (tool_use resolved from them and the
    run); the others are listed in `missing` with the reason. Data that is there but malformed raises DataError or
    BundleError (file and line). With world_size > 1 (every rank of an initialized process group calling it) rank r
    answers batches r, r + R, ... and every rank gets the whole result: each batch is the one process's, so the
    answers are too."""
    result = ChatCoreResult({}, {})
    present = {}  # every task loaded before any is scored: a bad data file stops the evaluation before its work
    for task in TASKS:
        try:
            examples = subset(load_task(task, bundle_dir, settings.mmlu), settings.max_per_task)
        except TaskDataMissing as e:
            result.missing[task] = str(e)
            continue
        if examples:
            present[task] = examples
        else:
            result.missing[task] = "no examples"
    if "humaneval" in present:
        result.sandbox = isolation_mode()
    size = settings.batch_size
    with evaluating(model):  # restored also when a task fails
        for task, examples in present.items():
            start = time.perf_counter()
            batches = [examples[i:i + size] for i in range(0, len(examples), size)]
            records = [record for batch in batches[rank::world_size]
                       for record in task_records(task, batch, model, tokenizer, settings.max_new_tokens, tool_use,
                                                  settings.humaneval_timeout_s, settings.humaneval_memory_mb,
                                                  result.sandbox)]
            if world_size > 1:
                shares = [None] * world_size
                torch.distributed.all_gather_object(shares, records)
                position = {index: i for i, (index, _) in enumerate(examples)}
                records = sorted((r for share in shares for r in share), key=lambda r: position[r["index"]])
            correct = sum(r["correct"] for r in records)
            accuracy = correct / len(records)
            baseline = BASELINES[task]
            task_result = ChatTaskResult(task, len(records), correct, accuracy, baseline,
                                         (accuracy - baseline) / (1 - baseline), time.perf_counter() - start)
            result.tasks[task] = task_result
            result.examples += [{"task": task, **r} for r in records]
            if progress:
                progress(task_result)
    return result


def task_records(task: str, batch: list[tuple[int, dict]], model, tokenizer: Tokenizer, max_new_tokens: int,
                 tool_use: bool, timeout_s: float, memory_mb: int, sandbox: str | None) -> list[dict]:
    """One batch of a task's (index in the file, example) pairs, answered and scored: a record per example."""
    if task in ("arc_easy", "arc_challenge", "mmlu"):
        predictions = categorical_predictions(model, tokenizer, [e for _, e in batch], len(batch))
        return [{"prediction": LETTERS[predicted], "answer": LETTERS[example["gold"]],
                 "correct": predicted == example["gold"], "index": index}
                for (index, example), predicted in zip(batch, predictions)]
    prompts = [e["question"] if task == "gsm8k" else e["prompt"] for _, e in batch]
    replies = answer_texts(model, tokenizer, prompts, max_new_tokens, tool_use, len(batch))
    records = []
    for (index, example), reply in zip(batch, replies):
        if task == "gsm8k":
            predicted = final_number(reply)
            records.append({"prediction": predicted, "answer": example["answer"],
                            "correct": same_answer(predicted, example["answer"]), "index": index, "reply": reply})
        else:
            outcome = run_humaneval(example, reply, timeout_s, memory_mb, sandbox)
            records.append({"prediction": outcome.status, "answer": "passed", "correct": outcome.passed,
                            "index": index, "reply": reply, "detail": outcome.detail})
    return records
