"""CORE evaluation: the DCLM "low variance" 22-task aggregate, computed as nanochat computes it
(``nanochat/core_eval.py`` + ``scripts/base_eval.py``).

Bundle layout (the public ``eval_bundle.zip``): ``core.yaml`` (``icl_tasks``), ``eval_meta_data.csv``
(``Eval Task``, ``Random baseline`` in percent) and ``eval_data/<category>/<task>.jsonl``.

Protocol, per task:
  1. Load the JSONL lines, shuffle with ``random.Random(1337)``, keep the first ``max_per_task``.
  2. Example ``idx`` gets ``num_fewshot`` shots: ``random.Random(1234 + idx).sample(others, k)`` where
     ``others`` are the indices of the (capped) task data except ``idx``.
  3. Render prompts; every shot is followed by a blank line ("\\n\\n"):
       multiple_choice  shot: query + delim + choices[gold];   one prompt per choice: query + delim + choice
       schema           shot: context_options[gold] + delim + continuation;
                        one prompt per context option: option + delim + continuation
       language_modeling shot: context.strip() + delim + continuation;
                        two prompts: (shots + context.strip() + delim).strip() and the same unstripped
                        + continuation (the strip keeps a trailing space out of the "without" prompt,
                        where a tokenizer would otherwise glue it to the next word).
  4. Tokenize every prompt with BOS prepended and find the scored span:
       multiple_choice: after the common token prefix of all choices, to the end;
       schema: the common token suffix of all options;
       language_modeling: the tokens of the "with" prompt beyond the "without" prompt.
  5. Right-pad with BOS and run all choices of the example in one forward pass, each whole: the model
     takes up to 10x its training length (``GPTConfig.max_input_len``, nanochat's RoPE tables), its full-context
     layers windowed at the training length past it, as nanochat's.
  6. multiple_choice / schema: per choice the mean cross-entropy over its span; prediction = argmin.
     language_modeling: correct iff the greedy argmax reproduces every span token.
  7. centered = (acc - b/100) / (1 - b/100) with b the task's random baseline;
     CORE = mean centered accuracy over the tasks evaluated.

Where nanochat would crash we keep going, and only there do we differ from it:
  - a capped task with fewer than ``num_fewshot + 1`` examples gets ``len(data) - 1`` shots
    (nanochat's ``rng.sample`` raises), so e.g. ``max_per_task=2`` works;
  - language_modeling: the span starts at the common token prefix of the two prompts, which is
    nanochat's ``len(tokens_without)`` whenever its "without is a prefix of with" assertion holds;
  - a sequence longer than ``max_seq_len`` (10x the training length) keeps its last ``max_seq_len`` tokens and
    its span shifts with them, a span longer than that its last ``max_seq_len - 1`` (nanochat asserts);
  - blank lines in a JSONL file are skipped (nanochat's ``json.loads`` raises on them).

Tasks whose data file is absent are skipped; the result then says how many of the 22 it covers
(``CoreResult.name`` is "CORE 18/22", never the bare "CORE" for a partial set).
"""

from __future__ import annotations

import csv
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

import torch
import torch.nn.functional as F
import yaml

from xsa_exp.eval.bundle import (
    CORE_META_FILE,
    CORE_TASKS_FILE,
    DOWNLOAD_COMMAND,
    BundleError,
    check_bundle,
    check_fields,
    data_path,
    read_examples,
)
from xsa_exp.model import evaluating

N_CORE_TASKS = 22
SHUFFLE_SEED = 1337
FEWSHOT_SEED = 1234
REQUIRED_FIELDS = {
    "multiple_choice": ("query", "choices", "gold"),
    "schema": ("context_options", "continuation", "gold"),
    "language_modeling": ("context", "continuation"),
}


class TokenEncoder(Protocol):
    """What CORE needs of a tokenizer (xsa_exp.data.tokenizer.Tokenizer is one)."""

    bos_id: int

    def encode(self, text: str) -> list[int]: ...


# -----------------------------------------------------------------------------
# Task specs and task data (the bundle itself: xsa_exp.eval.bundle)


@dataclass(frozen=True)
class TaskSpec:
    label: str
    dataset_uri: str  # relative to eval_data/
    task_type: str
    num_fewshot: int
    continuation_delimiter: str
    random_baseline: float  # percent


