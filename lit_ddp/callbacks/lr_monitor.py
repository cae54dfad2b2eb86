"""Lightning's LearningRateMonitor, except that a run without a logger (``--trainer.logger=false``) skips
it instead of failing: it is on by default, so it must not make a plain option an error; and that it writes
one point per logged optimizer step under gradient accumulation."""

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import LearningRateMonitor as _LightningLearningRateMonitor


class DashboardLearningRate(_LightningLearningRateMonitor):
    """Logs ``lr-<Optimizer>/pg<N>``, the learning rate of each param group (Lightning's callback).

    Fork of ``lightning.pytorch.callbacks.LearningRateMonitor``: it raises in a run without a logger, and
    writes each logged step's rates once for every accumulated batch; goes when it skips a run without a
    logger and writes a step once. Named apart from it: ``--trainer.callbacks+=LearningRateMonitor`` finds
    a class by its name, and two of one name are none.
    """

    _written_at: int | None = None  # the optimizer step whose rates this fit has written

    def on_train_start(self, trainer: Trainer, *args, **kwargs) -> None:
        self._written_at = None
        if trainer.loggers:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: Trainer, *args, **kwargs) -> None:
        # Every batch of an accumulated optimizer step passes Lightning's logging check, at the same step
        # and with the same rates: the first writes them.
        step = trainer.global_step  # read once: a chain of properties down to the optimizer's progress
        if trainer.loggers and step != self._written_at:
            self._written_at = step
            super().on_train_batch_start(trainer, *args, **kwargs)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.loggers:
            super().on_train_epoch_start(trainer, pl_module)
