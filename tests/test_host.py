"""The training process's host hygiene: the allocators' settings (CUDA's on a GPU, glibc's on a CPU), the frozen garbage
collector, pinned batches on CUDA and each rank's share of the CPUs for tokenizing."""

import gc
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.conftest import REPO, compose_config
from xsa_exp import evaluate_run
from xsa_exp.config.schema import SampleDataConfig
from xsa_exp.data.datamodule import TextDataModule
from xsa_exp.training import host
from xsa_exp.training import run as training
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


# Steps of a soft-capped loss over 4,096-way logits of 2,048 tokens (32 MiB, as the tiny preset's), as a CPU training
# step allocates and frees them; the page faults of a step before and after keep_freed_host_memory, in a process of
# its own: the setting is the process's for good.
PAGE_FAULTS = """
import resource, torch
from xsa_exp.training.host import keep_freed_host_memory
x, targets, w = torch.randn(2048, 8), torch.randint(0, 4096, (2048,)), torch.randn(8, 4096, requires_grad=True)
def faults_per_step(steps):
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        torch.nn.functional.cross_entropy(15 * torch.tanh(x @ w), targets).backward()
        w.grad = None
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / steps
faults_per_step(3)
before = faults_per_step(4)
keep_freed_host_memory()
faults_per_step(3)
print(before, faults_per_step(4))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_host_memory_stays_mapped_so_that_steps_stop_faulting_pages_in():
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PAGE_FAULTS], env=env, cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    before, after = map(float, out.split())
    assert before > 1000 and after < before / 5, (before, after)


def test_malloc_is_tuned_unless_the_user_tuned_it(monkeypatch):
    calls = []
    monkeypatch.setattr(host.ctypes, "CDLL", lambda name: SimpleNamespace(mallopt=lambda *args: calls.append(args)))
    for name in [k for k in os.environ if k == "GLIBC_TUNABLES" or k.startswith("MALLOC_")]:
        monkeypatch.delenv(name)
    host.keep_freed_host_memory()
    assert calls == [(host.M_MMAP_MAX, 0), (host.M_TRIM_THRESHOLD, 1 << 30)]
    for name, value in (("MALLOC_ARENA_MAX", "2"), ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")):
        calls.clear()
        with monkeypatch.context() as m:
            m.setenv(name, value)
            host.keep_freed_host_memory()
        assert calls == [], name


class Tuned(Exception):
    pass


def test_training_and_evaluating_on_a_cpu_tune_malloc_first(monkeypatch, tmp_path):
    def tuned():
        raise Tuned
    monkeypatch.setattr(training, "keep_freed_host_memory", tuned)
    monkeypatch.setattr(evaluate_run, "keep_freed_host_memory", tuned)
    with pytest.raises(Tuned):
        training.train(compose_config("trainer.accelerator=cpu"), tmp_path / "run")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[f"run={tmp_path / 'run'}", "device=cpu"])
    with pytest.raises(Tuned):
        evaluate_run.evaluate(cfg)


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
