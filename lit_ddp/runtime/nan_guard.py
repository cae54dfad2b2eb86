"""A non-finite loss stops training before it reaches the weights, saying where and what to resume from.

The check runs just before each optimizer step, on the gradients: after DDP's all-reduce they are
identical on every rank, so every rank stops at the same step without an extra collective (a check of the
local loss would stop one rank and leave the others waiting in the next all-reduce). A NaN or inf loss on
any rank makes the averaged gradients non-finite; so does an overflow in the backward pass of a finite
loss.

Under ``16-mixed`` precision an overflow is the GradScaler's business: it skips that step and lowers its
scale, by design and again whenever the scale has grown too far. The guard then stops only when every step
of ``max_skipped_steps`` in a row was skipped, which a diverged loss causes and the scaler cannot cure.
The check takes the largest absolute gradient (the inf-norm), which overflows only if a gradient is
already infinite, so finite ``16-true`` gradients pass.
"""

import math

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
    """Raises NonFiniteLossError at the first optimizer step whose gradients are NaN or infinite (under a
    GradScaler: after ``max_skipped_steps`` such steps in a row)."""

    def __init__(self, max_skipped_steps: int = 20) -> None:
        if max_skipped_steps < 1:
            raise UserError(f"--nan_guard.max_skipped_steps={max_skipped_steps} must be 1 or more")
        self.max_skipped_steps = max_skipped_steps
        self._skipped = 0  # consecutive non-finite steps the GradScaler skipped

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: Optimizer
    ) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        # One fused reduction per device and one host sync per step: NaN/inf anywhere makes it non-finite.
        largest = torch.nn.utils.get_total_norm(grads, norm_type=math.inf)
        if torch.isfinite(largest):
            self._skipped = 0
            return
        scaled = getattr(trainer.precision_plugin, "scaler", None) is not None  # 16-mixed
        if scaled:
            self._skipped += 1
            if self._skipped < self.max_skipped_steps:
                return  # the scaler skips this step and lowers its scale
        loss = trainer.callback_metrics.get("train/loss_step")
        loss_text = f" (last logged train/loss {float(loss):.4g})" if loss is not None else ""
        batch = trainer.fit_loop.epoch_loop.batch_progress.current.ready - 1
        streak = f" for {self._skipped} steps in a row (the GradScaler skipped them)" if scaled else ""
        raise NonFiniteLossError(
            f"non-finite loss or gradients at step {trainer.global_step} (epoch {trainer.current_epoch},"
            f" batch {batch}){streak}{loss_text}; training stopped before this update:"
            f" {_resume_hint(trainer)}"
        )
