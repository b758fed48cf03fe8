"""Streamed corpora: the files of data=climbmix and data=local, and reading their documents.

Each file is read on its own, in a fixed file order, so nothing is ever loaded whole and the document
order depends only on the file list: parquet one row group at a time with pyarrow through fsspec,
json and txt with `datasets.load_dataset(<format>, data_files=[file], streaming=True)`; either way
the same code path for a local mirror and for the Hugging Face hub (hf:// URLs). A reader of the
training stream reads only its share of the row groups (read_documents).

data=climbmix: the text form of ClimbMix-400B that nanochat pretrains on, parquet shards
shard_00000 ... shard_06542 (one `text` column) of the dataset repo karpathy/climbmix-400b-shuffle.
The last shard is the validation split, as in nanochat; training reads the first
data.num_train_shards shards. Files come from data.local_dir when it is set (a folder holding those
file names, e.g. nanochat's base_data_climbmix), else from the hub; HF_HUB_OFFLINE / HF_DATASETS_OFFLINE
make the hub an error instead of a hang.

data=local: the .parquet, .jsonl/.json and .txt files of data.path (a folder, a file or a glob),
sorted by path. Validation is split by file, never within one: the files of data.val_path when it
is given (they are then never trained on), else the last file, as for ClimbMix.
"""

from __future__ import annotations

import codecs
import functools
import glob
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path, PurePosixPath

from xsa_exp.config.schema import ClimbmixDataConfig, DataConfig, LocalDataConfig, SftDataConfig
from xsa_exp.data.conversations import CONVERTERS
from xsa_exp.errors import ConfigError, UserError

FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".txt": "text"}
TXT_SAMPLE_BY = ("document", "paragraph", "line")  # a .txt document: the whole file, a paragraph, a line
PARQUET_MAGIC = b"PAR1"  # a parquet file's first and last 4 bytes
DOCS_PER_READ = 256  # documents per read of a json/txt file: its chunk, and the tokenizer's batch


class DataError(UserError, ValueError):
    """Missing or unreadable data; the message is one line that names it and the fix."""


class DataSettingError(DataError, ConfigError):
    """A data.* setting that cannot work (a bad value, files that are not there, the hub while offline):
    what check_data_config finds before a run starts, so also a ConfigError. Found later (evaluate.py
    reading a run's data) it prints as a plain `error:` like any DataError."""
    label = DataError.label


@dataclass(frozen=True)
class StreamedCorpus:
    name: str
    train_files: tuple[str, ...]  # local paths or hf:// URLs, in reading order
    val_files: tuple[str, ...]
    text_column: str
    txt_sample_by: str
    fingerprint: str  # identifies the training text, for the tokenizer cache
    fix: str  # what to do when a file cannot be read


def streamed_corpus(data_cfg: ClimbmixDataConfig | LocalDataConfig) -> StreamedCorpus:
    if data_cfg.name == "climbmix":
        return climbmix_corpus(data_cfg)
    if data_cfg.name == "local":
        return local_corpus(data_cfg)
    raise DataSettingError(f"data={data_cfg.name} is not a streamed corpus; use climbmix or local")


def climbmix_corpus(cfg: ClimbmixDataConfig) -> StreamedCorpus:
    n_shards = cfg.num_shards
    if not isinstance(n_shards, int) or n_shards < 2:
        raise DataSettingError(f"data.num_shards={n_shards!r} must be an integer >= 2 (training shards plus the "
                               "validation shard)")
    n_train = n_shards - 1 if cfg.num_train_shards is None else cfg.num_train_shards
    if not isinstance(n_train, int) or not 1 <= n_train < n_shards:
        raise DataSettingError(f"data.num_train_shards={n_train!r} must be from 1 to {n_shards - 1} (the last shard is "
                               "validation), or null for all of them")
    names = [f"shard_{i:05d}.parquet" for i in [*range(n_train), n_shards - 1]]
    hub = f"https://huggingface.co/datasets/{cfg.repo}"
    if cfg.local_dir is None:
        variable = offline_variable()
        if variable:
            raise DataSettingError(f"data=climbmix streams from {hub}, but {variable}={os.environ[variable]}; "
                                   "set data.local_dir to a folder of its shard_XXXXX.parquet files, or unset "
                                   f"{variable} to go online")
        base, fix = (f"hf://datasets/{cfg.repo}",
                     f"check the connection to {hub}, or set data.local_dir to a local mirror")
    else:
        local_dir = Path(cfg.local_dir).expanduser().resolve()
        fix = (f"put the shards in data.local_dir (the validation shard {names[-1]} too), lower data.num_train_shards "
               "(nanochat's download, `python -m nanochat.dataset -n 170`, holds the first 170), or set "
               f"data.local_dir=null to stream from {hub}")
        if not local_dir.is_dir():
            raise DataSettingError(f"data.local_dir={local_dir} is not a directory; {fix}")
        base = str(local_dir)
    files = tuple(f"{base}/{name}" for name in names)
    # The shard names, not where they are read from: a mirror and the hub share one cached tokenizer.
    return StreamedCorpus("climbmix", files[:-1], files[-1:], "text", "document", digest(cfg.repo, *names[:-1]), fix)


