"""Lightning's LearningRateMonitor, except that a run without a logger (``--trainer.logger=false``) skips
it instead of failing: it is on by default, so it must not make a plain option an error."""

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import LearningRateMonitor as _LightningLearningRateMonitor


class LearningRateMonitor(_LightningLearningRateMonitor):
    """Logs ``lr-<Optimizer>/pg<N>``, the learning rate of each param group (Lightning's callback).

    Fork of ``lightning.pytorch.callbacks.LearningRateMonitor``: it raises in a run without a logger; goes
    when it skips one.
    """

    def on_train_start(self, trainer: Trainer, *args, **kwargs) -> None:
        if trainer.loggers:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: Trainer, *args, **kwargs) -> None:
        if trainer.loggers:
            super().on_train_batch_start(trainer, *args, **kwargs)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.loggers:
            super().on_train_epoch_start(trainer, pl_module)
