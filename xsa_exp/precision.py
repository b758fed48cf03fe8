"""trainer.precision beyond Lightning's own: bf16-compute, how nanochat trains in bf16, without
autocast. The token and value embeddings are stored in bf16, so the residual stream, its mixes and adds, the norms,
gates and attention all run in bf16; each matrix keeps an fp32 master weight and fp32 optimizer state and is cast to
bf16 inside its matmul; the logits are cast to fp32 for the soft-cap and the loss. Under bf16-mixed (autocast) the
weights and the residual stream stay fp32, and so do the ops autocast leaves alone (norms, adds, gates).
Also which CPUs compute bf16 natively, the rule of trainer.precision=auto and optim.muon.ns_dtype=auto.
"""

from __future__ import annotations

from pathlib import Path

import torch

BF16_COMPUTE = "bf16-compute"


def lightning_precision(precision: str) -> str:
    """The Trainer's precision: bf16-compute is Lightning's 32-true (no autocast), the model computing in bf16."""
    return "32-true" if precision == BF16_COMPUTE else precision


def prepare(model, precision: str) -> None:
    """Under bf16-compute, the model computes in bf16 (GPT.compute_in); under any other precision it stays as built."""
    if precision == BF16_COMPUTE:
        model.compute_in(torch.bfloat16)


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX-BF16 in the CPU flags (Linux); elsewhere bf16 matmul is emulated and slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def newton_schulz_dtype(setting: str, cuda: bool) -> tuple[str, str]:
    """Muon's Newton-Schulz dtype for optim.muon.ns_dtype, and why. auto is nanochat's bfloat16 on CUDA and on a CPU
    with native bf16 matmul, and float32 on other CPUs: there torch's bf16 matmul is a generic loop, tens of times
    slower than fp32, and bf16 iterations took more than half of each update of the default run (BENCHMARKS.md,
    "Newton–Schulz on a CPU without native bf16")."""
    if setting != "auto":
        return setting, "optim.muon.ns_dtype"
    if cuda:
        return "bfloat16", "auto: CUDA"
    if cpu_has_native_bf16():
        return "bfloat16", "auto: CPU with native bf16 matmul"
    return "float32", "auto: CPU without native bf16 matmul"
