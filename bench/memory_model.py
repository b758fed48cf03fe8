"""Peak memory of a training step per micro-batch token, measured on this CPU, and the presets' predicted
peaks on 80 GB and 141 GB GPUs.

    python bench/memory_model.py [--out memory.json]
    python bench/memory_model.py --precision bf16-compute --fused-loss-head --presets d12 --modes compiled

Each measurement is one process: a GPT at the real width and heads of d12 (768, 12 heads) or d24 (1024,
16 heads), sequence 2048, vocabulary 32,768, with 2 or 4 layers, MuonAdamW, bf16 autocast (trainer.precision=
bf16-mixed; --precision bf16-compute: the GPU presets' bf16 without autocast, with --fused-loss-head their loss
head), eager or torch.compile. After two warm-up steps (weights, grads and optimizer state exist;
compilation done), the process's peak resident set is reset (/proc/self/clear_refs) and one step of one
sequence (2,048 tokens) runs: the rise of the peak over the resident set before it is that step's
transient memory (saved activations, logits, temporaries), with glibc returning every freed block of
64 KiB or more to the system, so that the resident set is the live tensors' (as CUDA's max allocated).
Two layer counts separate a per-layer part from a fixed one (embeddings, logits, loss), both per token. With
--fused-loss-head the head's part that does not grow with the tokens (its weight gradient's fp32 sum and bf16 copy,
about 0.25 GB at d12) is counted per token of the one sequence measured, so the predicted peak overstates it by the
micro-batch's sequences (bench/loss_head.py measures the head at two token counts; BENCHMARKS.md corrects for it).

Predicted peak of a preset on a GPU = 4 bytes x (weights + grads) + Muon's momentum (4 bytes per
hidden-matrix weight) + AdamW's two moments (8 bytes per other weight) + tokens per micro-batch x
(fixed + layers x per-layer); under bf16-compute the embeddings' weights, gradients and moments take half that.
A prediction: the CPU's SDPA (flash attention for bf16) and allocator stand in for CUDA's; the caching allocator's
fragmentation is not modelled.
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

from peak_rss import measure_in_child, rss_kib  # bench/peak_rss.py, beside this script

from xsa_exp.memory import state_bytes
from xsa_exp.precision import BF16_COMPUTE

REPO = Path(__file__).resolve().parents[1]
WIDTHS = {"d12": (768, 12), "d24": (1024, 16)}
SEQ, VOCAB = 2048, 32768


def measure(width: int, heads: int, layers: int, compiled: bool, precision: str, fused: bool) -> int:
    """Transient bytes of one training step of one sequence, in a fresh process."""
    return measure_in_child(__file__, width, heads, layers, int(compiled), precision, int(fused))


def child(width: int, heads: int, layers: int, compiled: bool, precision: str, fused: bool) -> None:
    import torch
    from hydra import compose, initialize_config_dir

    from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
    from xsa_exp.model import GPT, GPTConfig
    from xsa_exp.optim import MuonAdamW, build_param_groups
    from xsa_exp.precision import prepare

    overrides = [f"model.n_embd={width}", f"model.n_head={heads}", f"model.n_layer={layers}",
                 f"model.sequence_len={SEQ}", f"model.vocab_size={VOCAB}", "data=climbmix", "data.local_dir=/",
                 f"model.fused_loss_head={fused}", "optim.muon.ns_dtype=bfloat16"]  # CUDA's, whatever this CPU's
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    torch.manual_seed(0)
    model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    prepare(model, precision)
    optimizer = MuonAdamW(build_param_groups(model, cfg.optim, None, compiled))
    forward = torch.compile(model.forward, fullgraph=True) if compiled else model.forward
    batch = torch.randint(0, VOCAB, (1, SEQ + 1))

    def step() -> None:
        optimizer.zero_grad(set_to_none=False)  # grads stay allocated, as after the first step of a run
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != BF16_COMPUTE):
            loss = forward(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()

    step(), step()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set (VmHWM) to the current one
    before = rss_kib("VmRSS")
    step()
    print((rss_kib("VmHWM") - before) * 1024)


def preset_counts(depth: str) -> tuple[dict, dict]:
    import torch
    from hydra import compose, initialize_config_dir

    from xsa_exp.config.schema import ModelConfig, XSAConfig, typed
    from xsa_exp.model import GPT, GPTConfig

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"depth={depth}", "data=climbmix", "data.local_dir=/"])
    with torch.device("meta"):
        model = GPT(GPTConfig.of(typed(cfg.model, ModelConfig), typed(cfg.xsa, XSAConfig)))
    return model.param_counts(), {"layers": cfg.model.n_layer, "device_batch_size": cfg.train.device_batch_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--precision", choices=["bf16-mixed", BF16_COMPUTE], default="bf16-mixed")
    parser.add_argument("--fused-loss-head", action="store_true", help="model.fused_loss_head=true")
    parser.add_argument("--presets", nargs="+", choices=list(WIDTHS), default=list(WIDTHS))
    parser.add_argument("--modes", nargs="+", choices=["eager", "compiled"], default=["eager", "compiled"])
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        width, heads, layers, compiled, precision, fused = args.child
        child(int(width), int(heads), int(layers), bool(int(compiled)), precision, bool(int(fused)))
        return
    figures = {"date": str(date.today()), "seq": SEQ, "vocab": VOCAB, "precision": args.precision,
               "fused_loss_head": args.fused_loss_head, "presets": {}}
    print(f"{'preset':<6} {'mode':<9} {'fixed B/token':>13} {'per layer B/token':>17} {'state GB':>9} "
          f"{'micro-batch':>11} {'predicted peak GB':>17} {'fits 80 GB':>10} {'fits 141 GB':>11} "
          f"{'largest batch on 80 GB':>22}")
    for depth in args.presets:
        width, heads = WIDTHS[depth]
        counts, preset = preset_counts(depth)
        state = state_bytes(counts, muon=True)
        if args.precision == BF16_COMPUTE:  # the embeddings' weights, gradients and AdamW moments in bf16
            state -= 8 * (VOCAB * width + counts["value embeddings"])
        for compiled in (mode == "compiled" for mode in args.modes):
            two, four = (measure(width, heads, layers, compiled, args.precision, args.fused_loss_head)
                         for layers in (2, 4))
            per_layer = (four - two) / 2 / SEQ
            fixed = two / SEQ - 2 * per_layer
            per_token = fixed + preset["layers"] * per_layer
            batch = preset["device_batch_size"]
            peak = (state + batch * SEQ * per_token) / 1e9
            largest = max(0, int((80e9 - state) / (SEQ * per_token)))
            mode = "compiled" if compiled else "eager"
            figures["presets"][f"{depth} {mode}"] = {"fixed_bytes_per_token": fixed,
                                                     "per_layer_bytes_per_token": per_layer,
                                                     "state_gb": state / 1e9, "device_batch_size": batch,
                                                     "predicted_peak_gb": peak, "largest_batch_80gb": largest}
            print(f"{depth:<6} {mode:<9} {fixed:>13,.0f} {per_layer:>17,.0f} {state / 1e9:>9.2f} {batch:>11} "
                  f"{peak:>17.1f} {'yes' if peak <= 80 else 'no':>10} {'yes' if peak <= 141 else 'no':>11} "
                  f"{largest:>22}")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
