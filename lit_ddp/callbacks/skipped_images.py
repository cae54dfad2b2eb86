"""Unreadable image files a data module skipped, gathered over the ranks and reported once per epoch; a
split whose every file read in an epoch is unreadable stops the run, predict's too (its files left out are
named in predictions.csv's report line, callbacks/predictions.py, or here when no predictions are written).

Works with any ``ImageDataModule`` whose splits are image files, through its ``unreadable``
(``UnreadableFiles``: ImageNetDataModule's). For any other it does nothing.
"""

import torch.distributed as dist
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from lit_ddp.callbacks.predictions import PredictionWriter
from lit_ddp.data import ImageDataModule
from lit_ddp.errors import UserError


class SkippedImagesReport(Callback):
    """At each epoch end: gather the unreadable files every rank met, warn once (rank 0) about the new
    ones, and log ``{split}/skipped_images`` (same value on every rank) once a split has any.

    It takes each rank's new files from ``trainer.datamodule.unreadable`` and keeps every rank's there
    (``UnreadableFiles.report``). Files are told apart by path: the reason can differ from one
    crop to the next (a truncated JPEG fails in whichever decoder the crop size picks).
    The gather is a collective, run by every rank in the same hook.
    """

    max_named = 20

    def _report(self, trainer: Trainer, pl_module: LightningModule, split: str) -> None:
        dm = trainer.datamodule
        files = dm.unreadable if isinstance(dm, ImageDataModule) else None
        if files is None:
            return  # a data module that reads no files (every rank decides alike: no collective is skipped)
        found, counts = files.take_pending(split), files.take_counts(split)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[tuple | None] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, (found, counts))
            found = {path: why for rank_found, _ in gathered for path, why in rank_found.items()}
            counts = tuple(sum(rank_counts[i] for _, rank_counts in gathered) for i in (0, 1))
        read, unreadable = counts
        if read and unreadable >= read and not trainer.sanity_checking:
            # Every rank decides on the same gathered counts: all stop alike, none waits for the others.
            path, why = next(iter(found.items()))
            if split == "predict":
                where = (
                    f"under --data.predict_dir={dm.predict_dir}"
                    if dm.predict_dir
                    else f"from the {dm.predict_source}"
                )
                raise UserError(
                    f"every one of the {read} image files read {where} is unreadable (such as {path}:"
                    f" {why}): predict would label none of them; replace them with readable images"
                )
            raise UserError(
                f"every one of the {read} {split} image files read this epoch is unreadable (such as {path}:"
                f" {why}): the run would learn or score black placeholders; replace the {split} files with"
                " readable images"
            )
        if split == "predict" and any(isinstance(c, PredictionWriter) for c in trainer.callbacks):
            return  # predictions.csv's report line names the files it left out
        new = files.report(split, found)
        known = files.reported(split)
        if new:
            more = len(new) - self.max_named
            named = [f"{path} ({found[path]})" for path in new[: self.max_named]]
            names = "; ".join(named) + (f"; and {more} more" if more > 0 else "")
            rank_zero_warn(
                f"skipped {len(new)} unreadable {split} image file(s) (left out of their batches; set"
                f" --data.strict=true to stop at the first one instead): {names}"
            )
        if known and split != "predict":  # predict logs no metric (Lightning refuses self.log there)
            # The same on every rank already (gathered above): nothing for Lightning to sync, which in
            # on_train_epoch_end it would do where the value is first read, on rank 0 alone.
            count = float(len(known))
            pl_module.log(f"{split}/skipped_images", count, on_step=False, on_epoch=True, batch_size=1)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._report(trainer, pl_module, "train")

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._report(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._report(trainer, pl_module, "test")

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._report(trainer, pl_module, "predict")