def local_corpus(cfg: LocalDataConfig) -> StreamedCorpus:
    if not cfg.path:
        raise DataSettingError("data=local needs data.path: a folder, file or glob of .parquet, .jsonl/.json or "
                               ".txt files")
    if cfg.txt_sample_by not in TXT_SAMPLE_BY:
        raise DataSettingError(f"data.txt_sample_by={cfg.txt_sample_by!r} is not an option; "
                               f"allowed: {', '.join(TXT_SAMPLE_BY)}")
    files = match_files(cfg.path, "data.path")
    if cfg.val_path is None:
        if len(files) < 2:
            raise DataSettingError(f"data.path={cfg.path} matches one file, {files[0]}; the last file is the "
                                   "validation split, so give at least two files or set data.val_path")
        train, val = files[:-1], files[-1:]
    else:
        val = match_files(cfg.val_path, "data.val_path")
        train = [f for f in files if f not in val]
        if not train:
            raise DataSettingError(f"data.path={cfg.path} has no files besides those of data.val_path={cfg.val_path}; "
                                   "give training files")
    # Path, size and modification time of every training file: a changed corpus gets a new tokenizer.
    stats = [f"{f}:{os.stat(f).st_size}:{os.stat(f).st_mtime_ns}" for f in train]
    return StreamedCorpus("local", tuple(train), tuple(val), cfg.text_column, cfg.txt_sample_by,
                          digest(cfg.text_column, cfg.txt_sample_by, *stats),
                          "check that the file is readable and in its format, or change data.path / data.val_path")


def match_files(pattern: str, key: str) -> list[str]:
    """The supported files of a folder (not its subfolders), a single file or a glob (** recurses), sorted."""
    path = Path(pattern).expanduser()
    if path.is_dir():
        candidates = list(path.iterdir())
    elif path.is_file():
        candidates = [path]
    else:
        candidates = [Path(p) for p in glob.glob(str(path), recursive=True)]
    files = sorted(str(p.resolve()) for p in candidates if p.is_file() and p.suffix in FORMATS)
    if not files:
        raise DataSettingError(f"{key}={pattern} matches no .parquet, .jsonl, .json or .txt files; "
                        "point it at a folder, a file or a glob of them")
    return files


def check_data_config(data_cfg: DataConfig) -> None:
    """What train.py checks before it creates a run directory: the data.* settings and, for a local mirror
    or corpus, that every file is there. Reads no data."""
    if data_cfg.name == "sft":  # no tokenizer of its own: its base run's
        check_chat_sources(data_cfg)
        return
    chars = data_cfg.tokenizer_chars
    if data_cfg.name in ("sample", "wiki"):  # the embedded corpora (corpus.py)
        if chars is not None:
            _positive_int(chars, "data.tokenizer_chars")
        if data_cfg.name == "wiki":  # the package and its data file are there (reads nothing)
            # imported here: corpus.py imports this module
            from xsa_exp.data.corpus import wiki_path

            try:
                wiki_path()
            except DataError as e:
                raise DataSettingError(str(e)) from None
        return
    _positive_int(chars, "data.tokenizer_chars")
    _positive_int(data_cfg.shuffle_rows, "data.shuffle_rows")
    if not isinstance(data_cfg.num_workers, int) or data_cfg.num_workers < 0:
        raise DataSettingError(f"data.num_workers={data_cfg.num_workers!r} must be an integer >= 0")
    corpus = streamed_corpus(data_cfg)
    local = tuple(f for f in corpus.train_files + corpus.val_files if "://" not in f)
    missing = [f for f in local if not Path(f).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more files)" if len(missing) > 1 else ""
        raise DataSettingError(f"{missing[0]} is missing{more}; {corpus.fix}")
    cut = cut_parquet_files(local)
    if cut:
        more = f" (and {len(cut) - 1} more files)" if len(cut) > 1 else ""
        raise DataSettingError(f"{cut[0]} is not a whole parquet file{more}: a download that stopped part-way, or a "
                               "copy cut short; download it again")


