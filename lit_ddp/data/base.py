"""What every lit_ddp DataModule shares: per-device batches of uint8 images, loaders, on-device
augmentation and normalisation.

Subclasses set ``num_classes``, ``class_names``, ``mean``, ``std`` and create ``train_set``,
``val_set``, ``test_set`` in ``setup``. The training loader shuffles by (seed, epoch) and shards over the
ranks (Lightning calls ``set_epoch`` on it); evaluation loaders shard without padding (samplers.py).

``predict`` reads the ``test_split`` (``test_set``), or with ``predict_dir`` every image file under that
folder, unlabelled (label -1), resized and centre-cropped as evaluation images are. Its batches carry each
sample's index in that set as a third tensor, so predictions can be put back in order and named, whatever
the rank, the batch, or an unreadable file left out of its batch.

Resuming mid-epoch is exact: the data module counts the training batches of the current epoch, saves the
count in the checkpoint (``state_dict``), and a resumed run continues at the next batch of the same order.
Training batches carry their samples' indices to the device, and each sample's crop and flip are drawn
from (seed, epoch, index) alone (``SampleRandom``, batch_transforms.py): the same on any device count and
after a resume. MixUp and CutMix (``mixup_alpha``, ``cutmix_alpha``) mix the normalised training batch and
make its labels (B, num_classes) probabilities; their draws come from (seed, rank, epoch, batch), since they
pair images inside one device's batch (the one device-count-dependent augmentation). Data modules that
augment each sample in the DataLoader workers (imagenet.py) get (index, seed) pairs from their training
sampler instead, the seed a function of (seed, epoch, index) only (``SeededSampleSampler``).
"""

import functools
import hashlib
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from lightning import LightningDataModule
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lit_ddp.data.batch_transforms import SampleRandom, draw_mix, mix_batch, normalize, random_crop_flip
from lit_ddp.data.image_folder import ImageFileDataset, drop_unreadable, list_image_files
from lit_ddp.data.jpeg import load_eval_crop
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


class IndexedDataset(Dataset):
    """``dataset``'s batches with one more tensor: the (B,) int64 indices of their samples in ``dataset``."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Sequence[int]) -> tuple:
        if hasattr(self.dataset, "__getitems__"):
            batch = self.dataset.__getitems__(indices)
        else:
            batch = torch.utils.data.default_collate([self.dataset[i] for i in indices])
        return (*batch, torch.as_tensor(indices, dtype=torch.long))


def split_indices(n: int, val_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """A seeded permutation split into (train, val): the same on every rank, since it depends on seed only."""
    if not 0 <= val_size < n:
        raise UserError(f"val_size={val_size} must be in [0, {n - 1}] for a training set of {n} images")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[val_size:].sort().values, perm[:val_size].sort().values


def _stable_seed(*parts: int) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class SeededSampleSampler(ResumableShuffleSampler):
    """The same training order, as (index, seed) pairs with seed = stable_seed(data seed, epoch, index): for
    datasets that draw each sample's augmentation in the DataLoader workers (image_folder.py seeds torch's
    global RNG with it around that sample).

    The epoch travels with every index because the workers hold their own copies of the dataset (persistent
    workers keep theirs all run long): a ``set_epoch`` on the main process's copy would never reach them.
    A sample's augmentation then depends on (seed, epoch, index) alone, not on the worker, rank, batch or
    device count that handles it, so a resumed or re-sharded run augments each image as the uninterrupted
    run would have.
    """

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch  # lazy pairs: one hash per sample as the loader asks, not an epoch's up front
        return ((i, _stable_seed(self.seed, epoch, i)) for i in super().__iter__())


def available_cpus() -> int:
    """The CPUs this process may run on: a container's or a scheduler's allotment, not the whole machine's
    (``os.cpu_count()`` counts those): its affinity mask (Linux-only, hence the fallback), within a cgroup
    CPU quota where one is set (``docker --cpus``, a Kubernetes CPU limit), which the mask does not show."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:  # cgroup v2: "max 100000", or "<quota> <period>" in µs of CPU time per period
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cpus


