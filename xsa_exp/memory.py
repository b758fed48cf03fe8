"""Predicted peak memory of a training step on a GPU, so that a run that would not fit says so before it
starts and names a micro-batch that fits.

The per-token figures were measured on a CPU under bf16 autocast at sequence 2048 and vocabulary 32,768, at
the d12 and d24 widths (bench/memory_model.py; BENCHMARKS.md, "Memory per micro-batch token"): what one
layer keeps for backward grows with the width, the rest (logits, their fp32 soft-capped copy, the loss's
gradient) with the vocabulary. A prediction: CUDA's attention kernels and allocator may differ a little.
"""

from __future__ import annotations

# Bytes per micro-batch token: per layer and channel of width, and outside the layers per vocabulary entry
# (the mean of the d12 and d24 measurements, which are within 2.5% of it).
# Compiled, inductor fuses the soft-capped logits with the loss and keeps less per layer.
PER_LAYER_BYTES_PER_CHANNEL = {"eager": 75.3, "compiled": 61.8}
FIXED_BYTES_PER_VOCAB_ENTRY = {"eager": 17.15, "compiled": 6.92}


def state_bytes(param_counts: dict[str, int], muon: bool) -> int:
    """fp32 weights and grads, Muon's momentum on the hidden matrices, AdamW's two moments on the rest."""
    total, matrices = param_counts["total"], param_counts["hidden matrices"] if muon else 0
    return 8 * total + 4 * matrices + 8 * (total - matrices)


def bytes_per_token(n_layer: int, n_embd: int, vocab_size: int, compiled: bool) -> float:
    mode = "compiled" if compiled else "eager"
    return n_layer * n_embd * PER_LAYER_BYTES_PER_CHANNEL[mode] + vocab_size * FIXED_BYTES_PER_VOCAB_ENTRY[mode]


def predicted_peak_bytes(model, device_batch_size: int, compiled: bool, muon: bool) -> float:
    c = model.config
    per_token = bytes_per_token(c.n_layer, c.n_embd, c.vocab_size, compiled)
    return state_bytes(model.param_counts(), muon) + device_batch_size * c.sequence_len * per_token


def fitting_batch_size(model, capacity_bytes: float, compiled: bool, tokens_per_batch_unit: int,
                       total_batch_tokens: int, muon: bool) -> int | None:
    """The largest device_batch_size predicted to fit that still divides the global batch
    (total_batch_tokens a multiple of device_batch_size x tokens_per_batch_unit); None if not even 1 fits."""
    fits = [b for b in range(1, total_batch_tokens // tokens_per_batch_unit + 1)
            if total_batch_tokens % (b * tokens_per_batch_unit) == 0
            and predicted_peak_bytes(model, b, compiled, muon) <= capacity_bytes]
    return max(fits) if fits else None


def memory_warning(model, device_batch_size: int, compiled: bool, muon: bool, capacity_bytes: float, device_name: str,
                   tokens_per_batch_unit: int, total_batch_tokens: int) -> str | None:
    """One line if the predicted peak exceeds the device's memory, naming what fits; else None."""
    peak = predicted_peak_bytes(model, device_batch_size, compiled, muon)
    if peak <= capacity_bytes:
        return None
    fix = []
    batch = fitting_batch_size(model, capacity_bytes, compiled, tokens_per_batch_unit, total_batch_tokens, muon)
    if batch is not None:
        fix.append(f"train.device_batch_size={batch} fits (gradient accumulation keeps the global batch)")
    if not compiled and predicted_peak_bytes(model, device_batch_size, True, muon) <= capacity_bytes:
        fix.append("train.compile=true fits as it is")
    advice = "; ".join(fix) if fix else "no micro-batch fits: use more devices or a smaller model"
    mode = "compiled" if compiled else "eager"
    return (f"predicted peak memory {peak / 1e9:.0f} GB ({mode}, train.device_batch_size={device_batch_size}) exceeds "
            f"this {device_name}'s {capacity_bytes / 1e9:.0f} GB; {advice}")
