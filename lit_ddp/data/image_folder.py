"""Image files in the ImageFolder layout (``root/<class>/<file>``), decoded in DataLoader workers.

A file that cannot be decoded does not stop the run: its slot in the batch carries the path and the
reason (batch.py ``Batch.unreadable``), the data module drops the slot in the main process
(``on_before_batch_transfer``) and notes it in
its ``UnreadableFiles``; the ``SkippedImagesReport`` callback gathers what every rank skipped at the end of
each epoch and warns once, on rank 0, with the count and the names. Each worker and each rank sees different
files, so the report has to be assembled from the batches, not from a worker's memory.
"""

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from lit_ddp.data.batch import Batch
from lit_ddp.data.folder_index import (
    IMAGE_EXTENSIONS,
    SampleIndex,
    class_key,
    find_classes,
    is_junk,
    load_or_scan,
)
from lit_ddp.data.jpeg import DECODE_ERRORS
from lit_ddp.errors import UserError

__all__ = [
    "ImageFileDataset",
    "SampleIndex",
    "UnreadableFiles",
    "decode_or_black",
    "find_classes",
    "is_junk",
    "list_image_files",
    "scan_image_files",
    "list_images",
    "stack_crops",
]

T = TypeVar("T")  # what a loader decodes: a path, or an encoded image's bytes


def list_images(root: Path, class_to_idx: dict[str, int]) -> SampleIndex:
    """(path, label) of every image file under ``root/<class>/``, sorted, read from no cache; each class
    folder is looked up in ``class_to_idx`` by its NFC form (``class_key``); classes not there are an error
    of the caller's to report (see ``find_classes``)."""
    listing, _ = load_or_scan(root, cache_dir=None)
    return listing.samples([class_to_idx[class_key(name)] for name in listing.folders])


def list_image_files(root: Path) -> list[str]:
    """Every image file under ``root`` and its sub-folders, sorted by path; junk (``is_junk``) left out."""
    return scan_image_files(root)[0]


def scan_image_files(root: Path) -> tuple[list[str], list[str]]:
    """``list_image_files``, and the other files it leaves out for their extension (paths relative to
    ``root``, sorted; ``left_out_note``)."""
    paths, others = [], []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not is_junk(d)]  # os.walk descends only into what is left here
        for name in (f for f in files if not is_junk(f)):
            path = os.path.join(folder, name)
            if name.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(path)
            else:
                others.append(os.path.relpath(path, root))
    return sorted(paths), sorted(others)


@contextlib.contextmanager
def seeded_global_rng(seed: int) -> Iterator[None]:
    """torch's global CPU RNG seeded with ``seed`` inside the block and restored after it, for torchvision's
    random transforms, which take no generator. Restored because with ``num_workers=0`` this is the training
    process's own RNG. (``torch.manual_seed`` would also seed every accelerator, far slower per sample.)"""
    generator = torch.default_generator
    state = generator.get_state()
    generator.manual_seed(seed)
    try:
        yield
    finally:
        generator.set_state(state)


def decode_or_black(
    load: Callable[[T], np.ndarray], source: T, name: str, seed: int | None, size: int
) -> tuple[np.ndarray, tuple[str, str] | None]:
    """``load(source)`` (a (size, size, 3) uint8 image), its random draws from torch's RNG seeded with
    ``seed`` (None: the worker's RNG as is); if it cannot be decoded, a black image and (``name``, why),
    which the batch carries to the main process (``Batch.drop``) instead of stopping the run."""
    try:
        with seeded_global_rng(seed) if seed is not None else contextlib.nullcontext():
            return load(source), None
    except DECODE_ERRORS as err:
        # A black placeholder keeps the batch stackable; the slot is dropped in the main process.
        return np.zeros((size, size, 3), np.uint8), (name, f"{type(err).__name__}: {err}")


def stack_crops(crops: Sequence[np.ndarray], names: Sequence[str] = ()) -> Tensor:
    """(B, 3, H, W) uint8 from (H, W, 3) crops, as a view of the stacked (B, H, W, 3): channels-last memory,
    which stays so through pinning, the device copy and normalisation, and is what a channels_last model
    wants."""
    return torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2)


