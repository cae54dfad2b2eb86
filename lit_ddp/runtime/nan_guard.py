"""A non-finite loss stops training before it reaches the weights, saying where and what to resume from.

The check runs just before each optimizer step, on the gradients: after DDP's all-reduce they are
identical on every rank, so every rank stops at the same step without an extra collective (a check of the
local loss would stop one rank and leave the others waiting in the next all-reduce). A NaN or inf loss on
any rank makes the averaged gradients non-finite; so does an overflow in the backward pass of a finite
loss.
"""

import torch
from lightning import Callback, LightningModule, Trainer
from torch.optim import Optimizer

from lit_ddp.errors import UserError
from lit_ddp.runtime.preemption import last_checkpoint_path


class NonFiniteLossError(UserError):
    """Training diverged; the message names the step and the checkpoint to resume from."""


def _resume_hint(trainer: Trainer) -> str:
    last = last_checkpoint_path(trainer)
    if not last.is_file():
        best = (getattr(cb, "best_model_path", "") for cb in trainer.checkpoint_callbacks)
        last = next((path for path in best if path), "")
    if last:
        return f"resume with --ckpt_path={last} and a lower --model.optim.lr or --trainer.gradient_clip_val"
    return "no checkpoint was saved yet: restart with a lower --model.optim.lr or --trainer.gradient_clip_val"


class NanGuard(Callback):
    """Raises NonFiniteLossError at the first optimizer step whose gradients are NaN or infinite."""

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: Optimizer
    ) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        # One fused norm per device and one host sync per step: NaN/inf anywhere makes the total non-finite.
        total = torch.nn.utils.get_total_norm(grads)
        if torch.isfinite(total):
            return
        loss = trainer.callback_metrics.get("train/loss_step")
        loss_text = f" (last logged train/loss {float(loss):.4g})" if loss is not None else ""
        batch = trainer.fit_loop.epoch_loop.batch_progress.current.ready - 1
        raise NonFiniteLossError(
            f"non-finite loss or gradients at step {trainer.global_step} (epoch {trainer.current_epoch},"
            f" batch {batch}){loss_text}; training stopped before this update: {_resume_hint(trainer)}"
        )
