"""A callback that counts the host-device synchronisations of each training step, for tests/test_cuda.py.

torch's sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``) warns at every operation that makes the
host wait for the GPU. A step's window runs from its ``on_train_batch_start`` (this callback, passed with
``--trainer.callbacks``, runs before lit_ddp's own) to the next step's, so it holds the forward, backward and
optimizer step, every callback's ``on_train_batch_end`` and Lightning's logging of that step. At the end the
counts go to ``out`` as JSON: ``[global_step at the step's start, synchronisations, the first one's text]``.
"""

import json
import warnings
from pathlib import Path

import torch
from lightning import Callback, LightningModule, Trainer

SYNC_WARNING = "called a synchronizing CUDA operation"


class SyncCounter(Callback):
    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.counts: list[tuple[int, int, str]] = []
        self._recording = None  # (catch_warnings context, its list, global_step)

    def _close(self) -> None:
        if self._recording is None:
            return
        context, caught, step = self._recording
        context.__exit__(None, None, None)
        syncs = [str(w.message) for w in caught if SYNC_WARNING in str(w.message)]
        self.counts.append((step, len(syncs), syncs[0][:200] if syncs else ""))
        self._recording = None

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        self._close()
        context = warnings.catch_warnings(record=True)
        caught = context.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        self._recording = (context, caught, trainer.global_step)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close()  # the epoch's last step ends here (validation and epoch metrics are not counted)
        torch.cuda.set_sync_debug_mode("default")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close()
        torch.cuda.set_sync_debug_mode("default")

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close()
        torch.cuda.set_sync_debug_mode("default")
        if trainer.is_global_zero:
            self.out.write_text(json.dumps(self.counts))
