"""The TensorBoard dashboard, the console (progress bar, model and epoch summaries), predictions.csv and
last.ckpt: plain callbacks on Lightning's public API.

Which of them a ``python -m lit_ddp`` run gets, and in which order, is declared in one list in
lit_ddp/assembly.py (``CALLBACKS``).
"""

from lit_ddp.callbacks.confusion import ConfusionMatrix
from lit_ddp.callbacks.console import ConsoleModelSummary, ProgressBar
from lit_ddp.callbacks.dashboard import Dashboard
from lit_ddp.callbacks.ema import EMA
from lit_ddp.callbacks.group import CallbackGroup
from lit_ddp.callbacks.images import TrainBatchImages
from lit_ddp.callbacks.last_checkpoint import LastCheckpoint
from lit_ddp.callbacks.lr_monitor import DashboardLearningRate
from lit_ddp.callbacks.predictions import PredictionWriter
from lit_ddp.callbacks.run_info import RunInfo
from lit_ddp.callbacks.skipped_images import SkippedImagesReport
from lit_ddp.callbacks.step_loss import StepLoss
from lit_ddp.callbacks.summary import EpochSummary
from lit_ddp.callbacks.throughput import Throughput

__all__ = [
    "CallbackGroup",
    "ConfusionMatrix",
    "ConsoleModelSummary",
    "Dashboard",
    "DashboardLearningRate",
    "EMA",
    "EpochSummary",
    "LastCheckpoint",
    "PredictionWriter",
    "ProgressBar",
    "RunInfo",
    "SkippedImagesReport",
    "StepLoss",
    "Throughput",
    "TrainBatchImages",
]
