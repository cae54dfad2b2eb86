"""The TensorBoard writer behind a trainer's loggers, for what only TensorBoard shows (images, text)."""

from lightning import Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.tensorboard import SummaryWriter


def tensorboard_writer(trainer: Trainer) -> SummaryWriter | None:
    """The SummaryWriter of the first TensorBoardLogger; None without one. Call on rank 0 only: other
    ranks' loggers are dummies, and creating the writer creates the run directory."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.experiment
    return None
