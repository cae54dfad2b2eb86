"""``StreamingDataModule``: training from shards written by ``python -m lit_ddp shard`` (shards.py), in a
local or shared folder or under ``s3://bucket/prefix``, with the promises of the local data modules.

- The training order is a function of (seed, epoch) only (``shards.chunk_window_order``: shards permuted,
  samples shuffled inside windows of ``window`` shards), dealt to the ranks as ``ResumableShuffleSampler``
  deals (rank r takes every N-th sample of it): global step k holds the same samples on 1, 2 or 4
  processes, so N × b trains the model 1 × N·b trains.
- Evaluation reads every sample once, unpadded (base.py's evaluation sampler).
- Augmentation is drawn from (seed, epoch, index) as in the other data modules: on the device for raw
  pixels (CIFAR-10 shards), in the workers for encoded files (ImageFolder shards, ImageNet's recipe).
- Encoded files are decoded as ImageNetDataModule decodes them, by the same strategy (decoders.py,
  ``--data.decode``): in the workers, or on the training device from the shards' bytes.
- A run stopped mid-epoch resumes at the next sample, also on another process count: the base's resume
  in global samples (``resume_point``), which refuses in one line a changed samples-per-step.

It is an ``ImageDataModule`` like the others: its splits come from ``load_split``, its shard order from
``train_sampler``; loaders, augmentation, resume and checkpoints are the base's.
"""

import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

from lit_ddp.data.base import ImageDataModule
from lit_ddp.data.batch import Batch
from lit_ddp.data.datasets import WorkerError, split_indices
from lit_ddp.data.image_folder import UnreadableFiles, decode_or_black, stack_crops
from lit_ddp.data.samplers import ResumableShuffleSampler, stable_seed
from lit_ddp.data.shards import (
    MANIFEST,
    READ_TIMEOUT,
    Sample,
    ShardedSamples,
    ShardError,
    check_url_form,
    chunk_window_order,
    is_remote,
    read_image_bytes,
    read_manifest,
)
from lit_ddp.errors import UserError
from lit_ddp.utils import local_path

# Normalisation by what the shards were made from; ImageNet's statistics for any photo folder.
STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "imagefolder": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}


