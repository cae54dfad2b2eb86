"""What every lit_ddp DataModule shares: per-device batches of uint8 images, loaders, on-device
augmentation and normalisation.

Subclasses set ``num_classes``, ``class_names``, ``mean``, ``std`` and create ``train_set``,
``val_set``, ``test_set`` in ``setup``. The training loader shuffles by (seed, epoch) and shards over the
ranks (Lightning calls ``set_epoch`` on it); evaluation loaders shard without padding (samplers.py).

Resuming mid-epoch is exact: the data module counts the training batches of the current epoch, saves the
count in the checkpoint (``state_dict``), and a resumed run continues at the next batch of the same order.
Augmentation draws from a generator seeded by (seed, rank, epoch, batch), so a resumed batch is augmented
as it would have been.
"""

import hashlib
from collections.abc import Sequence

import torch
from lightning import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lit_ddp.data.batch_transforms import normalize, random_crop_flip
from lit_ddp.data.samplers import ResumableShuffleSampler, UnpaddedDistributedSampler
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
        self._aug_generators: dict[str, torch.Generator] = {}
        self._epoch = 0  # the training epoch whose batches are being counted
        self._batches = 0  # training batches of that epoch seen so far (trained, or before a resume)
        self._resume: tuple[int, int] | None = None  # (epoch, batches) from a checkpoint

    # ---- loaders -------------------------------------------------------------------------------

    def _eval_sampler(self, dataset: Dataset) -> UnpaddedDistributedSampler | None:
        """Under DDP, shard evaluation sets without padding so every sample counts exactly once; with one
        process, or without a trainer, a plain sequential loader."""
        kwargs = self.trainer.distributed_sampler_kwargs if self.trainer is not None else None
        if not kwargs or kwargs["num_replicas"] <= 1:
            return None
        return UnpaddedDistributedSampler(dataset, num_replicas=kwargs["num_replicas"], rank=kwargs["rank"])

    def _train_sampler(self, dataset: Dataset) -> ResumableShuffleSampler:
        """The (seed, epoch) shuffle on every device count; a DistributedSampler, so Lightning keeps it."""
        kwargs = (self.trainer.distributed_sampler_kwargs if self.trainer is not None else None) or {}
        sampler = ResumableShuffleSampler(
            dataset, num_replicas=kwargs.get("num_replicas", 1), rank=kwargs.get("rank", 0), seed=self.seed
        )
        if self._resume is not None:
            epoch, batches = self._resume
            sampler.resume(epoch, batches * self.batch_size)
        return sampler

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() did not create this split")
        sampler = self._train_sampler(dataset) if train else self._eval_sampler(dataset)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
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

    def augmentation_generator(
        self, device: torch.device, rank: int, epoch: int, batch: int
    ) -> torch.Generator:
        """The RNG of one training batch, seeded by (seed, rank, epoch, batch): different on every rank and
        batch, reproducible, and the same after a resume. Re-seeding costs no device sync."""
        generator = self._aug_generators.get(str(device))
        if generator is None:
            generator = self._aug_generators[str(device)] = torch.Generator(device=device)
        return generator.manual_seed(_stable_seed(self.seed, rank, epoch, batch))

    def on_after_batch_transfer(
        self, batch: tuple[Tensor, Tensor], dataloader_idx: int
    ) -> tuple[Tensor, Tensor]:
        x, y = batch  # (B, C, H, W) uint8 on the device
        trainer = self.trainer
        if trainer is not None and trainer.training:
            batch_idx = self._count_training_batch(trainer.current_epoch)
            if self.augment:
                generator = self.augmentation_generator(
                    x.device, trainer.global_rank, trainer.current_epoch, batch_idx
                )
                x = self.augment_batch(x, generator)
        return normalize(x, self.mean, self.std), y

    def _count_training_batch(self, epoch: int) -> int:
        """This batch's index in its epoch. Counted here, where each trained batch passes once (the loader
        itself runs a batch ahead of training, which Lightning prefetches)."""
        if epoch != self._epoch:
            self._epoch, self._batches = epoch, 0
        self._batches += 1
        return self._batches - 1

    def state_dict(self) -> dict:
        # Saved with every checkpoint, resumed by load_state_dict: where in its epoch training stands.
        return {"epoch": self._epoch, "batches": self._batches}

    def load_state_dict(self, state_dict: dict) -> None:
        self._epoch, self._batches = state_dict["epoch"], state_dict["batches"]
        self._resume = (self._epoch, self._batches)
