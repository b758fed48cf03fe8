"""The SFT mixture (data=sft): conversations from Hugging Face datasets, rendered with a loss mask, packed.

Each source of data.train_sources / data.val_sources is read with `datasets.load_dataset`: from the
hub (path, subset, split) or, when `data_files` is set, from local .jsonl/.json/.parquet files through
the same call. Its `format` says how a row becomes a conversation:

- messages: a `messages` list of {role, content} (SmolTalk, or your own chat data);
- mmlu: question, choices, answer (an index) -> the multiple-choice prompt the chat evaluation asks,
  answered with the letter (MMLU's auxiliary_train rows come wrapped in a `train` field);
- gsm8k: question, answer (worked solution with <<expression=value>> calculator notes, "#### result")
  -> each note becomes a calculator tool call and its output (as nanochat), or with
  `data.gsm8k_tool_calls=false` is dropped from the text.

Conversations are shuffled (seeded), rendered (chat.py), and packed like documents: concatenated (each
starts with BOS) and cut into rows of sequence_len + 1. Only the assistant's tokens are targets
(packing.mask_tokens). A conversation may continue into the next row, as a document does in pretraining.
"""

from __future__ import annotations

import random
from pathlib import PurePosixPath

import torch

from xsa_exp.config.schema import ChatSourceConfig, SftDataConfig
from xsa_exp.data.chat import render_conversation
from xsa_exp.data.conversations import CONVERTERS
from xsa_exp.data.packing import cut_rows, mask_tokens
from xsa_exp.data.sources import FORMATS, DataError, first_bad_line, match_files, offline_variable
from xsa_exp.data.tokenizer import Tokenizer


def load_rows(key: str, source: ChatSourceConfig):
    """The rows of one source (config key `key`), a `datasets.Dataset`; at most source.max_rows of them."""
    import datasets

    files = []
    if source.data_files:
        files = match_files(source.data_files, f"{key}.data_files")
        builder = FORMATS[PurePosixPath(files[0]).suffix]
        if builder == "text":
            raise DataError(f"{key}.data_files={source.data_files}: chat data must be .jsonl, .json or .parquet, "
                            "not .txt")
        where, load = ", ".join(files), lambda: datasets.load_dataset(builder, data_files=files, split="train")
    else:
        where = f"hub dataset {source.path} ({source.subset or 'default'}, split {source.split})"
        variable = offline_variable()
        if variable:
            raise DataError(f"{where} needs the hub, but {variable} is set; set {key}.data_files to a local copy")
        load = lambda: datasets.load_dataset(source.path, source.subset, split=source.split)  # noqa: E731
    try:
        rows = load()
    except Exception as e:  # network, a missing file, a malformed file
        for file in files:
            bad_line = first_bad_line(file)
            if bad_line:
                raise DataError(f"cannot load {file}: {bad_line}; correct it, or leave it out of {key}.data_files") \
                    from e
        reason = str(e).strip().splitlines()[0] if str(e).strip() else "no message"
        fix = (f"replace them with readable copies, or leave them out of {key}.data_files" if files else
               f"set {key}.data_files to a local copy, or check the connection")
        raise DataError(f"cannot load {where} ({type(e).__name__}: {reason}); {fix}") from e
    if source.max_rows is not None:
        rows = rows.select(range(min(source.max_rows, len(rows))))
    return rows


def load_conversations(data_cfg: SftDataConfig, part: str) -> tuple[list[list[dict]], dict[str, int]]:
    """The conversations of every source of data.<part> (train_sources, val_sources), in source order,
    and how many each gave."""
    conversations, counts = [], {}
    for name, source in getattr(data_cfg, part).items():
        key = f"data.{part}.{name}"
        convert = CONVERTERS[source.format]
        rows = load_rows(key, source)
        try:
            converted = [convert(row, data_cfg.gsm8k_tool_calls) for row in rows]
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise DataError(f"{key}: a row does not fit format={source.format} ({type(e).__name__}: {e}); "
                            f"its columns are {', '.join(rows.column_names)}") from None
        conversations += converted
        counts[name] = len(converted)
    return conversations, counts


def conversation_rows(tokenizer: Tokenizer, conversations: list[list[dict]], row_len: int, seed: int) -> torch.Tensor:
    """The conversations, shuffled with seed, rendered with their masks and packed into rows (n, row_len); a row
    with no trained target (all prompt or tool output, as inside a long prompt) is left out: it teaches nothing,
    and a micro-batch of such rows would have a mean loss of 0/0 (NaN) and stop the run."""
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    tokens: list[int] = []
    for i in order:
        try:
            ids, mask = render_conversation(tokenizer, conversations[i])
        except (KeyError, TypeError, ValueError) as e:  # a message without content, a part without text, ...
            raise DataError(f"SFT conversation {i} (of all sources, in source order) cannot be rendered "
                            f"({type(e).__name__}: {e}); each message needs a role and a string or list of "
                            "{type, text} parts as content") from None
        tokens += mask_tokens(ids, mask)
    rows = cut_rows(torch.tensor(tokens, dtype=torch.int32), row_len)
    return rows[(rows[:, 1:] >= 0).any(dim=1)]