class ShardImageDataset(Dataset):
    """The samples at ``positions`` (global indices, ascending) of one split's shards, batched.

    Raw shards (``shape`` given) give (B, C, H, W) uint8 and labels; encoded ones are read by ``load(bytes)``
    (a decoder's ``reader``: the (size, size, 3) uint8 crop, or what the device decodes), batched by
    ``collate(loaded, names)``; an unreadable image becomes a black slot named in the ``Batch``'s
    ``unreadable``. Indices may be (index, seed) pairs: that sample's
    random draws then come from torch's RNG seeded with ``seed`` (samplers.py ``SeededSampleSampler``).
    A label outside 0..num_classes-1 (the manifest's classes) or a raw image of another size than ``shape``
    is the shard's damage: one line naming it.
    """

    def __init__(
        self,
        samples: ShardedSamples,
        positions: np.ndarray,
        shape: tuple[int, ...] | None = None,
        load: Callable[[np.ndarray], np.ndarray] | None = None,
        size: int = 0,
        num_classes: int | None = None,
        collate: Callable[[Sequence, Sequence[str]], object] = stack_crops,
    ) -> None:
        self.samples, self.positions, self.shape, self.load, self.size = samples, positions, shape, load, size
        self.num_classes = num_classes
        self.collate = collate

    def _sample(self, position: int) -> Sample:
        index = int(self.positions[position])
        sample = self.samples[index]
        n = self.num_classes
        if n is not None and not 0 <= sample.label < n:
            why = f"has label {sample.label}, outside 0..{n - 1}: {MANIFEST} names {n} classes"
            raise self.samples.corrupt(index, why)
        if self.shape is not None and len(sample.image) != math.prod(self.shape):
            shape = "×".join(map(str, self.shape))
            why = f"holds {len(sample.image)} bytes, not the {shape} of {MANIFEST}'s image_shape"
            raise self.samples.corrupt(index, why)
        return sample

    def __len__(self) -> int:
        return len(self.positions)

    def _decode(self, position: int, seed: int | None) -> tuple[np.ndarray, int, str, tuple[str, str] | None]:
        sample = self._sample(position)
        name = sample.path or f"{self.samples.split}[{sample.index}]"
        image, bad = decode_or_black(self.load, read_image_bytes(sample.image), name, seed, self.size)
        return image, sample.label, name, bad

    def __getitems__(self, indices: Sequence[int | tuple[int, int]]) -> Batch | WorkerError:
        try:
            return self._batch(indices)
        except ShardError as err:
            if get_worker_info() is None:
                raise
            return WorkerError(err)  # raised by the training process as it is: one line, no traceback

    def _batch(self, indices: Sequence[int | tuple[int, int]]) -> Batch:
        pairs = [i if isinstance(i, tuple) else (i, None) for i in indices]
        if self.shape is not None:
            got = [self._sample(i) for i, _ in pairs]
            x = torch.stack([torch.frombuffer(bytearray(s.image), dtype=torch.uint8) for s in got])
            y = torch.tensor([s.label for s in got], dtype=torch.long)
            return Batch(x.reshape(len(got), *self.shape), y)
        images, labels, names, errors = zip(*(self._decode(i, seed) for i, seed in pairs), strict=True)
        x = self.collate(images, names)
        labels = torch.tensor(labels, dtype=torch.long)
        return Batch(x, labels, unreadable={i: e for i, e in enumerate(errors) if e})

    def file_paths(self) -> list[str] | None:
        """Each sample's file, relative to the folder ``shard`` read, in position order: what predictions.csv
        names a row by. None for shards that keep no paths (CIFAR-10's, which come from no files)."""
        if self.samples.header != 8:
            return None
        return [self.samples[int(index)].path for index in self.positions]

    def __getitem__(self, index: int):
        batch = self._batch([index])
        return batch.images[0], batch.labels[0]


class ShardOrderSampler(ResumableShuffleSampler):
    """Rank ``rank``'s share of ``chunk_window_order`` (padded as DistributedSampler pads), resumable
    mid-epoch; with ``seeded``, (index, seed) pairs whose seed is a function of (seed, epoch, index)."""

    def __init__(
        self,
        dataset: ShardImageDataset,
        num_replicas: int,
        rank: int,
        seed: int,
        window: int,
        seeded: bool,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, seed=seed)
        self.shard_sizes = dataset.samples.shard_sizes()
        self.positions, self.window, self.seeded = dataset.positions, window, seeded

    def global_order(self, epoch: int) -> list[int]:
        order = chunk_window_order(self.shard_sizes, self.positions, self.seed, epoch, self.window)
        while len(order) < self.total_size:  # padding, as torch's DistributedSampler pads
            order += order[: self.total_size - len(order)]
        return order

    def __iter__(self) -> Iterator:
        epoch = self.epoch
        mine = self.global_order(epoch)[self.rank : self.total_size : self.num_replicas][self.start :]
        if self.seeded:
            return ((i, stable_seed(self.seed, epoch, i)) for i in mine)
        return iter(mine)


