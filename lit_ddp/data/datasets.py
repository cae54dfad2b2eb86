"""In-memory images and the batch plumbing every data module's loaders share.

``TensorImageDataset`` holds a split as one uint8 tensor and hands the DataLoader whole batches
(``__getitems__``), which ``collate_batch`` passes through; ``IndexedDataset`` adds each sample's index to
its batch (the key of its augmentation draws, and of predictions); ``split_indices`` is the seeded
train/val split the same on every rank.
"""

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from lit_ddp.data.batch import Batch
from lit_ddp.errors import UserError


class TensorImageDataset(Dataset):
    """Images held in memory as one (N, C, H, W) uint8 tensor, with int64 labels.

    ``__getitems__`` lets the DataLoader fetch a whole batch with one indexing op instead of N
    ``__getitem__`` calls and a collate (the loader passes the result through ``collate_batch``).
    """

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or len(images) != len(labels):
            raise ValueError(
                f"expected (N, C, H, W) uint8 images and N labels, got {images.shape} {images.dtype}"
            )
        self.images, self.labels = images, labels.long()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, Tensor]:
        # index_select copies whole images; ``images[idx]`` indexes element by element, much slower on CPU.
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.images.index_select(0, idx), self.labels.index_select(0, idx)


class WorkerError:
    """What a dataset returns from a DataLoader worker in place of a batch it could not build: the exception
    itself, pickled with the batch, which the training process raises as it is (``on_before_batch_transfer``).

    torch re-raises an exception from a worker as a new one of the same type whose message is "Caught X in
    DataLoader worker process N" followed by the worker's whole traceback (torch's ``ExceptionWrapper`` sends
    only the type and that text), so a ``UserError``'s one line would reach the user as a traceback."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __iter__(self):  # `x, y = batch` in a loop that reads the loader without the data module's hooks
        raise self.error


# What default_collate batches; anything else in a sample (a PIL image) is its TypeError traceback.
COLLATABLE = (Tensor, np.ndarray, numbers.Number, str, Mapping, Sequence)


def collate_samples(samples: Sequence) -> object:
    """``default_collate`` of a Dataset's samples; a ``WorkerError`` where an item of the first sample is of
    a type it cannot batch, raised as one line by the data module (``on_before_batch_transfer``), also when
    a loader worker collated it."""
    first = samples[0] if len(samples) else None
    for item in first if isinstance(first, tuple | list) else (first,):
        if not isinstance(item, COLLATABLE):
            kind = f"{type(item).__module__}.{type(item).__qualname__}"
            return WorkerError(
                UserError(
                    f"the Dataset's samples hold a {kind}, which the loader cannot batch: __getitem__ must"
                    " return a (C, H, W) uint8 image tensor and its int label (a PIL image:"
                    " torchvision.transforms.functional.pil_to_tensor(image))"
                )
            )
    return torch.utils.data.default_collate(samples)


def collate_batch(batch):
    """Pass through batches that ``__getitems__`` built (and a worker's ``WorkerError``); collate lists of
    samples as usual (``collate_samples``)."""
    if isinstance(batch, (Batch, tuple, WorkerError)):
        return batch
    return collate_samples(batch)


class IndexedDataset(Dataset):
    """``dataset``'s batches with the (B,) int64 indices of their samples in ``dataset``: a ``Batch``'s
    ``index``, or one more tensor after a tuple's."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Sequence[int]) -> tuple:
        index = torch.as_tensor(indices, dtype=torch.long)
        if hasattr(self.dataset, "__getitems__"):
            batch = self.dataset.__getitems__(indices)
        else:
            batch = collate_samples([self.dataset[i] for i in indices])
        if isinstance(batch, WorkerError):
            return batch
        if isinstance(batch, Batch):
            return replace(batch, index=index)
        if not isinstance(batch, tuple | list):  # dict samples: kept whole, not unpacked into their keys
            batch = (batch,)
        return (*batch, index)


def split_indices(n: int, val_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """A seeded permutation split into (train, val): the same on every rank, since it depends on seed only."""
    if not 0 <= val_size < n:
        raise UserError(f"val_size={val_size} must be in [0, {n - 1}] for a training set of {n} images")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[val_size:].sort().values, perm[:val_size].sort().values
