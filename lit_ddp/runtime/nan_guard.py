"""A non-finite loss stops training before it reaches the weights, saying where and what to resume from.

The check runs just before each optimizer step, on the gradients: after DDP's all-reduce they are
identical on every rank, so every rank stops at the same step without an extra collective (a check of the
local loss would stop one rank and leave the others waiting in the next all-reduce). A NaN or inf loss on
any rank makes the averaged gradients non-finite; so does an overflow in the backward pass of a finite
loss.

Under ``16-mixed`` precision an overflow is the GradScaler's business: it skips that step and lowers its
scale, by design and again whenever the scale has grown too far. The guard then stops only when every step
of ``max_skipped_steps`` in a row was skipped, which a diverged loss causes and the scaler cannot cure.
The check is the total norm of the gradients (torch.nn.utils.get_total_norm: fused per device where
torch has a fused kernel; on a CPU the same norm of norms, tensor by tensor), read as one number: a NaN
or inf anywhere makes it non-finite. Read at once on a CPU, fp32 and fp64 gradients are checked by the sum
of their squares in numpy instead (the squared 2-norm, one call per tensor where torch dispatches several
ops): non-finite where the 2-norm is, and beyond that only where one gradient's square overflows, as the
optimizer's own squares then do. The norm is the 2-norm, whose CPU kernel is vectorised (the
inf-norm's is not). fp16 gradients get the inf-norm, the largest absolute value, which overflows only if a
gradient is already infinite: a sum of finite fp16 squares overflows at 65504 (``16-true``). In fp32 and
bf16 the 2-norm overflows only beyond ~1e19, where the optimizer's own squares have overflowed too.

Reading the verdict on the host waits for the GPU to finish every kernel queued so far, which stalls the
next step's launch on every step. On CUDA the guard therefore copies the verdict to pinned host memory
without waiting and reads it at the next step (``read="next_step"``), when it has long arrived: the bad
update is applied, training stops one step later, naming the step that went wrong, and every checkpoint
write reads the verdict first, so no checkpoint ever holds that update. On a CPU there is nothing to stall
and the guard reads at once, stopping before the update (``read="now"``).
"""

import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from lightning import Callback, LightningModule, Trainer
from torch.optim import Optimizer

from lit_ddp.compat import batch_in_progress
from lit_ddp.errors import UserError
from lit_ddp.runtime.preemption import last_checkpoint_path


def _position(trainer: Trainer) -> tuple[int, int, int]:
    """(optimizer step, epoch, batch in the epoch) of the step being taken."""
    return trainer.global_step, trainer.current_epoch, batch_in_progress(trainer)


def _total_norm(grads: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """The norm of the gradients' norms, as ``torch.nn.utils.get_total_norm`` computes it. On a CPU its
    grouping, foreach dispatch and no-grad wrapper cost several times the per-tensor norms of a small model
    (docs/benchmarks.md, ``bench_step_overhead --device-ops``), and no kernel fuses there: the norms are
    taken one by one."""
    if all(g.is_cpu for g in grads):
        norms = torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads])
        return torch.linalg.vector_norm(norms, norm_type)
    return torch.nn.utils.get_total_norm(grads, norm_type)


# numpy's dot of a gradient with itself, the squared 2-norm: no fp16 (whose sum of squares of finite
# gradients overflows), nor bf16, which numpy lacks.
_HOST_SQUARED = (torch.float32, torch.float64)


def _finite_on_cpu(grads: list[torch.Tensor]) -> bool | None:
    """Whether the gradients are all finite, from the sum of their squares (``_total_norm``'s 2-norm,
    squared) taken in numpy; None where numpy cannot take them (another device, dtype or layout)."""
    total = 0.0
    with np.errstate(all="ignore"):  # an overflow is the verdict, not a warning
        for g in grads:
            if not g.is_cpu or g.dtype not in _HOST_SQUARED or g.layout != torch.strided:
                return None
            # A gradient needs no detach unless it has a graph of its own (create_graph): one op less each.
            a = (g.detach() if g.requires_grad else g).numpy().ravel()
            total += float(np.dot(a, a))  # NaN and ±inf propagate
    return math.isfinite(total)


