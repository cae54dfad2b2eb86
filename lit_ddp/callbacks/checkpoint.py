"""ModelCheckpoint whose ``last.ckpt`` is always the latest state, so resuming continues where a run stopped.

Since Lightning 2.6, ``save_last=True`` writes last.ckpt only at steps where a top-k checkpoint is written
too: with ``monitor="val/acc", save_top_k=1`` it is a copy of the best epoch, and ``--ckpt_path=last.ckpt``
silently restarts from there (reported downstream in openclimatefix/pvnet#544). Found by
tests/test_ddp_semantics.py (resume, and validating the final weights).
"""

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint as _LightningModelCheckpoint


class ModelCheckpoint(_LightningModelCheckpoint):
    """Lightning's ModelCheckpoint; with ``save_last=True`` last.ckpt is also written when no top-k one is."""

    def _save_latest(self, trainer: Trainer) -> None:
        # Skipped when this step was saved already (then Lightning has written last.ckpt too), in sanity
        # checks and outside fit. Every rank calls this (trainer.save_checkpoint writes on rank 0 only).
        if self.save_last is True and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_latest(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_latest(trainer)
