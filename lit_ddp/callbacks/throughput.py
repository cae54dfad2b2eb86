"""Training speed per epoch, reduced over all ranks: images/s (all ranks, and per device), epoch wall
time, the fraction of step time spent waiting for data, and peak CUDA memory.

Per step this costs two ``perf_counter`` calls and an integer add: no device sync, no collective. Each
rank measures itself; at epoch end two small all-reduces (sum, max) combine the ranks' values, on every
rank, before they are logged. Left to Lightning (``sync_dist=True``), the reduction would run where a
value is first read, and in this hook that is the progress bar, on rank 0 alone: a collective the other
ranks never join.

An epoch stopped inside (a stop signal, ``max_steps``, ``max_time``, a callback's ``should_stop``) and resumed
is one epoch on the dashboard, as in the uninterrupted run: one point, over both parts. Its checkpoint
carries what was measured before the stop (rank 0's sums stand for every rank's: the ranks train equal
shares of each step; resumed on another device count, the new ranks share those images), and an epoch cut
short logs nothing until the resumed run ends it.
"""

import time

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor

from lit_ddp.compat import epoch_cut_short


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

    Fork of ``lightning.pytorch.callbacks.ThroughputMonitor``: it reports no time spent waiting for data; goes
    when it logs that wait, reduced over the ranks in a hook every rank runs.
    """

    def __init__(self) -> None:
        self._open: dict | None = None  # the epoch being measured, and its sums before this process's part
        self._restored: dict = {}

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A run resumed mid-epoch gets no on_train_epoch_start for that epoch: Lightning skips it.
        self.on_train_epoch_start(trainer, pl_module)
        if self._restored.get("epoch") == trainer.current_epoch:  # the part of this epoch before the stop
            saved = self._restored
            self._open = {**saved, "world": trainer.world_size}
            share = saved.get("world", trainer.world_size) / trainer.world_size  # a rank's images: then / now
            self._images, self._wait, self._busy = saved["images"] * share, saved["wait"], saved["busy"]
        self._restored = {}

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        world = trainer.world_size  # a resume on another device count shares the images among its ranks
        self._open = {"epoch": trainer.current_epoch, "elapsed": 0.0, "peak": 0.0, "world": world}
        self._images = 0
        self._wait = self._busy = 0.0
        self._epoch_start = self._last_end = time.perf_counter()
        self._device = pl_module.device
        if self._device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self._device)

    def _peak(self) -> float:
        cuda = self._device.type == "cuda"
        return max(torch.cuda.max_memory_allocated(self._device) / 2**30 if cuda else 0.0, self._open["peak"])

    def state_dict(self) -> dict:
        if self._open is None:  # no epoch in progress: nothing to carry
            return {}
        elapsed = self._open["elapsed"] + time.perf_counter() - self._epoch_start
        sums = {"images": self._images, "wait": self._wait, "busy": self._busy}
        return {**self._open, **sums, "elapsed": elapsed, "peak": self._peak()}

    def load_state_dict(self, state_dict: dict) -> None:
        self._restored = dict(state_dict)

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
        # Validation inside a fit: restart the data-wait clock after it. Not ``trainer.training``: Lightning
        # sets the stage to validating for the whole validation loop, hooks included, so that was never true.
        if trainer.state.fn == TrainerFn.FITTING:
            self._last_end = time.perf_counter()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        step_time = self._wait + self._busy
        if self._images == 0 or step_time <= 0 or epoch_cut_short(trainer):  # the last: not over yet
            return
        rate = self._images / step_time  # this rank's images/s
        peak = self._peak()
        # Every rank reaches this hook, in the same epoch: the collectives pair up.
        summed = torch.tensor([rate, self._wait / step_time], dtype=torch.float64, device=pl_module.device)
        summed = trainer.strategy.reduce(summed, reduce_op="sum")
        elapsed = self._open["elapsed"] + time.perf_counter() - self._epoch_start
        self._open = None
        maxed = torch.tensor([elapsed, peak], dtype=torch.float64, device=pl_module.device)
        maxed = trainer.strategy.reduce(maxed, reduce_op="max")
        world = trainer.world_size
        values = {
            "perf/images_per_s": summed[0],
            "perf/images_per_s_per_device": summed[0] / world,
            "perf/epoch_time_s": maxed[0],
            "perf/data_wait": summed[1] / world,
        }
        if pl_module.device.type == "cuda":
            values["perf/peak_memory_gib"] = maxed[1]
        # Identical on every rank: nothing left for Lightning to sync.
        pl_module.log_dict(
            {k: v.float() for k, v in values.items()}, on_step=False, on_epoch=True, batch_size=1
        )
