"""The training process's host hygiene: the CUDA allocator's setting, the frozen garbage collector, pinned batches on
CUDA and each rank's share of the CPUs for tokenizing."""

import gc
import os
from types import SimpleNamespace

import pytest
import torch

from xsa_exp.config.schema import SampleDataConfig
from xsa_exp.data.datamodule import TextDataModule
from xsa_exp.training.host import ALLOCATOR_VARIABLES, FrozenGC, use_expandable_segments


def test_expandable_segments_unless_the_user_set_the_allocator(monkeypatch):
    for name in ALLOCATOR_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    use_expandable_segments()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    for name in ALLOCATOR_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv(name, "max_split_size_mb:256")
        use_expandable_segments()
        assert os.environ[name] == "max_split_size_mb:256" and len(set(ALLOCATOR_VARIABLES) & set(os.environ)) == 1
        monkeypatch.delenv(name)


def test_the_collector_is_frozen_after_the_first_update_and_thawed_at_the_end():
    callback, trainer = FrozenGC(), SimpleNamespace(global_step=0)
    callback.on_train_start(trainer, None)
    callback.on_train_batch_end(trainer, None, None, None, 0)  # mid-accumulation
    assert gc.get_freeze_count() == 0
    trainer.global_step = 1
    callback.on_train_batch_end(trainer, None, None, None, 1)
    try:
        assert gc.get_freeze_count() > 0
    finally:
        callback.on_train_end(trainer, None)
    assert gc.get_freeze_count() == 0
    callback.on_train_start(trainer, None)
    trainer.global_step = 2
    callback.on_train_batch_end(trainer, None, None, None, 2)
    callback.on_exception(trainer, None, RuntimeError())
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_batches_are_pinned_on_cuda_and_each_rank_tokenizes_with_its_share(monkeypatch, cache_dir, device):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    data = TextDataModule(SampleDataConfig(), 64, 512, 4, 42,
                          str(cache_dir), local_ranks=4)
    data.prepare_data()
    data.setup()
    assert data.tokenizer.threads == 4  # the node's 16 CPUs shared by its 4 ranks
    strategy = SimpleNamespace(root_device=torch.device(device))
    data.trainer = SimpleNamespace(global_rank=0, world_size=1, strategy=strategy)
    assert data.train_dataloader().pin_memory == (device == "cuda")