class ImageFileDataset(Dataset):
    """Decodes ``samples`` with ``load(path) -> (size, size, 3) uint8``; batches via ``__getitems__``:
    ``collate(loaded, paths)`` of the batch's samples, by default ``stack_crops``. A decoder strategy
    (decoders.py) gives both: its ``load`` may also leave the decode to the device.

    Indices may come as (index, seed) pairs (a training sampler's, samplers.py ``SeededSampleSampler``):
    then the random draws of that sample's ``load`` (crop, flip, augmentation) come from torch's RNG seeded
    with ``seed``, the same in every worker, process and run. A plain index draws from the worker's RNG as is.
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        load: Callable[[str], np.ndarray],
        size: int,
        collate: Callable[[Sequence, Sequence[str]], object] = stack_crops,
    ) -> None:
        self.samples = samples
        self.load = load
        self.size = size
        self.collate = collate

    @property
    def samples(self) -> SampleIndex:
        """(path, label) pairs, held as numpy arrays whatever was given: workers then copy none of them."""
        return self._samples

    @samples.setter
    def samples(self, samples: Sequence[tuple[str, int]]) -> None:
        self._samples = samples if isinstance(samples, SampleIndex) else SampleIndex.from_pairs(samples)

    def __len__(self) -> int:
        return len(self.samples)

    def read(self, index: int, seed: int | None) -> tuple[np.ndarray, tuple[str, str] | None]:
        """One sample's ``load``, its draws seeded by ``seed``; None or (path, why it is unreadable)."""
        path = self._samples.path(index)
        return decode_or_black(self.load, path, path, seed, self.size)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor, tuple[str, str] | None]:
        """One sample: (3, H, W) uint8, label, and None or (path, why it is unreadable)."""
        batch = self.__getitems__([index])
        return batch.images[0], batch.labels[0], batch.unreadable.get(0)

    def __getitems__(self, indices: Sequence[int | tuple[int, int]]) -> Batch:
        pairs = [i if isinstance(i, tuple) else (i, None) for i in indices]  # (index, seed or None)
        images, errors = zip(*(self.read(i, seed) for i, seed in pairs), strict=True)
        x = self.collate(images, [self._samples.path(i) for i, _ in pairs])
        y = torch.from_numpy(self._samples.labels[[i for i, _ in pairs]])
        return Batch(x, y, unreadable={i: e for i, e in enumerate(errors) if e})


class UnreadableFiles:
    """The unreadable image files a data module met, by split: this rank's since the last report
    (``take_pending``) and every rank's reported so far (``reported``). ``strict``: the first one stops the
    run instead, naming it."""

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self._pending: dict[str, dict[str, str]] = {}  # split → {path: reason}, this rank's
        self._reported: dict[str, dict[str, str]] = {}  # split → {path: reason}, all ranks'
        self._counts: dict[str, tuple[int, int]] = {}  # split → (files read, unreadable), this rank's

    def add(self, split: str, bad: dict[int, tuple[str, str]]) -> None:
        """Note a batch's unreadable files ({slot: (path, reason)}), or with ``strict`` stop at the first."""
        if self.strict and bad:
            path, reason = next(iter(bad.values()))
            # Not "delete it": a permission or network-disk error reads the same as a broken file.
            raise UserError(
                f"unreadable image file {path} ({reason}):"
                " replace it with a readable copy, or pass --data.strict=false to skip such files"
            )
        self._pending.setdefault(split, {}).update(bad.values())
        read, unreadable = self._counts.get(split, (0, 0))
        self._counts[split] = (read, unreadable + len(bad))

    def count_read(self, split: str, files: int) -> None:
        """Note a batch of ``files`` files read (readable or not) from ``split``."""
        read, unreadable = self._counts.get(split, (0, 0))
        self._counts[split] = (read + files, unreadable)

    def take_counts(self, split: str) -> tuple[int, int]:
        """This rank's (files read, unreadable ones) of ``split`` since the last call; forgets them."""
        return self._counts.pop(split, (0, 0))

    def take_pending(self, split: str) -> dict[str, str]:
        """This rank's files of ``split`` since the last call, {path: reason}; forgets them."""
        return self._pending.pop(split, {})

    def report(self, split: str, found: dict[str, str]) -> list[str]:
        """Add ``found`` (every rank's, gathered) to the reported files; return the new paths, sorted."""
        known = self._reported.setdefault(split, {})
        new = sorted(set(found) - set(known))
        known.update({path: found[path] for path in new})
        return new

    def reported(self, split: str) -> dict[str, str]:
        return self._reported.get(split, {})
