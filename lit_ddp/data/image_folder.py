"""Image files in the ImageFolder layout (``root/<class>/<file>``), decoded in DataLoader workers.

A file that cannot be decoded does not stop the run: its slot in the batch carries the path and the
reason, the data module drops the slot in the main process (``on_before_batch_transfer``) and keeps it in
``pending_skipped``; the ``SkippedImagesReport`` callback gathers what every rank skipped at the end of
each epoch and warns once, on rank 0, with the count and the names. Each worker and each rank sees different
files, so the report has to be assembled from the batches, not from a worker's memory.
"""

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS

from lit_ddp.data.jpeg import DECODE_ERRORS

# (B, 3, H, W) uint8, (B,) int64 labels, {position in batch: (path, reason)} for the unreadable files
FileBatch = tuple[Tensor, Tensor, dict[int, tuple[str, str]]]


def find_classes(root: Path) -> list[str]:
    """Sorted class folder names under ``root``: ImageFolder's order, so label i means the same everywhere."""
    if not root.is_dir():
        return []
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def list_images(root: Path, class_to_idx: dict[str, int]) -> list[tuple[str, int]]:
    """(path, label) of every image file under ``root/<class>/``, sorted; classes not in ``class_to_idx`` are
    an error of the caller's to report (see ``find_classes``)."""
    samples = []
    for name in find_classes(root):
        folder = root / name
        files = sorted(
            e.name for e in os.scandir(folder) if e.name.lower().endswith(IMG_EXTENSIONS) and e.is_file()
        )
        samples += [(str(folder / f), class_to_idx[name]) for f in files]
    return samples


class ImageFileDataset(Dataset):
    """Decodes ``samples`` with ``load(path) -> (size, size, 3) uint8``; batches via ``__getitems__``.

    A whole batch is stacked (B, H, W, 3) and returned as a (B, 3, H, W) view: channels-last memory, which
    stays so through pinning, the device copy and normalisation, and is what a channels_last model wants.
    """

    def __init__(self, samples: list[tuple[str, int]], load: Callable[[str], np.ndarray], size: int) -> None:
        self.samples = samples
        self.load = load
        self.size = size

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, index: int) -> tuple[np.ndarray, tuple[str, str] | None]:
        path = self.samples[index][0]
        try:
            return self.load(path), None
        except DECODE_ERRORS as err:
            # A black placeholder keeps the batch stackable; the slot is dropped in the main process.
            return np.zeros((self.size, self.size, 3), np.uint8), (path, f"{type(err).__name__}: {err}")

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor, tuple[str, str] | None]:
        """One sample: (3, H, W) uint8, label, and None or (path, why it is unreadable)."""
        x, y, bad = self.__getitems__([index])
        return x[0], y[0], bad.get(0)

    def __getitems__(self, indices: Sequence[int]) -> FileBatch:
        images, errors = zip(*(self._load(i) for i in indices), strict=True)
        x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2)  # (B, 3, H, W), channels-last strides
        y = torch.tensor([self.samples[i][1] for i in indices], dtype=torch.long)
        return x, y, {i: e for i, e in enumerate(errors) if e}


def drop_unreadable(batch: FileBatch) -> tuple[tuple[Tensor, Tensor], dict[int, tuple[str, str]]]:
    """Remove the slots of unreadable files. If every file of a batch is unreadable (only plausible with
    tiny batches) the black placeholders are kept, since an empty batch has no loss."""
    x, y, bad = batch
    if bad and len(bad) < len(y):
        keep = torch.ones(len(y), dtype=torch.bool)
        keep[list(bad)] = False
        x, y = x[keep], y[keep]
    return (x, y), bad