@functools.cache
def cut_parquet_files(files: tuple[str, ...]) -> list[str]:
    """The .parquet files among files that do not start and end with parquet's "PAR1" marker, found by reading 8
    bytes of each (a shard cut short would otherwise fail only when training reaches it, hours in). Cached: a sweep's
    jobs share their files."""
    cut = []
    for file in files:
        if PurePosixPath(file).suffix != ".parquet":
            continue
        try:
            with open(file, "rb") as f:
                head = f.read(4)
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - 4))
                tail = f.read(4)
        except OSError as e:
            raise DataSettingError(f"cannot read {file} ({e.strerror or e}); check its permissions") from None
        if size < 12 or head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
            cut.append(file)
    return cut


def check_chat_sources(data_cfg: SftDataConfig) -> None:
    for part in ("train_sources", "val_sources"):
        if not getattr(data_cfg, part):
            raise DataSettingError(f"data.{part} is empty; data=sft needs at least one source there")
        for name, source in getattr(data_cfg, part).items():
            key = f"data.{part}.{name}"
            if source.format not in CONVERTERS:
                raise DataSettingError(f"{key}.format={source.format!r} is not an option; "
                                       f"allowed: {', '.join(CONVERTERS)}")
            if source.max_rows is not None:
                _positive_int(source.max_rows, f"{key}.max_rows")
            if source.data_files:
                match_files(source.data_files, f"{key}.data_files")
            elif not source.path:
                raise DataSettingError(f"{key} needs a hub dataset (path) or local files (data_files)")
            elif offline_variable():
                raise DataSettingError(f"{key} is the hub dataset {source.path}, but {offline_variable()} is set; "
                                f"set {key}.data_files to a local copy, or go online")


def read_documents(corpus: StreamedCorpus, files: tuple[str, ...], reader: int = 0,
                   readers: int = 1) -> Iterator[list[str]]:
    """Batches of document texts from files, in order: every chunk, or reader's share of them out of readers.

    A chunk is a parquet row group (1,024 documents in ClimbMix's shards) or DOCS_PER_READ documents of a
    json/txt file. Chunks are counted over all the files in order and dealt round: chunk g belongs to
    reader g % readers, so every document belongs to exactly one reader and the shares differ by at most
    one chunk. A reader reads (parquet: it opens every file's footer, then only its row groups) or at
    least tokenizes (json/txt, which must be parsed in order) only its own chunks. Missing and empty
    documents are skipped."""
    chunks = count()  # the index of the next chunk, over all files
    for file in files:
        yield from _read_file(corpus, file, lambda: next(chunks) % readers == reader)


def _read_file(corpus: StreamedCorpus, file: str, mine: Callable[[], bool]) -> Iterator[list[str]]:
    """The documents of each chunk of file for which mine() (asked once per chunk, in order) is true."""
    builder = FORMATS[PurePosixPath(file).suffix]
    try:
        chunks = (_parquet_row_groups(corpus, file, mine) if builder == "parquet"
                  else _dataset_blocks(corpus, file, builder, mine))
        for texts in chunks:
            yield [text for text in texts if text]
    except DataError:
        raise
    except Exception as e:  # any failure to open or read: network, permissions, a corrupt file
        bad_line = first_bad_line(file)
        if bad_line:
            raise DataError(f"cannot read {file}: {bad_line}; {corpus.fix}") from e
        reason = str(e).strip().splitlines()[0] if str(e).strip() else "no message"
        # a file that is there, and that pyarrow finds invalid or cannot decode (an OSError without an errno: not a
        # permission or file-system failure), is damaged
        damaged = Path(file).is_file() and (type(e).__name__ == "ArrowInvalid"
                                            or isinstance(e, OSError) and e.errno is None)
        fix = "it is damaged: replace it (download it again)" if damaged else corpus.fix
        raise DataError(f"cannot read {file} ({type(e).__name__}: {reason}); {fix}") from e


