"""What a run prints: our own lines, not the libraries' chatter, unless XSA_EXP_VERBOSE=1 asks for everything.

Our warnings print as one line, `warning: <message>`, not as Python's two (the message, then the source line that
raised it); Lightning formats its own the same way, and other libraries' keep their form.

Quiet by default: Lightning's hardware lines, tips and "fit stopped"/"weights_only" notes; wandb's banner
and its "anonymous setting" warning (an offline run still says where its log is); the torch pytree
deprecation warning Lightning triggers; datasets' progress bars ("Generating train split"), and the line its JSON
reader logs before raising a parse error (which we report, naming the line), and the parquet reader's line about
a file it cannot read (which we report too). Warnings and errors of our own, and every
error a library raises, still show.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

from xsa_exp.errors import XsaExpWarning

VERBOSE_ENV = "XSA_EXP_VERBOSE"
LIGHTNING_NOISE = re.compile(r"GPU available|TPU available|HPU available|💡 Tip|`Trainer\.fit` stopped|"
                             r"`weights_only` was not set|LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES")


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not LIGHTNING_NOISE.search(record.getMessage())


def format_warning(message, category, filename, lineno, line=None) -> str:
    if issubclass(category, XsaExpWarning):
        return f"warning: {message}\n"
    return libraries_format_warning(message, category, filename, lineno, line)


libraries_format_warning = warnings.formatwarning  # replaced by the one in place at set-up (Lightning's wraps it)


def set_up_console() -> None:
    """One-line warnings of our own, and the libraries' chatter silenced for this process (and the processes it
    starts) unless verbose()."""
    global libraries_format_warning
    if warnings.formatwarning is not format_warning:
        libraries_format_warning, warnings.formatwarning = warnings.formatwarning, format_warning
    if verbose():
        return
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    # The variable covers a later import; an import already made needs the call. Not imported here: the
    # embedded corpora never use `datasets`, and its import (pyarrow, pandas) costs a second.
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # Lightning logs these through its rank_zero loggers (ours too: the filter keeps our lines) and the
    # checkpoint connector (weights_only).
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                 "lightning.pytorch.trainer.connectors.checkpoint_connector"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropNoise) for f in logger.filters):
            logger.addFilter(DropNoise())
    # datasets' JSON reader logs a parse error before raising it, as a row counted from 0 within a 10 MB chunk;
    # the error we report names the line (data/sources.py, first_bad_line). Its parquet reader logs a file it cannot
    # read before raising, which our one line names too (data/sft.py).
    logging.getLogger("datasets.packaged_modules.json.json").setLevel(logging.CRITICAL)
    logging.getLogger("datasets.packaged_modules.parquet.parquet").setLevel(logging.CRITICAL)


def wandb_offline() -> bool:
    """wandb runs offline unless the user has a key or chose a mode: runs never block on the network."""
    return "WANDB_API_KEY" not in os.environ and "WANDB_MODE" not in os.environ


def quiet_wandb_logger(logger) -> None:
    """Lightning's WandbLogger passes wandb.init an `anonymous` setting that current wandb only warns about."""
    if not verbose():
        getattr(logger, "_wandb_init", {}).pop("anonymous", None)
