"""What every lit_ddp DataModule shares: per-device batches of uint8 images, loaders, on-device
augmentation and normalisation.

Subclasses set ``num_classes``, ``class_names``, ``mean``, ``std`` and create ``train_set``,
``val_set``, ``test_set`` in ``setup``. Lightning adds the DistributedSampler to the training loader
(and calls ``set_epoch`` on it) under DDP; evaluation loaders shard without padding (samplers.py).
"""

import hashlib
from collections.abc import Sequence

import torch
from lightning import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lit_ddp.data.batch_transforms import normalize, random_crop_flip
from lit_ddp.data.samplers import UnpaddedDistributedSampler
from lit_ddp.errors import UserError
from lit_ddp.utils import global_batch_size


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
        # index_select copies whole images; ``images[idx]`` indexes element by element, ~20× slower on CPU.
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.images.index_select(0, idx), self.labels.index_select(0, idx)


def collate_batch(batch):
    """Pass through batches that ``__getitems__`` built; collate lists of samples as usual."""
    if isinstance(batch, tuple):
        return batch
    return torch.utils.data.default_collate(batch)


def split_indices(n: int, val_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """A seeded permutation split into (train, val): the same on every rank, since it depends on seed only."""
    if not 0 <= val_size < n:
        raise UserError(f"val_size={val_size} must be in [0, {n - 1}] for a training set of {n} images")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[val_size:].sort().values, perm[:val_size].sort().values


def _stable_seed(*parts: int) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class ImageDataModule(LightningDataModule):
    """Base of the lit_ddp DataModules. ``batch_size`` is per device; the global batch is printed once.

    Training batches are augmented on their device by ``augment_batch``: here a random crop from the
    image zero-padded by ``crop_padding`` pixels per side, then a horizontal flip with probability 1/2
    (the CIFAR recipe; subclasses with other needs override it).
    """

    num_classes: int = 10
    class_names: tuple[str, ...] = ()
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.25, 0.25, 0.25)

    def __init__(
        self,
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
        augment: bool = True,
        crop_padding: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise UserError(f"batch_size={batch_size} must be at least 1 (it is the per-device batch size)")
        if num_workers < 0:
            raise UserError(f"num_workers={num_workers} must be 0 or more")
        if crop_padding < 0:
            raise UserError(f"crop_padding={crop_padding} must be 0 or more (pixels of padding per side)")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.augment = augment
        self.crop_padding = crop_padding
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self._aug_generator: torch.Generator | None = None
        self._aug_key: tuple | None = None

    # ---- loaders -------------------------------------------------------------------------------

    def _eval_sampler(self, dataset: Dataset) -> UnpaddedDistributedSampler | None:
        """Under DDP, shard evaluation sets without padding so every sample counts exactly once; with one
        process, or without a trainer, a plain sequential loader."""
        kwargs = self.trainer.distributed_sampler_kwargs if self.trainer is not None else None
        if not kwargs or kwargs["num_replicas"] <= 1:
            return None
        return UnpaddedDistributedSampler(dataset, num_replicas=kwargs["num_replicas"], rank=kwargs["rank"])

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() did not create this split")
        # Training: Lightning injects its shuffled DistributedSampler and calls set_epoch on it.
        sampler = None if train else self._eval_sampler(dataset)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=train,
            sampler=sampler,
            num_workers=self.num_workers,
            collate_fn=collate_batch,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)

    # ---- on-device batch work ------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.trainer is not None:
            t = self.trainer
            rank_zero_info(
                f"global batch = {self.batch_size} per device × {t.world_size} devices"
                f" × {t.accumulate_grad_batches} accumulation"
                f" = {global_batch_size(t)} images per optimizer step"
            )

    def augment_batch(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """Training augmentation of a (B, C, H, W) uint8 batch on its device: random crop + flip."""
        return random_crop_flip(x, self.crop_padding, generator=generator)

    def _generator(self, device: torch.device) -> torch.Generator:
        """Augmentation RNG seeded by (seed, rank, epoch): different on every rank, reproducible, and
        resumable from a checkpoint at an epoch boundary without saving RNG state."""
        trainer = self.trainer
        key = (self.seed, trainer.global_rank, trainer.current_epoch, str(device))
        if self._aug_key != key:
            self._aug_generator = torch.Generator(device=device).manual_seed(_stable_seed(*key[:3]))
            self._aug_key = key
        return self._aug_generator

    def on_after_batch_transfer(
        self, batch: tuple[Tensor, Tensor], dataloader_idx: int
    ) -> tuple[Tensor, Tensor]:
        x, y = batch  # (B, C, H, W) uint8 on the device
        if self.augment and self.trainer is not None and self.trainer.training:
            x = self.augment_batch(x, self._generator(x.device))
        return normalize(x, self.mean, self.std), y
