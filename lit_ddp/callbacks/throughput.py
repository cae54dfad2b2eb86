"""Training speed per epoch, reduced over all ranks: images/s (all ranks, and per device), epoch wall
time, the fraction of step time spent waiting for data, and peak CUDA memory.

Per step this costs two ``perf_counter`` calls and an integer add: no device sync, no collective. Each
rank measures itself; at epoch end the values are logged with ``sync_dist=True``, so Lightning reduces
them (sum, max or mean over ranks) in the same epoch-end sync as the other metrics, on every rank.
"""

import time

import torch
from lightning import Callback, LightningModule, Trainer
from torch import Tensor


def batch_length(batch) -> int:
    """Number of samples in a batch: the leading dimension of its first tensor."""
    while not isinstance(batch, Tensor):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return batch.shape[0]


class Throughput(Callback):
    """Logs ``perf/images_per_s`` (all ranks), ``perf/images_per_s_per_device``, ``perf/epoch_time_s``,
    ``perf/data_wait`` and, on CUDA, ``perf/peak_memory_gib`` once per training epoch.

    Step time is measured on the host from the end of one training step to the end of the next; the part
    before ``on_train_batch_start`` is the data wait (loader fetch, host→device copy, on-device
    augmentation). Validation in the middle of an epoch is excluded from step time.
    """

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A run resumed mid-epoch gets no on_train_epoch_start for that epoch: Lightning skips it.
        self.on_train_epoch_start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._images = 0
        self._wait = self._busy = 0.0
        self._epoch_start = self._last_end = time.perf_counter()
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        self._step_start = time.perf_counter()
        self._wait += self._step_start - self._last_end

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        self._last_end = time.perf_counter()
        self._busy += self._last_end - self._step_start
        self._images += batch_length(batch)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.training:  # validation inside a training epoch: restart the data-wait clock after it
            self._last_end = time.perf_counter()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        step_time = self._wait + self._busy
        if self._images == 0 or step_time <= 0:
            return
        rate = self._images / step_time  # this rank's images/s
        # Same keys on every rank; Lightning all-reduces each value at epoch end (sync_dist=True).
        log = dict(on_step=False, on_epoch=True, sync_dist=True, batch_size=1)
        pl_module.log("perf/images_per_s", rate, reduce_fx="sum", **log)
        pl_module.log("perf/images_per_s_per_device", rate, reduce_fx="mean", **log)
        pl_module.log("perf/epoch_time_s", time.perf_counter() - self._epoch_start, reduce_fx="max", **log)
        pl_module.log("perf/data_wait", self._wait / step_time, reduce_fx="mean", **log)
        if pl_module.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
            pl_module.log("perf/peak_memory_gib", peak, reduce_fx="max", **log)
