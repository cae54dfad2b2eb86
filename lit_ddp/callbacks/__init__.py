"""Callbacks lit_ddp adds to Lightning's."""

from lightning import Callback

from lit_ddp.callbacks.checkpoint import ModelCheckpoint
from lit_ddp.callbacks.confusion import ConfusionMatrix
from lit_ddp.callbacks.gc_freeze import FreezeGC
from lit_ddp.callbacks.images import TrainBatchImages
from lit_ddp.callbacks.lr_monitor import LearningRateMonitor
from lit_ddp.callbacks.run_info import RunInfo
from lit_ddp.callbacks.summary import EpochSummary
from lit_ddp.callbacks.throughput import Throughput

# The TensorBoard dashboard: config key → callback every `python -m lit_ddp` run gets. Each is
# configurable (`--throughput.init_args...`, or a subclass by class_path) and `--KEY=null` turns it off.
# EpochSummary prints what Throughput logs in the same hook, so it comes after it.
DASHBOARD_CALLBACKS: dict[str, type[Callback]] = {
    "lr_monitor": LearningRateMonitor,
    "throughput": Throughput,
    "batch_images": TrainBatchImages,
    "confusion_matrix": ConfusionMatrix,
    "run_info": RunInfo,
    "epoch_summary": EpochSummary,
}

# Every callback a `python -m lit_ddp` run gets by default, each switchable off with `--KEY=null`: the
# dashboard, and FreezeGC (no full garbage collection stalls the ranks during training).
DEFAULT_CALLBACKS: dict[str, type[Callback]] = {**DASHBOARD_CALLBACKS, "gc_freeze": FreezeGC}

__all__ = [
    "DASHBOARD_CALLBACKS",
    "DEFAULT_CALLBACKS",
    "ConfusionMatrix",
    "EpochSummary",
    "FreezeGC",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "RunInfo",
    "Throughput",
    "TrainBatchImages",
]
