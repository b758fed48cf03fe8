"""bench/gpu_runs.py, the script behind BENCHMARKS.md's GPU figures: its whole plumbing at tiny shapes on a CPU
(--smoke), and what of its GPU path no CPU run reaches: the profiler's summary of CUDA kernels (from stand-in
events) and the count of recompiles."""

import argparse
import importlib
import json
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import REPO

MS = 1_000_000  # ns


@pytest.fixture
def gpu_runs(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # the script imports data_loader from beside it
    return importlib.import_module("gpu_runs")


def event(name: str, activity: str, start: int, end: int, correlation: int = 0, thread: int = 1):
    """One event of the profiler's Chrome trace, as bench/gpu_runs.py reads it."""
    return importlib.import_module("gpu_runs").TraceEvent(name, activity, start, end, correlation, thread)


def test_profile_summary_of_cuda_kernels(gpu_runs):
    events = [
        event(gpu_runs.OPTIMIZER_MARK, "user_annotation", 100 * MS, 200 * MS),
        # its device-side twin, on the device's clock: launches in it are not the optimizer's
        event(gpu_runs.OPTIMIZER_MARK, "gpu_user_annotation", 5 * MS, 40 * MS),
        event("cudaLaunchKernel", "cuda_runtime", 10 * MS, 11 * MS, correlation=1),
        event("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", 1000 * MS, 1400 * MS, correlation=1),
        event("cuLaunchKernel", "cuda_driver", 20 * MS, 21 * MS, correlation=2),
        event("triton_tem_fused_flex_attention_0", "kernel", 1400 * MS, 1600 * MS, correlation=2),
        event("cuLaunchKernel", "cuda_driver", 150 * MS, 151 * MS, correlation=3),  # inside the optimizer step
        event("triton_poi_fused_mul_0", "kernel", 1700 * MS, 1800 * MS, correlation=3),
        event("cuLaunchKernel", "cuda_driver", 30 * MS, 31 * MS, correlation=4),
        event("triton_poi_fused_add_1", "kernel", 1750 * MS, 1900 * MS, correlation=4),  # overlaps the one before
        event("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 2000 * MS, 2100 * MS, correlation=5),
    ]
    summary = gpu_runs.profile_summary(events, updates=2, window_s=4.0, cuda=True)
    assert summary["kernels_per_update"] == 2 and summary["window_ms_per_update"] == 2000
    assert summary["busy_ms_per_update"] == 450  # (600 + 200 + 100) ms over 2 updates: the overlap counted once
    assert summary["idle_fraction"] == 1 - 0.9 / 4.0
    assert {kind: v["ms_per_update"] for kind, v in summary["families"].items()} == {
        "matmul": 200, "attention": 100, "elementwise": 75, "optimizer": 50, "memcpy/memset": 50}
    assert summary["families"]["matmul"]["share"] == round(400 / 950, 4)


def test_profile_summary_on_a_cpu_counts_leaf_operators(gpu_runs):
    events = [event("aten::linear", "cpu_op", 0, 100 * MS), event("aten::mm", "cpu_op", 10 * MS, 60 * MS),
              event("aten::add_", "cpu_op", 60 * MS, 90 * MS), event("aten::mul", "cpu_op", 5 * MS, 50 * MS, thread=2)]
    assert [name for name, *_ in gpu_runs.device_work(events, cuda=False)] == ["aten::mm", "aten::add_", "aten::mul"]
    families = gpu_runs.profile_summary(events, updates=1, window_s=0.2, cuda=False)["families"]
    assert {kind: v["ms_per_update"] for kind, v in families.items()} == {"elementwise": 75, "matmul": 50}


@pytest.mark.parametrize("name, kind", [
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "matmul"), ("triton_tem_fused_mm_0", "matmul"),
    ("aten::addmm", "matmul"), ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "reduction/norm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("ncclDevKernel_AllGather_RING_LL", "communication"), ("Memset (Device)", "memcpy/memset"),
    ("aten::empty", "other")])
def test_kernel_families(gpu_runs, name, kind):
    assert gpu_runs.family(name) == kind


def test_compile_log_counts_recompiles(gpu_runs):
    log = gpu_runs.CompileLog()
    try:
        scale = torch.compile(lambda x, n: x * n, backend="eager")
        log.update = 1
        scale(torch.ones(2), 1)
        log.update = 2
        scale(torch.ones(2), 2)  # a guard on n fails: a recompile
    finally:
        torch._logging.getArtifactLogger("torch._dynamo.guards", "recompiles").removeHandler(log)
        torch._logging.set_logs()
    counts = gpu_runs.compile_counts(log)
    assert counts["recompiles"] == counts["recompiles_after_first_update"] == 1
    assert counts["recompile_reasons"][0].startswith("update 2: Recompiling function")


@pytest.mark.slow
def test_smoke_runs_every_part(tmp_path):
    """`--smoke` on this CPU: the checks, both compiled runs through the child and its measuring callback, the
    profiler's summary and the sync check's run (eager here), into the JSON and the table."""
    out = tmp_path / "smoke.json"
    result = subprocess.run([sys.executable, "bench/gpu_runs.py", "--smoke", "--budget-s", "900", "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert all(value is True for check, value in figures["checks"].items() if "equal" in check or "returns" in check)
    assert not [check for check in figures["checks"] if check.endswith("_error")], figures["checks"]
    runs = {r["run"]: r for r in figures["runs"]}
    assert list(runs) == ["d12_compiled", "d24_compiled"]
    for r in runs.values():
        assert "error" not in r and "stopped" not in r, r
        assert r["steady_updates"] == 3 and len(r["warmup_update_s"]) == 2 and r["tokens_per_sec"] > 0
        assert r["warmup_peak_gb"] > 0 and r["steady_peak_gb"] > 0 and r["predicted_peak_gb"] > 0
        assert r["compile"]["graph_breaks"] == 0 and r["compile"]["recompiles_after_first_update"] == 0
        assert r["compile"]["unique_graphs"] > 0
        profile = r["profile"]
        assert profile["updates"] == 2 and 0 < profile["busy_ms_per_update"] < profile["window_ms_per_update"]
        assert "optimizer" in profile["families"] and 0 < profile["idle_fraction"] < 1
    d24 = runs["d24_compiled"]
    assert 2 * d24["batch_tokens"] == d24["preset_batch_tokens"] and "batch_note" in d24
    assert runs["d12_compiled"]["batch_tokens"] == runs["d12_compiled"]["preset_batch_tokens"]
    sync = figures["sync_check"]
    assert sync["updates_checked"] == [3, 5, 6, 7, 9, 10, 11] and "error" not in sync and "stopped" not in sync
    assert "| d12_compiled | 4 x 4 | 1,024 | 3 |" in result.stdout and "d24_compiled profile" in result.stdout


def test_a_stop_from_bench_gpu_sh_keeps_the_part_in_progress(gpu_runs, tmp_path):
    """bench/gpu.sh's SIGTERM while a child runs (here a timer stands in for it): the child's process group is
    stopped, and the part is returned as stopped by bench/gpu.sh, with what the child had written."""
    import os
    import signal

    previous = signal.signal(signal.SIGALRM, gpu_runs.stop), signal.getsignal(signal.SIGTERM)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        figures = gpu_runs.run_child("d12_compiled", {"kind": "sync", "overrides": gpu_runs.SMOKE}, tmp_path,
                                     dict(os.environ), limit_s=120)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
    assert figures["stopped"] == "at bench/gpu.sh's limit" and figures["wall_s"] < 60, figures


def test_a_part_that_fails_or_has_no_time_is_recorded_and_the_next_runs(gpu_runs, capsys):
    """One device call is the whole chance: a failing part keeps its error in the JSON and the table, not a
    traceback that ends the parts after it."""
    def fails():
        raise KeyError("d24")

    failed = gpu_runs.part(fails, {"run": "d24_compiled"}, 300)
    assert failed == {"run": "d24_compiled", "error": "KeyError: 'd24'"}
    assert "d24_compiled failed: KeyError: 'd24'" in capsys.readouterr().out
    assert gpu_runs.table_row(failed).startswith("| d24_compiled | failed: KeyError: 'd24' |")
    skipped = gpu_runs.part(fails, {"run": "d12_compiled"}, gpu_runs.MIN_PART_S - 1)
    assert skipped == {"run": "d12_compiled", "skipped": "out of the time budget"}
    assert gpu_runs.part(lambda: {"run": "sync check", "count": 0}, {"run": "sync check"}, 90)["count"] == 0


@pytest.mark.parametrize("sync_fails", [False, True])
def test_a_failed_sync_check_sends_the_runs_to_the_path_that_ran_before(gpu_runs, monkeypatch, tmp_path, sync_fails):
    """The sync check runs the study's path first; where it fails on the device, the throughput runs measure the
    autocast path with the unfused head instead of failing alike, and the figures say so."""
    def sync_check(common, *rest):
        if sync_fails:
            raise RuntimeError("Could not run 'aten::addmm.dtype' with arguments from the 'CUDA' backend")
        return {"run": "sync check", "settings": [arg for arg in common if arg.startswith(("trainer.", "model."))]}
    runs = []
    monkeypatch.setattr(gpu_runs, "exactness_checks", lambda device, smoke: {})
    monkeypatch.setattr(gpu_runs, "write_corpus", lambda *args, **kwargs: None)
    monkeypatch.setattr(gpu_runs, "sync_check", sync_check)
    monkeypatch.setattr(gpu_runs, "throughput_run", lambda run, common, *rest: runs.append(common) or {"run": run})
    args = argparse.Namespace(budget_s=10_000, out=tmp_path / "gpu_runs.json", runs=["d12_compiled", "d24_compiled"],
                              smoke=True)
    study = ["trainer.precision=bf16-compute", "model.fused_loss_head=true"]
    figures = {"settings": study, "runs": []}
    gpu_runs.measure_all(args, figures, "cpu", time.monotonic())
    expected = gpu_runs.FALLBACK_SETTINGS if sync_fails else study
    assert len(runs) == 2 and all(set(expected) <= set(common) for common in runs)
    assert ("fallback" in figures) == sync_fails and figures["settings"] == expected
    assert json.loads(args.out.read_text())["settings"] == expected

