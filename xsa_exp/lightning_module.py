"""The LightningModule: one GPT, one MuonAdamW optimizer, one step-interval schedule."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from xsa_exp.data.packing import inputs_and_targets
from xsa_exp.model import GPT
from xsa_exp.optim import MuonAdamW, WarmupConstantWarmdown, build_param_groups
from xsa_exp.run_dir import checkpoint_meta


class LanguageModel(L.LightningModule):
    def __init__(self, model: GPT, optim_cfg, total_steps: int, run_config: dict | None = None,
                 max_skipped_steps: int = 0, compile_forward: bool = False):
        super().__init__()
        self.model = model
        # Only the training forward is compiled (one shape, one graph); evaluations call the eager model, whose
        # shapes change from batch to batch (CORE's examples, the last validation batch) and would recompile.
        self.train_forward = torch.compile(model.forward) if compile_forward else model.forward
        self.optim_cfg = optim_cfg
        self.total_steps = total_steps
        self.run_config = run_config
        self.max_skipped_steps = max_skipped_steps
        self.skipped_steps = 0
        self._reset_update_stats()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Enough to rebuild the model without the run directory: its config, and where its tokenizer lives.
        checkpoint["xsa_exp"] = checkpoint_meta(self.run_config, self.skipped_steps)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.skipped_steps = checkpoint.get("xsa_exp", {}).get("skipped_steps", 0)

    def _reset_update_stats(self) -> None:
        self._loss_sum = torch.zeros(())
        self._micro_batches = 0
        self._update = {}

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.train_forward(*inputs_and_targets(batch))
        self._loss_sum = self._loss_sum.to(loss.device) + loss.detach()
        self._micro_batches += 1
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        # Called once per update, after the last micro-batch's backward and before clipping.
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads)
        if not (torch.isfinite(grad_norm) and torch.isfinite(self._loss_sum)):
            what = "loss" if not torch.isfinite(self._loss_sum) else "gradient"
            step = self.trainer.global_step + 1
            if self.skipped_steps >= self.max_skipped_steps:
                # Stop before the bad update reaches the weights; the last checkpoint stays the last good state.
                raise FloatingPointError(f"non-finite {what} at step {step}; lower the learning rates, enable "
                                         "train.grad_clip, or allow train.skip_nonfinite_steps")
            # Skip: no parameter has a gradient, so the optimizer leaves weights and state untouched.
            self.skipped_steps += 1
            for p in self.parameters():
                p.grad = None
            rank_zero_warn(f"non-finite {what} at step {step}: update skipped "
                           f"({self.skipped_steps} of train.skip_nonfinite_steps={self.max_skipped_steps})")
        self._update["skipped_steps"] = self.skipped_steps
        self._update["grad_norm"] = grad_norm
        for group in optimizer.param_groups:
            self._update[f"lr/{group['role']}"] = group["lr"]
            if group["algorithm"] == "muon":
                self._update["muon_momentum"] = group["momentum"]

    def pop_update_stats(self) -> dict[str, float]:
        """Mean train loss over the micro-batches (and ranks) of the update just taken, its grad norm and lrs."""
        loss = self.trainer.strategy.reduce(self._loss_sum / self._micro_batches, reduce_op="mean")
        stats = {"loss": loss.item(), **{k: float(v) for k, v in self._update.items()}}
        self._reset_update_stats()
        return stats

    def configure_optimizers(self):
        optimizer = MuonAdamW(build_param_groups(self.model, self.optim_cfg))
        muon, schedule = self.optim_cfg.muon, self.optim_cfg.schedule
        scheduler = WarmupConstantWarmdown(
            optimizer, self.total_steps, schedule.warmup_frac, schedule.warmdown_frac, schedule.final_lr_frac,
            muon.momentum_start, muon.momentum, muon.momentum_warmup_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
