from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

REPO = Path(__file__).resolve().parents[1]

# pytest-xdist runs one worker per core (pyproject's addopts): each computes on one thread, as do the runs it
# starts (OMP_NUM_THREADS is torch's default thread count), so that workers do not oversubscribe the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
CONF_DIR = REPO / "conf"

# A model small enough to train a few steps in seconds; 2 micro-batches per update exercise accumulation.
SMALL = [
    "logger=csv", "model.n_layer=2", "model.n_embd=64", "model.n_head=2", "model.sequence_len=64",
    "model.vocab_size=512", "train.device_batch_size=4", "train.total_batch_tokens=512", "train.max_steps=6",
    "eval.every=3", "eval.val_tokens=1024", "log.print_every=1",
]


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory) -> Path:
    """One tokenizer cache for the whole session, never the user's."""
    path = tmp_path_factory.mktemp("xsa-exp-cache")
    os.environ["XSA_EXP_CACHE"] = str(path)
    return path


def compose_config(*overrides: str):
    """A run's config as Hydra hands it to a job: without the hydra node, whose record of the run is set globally;
    the group choices (depth_name, ...) resolved now, so that configs composed one after another keep their own."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(copy.deepcopy(cfg))
    with open_dict(cfg):
        for name in ("depth_name", "stack_name", "stage_name"):
            cfg[name] = cfg[name]
        del cfg["hydra"]
    return cfg


@pytest.fixture
def small_cfg():
    return lambda *overrides: compose_config(*SMALL, *overrides)
