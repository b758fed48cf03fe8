"""The LightningModule: one GPT, one MuonAdamW optimizer, one step-interval schedule."""

from __future__ import annotations

import math

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from xsa_exp.config.arithmetic import Transfer
from xsa_exp.config.schema import OptimConfig
from xsa_exp.data.packing import inputs_and_targets
from xsa_exp.errors import XsaExpWarning
from xsa_exp.model import GPT
from xsa_exp.optim import MuonAdamW, OptimizerSchedule, build_param_groups
from xsa_exp.run_dir import checkpoint_meta


def update_guard(params, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient norm over params and MuonAdamW's found_inf (1.0 when the loss or the norm is not finite), both
    left on the device."""
    grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    return grad_norm, (~(torch.isfinite(grad_norm) & torch.isfinite(loss))).float()


class LanguageModel(L.LightningModule):
    def __init__(self, model: GPT, optim_cfg: OptimConfig, transfer: Transfer | None, total_steps: int,
                 run_config: dict | None, max_skipped_steps: int, compile: bool):
        super().__init__()
        self.model = model
        # Compiled: the training forward (one shape, one graph) and Muon's step (one graph per shape group).
        # Evaluations call the eager model, whose shapes change from batch to batch (CORE's examples, the last
        # validation batch) and would recompile. fullgraph: a graph break (a torch version that cannot trace a call)
        # fails here instead of silently splitting the forward into graphs and eager Python between them.
        # An earlier run of this process (a sweep's job, in Hydra's own launcher or a reused joblib worker) compiled
        # GPT.forward for its own model: its graphs would count against torch's recompile limit (8), which fullgraph
        # makes an error at the 9th model of another shape.
        self.compiled = compile
        if compile:
            torch._dynamo.reset()
        self.train_forward = torch.compile(model.forward, fullgraph=True) if compile else model.forward
        self.optim_cfg, self.transfer = optim_cfg, transfer
        self.total_steps = total_steps
        self.run_config = run_config
        self.max_skipped_steps = max_skipped_steps
        self.skipped_steps = 0
        self._reset_update_stats()

    def on_fit_start(self) -> None:
        if self.device.type == "cuda":  # windowed layers train through FlexAttention's block masks
            self.model.use_block_masks(self.model.config.sequence_len, self.device)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Enough to rebuild the model without the run directory: its config, and where its tokenizer lives.
        checkpoint["xsa_exp"] = checkpoint_meta(self.run_config, self.skipped_steps)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.skipped_steps = checkpoint.get("xsa_exp", {}).get("skipped_steps", 0)

    def _reset_update_stats(self) -> None:
        self._loss_sum: torch.Tensor | None = None
        self._micro_batches = 0
        self._pending: list[dict] = []  # the updates since the last pop_update_stats, as device tensors and floats

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.train_forward(*inputs_and_targets(batch))
        self._loss_sum = loss.detach() if self._loss_sum is None else self._loss_sum + loss.detach()
        self._micro_batches += 1
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        # Called once per update, after the last micro-batch's backward and before clipping. Nothing here reads a
        # device value: a non-finite loss or gradient sets the optimizer's found_inf, which skips the update on the
        # device (weights and state unchanged); pop_update_stats counts the skips against the budget.
        loss = self._loss_sum / self._micro_batches
        grad_norm, optimizer.found_inf = update_guard(self.parameters(), loss)
        update = {"loss": loss, "grad_norm": grad_norm, "found_inf": optimizer.found_inf,
                  "step": self.trainer.global_step + 1}
        for group in optimizer.param_groups:
            update[f"lr/{group['role']}"] = group["lr"]
            if group["algorithm"] == "muon":
                update["muon_momentum"] = group["momentum"]
        self._pending.append(update)
        self._loss_sum, self._micro_batches = None, 0

    def pop_update_stats(self) -> list[dict[str, float]]:
        """The updates taken since the last call, in order: mean train loss over the micro-batches (and ranks), grad
        norm, lrs and the skips so far, read from the device in one go. A skip beyond train.skip_nonfinite_steps raises
        FloatingPointError naming its step (its update never reached the weights)."""
        pending, self._pending = self._pending, []
        if not pending:
            return []
        losses = self.trainer.strategy.reduce(torch.stack([u["loss"] for u in pending]), reduce_op="mean")
        values = torch.stack([losses, *(torch.stack([u[k] for u in pending]) for k in ("grad_norm", "found_inf"))], 1)
        stats = []
        for update, (loss, grad_norm, found_inf) in zip(pending, values.tolist()):
            if found_inf:
                self._count_skip(update["step"], "loss" if not math.isfinite(loss) else "gradient")
            fixed = {k: float(v) for k, v in update.items() if k not in ("loss", "grad_norm", "found_inf", "step")}
            stats.append({"step": update["step"], "loss": loss, "grad_norm": grad_norm,
                          "skipped_steps": float(self.skipped_steps), **fixed})
        return stats

    def _count_skip(self, step: int, what: str) -> None:
        if self.skipped_steps >= self.max_skipped_steps:
            raise FloatingPointError(f"non-finite {what} at step {step}; lower the learning rates, enable "
                                     "train.grad_clip, or allow train.skip_nonfinite_steps")
        self.skipped_steps += 1
        rank_zero_warn(f"non-finite {what} at step {step}: update skipped "
                       f"({self.skipped_steps} of train.skip_nonfinite_steps={self.max_skipped_steps})",
                       category=XsaExpWarning)

    def configure_optimizers(self):
        optimizer = MuonAdamW(build_param_groups(self.model, self.optim_cfg, self.transfer, self.compiled))
        muon, schedule = self.optim_cfg.muon, self.optim_cfg.schedule
        scheduler = OptimizerSchedule(
            optimizer, self.total_steps, schedule.warmup_steps, schedule.warmdown_frac, schedule.final_lr_frac,
            muon.momentum_start, muon.momentum, muon.momentum_warmup_steps, muon.momentum_warmdown,
            muon.weight_decay_schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
