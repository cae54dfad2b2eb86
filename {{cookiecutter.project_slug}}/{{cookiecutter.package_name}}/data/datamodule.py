"""Your data. ``load_split`` is the one method to rewrite: return a split's images and labels.

lit_ddp's ``ImageDataModule`` does the rest the same way on any device count: per-device batches, the
training shuffle by (seed, epoch) sharded over the ranks, evaluation without padded duplicates, crop and
flip on the device, normalisation, and exact mid-epoch resume. To start, it draws lit_ddp's embedded
Shapes images, so everything runs with no file.
"""

from functools import cache

from lit_ddp.data import ImageDataModule, ShapesDataModule, draw_shapes
from torch import Tensor

SPLITS = ("train", "val", "test")


@cache  # drawn once per process: a test or a check that builds the data module again pays nothing
def _shapes(n: int, seed: int) -> tuple[Tensor, Tensor]:
    return draw_shapes(n, seed=seed)


class MyDataModule(ImageDataModule):
    """3×32×32 images in 10 classes, held in memory as uint8 (the fastest loader: no decoding, no workers).

    Args:
        train_size / val_size / test_size: images in each split.
        num_workers: 0: the images are in memory, no decoding to spread.
        **kwargs: ImageDataModule's: batch_size (per device; the global batch is printed once at start),
            seed (the images and the shuffle; the same on every rank), augmentation, predict_dir, ...
    """

    class_names = ShapesDataModule.class_names
    num_classes = len(class_names)
    # Per-channel statistics of the training images, in [0, 1] units: normalisation runs on the device.
    mean = (0.5, 0.5, 0.5)
    std = (0.29, 0.29, 0.29)

    def __init__(
        self,
        train_size: int = 20000,
        val_size: int = 2000,
        test_size: int = 2000,
        num_workers: int | None = 0,
        **kwargs,
    ) -> None:
        # kwargs: ImageDataModule's (batch_size, seed, augmentation, ...), which the command line shows too
        super().__init__(num_workers=num_workers, **kwargs)
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}

    def load_split(self, split: str) -> tuple[Tensor, Tensor]:
        """(N, 3, H, W) uint8 images and (N,) int64 labels in [0, num_classes) of ``split``.

        Replace with your loading code (numpy arrays: ``torch.from_numpy``); keep it a function of the
        seed only, so every rank holds the same split.
        """
        return _shapes(self.sizes[split], self.seed * len(SPLITS) + SPLITS.index(split))
