"""CIFAR-10 from its original python-pickle release (``cifar-10-batches-py``), held in memory as uint8.

The 50,000 training images are split by a seeded permutation into train and ``val_size`` validation
images (the same split on every rank); ``test`` is the official 10,000-image test batch.
"""

import pickle
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lit_ddp.data.base import ImageDataModule, TensorImageDataset, split_indices
from lit_ddp.errors import UserError

FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def read_batch(path: Path) -> tuple[Tensor, Tensor]:
    """One pickled batch → images (N, 3, 32, 32) uint8 and labels (N,) int64.

    The official files are pickles (load only files you trust, as with any pickle).
    """
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f, encoding="bytes")
        data = np.asarray(entry[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(entry.get(b"labels", entry.get(b"fine_labels")), dtype=np.int64)
        if len(labels) != len(data):
            raise ValueError(f"{len(data)} images but {len(labels)} labels")
    except (OSError, EOFError, pickle.UnpicklingError, KeyError, ValueError, TypeError) as err:
        raise UserError(
            f"CIFAR-10 file {path} is unreadable ({err}):"
            f" delete {path.parent} and re-run with --data.download=true"
        ) from None
    return torch.from_numpy(data.copy()), torch.from_numpy(labels)


def read_split(folder: Path, names: tuple[str, ...]) -> tuple[Tensor, Tensor]:
    batches = [read_batch(folder / name) for name in names]
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


def find_folder(data_dir: Path) -> Path | None:
    """``data_dir/cifar-10-batches-py`` (torchvision's layout) or ``data_dir`` itself."""
    for folder in (data_dir / FOLDER, data_dir):
        if all((folder / name).is_file() for name in (*TRAIN_BATCHES, TEST_BATCH)):
            return folder
    return None


class CIFAR10DataModule(ImageDataModule):
    """CIFAR-10, with random crop (4-pixel padding) and horizontal flip done on whole batches on the device.

    Args:
        data_dir: folder holding ``cifar-10-batches-py`` (or that folder itself).
        download: fetch the dataset into ``data_dir`` first (in ``prepare_data``: one process per node).
        batch_size: per device.
        val_size: training images held out for validation by a seeded split.
        seed: decides the split; the same on every rank.
    """

    num_classes = 10
    class_names = CLASS_NAMES
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)

    def __init__(
        self,
        data_dir: str = "data/",
        download: bool = False,
        batch_size: int = 128,
        num_workers: int = 0,
        val_size: int = 5000,
        seed: int = 0,
        augment: bool = True,
        crop_padding: int = 4,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            num_workers=num_workers,
            seed=seed,
            augment=augment,
            crop_padding=crop_padding,
        )
        self.save_hyperparameters()
        self.data_dir = Path(data_dir)
        self.download = download
        self.val_size = val_size
        # Fail here, in the launching process, before any rank is spawned.
        if not download and find_folder(self.data_dir) is None:
            raise UserError(
                f"CIFAR-10 not found in {self.data_dir / FOLDER}: pass --data.download=true to fetch it,"
                f" or --data.data_dir=<folder holding {FOLDER}>"
            )

    def prepare_data(self) -> None:
        if self.download and find_folder(self.data_dir) is None:
            from torchvision.datasets import CIFAR10

            CIFAR10(str(self.data_dir), train=True, download=True)
            CIFAR10(str(self.data_dir), train=False, download=True)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        folder = find_folder(self.data_dir)
        if folder is None:
            raise UserError(f"CIFAR-10 not found in {self.data_dir / FOLDER}: pass --data.download=true")
        if stage in ("fit", "validate"):
            images, labels = read_split(folder, TRAIN_BATCHES)
            train_idx, val_idx = split_indices(len(images), self.val_size, self.seed)
            self.train_set = TensorImageDataset(images[train_idx], labels[train_idx])
            self.val_set = TensorImageDataset(images[val_idx], labels[val_idx])
        if stage in ("test", "predict"):
            self.test_set = TensorImageDataset(*read_split(folder, (TEST_BATCH,)))