def first_bad_line(file: str) -> str | None:
    """The first line of a .jsonl/.json or .txt file that cannot be read, numbered as an editor numbers it ("line 18
    is not valid JSON (...)"): the readers' own messages count rows from 0 within a 10 MB chunk. None where no line
    is at fault, for parquet, or where the file cannot be read again."""
    import fsspec

    if FORMATS[PurePosixPath(file).suffix] == "parquet":
        return None
    json_lines = FORMATS[PurePosixPath(file).suffix] == "json"
    try:
        with fsspec.open(file, "rb") as f:
            for number, line in enumerate(f, 1):
                line = line.removeprefix(codecs.BOM_UTF8) if number == 1 else line
                if json_lines and number == 1 and line.lstrip().startswith(b"["):  # a .json array, not JSON lines
                    return json_array_problem(line + f.read())
                problem = line_problem(line, json_lines)
                if problem:
                    return f"line {number} {problem}"
    except OSError:
        return None
    return None


def line_problem(line: bytes, json_lines: bool) -> str | None:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"is not UTF-8 (byte 0x{line[e.start]:02x} at byte {e.start + 1} of the line)"
    if not json_lines or not text.strip():
        return None
    try:
        value = json.loads(text.rstrip("\r\n"))  # the line end would be "an invalid control character" in a string
    except json.JSONDecodeError as e:
        return f"is not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno})"
    return None if isinstance(value, dict) else "is not a JSON object"


def json_array_problem(data: bytes) -> str | None:
    try:
        json.loads(data)
    except json.JSONDecodeError as e:
        return f"line {e.lineno} is not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno})"
    except ValueError:  # not UTF-8, which datasets' reader of JSON arrays accepts: not the cause
        pass
    return None


def _parquet_row_groups(corpus: StreamedCorpus, file: str, mine: Callable[[], bool]) -> Iterator[list[str]]:
    """The text column of each of the file's row groups that `mine` keeps, read one row group at a time.
    fsspec opens local paths and hf:// URLs alike (huggingface_hub's file system), fetching only what is read."""
    import fsspec  # here, not at the top: config checks import this module and stay fast
    import pyarrow.parquet as pq

    with fsspec.open(file, "rb") as f:
        parquet = pq.ParquetFile(f)
        if corpus.text_column not in parquet.schema_arrow.names:
            raise DataError(f"data.text_column={corpus.text_column!r} is not a column of {file} (it has "
                            f"{', '.join(parquet.schema_arrow.names)}); set data.text_column")
        for j in range(parquet.num_row_groups):
            if mine():
                yield parquet.read_row_group(j, columns=[corpus.text_column]).column(0).to_pylist()


def _dataset_blocks(corpus: StreamedCorpus, file: str, builder: str, mine: Callable[[], bool]) -> Iterator[list[str]]:
    """Blocks of DOCS_PER_READ documents of a json or txt file that `mine` keeps, streamed with `datasets`."""
    import datasets

    column = "text" if builder == "text" else corpus.text_column
    options = {"sample_by": corpus.txt_sample_by} if builder == "text" else {}
    stream = datasets.load_dataset(builder, data_files=[file], split="train", streaming=True, **options)
    for batch in stream.iter(batch_size=DOCS_PER_READ):
        if column not in batch:
            raise DataError(f"data.text_column={column!r} is not a column of {file} (it has {', '.join(batch)}); "
                            "set data.text_column")
        if mine():
            yield batch[column]


def offline_variable() -> str | None:
    """The environment variable that puts the hub offline, if one does (huggingface_hub's truthy values)."""
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(variable, "").upper() in ("1", "ON", "YES", "TRUE"):
            return variable
    return None


def digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _positive_int(value, key: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise DataSettingError(f"{key}={value!r} must be a positive integer")