def load_task_specs(bundle_dir: str | os.PathLike) -> list[TaskSpec]:
    """All tasks of core.yaml, in order, joined with their random baselines from eval_meta_data.csv."""
    bundle_dir = check_bundle(bundle_dir)
    config_path, meta_path = bundle_dir / CORE_TASKS_FILE, bundle_dir / CORE_META_FILE

    with open(meta_path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"Eval Task", "Random baseline"} <= set(rows[0]):
        raise BundleError(f"{meta_path} lacks the 'Eval Task' and 'Random baseline' columns; "
                          "restore it from the public bundle")
    try:
        baselines = {row["Eval Task"]: float(row["Random baseline"]) for row in rows}
    except ValueError as e:
        raise BundleError(f"{meta_path}: a 'Random baseline' is not a number ({e}); "
                          "restore it from the public bundle") from e

    try:
        with open(config_path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except (yaml.YAMLError, ValueError) as e:  # ValueError: not UTF-8
        reason = " ".join(str(e).split())[:160]
        raise BundleError(f"{config_path} is not readable YAML ({type(e).__name__}: {reason}); restore it from the "
                          "public bundle") from None
    if not isinstance(config, dict) or not isinstance(config.get("icl_tasks"), list):
        raise BundleError(f"{config_path} has no 'icl_tasks' list; restore it from the public bundle")
    specs = []
    for i, task in enumerate(config["icl_tasks"], start=1):
        try:
            label, task_type = task["label"], task["icl_task_type"]
            spec = TaskSpec(
                label=label,
                dataset_uri=task["dataset_uri"],
                task_type=task_type,
                num_fewshot=int(task["num_fewshot"][0]),
                continuation_delimiter=task.get("continuation_delimiter", " "),  # nanochat's default
                random_baseline=baselines.get(label, math.nan),
            )
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BundleError(f"{config_path}: task #{i} is malformed ({e!r}); each needs label, dataset_uri, "
                              "icl_task_type and num_fewshot: [n]") from e
        if task_type not in REQUIRED_FIELDS:
            raise BundleError(f"{config_path}: task {label!r} has icl_task_type {task_type!r}; "
                              f"expected one of {', '.join(REQUIRED_FIELDS)}")
        if label not in baselines:
            raise BundleError(f"task {label!r} from {config_path} has no row in {meta_path}; "
                              "add its 'Random baseline' there")
        specs.append(spec)
    return specs


def task_path(bundle_dir: str | os.PathLike, spec: TaskSpec) -> Path:
    return data_path(bundle_dir, spec.dataset_uri)


def load_task_data(path: str | os.PathLike, task_type: str) -> list[tuple[int, dict]]:
    """(line index in the file, example) pairs, validated and shuffled as nanochat shuffles them."""
    data = read_examples(path, lambda item, where: check_example(item, task_type, where))
    random.Random(SHUFFLE_SEED).shuffle(data)  # same permutation as shuffling the bare items
    return data


def check_example(item: dict, task_type: str, where: str) -> None:
    check_fields(item, REQUIRED_FIELDS[task_type], task_type, where)
    if "gold" in REQUIRED_FIELDS[task_type]:
        key = "choices" if task_type == "multiple_choice" else "context_options"
        options = item[key]
        if not isinstance(options, list) or not options:
            raise BundleError(f"{where}: field '{key}' must be a non-empty list; fix or remove that line")
        gold = item["gold"]
        if not isinstance(gold, int) or not 0 <= gold < len(options):
            raise BundleError(f"{where}: field 'gold' must index one of the {len(options)} options, got {gold!r}")
    elif not item["continuation"]:
        raise BundleError(f"{where}: field 'continuation' is empty; fix or remove that line")


# -----------------------------------------------------------------------------
# Prompts and token spans


def sample_fewshot(n_examples: int, idx: int, num_fewshot: int) -> list[int]:
    """Indices of the few-shot examples for example ``idx`` (never ``idx`` itself)."""
    if num_fewshot <= 0:
        return []
    others = [i for i in range(n_examples) if i != idx]
    return random.Random(FEWSHOT_SEED + idx).sample(others, min(num_fewshot, len(others)))


def render_prompts_mc(item: dict, delimiter: str, fewshot: Sequence[dict] = ()) -> list[str]:
    shots = "".join(f"{ex['query']}{delimiter}{ex['choices'][ex['gold']]}\n\n" for ex in fewshot)
    return [f"{shots}{item['query']}{delimiter}{choice}" for choice in item["choices"]]


def render_prompts_schema(item: dict, delimiter: str, fewshot: Sequence[dict] = ()) -> list[str]:
    shots = "".join(f"{ex['context_options'][ex['gold']]}{delimiter}{ex['continuation']}\n\n" for ex in fewshot)
    return [f"{shots}{option}{delimiter}{item['continuation']}" for option in item["context_options"]]


def render_prompts_lm(item: dict, delimiter: str, fewshot: Sequence[dict] = ()) -> list[str]:
    """[prompt without the continuation, prompt with it]."""
    shots = "".join(f"{ex['context'].strip()}{delimiter}{ex['continuation']}\n\n" for ex in fewshot)
    prompt = f"{shots}{item['context'].strip()}{delimiter}"
    return [prompt.strip(), prompt + item["continuation"]]


RENDERERS = {
    "multiple_choice": render_prompts_mc,
    "schema": render_prompts_schema,
    "language_modeling": render_prompts_lm,
}


def render_prompts(task_type: str, item: dict, delimiter: str, fewshot: Sequence[dict] = ()) -> list[str]:
    return RENDERERS[task_type](item, delimiter, fewshot)


def common_length(seqs: Sequence[Sequence[int]], from_end: bool = False) -> int:
    """Length of the prefix (or suffix, with ``from_end``) that all sequences share."""
    n = 0
    for column in zip(*(reversed(s) if from_end else s for s in seqs)):
        if any(t != column[0] for t in column):
            break
        n += 1
    return n


def token_spans(task_type: str, prompts: Sequence[str],
                tokenizer: TokenEncoder) -> tuple[list[list[int]], list[int], list[int]]:
    """BOS-prefixed token sequences to forward, and per sequence the [start, end) span to score."""
    tokens = [[tokenizer.bos_id, *tokenizer.encode(p)] for p in prompts]
    if task_type == "multiple_choice":  # shared context, differing answers
        start = common_length(tokens)
        return tokens, [start] * len(tokens), [len(t) for t in tokens]
    if task_type == "schema":  # differing contexts, shared continuation
        suffix = common_length(tokens, from_end=True)
        return tokens, [len(t) - suffix for t in tokens], [len(t) for t in tokens]
    without, with_ = tokens  # language_modeling: score only the "with" prompt
    return [with_], [common_length([without, with_])], [len(with_)]


def crop_left(tokens: list[list[int]], starts: list[int], ends: list[int], max_seq_len: int
              ) -> tuple[list[list[int]], list[int], list[int]]:
    """Keep the last ``max_seq_len`` tokens of each sequence and shift its span to match.

    A span start is kept >= 1: its first token needs a preceding position to be predicted from.
    """
    out_tokens, out_starts, out_ends = [], [], []
    for t, s, e in zip(tokens, starts, ends):
        cut = max(0, len(t) - max_seq_len)
        out_tokens.append(t[cut:])
        out_starts.append(max(s - cut, 1))
        out_ends.append(e - cut)
    return out_tokens, out_starts, out_ends


# -----------------------------------------------------------------------------
# Scoring


@torch.no_grad()
def score_example(model: torch.nn.Module, tokenizer: TokenEncoder, task_type: str, prompts: Sequence[str],
                  max_seq_len: int, device: torch.device) -> tuple[list[float], bool]:
    """Per-sequence mean CE over the span, and whether greedy decoding reproduces every span
    (the latter is the language_modeling criterion)."""
    tokens, starts, ends = crop_left(*token_spans(task_type, prompts, tokenizer), max_seq_len)
    ids = torch.full((len(tokens), max(map(len, tokens))), tokenizer.bos_id, dtype=torch.long)
    for row, t in zip(ids, tokens):
        row[: len(t)] = torch.tensor(t, dtype=torch.long)
    ids = ids.to(device)
    logits = model(ids)  # one forward pass for all choices; right padding never feeds back into a span
    losses, greedy_ok = [], True
    for i, (s, e) in enumerate(zip(starts, ends)):
        span_logits, targets = logits[i, s - 1 : e - 1].float(), ids[i, s:e]  # position p predicts p + 1
        losses.append(F.cross_entropy(span_logits, targets, reduction="none").mean().item())
        greedy_ok = greedy_ok and bool((span_logits.argmax(-1) == targets).all())
    return losses, greedy_ok


def centered_accuracy(accuracy: float, random_baseline: float) -> float:
    """Accuracy rescaled so chance (``random_baseline`` percent) is 0 and perfect is 1."""
    b = 0.01 * random_baseline
    return (accuracy - b) / (1.0 - b)


@dataclass
class TaskResult:
    label: str
    task_type: str
    num_fewshot: int  # as configured; see the module docstring for tiny capped tasks
    n_examples: int
    accuracy: float
    centered: float
    random_baseline: float  # percent


@dataclass
class CoreResult:
    tasks: dict[str, TaskResult]
    core: float
    n_tasks: int
    n_total: int = N_CORE_TASKS
    # {task, index (after shuffle), original_index (line in file), correct, pred, gold, losses};
    # language_modeling: gold 0, pred 0 if greedy decoding reproduced the continuation else -1.
    examples: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "CORE" if self.n_tasks == self.n_total else f"CORE {self.n_tasks}/{self.n_total}"

    @classmethod
    def from_tasks(cls, results: Sequence[TaskResult], examples: Sequence[dict] = ()) -> "CoreResult":
        core = sum(r.centered for r in results) / len(results)
        return cls(tasks={r.label: r for r in results}, core=core, n_tasks=len(results), examples=list(examples))


def evaluate_task(model: torch.nn.Module, tokenizer: TokenEncoder, spec: TaskSpec, data: Sequence[tuple[int, dict]],
                  max_seq_len: int, device: torch.device, rank: int = 0,
                  world_size: int = 1) -> tuple[TaskResult, list[dict]]:
    """Score one task's (shuffled, capped) examples. Under torch.distributed (world_size > 1) rank r scores
    examples r, r + R, ... and every rank gets all the records back in order, so each example is scored
    once and the result is the one process's exactly (an example's score depends on it alone)."""
    items = [item for _, item in data]
    records = []
    for idx, (original_index, item) in enumerate(data):
        if idx % world_size != rank:
            continue
        fewshot = [items[i] for i in sample_fewshot(len(items), idx, spec.num_fewshot)]
        prompts = render_prompts(spec.task_type, item, spec.continuation_delimiter, fewshot)
        losses, greedy_ok = score_example(model, tokenizer, spec.task_type, prompts, max_seq_len, device)
        if spec.task_type == "language_modeling":
            gold, pred = 0, 0 if greedy_ok else -1
        else:
            gold, pred = item["gold"], losses.index(min(losses))  # first minimum, as nanochat
        records.append({"task": spec.label, "index": idx, "original_index": original_index,
                        "correct": pred == gold, "pred": pred, "gold": gold, "losses": losses})
    if world_size > 1:
        shares = [None] * world_size
        torch.distributed.all_gather_object(shares, records)
        records = sorted((r for share in shares for r in share), key=lambda r: r["index"])
    accuracy = sum(r["correct"] for r in records) / len(records)
    result = TaskResult(spec.label, spec.task_type, spec.num_fewshot, len(records), accuracy,
                        centered_accuracy(accuracy, spec.random_baseline), spec.random_baseline)
    return result, records


def evaluate_core(model: torch.nn.Module, tokenizer: TokenEncoder, bundle_dir: str | os.PathLike, max_seq_len: int,
                  max_per_task: int | None = None, tasks: Sequence[str] | None = None,
                  progress: Callable[[TaskResult, int, int], None] | None = None, rank: int = 0,
                  world_size: int = 1) -> CoreResult:
    """Evaluate CORE over the bundle's tasks whose data is present.

    ``tasks`` restricts to these labels; ``max_per_task`` caps examples per task after the shuffle
    (None: all); ``progress(task_result, n_done, n_to_do)`` is called after each task. With
    world_size > 1 (every rank of an initialized process group calling it) the ranks share the examples.
    """
    if max_per_task is not None and max_per_task < 1:
        raise ValueError(f"max_per_task must be a positive int or None (all), got {max_per_task}")
    specs = load_task_specs(bundle_dir)
    if tasks is not None:
        unknown = sorted(set(tasks) - {s.label for s in specs})
        if unknown:
            raise BundleError(f"unknown CORE task(s) {', '.join(unknown)}; "
                              f"core.yaml has {', '.join(s.label for s in specs)}")
        wanted = set(tasks)
        specs = [s for s in specs if s.label in wanted]
    present = [s for s in specs if task_path(bundle_dir, s).is_file()]
    if not present:
        raise BundleError(f"none of the selected CORE task files exist under {Path(bundle_dir) / 'eval_data'}; "
                          f"place the full bundle there ({DOWNLOAD_COMMAND})")

    device = next(model.parameters()).device
    results, examples = [], []
    with evaluating(model):
        for n_done, spec in enumerate(present, start=1):
            data = load_task_data(task_path(bundle_dir, spec), spec.task_type)[:max_per_task]
            result, records = evaluate_task(model, tokenizer, spec, data, max_seq_len, device, rank, world_size)
            results.append(result)
            examples.extend(records)
            if progress is not None:
                progress(result, n_done, len(present))
    return CoreResult.from_tasks(results, examples)