class NonFiniteLossError(UserError):
    """Training diverged; the message names the step and the checkpoint to resume from."""


def _resume_hint(trainer: Trainer) -> str:
    last = last_checkpoint_path(trainer)
    if not Path(last).is_file():
        best = (getattr(cb, "best_model_path", "") for cb in trainer.checkpoint_callbacks)
        last = next((path for path in best if path and Path(path).is_file()), "")  # a save may have failed
    if last:
        return f"resume with --ckpt_path={last} and a lower --model.optim.lr or --trainer.gradient_clip_val"
    return "no checkpoint was saved yet: restart with a lower --model.optim.lr or --trainer.gradient_clip_val"


class NanGuard(Callback):
    """Raises NonFiniteLossError at the first optimizer step whose gradients are NaN or infinite (under a
    GradScaler: after ``max_skipped_steps`` such steps in a row). ``read``: "now" (before that update),
    "next_step" (one step later, without a device sync), or "auto": "next_step" on CUDA, else "now"."""

    def __init__(
        self, max_skipped_steps: int = 20, read: Literal["auto", "now", "next_step"] = "auto"
    ) -> None:
        if max_skipped_steps < 1:
            raise UserError(f"--resilience.max_skipped_steps={max_skipped_steps} must be 1 or more")
        self.max_skipped_steps = max_skipped_steps
        self.read = read
        self._skipped = 0  # consecutive non-finite steps the GradScaler skipped
        self._host: torch.Tensor | None = None  # pinned, for the verdict's copy (next_step)
        self._pending: tuple[torch.cuda.Event | None, tuple[int, int, int]] | None = None

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: Optimizer
    ) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        self._read_pending(trainer)  # the previous step's verdict (next_step): arrived long ago
        if self.read != "next_step":
            finite = _finite_on_cpu(grads)  # None off a CPU: "auto" then reads as on_cuda says
            if finite is not None:
                self._judge(trainer, finite, None, late=False)
                return
        norm_type = math.inf if any(g.dtype == torch.float16 for g in grads) else 2.0
        largest = _total_norm(grads, norm_type)  # NaN and ±inf propagate
        on_cuda = largest.device.type == "cuda"
        if self.read == "now" or (self.read == "auto" and not on_cuda):
            # No position passed: _judge reads this step's only if it fails.
            self._judge(trainer, math.isfinite(largest.item()), None, late=False)
            return
        if self._host is None:
            self._host = torch.empty((), dtype=torch.float32, pin_memory=on_cuda)
        self._host.copy_(largest, non_blocking=on_cuda)
        event = None
        if on_cuda:
            event = torch.cuda.Event()
            event.record()
        self._pending = (event, _position(trainer))

    def _read_pending(self, trainer: Trainer) -> None:
        if self._pending is None:
            return
        (event, where), self._pending = self._pending, None
        if event is not None:
            event.synchronize()  # waits for that step's check alone, not for the work queued since
        self._judge(trainer, math.isfinite(self._host.item()), where, late=True)

    def _judge(self, trainer: Trainer, finite: bool, where: tuple[int, int, int] | None, late: bool) -> None:
        if finite:
            self._skipped = 0
            return
        scaled = getattr(trainer.precision_plugin, "scaler", None) is not None  # 16-mixed
        if scaled:
            self._skipped += 1
            if self._skipped < self.max_skipped_steps:
                return  # the scaler skips this step and lowers its scale
        step, epoch, batch = where or _position(trainer)
        loss = trainer.callback_metrics.get("train/loss_step")
        loss_text = f" (last logged train/loss {float(loss):.4g})" if loss is not None else ""
        streak = f" for {self._skipped} steps in a row (the GradScaler skipped them)" if scaled else ""
        stopped = "before this update" if not late else "one step later, and no checkpoint holds that update"
        raise NonFiniteLossError(
            # epochs and batches count from 1, as the progress bar does (runtime/position.py)
            f"non-finite loss or gradients at step {step} (epoch {epoch + 1}, batch {batch + 1}){streak}"
            f"{loss_text};"
            f" training stopped {stopped}: {_resume_hint(trainer)}"
        )

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        self._read_pending(trainer)  # on every rank, before anything is written

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._read_pending(trainer)
