"""The evaluations a run makes while it trains, each on its own schedule: validation bits-per-byte, CORE and the
attention diagnostics (with the learned residual scalars and learnable alphas)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from xsa_exp import run_dir as rd
from xsa_exp.eval.bpb import evaluate_bpb
from xsa_exp.eval.core import evaluate_core
from xsa_exp.eval.diagnostics import attention_diagnostics, flatten_diagnostics
from xsa_exp.training.metrics_log import log_row


class ScheduledEvaluation(L.Callback):
    """Runs `measure` at step 0 (before any update), every `every` steps and at the last step; every <= 0 turns it
    off."""

    def __init__(self, every: int, tokens_per_step: int):
        self.every, self.tokens_per_step = every, tokens_per_step
        self.last_step = -1

    def measure(self, trainer, pl_module) -> dict[str, float]:
        raise NotImplementedError

    def run(self, trainer, pl_module) -> None:
        step = trainer.global_step
        row = self.measure(trainer, pl_module)
        log_row(trainer, row, step, self.tokens_per_step)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in row.items() if self.headline(k))
        rank_zero_info(f"step {step:>6}/{trainer.max_steps} | {shown}{self.console_note(trainer)}")
        self.last_step = step

    def headline(self, key: str) -> bool:
        """Whether a metric goes on the console line (all go to the loggers)."""
        return True

    def console_note(self, trainer) -> str:
        """Text after the console line's numbers, e.g. how much of the split they cover."""
        return ""

    def on_train_start(self, trainer, pl_module) -> None:
        if self.every > 0 and trainer.global_step == 0:
            self.run(trainer, pl_module)
        self.last_step = trainer.global_step  # a resumed run logged this step's rows before its checkpoint

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every > 0 and step != self.last_step and (step % self.every == 0 or step == trainer.max_steps):
            self.run(trainer, pl_module)


class ValidationBPB(ScheduledEvaluation):
    """Validation bits-per-byte over the whole validation split, or its first `val_tokens` (then the console says
    so)."""

    def __init__(self, every: int, val_tokens: int | None, tokens_per_step: int):
        super().__init__(every, tokens_per_step)
        self.val_tokens = val_tokens

    def measure(self, trainer, pl_module) -> dict[str, float]:
        datamodule = trainer.datamodule
        batches = datamodule.val_batches(self.val_tokens, trainer.global_rank, trainer.world_size)
        # Same autocast as training (bf16-mixed on CUDA), so the numbers match evaluate.py's.
        bpb = evaluate_bpb(pl_module.model, batches, datamodule.token_bytes, trainer.precision_plugin.forward_context)
        return {"val/bpb": bpb}

    def console_note(self, trainer) -> str:
        scope = rd.describe_val_scope(trainer.datamodule.val_scope(self.val_tokens))
        return f" ({scope})" if scope else ""


class CoreEvaluation(ScheduledEvaluation):
    """CORE on the eval bundle, capped at max_per_task examples per task (nanochat uses 500 in training)."""

    def __init__(self, every: int, tokens_per_step: int, bundle_dir, max_per_task: int | None):
        super().__init__(every, tokens_per_step)
        self.bundle_dir, self.max_per_task = bundle_dir, max_per_task

    def measure(self, trainer, pl_module) -> dict[str, float]:
        model = pl_module.model
        with trainer.precision_plugin.forward_context():  # the ranks share the examples; each gets the whole result
            result = evaluate_core(model, trainer.datamodule.tokenizer, self.bundle_dir, model.config.max_input_len,
                                   self.max_per_task, rank=trainer.global_rank, world_size=trainer.world_size)
        # The key says how many of the 22 tasks it covers, so a partial CORE is never read as the full one.
        key = "core/CORE" if result.n_tasks == result.n_total else f"core/CORE_{result.n_tasks}of{result.n_total}"
        return {key: result.core, **{f"core/{label}": t.centered for label, t in result.tasks.items()}}

    def headline(self, key: str) -> bool:
        return key.startswith("core/CORE")


class AttentionDiagnostics(ScheduledEvaluation):
    """attn_self_cos, out_self_cos, diag_attn, value_sim, attn_entropy on a fixed validation batch:
    per layer (head mean) and overall in the metrics; every head in diagnostics.jsonl, with the alpha
    each head applies ("alpha"; learnable runs also log xsa/alpha and xsa/alpha/L{layer}). With the model's
    residual scalars, also their values per layer (lambda/resid/L{layer}, lambda/x0/L{layer}): how much of
    the token's own embedding each block is given back, which XSA's removal of the self direction may change."""

    def __init__(self, every: int, tokens_per_step: int, rows: int, run_dir):
        super().__init__(every, tokens_per_step)
        self.rows, self.run_dir = rows, run_dir

    def measure(self, trainer, pl_module) -> dict[str, float]:
        idx = trainer.datamodule.diagnostics_inputs(self.rows).to(pl_module.device)
        model = pl_module.model
        diag = attention_diagnostics(model, idx, trainer.precision_plugin.forward_context)
        alphas = model.xsa_alphas()
        if trainer.is_global_zero:
            rd.append_diagnostics(self.run_dir, {"step": trainer.global_step,
                                                 **{k: v.tolist() for k, v in diag.items()},
                                                 "alpha": alphas.tolist()})
        row = {k: v for k, v in flatten_diagnostics(diag).items() if "/H" not in k}
        if model.config.xsa.learnable:  # what the model has learned, per layer (mean over heads; 0 where XSA is off)
            row["xsa/alpha"] = alphas.mean().item()
            row.update({f"xsa/alpha/L{layer}": heads.mean().item() for layer, heads in enumerate(alphas)})
        for name, values in model.residual_scalars().items():
            row.update({f"lambda/{name}/L{layer}": value for layer, value in enumerate(values.tolist())})
        return row

    def headline(self, key: str) -> bool:
        return "/L" not in key
