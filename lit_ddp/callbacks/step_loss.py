"""The training batch loss, ``train/loss_step``, on the steps Lightning writes, and in the progress bar.

A callback rather than ``self.log`` in ``training_step``: Lightning's bookkeeping of a value logged on every
step costs a sizeable share of a small model's step (docs/benchmarks.md), while the value is written only
every ``log_every_n_steps``. Logged on those steps alone, it costs a fraction of that.

Not logged with ``prog_bar=True``: Lightning would then turn the cached value into a Python float after
every step, a blocking device-to-host copy (a full device sync on a GPU) per step. lit_ddp's progress bar
shows it instead, read when it redraws (callbacks/console.py).
"""

from lightning import Callback, LightningModule, Trainer
from torch import Tensor

STEP_LOSS = "train/loss_step"


class StepLoss(Callback):
    """Logs this rank's batch loss as ``train/loss_step`` every ``log_every_n_steps`` optimizer steps."""

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        every = trainer.log_every_n_steps
        # Lightning writes step values after this hook when the optimizer steps so far are a multiple of it,
        # and on the step a stop was decided (should_stop: max_time, a callback), where it would otherwise
        # write the value cached at the last multiple (the CLI runs Lightning's Timer before this callback).
        if every <= 0 or (trainer.global_step % every != 0 and not trainer.should_stop):
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if not isinstance(loss, Tensor):
            return
        if pl_module.automatic_optimization:
            # Lightning passes on the loss it divided by accumulate_grad_batches for the backward pass: the
            # batch's own loss is that times the accumulation (a manual step's output is not divided).
            loss = loss * trainer.accumulate_grad_batches
        pl_module.log(STEP_LOSS, loss.detach(), on_step=True, on_epoch=False)