class StreamingDataModule(ImageDataModule):
    """Shards from ``python -m lit_ddp shard`` (CIFAR-10 or ImageFolder), local or on s3://.

    Args:
        url: the shards' folder (local or shared file system) or ``s3://bucket/prefix``; S3's endpoint and
            credentials come from the standard AWS environment variables (``AWS_ENDPOINT_URL``, ...).
        val_size: for shards without a val split (CIFAR-10): training samples held out by a seeded split;
            shards with one (ImageFolder's val/) take 0.
        window: shards whose samples are shuffled together; larger mixes more, reads more shards at once.
        cache_dir: node-local folder for shards read from s3:// (shared by the node's ranks); None:
            ``$XDG_CACHE_HOME/lit_ddp/shards``. cache_limit_gb bounds it (least recently used out first).
        retries: attempts per shard read before the run stops naming the shard (a file missing from a
            local folder: at most 3, within a second).
        read_timeout: s3:// only: seconds a read waits for the server before it fails (and is retried).
        image_size / val_resize / draft / exif_transpose / decode / decode_ahead: encoded (ImageFolder)
            shards: as ImageNetDataModule (``decode=gpu``: the shards' bytes decoded on the training
            device); raw (CIFAR) shards keep their images' size and take ``decode=cpu`` only.
        strict: encoded shards: stop at the first unreadable image, naming it, instead of skipping it.
        **kwargs: ``ImageDataModule``'s (batch_size, num_workers, seed, augmentation, predict_dir,
            mixup_alpha, cutmix_alpha). ``augmentation``: raw shards take an on-device one (``CropFlip``,
            the default); encoded shards ``RandomResizedCropFlip`` in the workers (the ImageNet recipe), or
            an on-device one on their centre crops.
    """

    def __init__(
        self,
        url: str = "shards",
        val_size: int = 0,
        window: int = 8,
        cache_dir: str | None = None,
        cache_limit_gb: float = 50.0,
        retries: int = 4,
        read_timeout: float = READ_TIMEOUT,
        image_size: int = 224,
        val_resize: int = 256,
        draft: bool = True,
        exif_transpose: bool = True,
        strict: bool = False,
        decode: str = "cpu",
        decode_ahead: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        for name, value, fits, bound, what in (  # a NaN fits neither comparison
            ("window", window, window >= 1, "1 or more", "shards shuffled together"),
            ("retries", retries, retries >= 1, "1 or more", "attempts per shard read"),
            ("cache_limit_gb", cache_limit_gb, cache_limit_gb > 0, "above 0", "GB of the node's shard cache"),
            ("read_timeout", read_timeout, read_timeout > 0, "above 0", "seconds an s3:// read waits"),
        ):
            if not fits:
                raise UserError(f"--data.{name}={value} must be {bound} ({what})")
        url = local_path(url, "--data.url")  # a YAML config's ~ and $VAR arrive unexpanded
        check_url_form(url, f"--data.url={url}")
        if is_remote(url) and not url[len("s3://") :].partition("/")[0]:  # stripped of "/", s3:// is "s3:"
            raise UserError(f"--data.url={url} names no bucket: pass --data.url=s3://bucket/prefix")
        self.url, self.val_size, self.window, self.retries = url.rstrip("/"), val_size, window, retries
        self.read_timeout = read_timeout
        self.cache_dir = Path(local_path(cache_dir, "--data.cache_dir")) if cache_dir is not None else None
        self.cache_limit_bytes = int(cache_limit_gb * (1 << 30))
        # Read here, in the launching process: the CLI links num_classes to the model, and a wrong url
        # fails before any rank is spawned.
        manifest = read_manifest(self.url, retries, read_timeout)
        self.splits = manifest["splits"]
        self.class_names = tuple(manifest["class_names"])
        self.num_classes = len(self.class_names)
        self.mean, self.std = STATS.get(manifest["kind"], STATS["imagefolder"])
        self.shape = tuple(manifest["image_shape"]) if manifest["encoding"] == "raw" else None
        if self.shape is not None:
            self.image_size = self.val_resize = self.shape[-1]
            self.exif_transpose = exif_transpose  # for predict_dir's files
            if self.augmentation is not None and not self.augmentation.on_device:
                raise UserError(
                    f"the shards at {url} hold decoded pixels, which {type(self.augmentation).__name__}"
                    " cannot crop in the workers: pass --data.augmentation=CropFlip (on the device) or null"
                )
            if decode != "cpu":
                raise UserError(
                    f"--data.decode={decode}: the shards at {url} hold decoded pixels, nothing to decode:"
                    " leave out --data.decode"
                )
        else:
            self.unreadable = UnreadableFiles(strict=strict)
            self.decode_images(decode, image_size, val_resize, draft, exif_transpose, ahead=decode_ahead)
        if "val" in self.splits and val_size != 0:
            raise UserError(
                f"val_size={val_size}: the shards at {url} have a val split of their own: pass"
                " --data.val_size=0 (it holds out training samples only for shards without one)"
            )
        if "val" not in self.splits and val_size < 1:
            raise UserError(
                f"the shards at {url} have no val split: pass --data.val_size=N (held out of train)"
            )
        self.test_split = "test" if "test" in self.splits else "val"

    def loader_remedies(self) -> list[str]:
        remedies = super().loader_remedies()
        if self.url.startswith("s3://"):
            remedies.append(
                "a node cache on a local disk that holds an epoch: --data.cache_dir, cache_limit_gb"
            )
        return remedies

    def _split_samples(self, split: str) -> ShardedSamples:
        return ShardedSamples(
            self.url,
            split,
            self.cache_dir,
            self.cache_limit_bytes,
            self.retries,
            read_timeout=self.read_timeout,
        )

    def _dataset(self, samples: ShardedSamples, positions: np.ndarray, train: bool) -> ShardImageDataset:
        if self.shape is not None:
            return ShardImageDataset(samples, positions, shape=self.shape, num_classes=self.num_classes)
        decoder = self.decoder
        return ShardImageDataset(
            samples,
            positions,
            load=decoder.reader(train),
            size=self.image_size,
            num_classes=self.num_classes,
            collate=decoder.collate(train),
        )

    def load_split(self, split: str) -> ShardImageDataset:
        if split == "test":
            test = self._split_samples(self.test_split)
            return self._dataset(test, np.arange(len(test)), train=False)
        if "val" in self.splits:
            samples = self._split_samples(split)
            return self._dataset(samples, np.arange(len(samples)), train=split == "train")
        # no val split: a seeded hold-out of train, the same on every rank
        train = self._split_samples("train")
        train_idx, val_idx = split_indices(len(train), self.val_size, self.seed)
        return self._dataset(
            train, (train_idx if split == "train" else val_idx).numpy(), train=split == "train"
        )

    def split_options(self) -> dict:
        return {**super().split_options(), "val_size": self.val_size}  # held out of train by the seed

    def order_inputs(self) -> dict | None:
        """The train split's shards (their sample counts: sharded again with another --shard-mb is another
        order), its samples (the held-out val_size) and the window; None for a split someone wrapped. And
        what the shards hold (``content``: each one's bytes and the SHA-1 ``index.json`` records), so that
        shards of another tree with as many samples in each are told apart; the same tree sharded again
        gives the same bytes. A checkpoint saved without ``content`` is compared without it."""
        train = self.train_set
        if not isinstance(train, ShardImageDataset):
            return None
        sizes = np.asarray(train.samples.shard_sizes(), np.int64)
        digest = hashlib.blake2b(sizes.tobytes(), digest_size=16)
        digest.update(np.asarray(train.positions, np.int64).tobytes())
        shards, samples = len(sizes), len(train.positions)
        records = zip(train.samples.shards, train.samples.digests, strict=True)
        held = [f"{size} {sha1 or ''}" for (_, size, _), sha1 in records]
        content = hashlib.blake2b("\n".join(held).encode(), digest_size=16).hexdigest()
        return {
            "shards": shards,
            "samples": samples,
            "window": self.window,
            "digest": digest.hexdigest(),
            "content": content,
        }

    def train_sampler(self, dataset: Dataset, num_replicas: int, rank: int) -> Sampler:
        """The shards' windowed (seed, epoch) order (``ShardOrderSampler``), started at ``resume_point``."""
        if not isinstance(dataset, ShardImageDataset):
            # A split someone wrapped (the trust kit's subsample): the base's (seed, epoch) shuffle over it.
            return super().train_sampler(dataset, num_replicas, rank)
        in_workers = self.augmentation is not None and not self.augmentation.on_device
        sampler = ShardOrderSampler(dataset, num_replicas, rank, self.seed, self.window, seeded=in_workers)
        if self.resume_point is not None:
            epoch, samples = self.resume_point
            # rank r takes positions r, r + W, ... of the order: the first `samples` are samples / W of each
            # rank's share (the base's load_state_dict made sure W divides it)
            sampler.resume(epoch, samples // num_replicas)
        return sampler