def available_memory() -> int | None:
    """Bytes this process could still take: the kernel's estimate of available memory (``MemAvailable``),
    within a cgroup v2 memory limit where one is set; free pages where there is no /proc (other Unixes);
    None where none of these can be read."""
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        available = int(meminfo["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(available, 0)


# A worker of the ImageNet recipe (batch 256 of 224 px) at its peak: its private memory and its prefetched
# batches in shared memory (docs/gpu.md, benchmarks/bench_worker_memory_gpu.py). Workers may take half the
# available memory: the rest stays for the training process (pinned batches, checkpoints) and the page cache,
# which keeps the dataset's files.
WORKER_BYTES = 256 << 20
WORKER_MEMORY_SHARE = 0.5


def auto_num_workers(
    cpus: int, devices: int, memory: int | None = None, worker_bytes: int = WORKER_BYTES
) -> int:
    """DataLoader workers per device for ``num_workers=None``. Each device's process has its CPUs: an equal
    share of the ``cpus`` this process may use, or all of them where the launcher gave each device's process
    CPUs of its own (SLURM's ``--cpus-per-task``, which srun binds each task to). It keeps one core for
    itself (the training loop, feeding the GPU); the rest decode, as many as ``WORKER_MEMORY_SHARE`` of the
    ``memory`` (bytes; None: ``available_memory()``) shared over the devices holds at ``worker_bytes`` each.

    No fixed cap: a fast GPU takes every core a node gives it (a ResNet-50 on an H100 eats ~4,000 images/s,
    a worker decodes a few hundred). A share of one core or less gets 0 workers: a worker would only compete
    with its own main process (on 2 cores with 2 CPU processes, 0 workers is 8× faster than 10)."""
    devices = max(devices, 1)
    own_cpus = os.environ.get("SLURM_CPUS_PER_TASK") == str(cpus)
    workers = (cpus if own_cpus else cpus // devices) - 1
    memory = available_memory() if memory is None else memory
    if memory is not None:
        workers = min(workers, int(memory * WORKER_MEMORY_SHARE / devices) // worker_bytes)
    return max(0, workers)


# Which split a batch belongs to, from the trainer's running stage (the sanity check runs val batches).
SPLIT_OF_STAGE = {
    RunningStage.TRAINING: "train",
    RunningStage.SANITY_CHECKING: "val",
    RunningStage.VALIDATING: "val",
    RunningStage.TESTING: "test",
    RunningStage.PREDICTING: "predict",
}


class ImageDataModule(LightningDataModule):
    """Base of the lit_ddp DataModules. ``batch_size`` is per device; the global batch is printed once.

    Training batches are augmented on their device by ``augment_batch``: here a random crop from the
    image zero-padded by ``crop_padding`` pixels per side, then a horizontal flip with probability 1/2
    (the CIFAR recipe; subclasses with other needs override it). ``mixup_alpha`` / ``cutmix_alpha`` > 0
    then mix the normalised batch (MixUp / CutMix with Beta(α, α); with both, one per batch, p = 1/2).
    """

    num_classes: int = 10
    class_names: tuple[str, ...] = ()
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.25, 0.25, 0.25)
    # Evaluation crops (predict_dir's images): short side resized to val_resize, centre crop of image_size.
    image_size: int = 32
    val_resize: int = 32
    test_split: str = "test"  # what test_set holds, named in predict's report
    # True: the training sampler yields (index, seed) pairs, for a train_set that augments each sample itself.
    per_sample_seeds: bool = False
    # True: the splits are image files, some maybe unreadable (callbacks/skipped_images.py reports them);
    # strict: the first unreadable file stops the run (subclasses that read files take it as an argument).
    reads_image_files: bool = False
    strict: bool = False
    # Image files are turned upright as their EXIF orientation says, in every split and predict_dir alike
    # (subclasses that read files take it as an argument).
    exif_transpose: bool = True

    def __init__(
        self,
        batch_size: int = 128,
        num_workers: int | None = None,
        seed: int = 0,
        augment: bool = True,
        crop_padding: int = 0,
        predict_dir: str | None = None,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise UserError(f"batch_size={batch_size} must be at least 1 (it is the per-device batch size)")
        if num_workers is not None and num_workers < 0:
            raise UserError(f"num_workers={num_workers} must be 0 or more (or null: one per spare CPU core)")
        if crop_padding < 0:
            raise UserError(f"crop_padding={crop_padding} must be 0 or more (pixels of padding per side)")
        for name, alpha in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
            if alpha < 0:
                raise UserError(f"{name}={alpha} must be 0 (off) or more (the α of its Beta(α, α))")
        self.batch_size = batch_size
        self.num_workers = num_workers  # None: auto_num_workers, resolved once the trainer is attached
        self._auto_workers: int | None = None
        self.seed = seed
        self.augment = augment
        self.crop_padding = crop_padding
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.predict_set: Dataset | None = None  # what predict reads: test_set or predict_dir's images
        self.predict_dir = predict_dir
        # Listed here, in the launching process: a wrong folder fails before any rank is spawned.
        self.predict_files = self._list_predict_dir(predict_dir) if predict_dir is not None else []
        # Unreadable files, reported by callbacks/skipped_images.py (a data module has no epoch-end hooks).
        self.skipped: dict[str, dict[str, str]] = {}  # split → {path: reason} met so far, all ranks
        self.pending_skipped: dict[str, dict[str, str]] = {}  # this rank's, since the last report
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
        sampler_class = SeededSampleSampler if self.per_sample_seeds else ResumableShuffleSampler
        sampler = sampler_class(
            dataset, num_replicas=kwargs.get("num_replicas", 1), rank=kwargs.get("rank", 0), seed=self.seed
        )
        if self._resume is not None:
            epoch, batches = self._resume
            sampler.resume(epoch, batches * self.batch_size)
        return sampler

    def workers_per_device(self) -> int:
        """``num_workers`` as given, or for ``None`` the automatic count for this node (reported once)."""
        if self.num_workers is not None:
            return self.num_workers
        if self._auto_workers is None:
            devices = self.trainer.num_devices if self.trainer is not None else 1  # per node
            cpus = available_cpus()
            self._auto_workers = auto_num_workers(cpus, devices)
            rank_zero_info(
                f"num_workers = {self._auto_workers} per device (auto: {cpus} CPUs for {devices} device(s);"
                " --data.num_workers=N sets it)"
            )
        return self._auto_workers

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() did not create this split")
        sampler = self._train_sampler(dataset) if train else self._eval_sampler(dataset)
        if train and not self.per_sample_seeds:
            dataset = IndexedDataset(dataset)  # the indices key each sample's augmentation on the device
        workers = self.workers_per_device()
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=workers,
            collate_fn=collate_batch,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=workers > 0,
            drop_last=train and self._drop_one_image_batch(len(sampler)),
        )

    def _drop_one_image_batch(self, shard: int) -> bool:
        """Whether each epoch's last training batch, which would hold 1 image per device, is left out: a
        model with BatchNorm cannot normalise one image in training ("Expected more than 1 value per
        channel"). Shards are equal on every rank, so every rank decides alike and takes the same steps."""
        if shard % self.batch_size != 1 or shard == 1 or self.trainer is None:
            return False
        # By name: torch's BatchNorm1d/2d/3d, SyncBatchNorm, lit_ddp's AllReduceSyncBatchNorm, timm's.
        if not any("BatchNorm" in type(m).__name__ for m in self.trainer.lightning_module.modules()):
            return False
        rank_zero_info(
            f"the last training batch of each epoch would hold 1 image per device ({shard} ="
            f" {shard // self.batch_size} × {self.batch_size} + 1), which BatchNorm cannot normalise: it is"
            " left out"
        )
        return True

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)

    @staticmethod
    def _list_predict_dir(predict_dir: str) -> list[str]:
        if not Path(predict_dir).is_dir():
            raise UserError(f"predict_dir={predict_dir} is not a folder: pass a folder of image files")
        files = list_image_files(Path(predict_dir))
        if not files:
            raise UserError(
                f"no image files under predict_dir={predict_dir} (searched its sub-folders too; hidden files"
                " and __MACOSX are left out)"
            )
        return files

    @property
    def predict_source(self) -> str:
        """What predict reads, for the report: ``predict_dir`` or the name of the test split."""
        return self.predict_dir if self.predict_dir is not None else f"{self.test_split} split"

    def predict_dataloader(self) -> DataLoader:
        if self.predict_dir is not None:
            sizes = dict(size=self.image_size, resize=self.val_resize)
            load = functools.partial(load_eval_crop, **sizes, exif_transpose=self.exif_transpose)
            self.predict_set = ImageFileDataset([(f, -1) for f in self.predict_files], load, self.image_size)
        else:
            self.predict_set = self.test_set
        if self.predict_set is None:
            raise RuntimeError(f"{type(self).__name__}.setup() did not create the test split")
        return self._loader(IndexedDataset(self.predict_set), train=False)

    # ---- on-device batch work ------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.trainer is not None:
            t = self.trainer
            rank_zero_info(
                f"global batch = {self.batch_size} per device × {t.world_size} devices"
                f" × {t.accumulate_grad_batches} accumulation"
                f" = {global_batch_size(t)} images per optimizer step"
            )

    def augment_batch(self, x: Tensor, rand: SampleRandom) -> Tensor:
        """Training augmentation of a (B, C, H, W) uint8 batch on its device: random crop + flip, each
        sample's from ``rand`` (its draws 0–2). An override takes every random number from ``rand``, so
        that it stays the same on any device count; a draw of its own takes the next free draw number."""
        return random_crop_flip(x, self.crop_padding, rand=rand)

    def augmentation_random(self, index: Tensor, epoch: int) -> SampleRandom:
        """The per-sample random numbers of a training batch whose samples are ``index`` (B,): a function
        of (seed, epoch, index) only, so neither rank nor batch nor device count changes a sample's draws."""
        return SampleRandom(index, _stable_seed(self.seed, epoch))

    def mixing_rng(self, rank: int, epoch: int, batch: int) -> random.Random:
        """MixUp/CutMix's draws for one training batch (the choice, λ, the box: a few host scalars), seeded
        by (seed, rank, epoch, batch): mixing pairs images inside this device's batch anyway (why Python's
        RNG: batch_transforms.py)."""
        return random.Random(_stable_seed(self.seed, rank, epoch, batch))

    def on_before_batch_transfer(self, batch: tuple, dataloader_idx: int) -> tuple:
        # A batch of image files (ImageFolder splits, predict_dir) carries its unreadable files in a third
        # slot, {slot: (path, why)}: their slots go here, on the CPU before the copy (no device sync).
        if len(batch) > 2 and isinstance(batch[2], dict):
            batch, bad = drop_unreadable(batch)
            if bad:
                self.on_unreadable_files(bad)
        trainer = self.trainer
        if trainer is not None and trainer.training and self._augments_on_device() and len(batch) > 2:
            # The draws' hashing (a few dozen integer ops on (B,) tensors) here, on the host: on a GPU each
            # op would be a kernel launch per step. The draws travel to the device with the batch.
            x, y, index, *rest = batch
            batch = (x, y, self.augmentation_random(index, trainer.current_epoch), *rest)
        return batch

    def _augments_on_device(self) -> bool:
        return self.augment and not self.per_sample_seeds  # per_sample_seeds: the workers augmented

    def on_unreadable_files(self, bad: dict[int, tuple[str, str]]) -> None:
        """With ``strict``, stop at the first one, naming it; else keep them for the skipped-images report
        (callbacks/skipped_images.py). predict's are named in predictions.csv's report."""
        if self.strict:
            path, reason = next(iter(bad.values()))
            # Not "delete it": a permission or network-disk error reads the same as a broken file.
            raise UserError(
                f"unreadable image file {path} ({reason}):"
                " replace it with a readable copy, or pass --data.strict=false to skip such files"
            )
        split = SPLIT_OF_STAGE.get(self.trainer.state.stage, "predict") if self.trainer else "predict"
        self.pending_skipped.setdefault(split, {}).update(bad.values())

    def on_after_batch_transfer(self, batch: tuple[Tensor, ...], dataloader_idx: int) -> tuple[Tensor, ...]:
        x, y, *index = batch  # (B, C, H, W) uint8 on the device; training and predict batches add indices
        trainer = self.trainer
        mix = None
        if trainer is not None and trainer.training:
            epoch = trainer.current_epoch
            key = (trainer.global_rank, epoch, self._count_training_batch(epoch))  # seeds the mixing
            if self._augments_on_device():
                if not index:
                    raise RuntimeError(
                        f"{type(self).__name__}: training batches reach the device without their sample"
                        " indices: build the training loader with ImageDataModule._loader"
                    )
                rand = index[0]  # drawn before the copy (on_before_batch_transfer), else drawn here
                if not isinstance(rand, SampleRandom):
                    rand = self.augmentation_random(rand, epoch)
                x = self.augment_batch(x, rand)
            index = []  # training steps take (x, y), as they always have
            if self.mixup_alpha > 0 or self.cutmix_alpha > 0:
                h, w = x.shape[-2:]
                mix = draw_mix(h, w, self.mixup_alpha, self.cutmix_alpha, self.mixing_rng(*key))
        x = normalize(x, self.mean, self.std)
        if mix is not None:  # after normalisation, as torchvision's reference mixes the batches it loads
            x, y = mix_batch(x, y, self.num_classes, *mix)  # y: (B, num_classes) probabilities from here
        return x, y, *index

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
