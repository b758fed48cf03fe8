"""Predicted peak memory of a training step on a GPU, so that a run that would not fit says so before it
starts and names what fits.

The per-token figures were measured on a CPU at sequence 2048 and vocabulary 32,768, at the d12 and d24 widths,
for each precision, mode and loss head (bench/memory_model.py; BENCHMARKS.md, "Memory per micro-batch token"):
what one layer keeps for backward grows with the width; outside the layers, the full logits grow with the
vocabulary, the fused loss head's chunks with the width (a chunk's logits are about as large as its hidden states)
and its fixed part with lm_head's size. A prediction: CUDA's attention kernels and allocator may differ a little.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Footprint:
    """Transient bytes of a training step per micro-batch token, for one precision and mode."""
    per_layer_per_channel: float       # what one layer keeps for backward, per channel of width
    logits_per_vocab_entry: float      # outside the layers with the full logits (model.fused_loss_head=false)
    fused_head_per_channel: float      # outside the layers with the fused loss head: the difference of two large
    #                                    measurements, within 20 KB per token of 0 either side (a layer: 40-80 KB)
    fused_head_fixed_per_weight: float  # the fused head's part that does not grow with the tokens, per lm_head weight


# The means of the d12 and d24 measurements (2026-12-07), by (precision, mode).
FOOTPRINTS = {
    ("bf16-mixed", "eager"): Footprint(72.30, 17.47, 26.77, 9.35),
    ("bf16-mixed", "compiled"): Footprint(57.78, 7.15, -2.17, 13.29),
    ("bf16-compute", "eager"): Footprint(67.30, 17.31, 12.97, 11.34),
    ("bf16-compute", "compiled"): Footprint(53.90, 7.09, -7.81, 11.53),
    ("32-true", "eager"): Footprint(80.55, 16.65, 28.14, 7.99),
    ("32-true", "compiled"): Footprint(78.46, 8.43, 16.44, 8.49),
}
# Precisions whose activations take the bytes of a measured one: fp16 autocast as bf16's, fp32 under either name.
MEASURED_AS = {"bf16-mixed": "bf16-mixed", "16-mixed": "bf16-mixed", "bf16-compute": "bf16-compute",
               "32-true": "32-true", "32": "32-true"}


def state_bytes(model, muon: bool) -> int:
    """Weights and grads, Muon's momentum on the hidden matrices, AdamW's two moments on the rest, each in its
    parameter's dtype (so call it once the model is in its training precision: under bf16-compute the embeddings
    are bf16)."""
    total = 0
    for role, params in model.named_param_groups().items():
        moments = 1 if muon and role == "matrix" else 2
        total += sum((2 + moments) * p.numel() * p.element_size() for _, p in params)
    return total


def peak_bytes(model, device_batch_size: int, footprint: Footprint, fused: bool, muon: bool) -> float:
    c = model.config
    if fused:
        outside = c.n_embd * footprint.fused_head_per_channel
        fixed = c.vocab_size * c.n_embd * footprint.fused_head_fixed_per_weight
    else:
        outside, fixed = c.vocab_size * footprint.logits_per_vocab_entry, 0.0
    per_token = c.n_layer * c.n_embd * footprint.per_layer_per_channel + outside
    return state_bytes(model, muon) + fixed + device_batch_size * c.sequence_len * per_token


def predicted_peak_bytes(model, device_batch_size: int, precision: str, compiled: bool, muon: bool,
                         fused: bool | None = None) -> float | None:
    """The predicted peak of a training step; None for a precision not measured (bf16-true, 16-true, 64-true).
    fused: the loss head's setting, model.fused_loss_head unless given."""
    if precision not in MEASURED_AS:
        return None
    footprint = FOOTPRINTS[MEASURED_AS[precision], "compiled" if compiled else "eager"]
    return peak_bytes(model, device_batch_size, footprint, model.config.fused_loss_head if fused is None else fused,
                      muon)


def fitting_batch_size(model, capacity_bytes: float, precision: str, compiled: bool, tokens_per_batch_unit: int,
                       total_batch_tokens: int, muon: bool) -> int | None:
    """The largest device_batch_size predicted to fit that still divides the global batch
    (total_batch_tokens a multiple of device_batch_size x tokens_per_batch_unit); None if not even 1 fits."""
    fits = [b for b in range(1, total_batch_tokens // tokens_per_batch_unit + 1)
            if total_batch_tokens % (b * tokens_per_batch_unit) == 0
            and predicted_peak_bytes(model, b, precision, compiled, muon) <= capacity_bytes]
    return max(fits) if fits else None


def memory_warning(model, device_batch_size: int, precision: str, compiled: bool, muon: bool, capacity_bytes: float,
                   device_name: str, tokens_per_batch_unit: int, total_batch_tokens: int) -> str | None:
    """One line if the predicted peak exceeds the device's memory, naming what fits; else None (also where the
    precision has no prediction)."""
    peak = predicted_peak_bytes(model, device_batch_size, precision, compiled, muon)
    if peak is None or peak <= capacity_bytes:
        return None
    fix = []
    batch = fitting_batch_size(model, capacity_bytes, precision, compiled, tokens_per_batch_unit, total_batch_tokens,
                               muon)
    if batch is not None:
        fix.append(f"train.device_batch_size={batch} fits (gradient accumulation keeps the global batch)")
    if not compiled and predicted_peak_bytes(model, device_batch_size, precision, True, muon) <= capacity_bytes:
        fix.append("train.compile=true fits as it is")
    fused_peak = predicted_peak_bytes(model, device_batch_size, precision, compiled, muon, fused=True)
    if not model.config.fused_loss_head and fused_peak <= capacity_bytes:
        fix.append("model.fused_loss_head=true fits as it is")
    advice = "; ".join(fix) if fix else "no micro-batch fits: use more devices or a smaller model"
    mode = "compiled" if compiled else "eager"
    return (f"predicted peak memory {peak / 1e9:.0f} GB ({precision}, {mode}, train.device_batch_size="
            f"{device_batch_size}) exceeds this {device_name}'s {capacity_bytes / 1e9:.0f} GB; {advice}")
