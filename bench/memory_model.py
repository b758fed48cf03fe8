"""Peak memory of a training step per micro-batch token, measured on this CPU, for each precision, mode and loss
head, and the presets' predicted peaks on 80 GB and 141 GB GPUs: the figures xsa_exp/memory.py keeps.

    python bench/memory_model.py [--out memory.json]
    python bench/memory_model.py --precisions bf16-compute --presets d12 --modes compiled

Each measurement is one process: a GPT at the real width and heads of d12 (768, 12 heads) or d24 (1024, 16 heads),
sequence 2048, vocabulary 32,768, MuonAdamW, in the precision named (bf16-mixed: autocast over fp32 weights;
bf16-compute: the GPU presets' bf16 without autocast; 32-true: fp32), eager or torch.compile (the training forward,
as train.compile does). After two warm-up steps (weights, grads and optimizer state exist; compilation done), the
process's peak resident set is reset (/proc/self/clear_refs) and one step runs: the rise of the peak over the
resident set before it is that step's transient memory (saved activations, logits, temporaries), with glibc
returning every freed block of 64 KiB or more to the system, so that the resident set is the live tensors' (as
CUDA's max allocated).
Four measurements per precision, preset and mode split that memory into its parts:
- the full logits (model.fused_loss_head=false), one sequence, 2 and 4 layers: bytes per token per layer, and per
  token outside the layers (mostly the logits, their fp32 soft-capped copy and the loss's gradient);
- the fused loss head, 2 layers, one and two sequences: its bytes per token outside the layers (a chunk's logits,
  spread over the chunks) and the part that does not grow with the tokens (its weight gradient's fp32 sum and, in
  bf16, the weight's bf16 copy).

Predicted peak of a preset on a GPU = optimizer state (xsa_exp/memory.py: weights, grads, Muon's momentum, AdamW's
moments, each in its parameter's dtype) + the fused head's fixed part + tokens per micro-batch x (outside + layers x
per layer). A prediction: the CPU's SDPA (flash attention for bf16) and allocator stand in for CUDA's; the caching
allocator's fragmentation is not modelled.
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

from peak_rss import measure_in_child, rss_kib  # bench/peak_rss.py, beside this script

from xsa_exp.memory import Footprint, peak_bytes

REPO = Path(__file__).resolve().parents[1]
WIDTHS = {"d12": (768, 12), "d24": (1024, 16)}
SEQ, VOCAB = 2048, 32768
PRECISIONS = ("bf16-mixed", "bf16-compute", "32-true")


def measure(width: int, heads: int, layers: int, compiled: bool, precision: str, fused: bool, sequences: int) -> int:
    """Transient bytes of one training step, in a fresh process."""
    return measure_in_child(__file__, width, heads, layers, int(compiled), precision, int(fused), sequences)


def build(overrides: list[str], precision: str):
    """The GPT of train.yaml with nanochat's stack and these overrides, in the precision's dtypes, and its config.
    Every layer attends over its whole context: on CUDA the windows are FlexAttention's, which keeps for backward
    what full attention's flash kernel does, where a CPU's windowed path (a dense mask) would keep the scores."""
    from hydra import compose, initialize_config_dir

    from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
    from xsa_exp.model import GPT, GPTConfig
    from xsa_exp.precision import prepare

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["stack=nanochat_2604", "data=climbmix", "data.local_dir=/",
                                                      *overrides, "model.window_pattern=L"])
    model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    prepare(model, precision)
    return model, cfg


def child(width: int, heads: int, layers: int, compiled: bool, precision: str, fused: bool, sequences: int) -> None:
    import torch

    from xsa_exp.optim import MuonAdamW, build_param_groups

    torch.manual_seed(0)
    model, cfg = build([f"model.n_embd={width}", f"model.n_head={heads}", f"model.n_layer={layers}",
                        f"model.sequence_len={SEQ}", f"model.vocab_size={VOCAB}", f"model.fused_loss_head={fused}",
                        "optim.muon.ns_dtype=bfloat16"], precision)  # CUDA's Newton-Schulz, whatever this CPU's
    optimizer = MuonAdamW(build_param_groups(model, cfg.optim, None, compiled))
    forward = torch.compile(model.forward, fullgraph=True) if compiled else model.forward
    batch = torch.randint(0, VOCAB, (sequences, SEQ + 1))

    def step() -> None:
        optimizer.zero_grad(set_to_none=False)  # grads stay allocated, as after the first step of a run
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            loss = forward(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()

    step(), step()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set (VmHWM) to the current one
    before = rss_kib("VmRSS")
    step()
    print((rss_kib("VmHWM") - before) * 1024)


def footprint(width: int, heads: int, compiled: bool, precision: str) -> tuple[Footprint, dict]:
    """This width's figures per token (xsa_exp/memory.py's Footprint) and the raw measurements behind them."""
    raw = {"full logits, 2 layers": measure(width, heads, 2, compiled, precision, False, 1),
           "full logits, 4 layers": measure(width, heads, 4, compiled, precision, False, 1),
           "fused head, 2 layers": measure(width, heads, 2, compiled, precision, True, 1),
           "fused head, 2 layers, 2 sequences": measure(width, heads, 2, compiled, precision, True, 2)}
    two, four, one_seq, two_seq = raw.values()
    per_layer = (four - two) / 2 / SEQ
    fused_fixed = 2 * one_seq - two_seq
    return Footprint(per_layer_per_channel=per_layer / width,
                     logits_per_vocab_entry=(two / SEQ - 2 * per_layer) / VOCAB,
                     fused_head_per_channel=((two_seq - one_seq) / SEQ - 2 * per_layer) / width,
                     fused_head_fixed_per_weight=fused_fixed / (VOCAB * width)), raw


def preset(depth: str, precision: str):
    """The preset's GPT on the meta device, in the precision's dtypes, and its micro-batch."""
    import torch

    with torch.device("meta"):
        model, cfg = build([f"depth={depth}"], precision)
    return model, cfg.train.device_batch_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--presets", nargs="+", choices=list(WIDTHS), default=list(WIDTHS))
    parser.add_argument("--modes", nargs="+", choices=["eager", "compiled"], default=["eager", "compiled"])
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        width, heads, layers, compiled, precision, fused, sequences = args.child
        child(int(width), int(heads), int(layers), bool(int(compiled)), precision, bool(int(fused)), int(sequences))
        return
    figures = {"date": str(date.today()), "seq": SEQ, "vocab": VOCAB, "rows": []}
    print(f"{'preset':<6} {'precision':<12} {'mode':<9} {'B/token/layer':>13} {'logits B/token':>14} "
          f"{'fused B/token':>13} {'fused fixed MB':>14} {'micro-batch':>11} {'GB logits':>9} {'GB fused':>8} "
          f"{'largest fused on 80 GB':>22}")
    for precision in args.precisions:
        for depth in args.presets:
            width, heads = WIDTHS[depth]
            model, batch = preset(depth, precision)
            for mode in args.modes:
                fp, raw = footprint(width, heads, mode == "compiled", precision)
                logits, fused = (peak_bytes(model, batch, fp, f, muon=True) / 1e9 for f in (False, True))
                largest = max([b for b in range(1, 257) if peak_bytes(model, b, fp, True, muon=True) <= 80e9],
                              default=0)
                figures["rows"].append({"preset": depth, "precision": precision, "mode": mode,
                                        "footprint": vars(fp), "raw_bytes": raw, "device_batch_size": batch,
                                        "predicted_peak_gb": {"full logits": logits, "fused head": fused},
                                        "largest_fused_batch_80gb": largest})
                print(f"{depth:<6} {precision:<12} {mode:<9} {fp.per_layer_per_channel * width:>13,.0f} "
                      f"{fp.logits_per_vocab_entry * VOCAB:>14,.0f} {fp.fused_head_per_channel * width:>13,.0f} "
                      f"{fp.fused_head_fixed_per_weight * VOCAB * width / 1e6:>14,.0f} {batch:>11} {logits:>9.1f} "
                      f"{fused:>8.1f} {largest:>22}", flush=True)
                if args.out:
                    args.out.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
