"""A callback that records, on every rank, what a run did, for tests/test_ddp_semantics.py.

Added to a CLI run with ``--trainer.callbacks='{"class_path": "ddp_semantics_probe.Probe", ...}'``
(tests/helpers/ on PYTHONPATH). lit_ddp.testing's Recorder keeps the weights, gradients, samples, augmented
batches and metrics (lit_ddp/testing/record.py); the probe adds a fingerprint of the data splits, each
epoch's first batch normalised without augmentation, every checkpoint write this rank made, and a simulated
kill after ``stop_after_epochs``. Each rank saves ``<out_dir>/<stage>_rank<r>.pt``.
"""

import torch
from lightning import LightningModule, Trainer

from lit_ddp.data.batch_transforms import normalize
from lit_ddp.testing.record import Recorder, load  # noqa: F401 - load: the tests read the records with it


def digest(dataset) -> tuple[int, int, int]:
    """A cheap fingerprint of an in-memory TensorImageDataset: size, pixel sum, label-weighted sum."""
    images, labels = dataset.images, dataset.labels
    weights = torch.arange(1, len(labels) + 1)
    return len(labels), int(images.long().sum()), int((labels * weights).sum())


class Probe(Recorder):
    def __init__(self, out_dir: str, stop_after_epochs: int = 0) -> None:
        super().__init__(out_dir)
        self.stop_after_epochs = stop_after_epochs  # > 0: simulate a run killed after this many epochs
        self.record.update(plain=[], writes=[])

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            dm = trainer.datamodule
            self.record["split"] = {"train": digest(dm.train_set), "val": digest(dm.val_set)}
        # Log the writes this rank makes through Lightning's checkpoint I/O.
        io = trainer.strategy.checkpoint_io
        save = io.save_checkpoint

        def logged_save(checkpoint, path, storage_options=None):
            self.record["writes"].append(str(path))
            return save(checkpoint, path, storage_options=storage_options)

        io.save_checkpoint = logged_save

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        # The epoch's first batch normalised without augmentation, beside what training saw (Recorder's aug).
        if batch_idx == 0 and len(self.record["plain"]) < len(self.record["aug"]):
            dm = trainer.datamodule
            first = self.record["aug_index"][-1]
            plain = normalize(dm.train_set.images[first].to(pl_module.device), dm.mean, dm.std)
            self.record["plain"].append(plain.cpu())

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self.stop_after_epochs and trainer.current_epoch + 1 >= self.stop_after_epochs:
            trainer.should_stop = True
