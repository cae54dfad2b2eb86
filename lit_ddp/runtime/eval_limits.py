"""A fractional ``--trainer.limit_val_batches`` / ``limit_test_batches`` / ``limit_predict_batches``: the
same batch count on every rank.

Lightning applies a fraction to each rank's own loader. Evaluation shards are uneven here (every sample
counts once, no padding: data/samplers.py), so 0.5 of 65 images in batches of 32 on 2 ranks is 1 batch on
rank 0 and 0.5 × 1 → 0 on rank 1, which raises there while rank 0 goes on and then loses contact. Here the
fraction is taken of the largest shard's batch count, computed alike on every rank from the dataset's size,
and handed to Lightning as that count (a rank with fewer batches runs all of its own), before its loops
read it. An evaluation epoch has no collective per batch, so ranks may run different counts.

Any limit (a count, a fraction, overfit_batches's) that leaves images of the val or test split unscored is
said in one line: every other metric is the whole split's, and these are a subset's.
"""

import math

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lit_ddp.data import ImageDataModule
from lit_ddp.errors import UserError

# stage → (the Trainer's limit, the data module's split it limits: predict's is the test split or predict_dir)
LIMITS = {
    "fit": (("limit_val_batches", "val_set"),),
    "validate": (("limit_val_batches", "val_set"),),
    "test": (("limit_test_batches", "test_set"),),
    "predict": (("limit_predict_batches", "predict_set"),),
}


def split_samples(dm: ImageDataModule, split: str) -> int | None:
    """The samples of ``split``, or None where the data module has none. ``predict_set`` is built with the
    predict loader, after the callbacks' setup: its size is predict_dir's file count or the test split's."""
    if split == "predict_set":
        if dm.predict_dir is not None:
            return len(dm.predict_files)
        split = "test_set"
    dataset = getattr(dm, split, None)
    return len(dataset) if dataset is not None else None


def batches_of_fraction(limit: str, fraction: float, samples: int, world_size: int, batch_size: int) -> int:
    """``fraction`` of the largest shard's batches (rank 0's: ``samples`` split ``rank::world_size``), or a
    UserError when that is no batch."""
    largest = math.ceil(math.ceil(samples / world_size) / batch_size)
    batches = int(fraction * largest)
    if batches == 0:
        raise UserError(
            f"--trainer.{limit}={fraction} of {largest} batch(es) per device is no batch: pass at least"
            f" {1 / largest:.3g}, or a number of batches (an integer)"
        )
    return batches


def images_scored(limit: int | float, samples: int, world_size: int, batch_size: int) -> int:
    """The images an evaluation limited to ``limit`` batches per device (a count, or a fraction of each
    rank's own, as Lightning takes it) scores over all ranks, each holding ``rank::world_size``."""
    scored = 0
    for rank in range(world_size):
        shard = len(range(rank, samples, world_size))
        batches = math.ceil(shard / batch_size)
        batches = int(limit * batches) if isinstance(limit, float) else min(int(limit), batches)
        scored += min(batches * batch_size, shard)
    return scored


def _subset_note(trainer: Trainer, limit: str, given: float, samples: int, batch_size: int) -> str | None:
    """One line where the limit leaves images of the split unscored: its metrics are then a subset's, not
    the whole split's that every other metric is. None under fast_dev_run, whose own line says it."""
    # overfit_batches has Lightning replace every rank's sampler by one reading the split from its start.
    world_size = 1 if trainer.overfit_batches else trainer.world_size
    scored = images_scored(getattr(trainer, limit), samples, world_size, batch_size)
    if not 0 < scored < samples or trainer.fast_dev_run:  # 0: no evaluation
        return None
    option = f"overfit_batches={trainer.overfit_batches}" if trainer.overfit_batches else f"{limit}={given}"
    split = limit.split("_")[1]
    return (
        f"lit_ddp: note: --trainer.{option} scores {scored} of the {samples} {split} images: the {split}/*"
        f" metrics are those images', not the whole {split} split's"
    )


class EvenEvalLimits(Callback):
    """Turns a fractional evaluation limit into one batch count for all ranks, for the run; restores it."""

    def __init__(self) -> None:
        self._given: dict[str, float] = {}

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Called after the data module's setup (its splits exist), before any loop builds a loader and
        # before configure_optimizers reads the global batch.
        dm = trainer.datamodule
        if not isinstance(dm, ImageDataModule):
            return  # another data module: its own sampler
        for limit, split in LIMITS.get(stage, ()):
            given, samples = getattr(trainer, limit), split_samples(dm, split)
            if samples is None:
                continue
            if isinstance(given, float) and 0.0 < given < 1.0:
                # No batch is the same line on one process (Lightning's names no option, and fails later)
                batches = batches_of_fraction(limit, given, samples, trainer.world_size, dm.batch_size)
                if trainer.world_size > 1:  # one process: Lightning's own rule is the same
                    self._given[limit] = given
                    setattr(trainer, limit, batches)
                    rank_zero_info(f"{limit}={given}: {batches} batch(es) per device, the same on every rank")
            if limit != "limit_predict_batches":  # predict's rows say their count
                note = _subset_note(trainer, limit, given, samples, dm.batch_size)
                if note is not None:
                    rank_zero_info(note)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        for limit, fraction in self._given.items():
            setattr(trainer, limit, fraction)
        self._given.clear()
