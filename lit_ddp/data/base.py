"""What every lit_ddp DataModule shares: per-device batches of uint8 images, loaders, augmentation and
normalisation. The contract for your own data module: docs/data-module.md.

A subclass sets ``num_classes``, ``class_names``, ``mean``, ``std`` and implements
``load_split(split) -> Dataset`` for "train", "val" and "test"; the base's one ``setup`` calls it for the
splits a stage needs. The training loader shuffles by (seed, epoch) and shards over the ranks
(``train_sampler``, overridable); evaluation loaders shard without padding (samplers.py).

``predict`` reads the test split, or with ``predict_dir`` every image file under that folder, unlabelled
(label -1), resized and centre-cropped as evaluation images are. Its batches carry each sample's index in
that set as a third tensor, so predictions can be put back in order and named, whatever the rank, the
batch, or an unreadable file left out of its batch.

Resuming mid-epoch is exact, and counted in samples: the data module counts the training samples of the
current epoch consumed over all ranks, saves the count in the checkpoint (``state_dict``), and a resumed
run continues at the next sample of the same (seed, epoch) order, on any device count and per-device batch
whose product (the samples per step over all devices) is the one the checkpoint was saved with. Each
sample's augmentation comes from (seed, epoch, index) alone (augmentation.py), the same on any device count
and after a resume. MixUp and CutMix (``mixup_alpha``, ``cutmix_alpha``) mix the normalised training batch
and make its labels (B, num_classes) probabilities; their draws come from (seed, rank, epoch, batch), since
they pair images inside one device's batch (the one device-count-dependent augmentation).
"""

import functools
import inspect
import math
import random
from collections.abc import Callable, Sized
from dataclasses import replace
from pathlib import Path

import torch
from lightning import LightningDataModule
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from numpy import ndarray
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from lit_ddp.data.augmentation import Augmentation, CropFlip, describe, rebuild
from lit_ddp.data.batch import Batch
from lit_ddp.data.batch_transforms import SampleRandom, draw_mix, mix_batch, normalize
from lit_ddp.data.datasets import IndexedDataset, TensorImageDataset, WorkerError, collate_batch
from lit_ddp.data.decoders import ImageDecode, image_decode
from lit_ddp.data.folder_index import left_out_note
from lit_ddp.data.image_folder import ImageFileDataset, UnreadableFiles, scan_image_files
from lit_ddp.data.jpeg import load_eval_crop
from lit_ddp.data.loader_checks import (
    BUILT_FOR_TRAINING,
    LOADER_HOOKS,
    check_loader_options,
    checked_loader_hook,
)
from lit_ddp.data.samplers import (
    ResumableShuffleSampler,
    SeededSampleSampler,
    UnpaddedDistributedSampler,
    stable_seed,
)
from lit_ddp.data.split_checks import check_split_evaluated, check_training_batch_fits
from lit_ddp.data.workers import auto_num_workers, available_cpus
from lit_ddp.errors import UserError
from lit_ddp.utils import (
    LoadsSavedSubclass,
    accumulation,
    from_here,
    global_batch_size,
    later_global_batches,
    local_path,
    plain_data,
    scheduled_accumulation,
)

# Which split a batch belongs to, from the trainer's running stage (the sanity check runs val batches).
SPLIT_OF_STAGE = {
    RunningStage.TRAINING: "train",
    RunningStage.SANITY_CHECKING: "val",
    RunningStage.VALIDATING: "val",
    RunningStage.TESTING: "test",
    RunningStage.PREDICTING: "predict",
}

# The splits each stage's ``setup`` loads (predict reads the test split unless predict_dir is given).
SPLITS_OF_STAGE = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("test",)}

# The largest training split whose augmentation draws are hashed for the whole epoch at once (10 MB of them).
EPOCH_DRAWS_MAX = 1 << 18


def _trains() -> str | None:
    """A model that has not said otherwise trains on a batch of one image per device."""
    return None


class ImageDataModule(LoadsSavedSubclass, LightningDataModule):
    """Base of the lit_ddp DataModules. ``batch_size`` is per device; the global batch is printed once.
    The base saves every constructor's arguments, a subclass's too (no ``save_hyperparameters`` needed),
    except data given to one (a tensor, an array, a Dataset): pass that again to ``load_from_checkpoint``.

    Args:
        batch_size: per device.
        num_workers: DataLoader workers per device; None: one per spare CPU core (``auto_num_workers``).
        seed: the shuffle, the augmentation and any seeded split; the same on every rank.
        augmentation: training augmentation (augmentation.py): ``CropFlip`` (random crop from the image
            zero-padded by ``padding`` pixels, then a horizontal flip, on the device), another
            ``Augmentation``, or null for none.
        predict_dir: predict on every image file under this folder (unlabelled) instead of the test split.
        mixup_alpha: MixUp of the normalised training batch with Beta(α, α); 0 is off. With CutMix
            too, one of the two per batch, p = 1/2.
        cutmix_alpha: CutMix of the normalised training batch with Beta(α, α); 0 is off.
    """

    num_classes: int = 10
    class_names: tuple[str, ...] = ()
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.25, 0.25, 0.25)
    # Evaluation crops (predict_dir's images): short side resized to val_resize, centre crop of image_size.
    image_size: int = 32
    val_resize: int = 32
    test_split: str = "test"  # what test_set holds, named in predict's report
    exif_transpose: bool = True  # predict_dir's images are turned upright as their EXIF orientation says
    # Data modules whose splits are image files note the unreadable ones here (callbacks/skipped_images.py
    # reports them), as does any with a predict_dir; None: the splits are in memory, nothing to report.
    unreadable: UnreadableFiles | None = None
    # Data modules of encoded images (files, shards) decode them with this strategy (decoders.py), chosen
    # once by their --data.decode; None: the splits are pixels already.
    decoder: ImageDecode | None = None

    def __init_subclass__(cls, **kwargs) -> None:
        # A subclass's own loader hooks are checked as they return (loader_checks.py): a DataLoader built
        # without self.loader fails at its first batch, inside torch's collate, or loses the samplers in
        # silence.
        super().__init_subclass__(**kwargs)
        for name in LOADER_HOOKS:
            hook = cls.__dict__.get(name)
            if inspect.isfunction(hook):
                setattr(cls, name, checked_loader_hook(hook, name))

    def __init__(
        self,
        batch_size: int = 128,
        num_workers: int | None = None,
        seed: int = 0,
        augmentation: Augmentation | None = CropFlip(padding=4),
        predict_dir: str | None = None,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise UserError(f"batch_size={batch_size} must be at least 1 (it is the per-device batch size)")
        if num_workers is not None and num_workers < 0:
            raise UserError(f"num_workers={num_workers} must be 0 or more (or null: one per spare CPU core)")
        for name, alpha in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
            if alpha < 0:
                raise UserError(f"{name}={alpha} must be 0 (off) or more (the α of its Beta(α, α))")
        # torch's generators take 64 bits: a larger seed was a traceback at the first epoch
        if not -(2**63) <= seed < 2**63:
            raise UserError(
                f"--data.seed={seed} is out of range: pass a whole number below 2**63 in size, e.g. 0"
            )
        self.batch_size = batch_size
        self.num_workers = num_workers  # None: auto_num_workers, resolved once the trainer is attached
        self._auto_workers: int | None = None
        # The workers an override's training loader sets itself (loader(..., num_workers=N)), or None.
        self._own_train_workers: int | None = None
        # The line a training batch of one image per device fails with, or None where it trains: a model
        # whose BatchNorm normalises each device's batch alone hands this question over as it is set up
        # (ImageClassifier.setup); the training loader asks it once the strategy synchronised the layers.
        self.batch_of_one_fails: Callable[[], str | None] = _trains
        self.seed = seed
        if isinstance(augmentation, dict):  # as a checkpoint holds it: load_from_checkpoint passes it back
            augmentation = rebuild(augmentation)
        self.augmentation = augmentation
        # Every constructor's arguments, the subclasses' included (Lightning collects the whole chain), for
        # the checkpoint; as plain data (the augmentation described, a path as its string), which a
        # weights-only load reads without importing.
        self.save_hyperparameters(ignore=["augmentation"])
        # Data handed to a subclass's constructor is not a setting: the checkpoint would hold the dataset and
        # the logger would write it into hparams.yaml, number by number, before the first batch.
        data = [key for key, value in self.hparams.items() if isinstance(value, Tensor | Dataset | ndarray)]
        if data:
            self.save_hyperparameters(ignore=["augmentation", *data])
        self.hparams["augmentation"] = describe(self.augmentation)
        self.hparams.update(plain_data(dict(self.hparams)))
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.predict_set: Dataset | None = None  # what predict reads: test_set or predict_dir's images
        self.predict_dir = local_path(predict_dir, "--data.predict_dir") if predict_dir is not None else None
        # Listed here, in the launching process: a wrong folder fails before any rank is spawned.
        self.predict_files = self._list_predict_dir(self.predict_dir) if self.predict_dir is not None else []
        if self.predict_dir is not None and self.unreadable is None:
            self.unreadable = UnreadableFiles()
        self._epoch = 0  # the training epoch whose samples are being counted
        self._samples = 0  # training samples of that epoch consumed over all ranks (trained, or resumed)
        self._batches = 0  # training batches of that epoch on this rank: MixUp/CutMix's key
        self._resume: tuple[int, int] | None = None  # (epoch, samples) from a checkpoint
        self._labels_checked: dict[str, Dataset] = {}  # in-memory splits whose labels setup checked whole
        self._draws_of: tuple[tuple, SampleRandom] | None = None  # ((seed, epoch, N), that epoch's draws)

    @property
    def augment(self) -> bool:
        """Whether training images are augmented at all."""
        return self.augmentation is not None

    # ---- the splits ----------------------------------------------------------------------------

    def check_stage(self, stage: str) -> None:
        """UserError where what ``stage`` ("fit", "validate", "test", "predict") reads is missing: the CLI
        calls it before any process starts. Nothing here: a data module of folders checks them
        (imagenet.py)."""

    def load_split(self, split: str) -> Dataset | tuple[Tensor, Tensor]:
        """The ``split`` ("train", "val" or "test") as a Dataset of (C, H, W) uint8 images and int64 labels,
        or as a pair (N, C, H, W) uint8 images, (N,) labels held in memory. A function of the seed only:
        every rank must hold the same split."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_split(split) -> Dataset")

    def setup(self, stage: str) -> None:
        if stage == "fit":
            # Every fit counts from the start of its first epoch: a data module fitted before in this process
            # (a notebook, a sweep) would otherwise start at that fit's resume point, and count on from its
            # samples. A resumed fit's load_state_dict runs after setup and sets them from its checkpoint.
            self._epoch, self._samples, self._batches, self._resume = 0, 0, 0, None
            self.batch_of_one_fails = _trains  # until this fit's model hands over its own
        if stage == "fit" and self.trainer is not None:
            t = self.trainer
            rank_zero_info(
                f"global batch = {self.batch_size} per device × {t.world_size} devices"
                f" × {accumulation(t)} accumulation"
                f" = {global_batch_size(t)} images per optimizer step{later_global_batches(t)}"
            )
        if self.class_names and len(self.class_names) != self.num_classes:
            # Else predictions.csv names the classes that have a name and numbers the others, in silence.
            raise UserError(
                f"{type(self).__name__} has {len(self.class_names)} class_names for num_classes="
                f"{self.num_classes}: give one name per class (or none: classes are then numbered)"
            )
        splits = SPLITS_OF_STAGE[stage]
        if stage == "predict" and self.predict_dir is not None:
            splits = ()  # predict reads predict_dir's files, not the test split
        for split in splits:
            data = self.load_split(split)
            self._check_split_kind(stage, split, data)
            if isinstance(data, tuple):
                self._check_tensor_split(split, *data)
                if stage != "predict":  # predict reads no label: a split of unlabelled images may say -1
                    # Every label at once, before the run: a bad one deep in the split is found now, not
                    # when its batch comes, and this split's batches need no check of their own. Before
                    # TensorImageDataset casts them to int64, which would turn a label 0.5 into 0.
                    self._check_labels(data[1], split)
                data = TensorImageDataset(*data)
                if stage != "predict":
                    self._labels_checked[split] = data
            setattr(self, f"{split}_set", data)
        if self.trainer is not None and stage == "fit":
            t, scheduled = self.trainer, scheduled_accumulation(self.trainer)
            most = t.accumulate_grad_batches if scheduled is None else scheduled
            train = getattr(self, "train_set", None)
            check_training_batch_fits(self.batch_size, train, t.world_size, most, scheduled is not None)
        if stage in ("validate", "test"):
            check_split_evaluated(stage, getattr(self, f"{SPLITS_OF_STAGE[stage][0]}_set", None))

    def _check_split_kind(self, stage: str, split: str, data: object) -> None:
        """UserError for a ``load_split`` result the loaders cannot read: None where the stage reads the split
        (the loader's RuntimeError after the model summary), or a Dataset without a length (an
        IterableDataset: a TypeError in setup); the samplers shard, shuffle and resume by sample index."""
        name = f"{type(self).__name__}.load_split('{split}')"
        if data is None:
            t = self.trainer
            if split == "val" and stage == "fit" and (t is None or t.limit_val_batches == 0):
                return  # a fit that does not validate reads no val split
            without = ", or pass --trainer.limit_val_batches=0 to fit without one" if stage == "fit" else ""
            raise UserError(
                f"{name} returned None, and {getattr(stage, 'value', stage)} reads the {split} split: return"
                f" it as a Dataset or an (images, labels) pair{without}"
            )
        if not isinstance(data, tuple) and (
            isinstance(data, IterableDataset) or not hasattr(data, "__len__")
        ):
            raise UserError(
                f"{name} returned a dataset without a length ({type(data).__name__}, an iterable dataset):"
                " lit_ddp shards, shuffles and resumes by sample index; return a map-style Dataset (__len__"
                " and __getitem__), or write the data as shards (python -m lit_ddp shard) and read them with"
                " StreamingDataModule"
            )

    def _check_tensor_split(self, split: str, images: Tensor, labels: Tensor) -> None:
        """UserError for a (images, labels) split that is not (N, C, H, W) uint8 and N labels, naming the
        conversion; TensorImageDataset's own refusal was a ValueError traceback."""
        for what, value in (("images", images), ("labels", labels)):
            if not isinstance(value, Tensor):  # a numpy array's dtype would print as the uint8 it asks for
                kind = f"{type(value).__module__.split('.')[0]}.{type(value).__qualname__}"
                convert = "torch.from_numpy" if kind == "numpy.ndarray" else "torch.tensor"
                raise UserError(
                    f"{type(self).__name__}.load_split('{split}') returned its {what} as a"
                    f" {kind.removeprefix('builtins.')}, not a torch tensor: return {convert}({what})"
                )
        shape, dtype = tuple(images.shape), images.dtype
        if dtype != torch.uint8:
            fix = "uint8 images in 0..255 (from floats in [0, 1]: (x * 255).round().to(torch.uint8))"
        elif len(shape) == 3:
            fix = "(N, C, H, W) images (grayscale (N, H, W): x.unsqueeze(1), with one-value mean and std)"
        elif len(shape) != 4:
            fix = "(N, C, H, W) images"
        elif len(labels) != shape[0]:
            fix = f"one label per image ({len(labels)} labels for {shape[0]} images)"
        else:
            return
        raise UserError(
            f"{type(self).__name__}.load_split('{split}') returned images of shape {shape} and dtype {dtype}:"
            f" give {fix}"
        )

    # ---- loaders -------------------------------------------------------------------------------

    def _replicas(self) -> tuple[int, int]:
        """(num_replicas, rank) of the samplers: the trainer's, or (1, 0) without one."""
        kwargs = (self.trainer.distributed_sampler_kwargs if self.trainer is not None else None) or {}
        return kwargs.get("num_replicas", 1), kwargs.get("rank", 0)

    def _eval_sampler(self, dataset: Dataset) -> UnpaddedDistributedSampler | None:
        """Under DDP, shard evaluation sets without padding so every sample counts exactly once; with one
        process, or without a trainer, a plain sequential loader."""
        num_replicas, rank = self._replicas()
        if num_replicas <= 1:
            return None
        return UnpaddedDistributedSampler(dataset, num_replicas=num_replicas, rank=rank)

    @property
    def resume_point(self) -> tuple[int, int] | None:
        """(epoch, samples of it consumed over all ranks) where a resumed run continues; None: from the
        start of whatever epoch Lightning runs."""
        return self._resume

    def train_sampler(self, dataset: Dataset, num_replicas: int, rank: int) -> Sampler:
        """The training sampler: rank ``rank``'s shard of a (seed, epoch) permutation, the same order on every
        device count, started at ``resume_point``. An override must keep those promises (a
        DistributedSampler subclass, so Lightning keeps it; ``set_epoch``). With an augmentation that runs
        in the workers, it yields (index, seed) pairs (``SeededSampleSampler``)."""
        in_workers = self.augmentation is not None and not self.augmentation.on_device
        sampler_class = SeededSampleSampler if in_workers else ResumableShuffleSampler
        sampler = sampler_class(dataset, num_replicas=num_replicas, rank=rank, seed=self.seed)
        if self._resume is not None:
            epoch, samples = self._resume
            # rank r takes positions r, r + W, ... of the permutation: the first `samples` are samples / W
            # of each rank's shard (load_state_dict made sure W divides it)
            sampler.resume(epoch, samples // num_replicas)
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

    def decode_images(
        self, decode: str, image_size: int, val_resize: int, draft: bool, exif_transpose: bool, ahead: bool
    ) -> None:
        """The settings of a data module of encoded images (a folder of JPEGs, or shards of them) and the
        decoder they choose (decoders.py), set once for both."""
        if image_size < 1:  # else the network's first layer fails on 0-pixel crops, once training started
            raise UserError(
                f"--data.image_size={image_size} must be 1 or more (the side of the square crops the model"
                " gets; 224 for ImageNet's networks)"
            )
        self.image_size, self.val_resize = image_size, val_resize
        self.draft, self.exif_transpose = draft, exif_transpose
        settings = {"draft": draft, "exif_transpose": exif_transpose, "ahead": ahead}
        self.decoder = image_decode(decode, image_size, val_resize, self.augmentation, self.mean, **settings)

    def loader_remedies(self) -> list[str]:
        """What would feed the devices faster with this data module, most likely first, each as the option to
        set: the console names them when training steps wait for data. Subclasses add their own."""
        own = self._own_train_workers
        workers, cpus = self.workers_per_device() if own is None else own, available_cpus()
        devices = self.trainer.num_devices if self.trainer is not None else 1
        spare = cpus // max(devices, 1) - 1
        device = self._training_device()
        on_cuda = device is not None and device.type == "cuda"
        remedies = []
        # Encoded images decoded in the workers, and no per-image augmentation that must run there.
        if on_cuda and type(self.decoder) is ImageDecode and self.decoder.sample_augment is None:
            remedies.append("decode the images on the GPU: --data.decode=gpu")
        if not on_cuda and isinstance(self.train_set, TensorImageDataset):
            # Training on the CPU from memory, the wait is the crop, flip and normalisation the training
            # process does itself: a worker would only index memory and add a copy between processes.
            return remedies
        if workers < spare:
            # --data.num_workers does not reach a training loader that sets its own: name where it is set.
            option = (
                f"--data.num_workers={spare}"
                if own is None
                else f"num_workers={spare} in {type(self).__name__}.train_dataloader's self.loader(...)"
            )
            remedies.append(f"more loader workers: {option} (now {workers}, {cpus} CPUs)")
        else:
            remedies.append(f"more CPUs per device (now {workers} loader workers and training, {cpus} CPUs)")
        return remedies

    def loader(self, dataset: Dataset | None, train: bool = False, **dataloader_kwargs) -> DataLoader:
        """The DataLoader of ``dataset`` (a split, or a Dataset wrapping one), as every loader of the data
        module is built: the training sampler (``train``: order by seed and epoch, shards, resume point) or
        evaluation's without padding, the batch collate, and the sample indices where the batches need them.
        ``dataloader_kwargs`` override DataLoader arguments (``num_workers``, ``pin_memory``,
        ``prefetch_factor``, ``persistent_workers``, ...); those that would replace lit_ddp's parts
        (``sampler``, ``batch_sampler``, ``shuffle``, ``collate_fn``, ``drop_last``, another ``batch_size``)
        are refused (loader_checks.py). Call it from an override of ``train_dataloader`` and the like."""
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() did not create this split")
        check_loader_options(type(self).__name__, dataloader_kwargs, train, self.batch_size)
        sampler = self.train_sampler(dataset, *self._replicas()) if train else self._eval_sampler(dataset)
        failure = self.batch_of_one_fails() if train else None  # the layers the model trains with
        if failure is not None and self.batch_size == 1:
            raise UserError(failure)
        if self._needs_index(train) and not isinstance(dataset, IndexedDataset):
            dataset = IndexedDataset(dataset)  # the indices key each sample's augmentation, or its prediction
        workers = dataloader_kwargs.get("num_workers")
        if train:
            self._own_train_workers = workers
        workers = self.workers_per_device() if workers is None else workers
        options = {
            "pin_memory": torch.cuda.is_available(),
            "persistent_workers": workers > 0,
            **dataloader_kwargs,
            "num_workers": workers,
            "batch_size": self.batch_size,
            "sampler": sampler,
            "collate_fn": collate_batch,
            "drop_last": failure is not None and self._drop_one_image_batch(len(sampler)),
        }
        options.pop("shuffle", None)  # as the sampler reads the split (check_loader_options)
        if workers == 0:  # torch refuses both without workers, which --data.num_workers=0 would then hit
            options.pop("prefetch_factor", None)
            options.pop("persistent_workers")
        if self.decoder is not None:
            loader = self.decoder.loader(dataset, self._training_device, **options)
        else:
            loader = DataLoader(dataset, **options)
        setattr(loader, BUILT_FOR_TRAINING, train)  # what a subclass's loader hook is checked for
        return loader

    def _needs_index(self, train: bool) -> bool:
        """Whether the loader's batches carry their samples' indices (``IndexedDataset``): training batches
        augmented on the device, and predict's (each prediction put back in its place)."""
        if train:
            return self._augments_on_device()
        return self.trainer is not None and self.trainer.predicting

    def _training_device(self) -> torch.device | None:
        return self.trainer.strategy.root_device if self.trainer is not None else None

    def _drop_one_image_batch(self, shard: int) -> bool:
        """Whether each epoch's last training batch, which would hold 1 image per device, is left out, where
        the model cannot train on one image (``batch_of_one_fails``). Shards are equal on every rank, so every
        rank decides alike and takes the same steps."""
        if shard % self.batch_size != 1 or shard == 1:
            return False
        rank_zero_info(
            f"the last training batch of each epoch would hold 1 image per device ({shard} ="
            f" {shard // self.batch_size} × {self.batch_size} + 1), which BatchNorm cannot normalise: it is"
            " left out"
        )
        return True

    def _check_loaded(self, dataset: Dataset | None, split: str, stage: str) -> None:
        """UserError for a loader asked for before any ``setup`` that loads its split (a loop of your own, a
        look at a batch): a Trainer given the data module calls ``setup`` itself. With a Trainer, the base's
        ``setup`` has refused a missing split already."""
        if dataset is None and self.trainer is None:
            raise UserError(
                f"{type(self).__name__}'s splits are not loaded: call dm.setup({stage!r}) before its {split}"
                " loader (a Trainer given datamodule=dm calls it)"
            )

    def train_dataloader(self) -> DataLoader:
        self._check_loaded(self.train_set, "train", "fit")
        return self.loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        self._check_loaded(self.val_set, "val", "fit")
        return self.loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        self._check_loaded(self.test_set, "test", "test")
        return self.loader(self.test_set)

    @staticmethod
    def _list_predict_dir(predict_dir: str) -> list[str]:
        if not Path(predict_dir).is_dir():
            where = from_here(predict_dir)
            raise UserError(f"predict_dir={where} is not a folder: pass a folder of image files")
        files, others = scan_image_files(Path(predict_dir))
        note = left_out_note(others)
        if not files:
            raise UserError(
                f"no image files under predict_dir={predict_dir} (searched its sub-folders too; hidden files"
                f" and __MACOSX are left out){note}"
            )
        if note:  # the launching process lists it: said once
            rank_zero_info(f"predict_dir={predict_dir}: {len(files):,} image files{note}")
        return files

    @property
    def predict_source(self) -> str:
        """What predict reads, for the report: ``predict_dir`` or the name of the test split."""
        return self.predict_dir if self.predict_dir is not None else f"{self.test_split} split"

    def predict_dataloader(self) -> DataLoader:
        if self.predict_dir is not None:
            files = [(f, -1) for f in self.predict_files]
            if self.decoder is not None:  # as the test split would be decoded
                load, collate = self.decoder.reader(train=False), self.decoder.collate(train=False)
                self.predict_set = ImageFileDataset(files, load, self.image_size, collate)
            else:
                sizes = dict(size=self.image_size, resize=self.val_resize)
                load = functools.partial(load_eval_crop, **sizes, exif_transpose=self.exif_transpose)
                self.predict_set = ImageFileDataset(files, load, self.image_size)
        else:
            self._check_loaded(self.test_set, "predict", "predict")
            self.predict_set = self.test_set
        if self.predict_set is None:
            raise RuntimeError(f"{type(self).__name__}.setup() did not create the test split")
        return self.loader(IndexedDataset(self.predict_set))

    # ---- on-device batch work ------------------------------------------------------------------

    def augment_batch(self, x: Tensor, rand: SampleRandom) -> Tensor:
        """Training augmentation of a (B, C, H, W) uint8 batch on its device: the ``augmentation``'s, each
        sample's draws from ``rand``. An override takes every random number from ``rand``, so that it stays
        the same on any device count; a draw of its own takes the next free draw number."""
        return self.augmentation.augment_batch(x, rand) if self.augmentation is not None else x

    def augmentation_random(self, index: Tensor, epoch: int) -> SampleRandom:
        """The per-sample random numbers of a training batch whose samples are ``index`` (B,): a function
        of (seed, epoch, index) only, so neither rank nor batch nor device count changes a sample's draws."""
        if index.device.type == "cpu" and (table := self._epoch_draws(epoch)) is not None:
            try:
                return table.take(index)
            except IndexError:  # indices past the split (hooks called by hand): hashed as any others
                pass
        return SampleRandom(index, stable_seed(self.seed, epoch))

    def _epoch_draws(self, epoch: int) -> SampleRandom | None:
        """The draws of every training sample in ``epoch``, hashed once an epoch where the training split
        is small enough to hold them (``EPOCH_DRAWS_MAX``, 40 bytes a sample): a batch's draws are then its
        rows, where hashing them costs a few dozen array ops a step on the host, which a step as fast as
        LeNet's on a GPU waits for. The training sampler's indices are positions in this split."""
        n = len(self.train_set) if isinstance(self.train_set, Sized) else EPOCH_DRAWS_MAX + 1
        if n > EPOCH_DRAWS_MAX:
            return None
        made_for = (self.seed, epoch, n)
        if self._draws_of is None or self._draws_of[0] != made_for:
            self._draws_of = (made_for, SampleRandom(torch.arange(n), stable_seed(self.seed, epoch)))
        return self._draws_of[1]

    def mixing_rng(self, rank: int, epoch: int, batch: int) -> random.Random:
        """MixUp/CutMix's draws for one training batch (the choice, λ, the box: a few host scalars), seeded
        by (seed, rank, epoch, batch): mixing pairs images inside this device's batch anyway (why Python's
        RNG: batch_transforms.py)."""
        return random.Random(stable_seed(self.seed, rank, epoch, batch))

    def on_before_batch_transfer(self, batch: Batch | tuple | WorkerError, dataloader_idx: int) -> Batch:
        if isinstance(batch, WorkerError):  # a worker could not build it: its error, here, as itself
            raise batch.error
        if not isinstance(batch, Batch):  # a Dataset of the user's: (image, label) pairs
            batch = self._as_batch(batch)
        if self.unreadable is not None:  # every file of a split unreadable is refused (skipped_images.py)
            self.unreadable.count_read(self._split_name(), len(batch.labels))
        if batch.unreadable:  # files the workers could not read: dropped here, on the CPU before the copy
            bad = batch.unreadable
            batch = batch.drop(bad)
            self.on_unreadable_files(bad)
        trainer = self.trainer
        if trainer is not None and not trainer.predicting:  # predict_dir's images carry label -1: unlabelled
            split = self._split_name()
            checked = self._labels_checked.get(split)  # skipped only for the very split setup checked whole
            if checked is None or checked is not getattr(self, f"{split}_set", None):
                self._check_labels(batch.labels, split, per_sample=True)
        if isinstance(batch.labels, Tensor) and batch.labels.dtype != torch.int64:
            # cross-entropy takes int64 class indices only; a pair's labels are cast as they are wrapped
            batch = replace(batch, labels=batch.labels.long())
        if (
            trainer is not None
            and trainer.training
            and self._augments_on_device()
            and batch.index is not None
        ):
            # The draws' hashing (a few dozen integer ops on (B,) tensors) here, on the host: on a GPU each
            # op would be a kernel launch per step. The draws travel to the device with the batch.
            batch = replace(batch, draws=self.augmentation_random(batch.index, trainer.current_epoch))
        return batch

    def _indexed(self) -> bool:
        """Whether this stage's loader adds each sample's index to its batches (``IndexedDataset``): training
        batches augmented on the device, and predict batches."""
        trainer = self.trainer
        return trainer is not None and (
            trainer.predicting or (trainer.training and self._augments_on_device())
        )

    def _as_batch(self, batch: tuple | list | dict) -> Batch:
        """A user Dataset's collated samples, ``(images, labels)`` plus the indices the loader adds
        (``_indexed``), as a ``Batch``; anything else is refused (``_check_samples``)."""
        self._check_samples(batch)
        return Batch(batch[0], batch[1], index=batch[2] if self._indexed() else None)

    def _check_samples(self, batch: tuple | dict) -> None:
        """UserError for a batch that is not (images, labels), plus the indices the loader adds to training
        batches augmented on the device and to predict batches: a dataset yielding dicts failed with a
        traceback far from it, and one yielding (image, label, extra) had its extra taken for the indices
        that key each sample's augmentation, in silence."""
        trainer = self.trainer
        added = self._indexed()
        items = list(batch[: len(batch) - added]) if isinstance(batch, tuple | list) else [batch]
        # The first item is the images, or the loader's own batch of them (file bytes decoded on the device).
        if len(items) == 2 and not isinstance(items[0], dict) and isinstance(items[1], Tensor):
            return
        if isinstance(items[0], dict):
            what = f"dict samples (keys {', '.join(map(str, items[0]))})"
        else:
            what = f"samples of {len(items)} items ({', '.join(type(t).__name__ for t in items)})"
        split = SPLIT_OF_STAGE.get(trainer.state.stage, "") if trainer is not None else ""
        raise UserError(
            f"{type(self).__name__}'s {split} split yields {what}, not (image, label) pairs: load_split must"
            " return a Dataset whose samples are a (C, H, W) uint8 image tensor and its int label"
        )

    def _check_labels(self, y: Tensor, split: str, per_sample: bool = False) -> None:
        """UserError for labels of ``split`` that are not one class index in [0, num_classes) per image:
        cross-entropy fails on one outside with a traceback on a CPU and a device-side assert on a GPU, on
        (N, 1) or one-hot labels with a traceback, and the cast to int64 truncates 0.5 to 0 in silence. An
        in-memory split's labels are checked whole in ``setup``; a Dataset's, batch by batch
        (``per_sample``), on the host before the copy (no device sync)."""
        if not isinstance(y, Tensor) or y.numel() == 0:
            return
        if y.ndim != 1:  # cross-entropy's traceback: "0D or 1D target tensor expected" or "Expected floating"
            name = type(self).__name__
            if not per_sample:  # a pair of tensors' labels
                how = "labels.squeeze(1)" if y.shape[1:] == (1,) else "from one-hot: labels.argmax(1)"
                what = f"labels of shape {tuple(y.shape)}: give one class index per image, shape (N,) ({how})"
            else:
                what = f"labels of shape {tuple(y.shape[1:])} per sample: __getitem__ must return int labels"
            raise UserError(f"{name}'s {split} split has {what}")
        if y.device.type != "cpu":  # a dataset already on the device: reading its labels would wait for it
            return
        if y.is_floating_point():  # whole values are cast to int64; others would be truncated in silence
            fraction = y[y != y.round()]  # NaN too
            if fraction.numel():
                raise UserError(
                    f"{type(self).__name__}'s {split} split has label {float(fraction[0]):g}, not a class"
                    f" index: labels are whole numbers 0..{self.num_classes - 1}; map them to class indices"
                    " in load_split"
                )
        low, high = (int(v) for v in torch.aminmax(y))
        if low >= 0 and high < self.num_classes:
            return
        raise UserError(
            f"{type(self).__name__}'s {split} split has label {low if low < 0 else high}, outside"
            f" 0..{self.num_classes - 1} (num_classes={self.num_classes}): labels are class indices; map them"
            " to 0..num_classes-1 in load_split, or set num_classes to the number of classes"
        )

    def _augments_on_device(self) -> bool:
        return self.augmentation is not None and self.augmentation.on_device

    def on_unreadable_files(self, bad: dict[int, tuple[str, str]]) -> None:
        """Note them in ``unreadable`` for the skipped-images report (or stop, when it is strict); predict's
        are named in predictions.csv's report."""
        if self.unreadable is not None:
            self.unreadable.add(self._split_name(), bad)

    def _split_name(self) -> str:
        """The split the trainer reads now; "predict" outside a trainer."""
        return SPLIT_OF_STAGE.get(self.trainer.state.stage, "predict") if self.trainer else "predict"

    def on_after_batch_transfer(self, batch: Batch | tuple, dataloader_idx: int) -> tuple[Tensor, ...]:
        if not isinstance(batch, Batch):  # hooks called by hand, with a user Dataset's tuple
            batch = self._as_batch(batch)
        if self.decoder is not None and self.decoder.on_device:  # decoded on a thread, or still bytes
            batch = self._decode_on_device(batch)
        x, y = batch.images, batch.labels  # (B, C, H, W) uint8 on the device
        trainer = self.trainer
        mix = None
        if trainer is not None and trainer.training:
            epoch = trainer.current_epoch
            key = (trainer.global_rank, epoch, self._count_training_batch(epoch, trainer.world_size))
            if self._augments_on_device():
                if batch.index is None:
                    raise UserError(
                        f"{type(self).__name__}'s training batches reach the device without their sample"
                        " indices, which key each sample's augmentation: build the training loader with"
                        " self.loader(dataset, train=True, **DataLoader arguments)"
                    )
                # drawn before the copy (on_before_batch_transfer), else drawn here
                rand = (
                    batch.draws if batch.draws is not None else self.augmentation_random(batch.index, epoch)
                )
                x = self.augment_batch(x, rand)
            if self.mixup_alpha > 0 or self.cutmix_alpha > 0:
                h, w = x.shape[-2:]
                mix = draw_mix(h, w, self.mixup_alpha, self.cutmix_alpha, self.mixing_rng(*key))
        if x.ndim == 4 and {len(self.mean), len(self.std)} - {1, x.shape[1]}:  # else a broadcast traceback
            self._refuse_channels(x.shape)
        x = normalize(x, self.mean, self.std)
        if mix is not None:  # after normalisation, as torchvision's reference mixes the batches it loads
            x, y = mix_batch(x, y, self.num_classes, *mix)  # y: (B, num_classes) probabilities from here
        if (trainer is not None and trainer.training) or batch.index is None:
            return x, y  # training steps take (x, y), as they always have
        return x, y, batch.index  # predict: each row's sample

    def _decode_on_device(self, batch: Batch) -> Batch:
        """The batch the decoder left encoded, decoded on the labels' device; what the decoder refused is
        dropped and reported as the workers' unreadable files are (``Batch.drop``)."""
        images, bad = self.decoder.decode(batch.images, batch.labels.device)
        batch = replace(batch, images=images).drop(bad)
        if bad:
            self.on_unreadable_files(bad)
        return batch

    def _refuse_channels(self, shape: torch.Size) -> None:
        """UserError for a (B, C, H, W) batch whose C is not the length of ``mean`` and ``std``."""
        name = type(self).__name__
        if shape[-1] == len(self.mean):  # (B, H, W, C): numpy/PIL images, never permuted
            raise UserError(
                f"{name}'s images arrive as {tuple(shape)}, channels last (B, H, W, C): load_split must give"
                " (C, H, W) images (from numpy's (N, H, W, C): torch.from_numpy(a).permute(0, 3, 1, 2))"
            )
        raise UserError(
            f"{name}'s images have {shape[1]} channel(s), but its mean has {len(self.mean)} values and its"
            f" std {len(self.std)}: give one value per channel (class attributes mean = {(0.5,) * shape[1]},"
            " std = ...)"
        )

    def _count_training_batch(self, epoch: int, world_size: int) -> int:
        """This batch's index in its epoch; counts its samples over all ranks. Counted here, where each
        trained batch passes once (the loader itself runs a batch ahead of training, which Lightning
        prefetches)."""
        if epoch != self._epoch:
            self._epoch, self._samples, self._batches = epoch, 0, 0
        self._samples += self.batch_size * world_size
        self._batches += 1
        return self._batches - 1

    # ---- resume --------------------------------------------------------------------------------

    def _samples_per_step(self) -> int:
        """Training samples one batch takes over all ranks: per-device batch × processes."""
        return self.batch_size * (self.trainer.world_size if self.trainer is not None else 1)

    def split_options(self) -> dict:
        """The ``--data`` options that order every epoch and draw any held-out split, by name: a fit resumed
        with other values is refused at any point (another order trains some samples twice and others never
        in the resumed epoch; another split can validate on images the model trained on). A subclass adds
        its own (CIFAR-10's ``val_size``)."""
        return {"seed": self.seed}

    def order_inputs(self) -> dict | None:
        """What the training order is made of besides those options and the global batch (the training
        samples as a count and a digest, a shuffle window), saved with each checkpoint and compared when a
        fit resumes inside an epoch: the same number of samples skipped in an order of other samples are
        not the ones trained. ``{"samples": N, ...}``, or None: nothing to compare. The default is the
        training split's size: a permutation of another count (``--data.train_size`` changed) puts other
        samples after the ones skipped."""
        train = getattr(self, "train_set", None)
        return {"samples": len(train)} if isinstance(train, Sized) else None

    def state_dict(self) -> dict:
        # Saved with every checkpoint, resumed by load_state_dict: where in its epoch training stands, in
        # samples over all ranks, what made its order, and the classes the model learnt (checked on any
        # later use of it).
        trainer = self.trainer
        complete = trainer is not None and self._batches >= trainer.num_training_batches
        order = self.order_inputs()
        return {
            "epoch": self._epoch,
            "samples": self._samples,
            "samples_per_step": self._samples_per_step(),
            # A GradientAccumulationScheduler's for the epoch: the Trainer's says 1 until a batch of a
            # resumed epoch starts, where a stop as training starts saves.
            "accumulate_grad_batches": accumulation(trainer, self._epoch) if trainer is not None else 1,
            "epoch_complete": bool(complete),
            "split_options": self.split_options(),
            **({"order": order} if order is not None else {}),
            "batches": self._batches,
            "class_names": list(self.class_names),
            "crops": [self.image_size, self.val_resize],
            "training_options": self.training_options(),
        }

    def training_options(self) -> dict:
        """What the training batches are made of besides their order: the augmentation (described) and
        MixUp/CutMix. A fit resumed with others trains on with them, and says so (``load_state_dict``)."""
        return {
            "augmentation": self.hparams.get("augmentation"),
            "mixup_alpha": self.mixup_alpha,
            "cutmix_alpha": self.cutmix_alpha,
        }

    def _check_same_order(self, state_dict: dict, mid_epoch: bool) -> None:
        """UserError where a fit resumed from ``state_dict`` would not continue its order (split_options,
        order_inputs); a checkpoint without these fields resumes as before."""
        now = self.split_options()
        changed = [k for k, v in (state_dict.get("split_options") or {}).items() if k in now and now[k] != v]
        if changed:
            then = " ".join(f"--data.{k}={state_dict['split_options'][k]}" for k in changed)
            this = " ".join(f"--data.{k}={now[k]}" for k in changed)
            raise UserError(
                f"the checkpoint's run shuffled (and split) its data with {then}, this run has {this}: resume"
                f" with {then}, or train with other values in a new run (no --ckpt_path)"
            )
        saved, order = state_dict.get("order"), self.order_inputs()
        if saved is not None and order is not None:  # what an older checkpoint did not record is not compared
            saved, order = ({k: d[k] for k in saved.keys() & order.keys()} for d in (saved, order))
        if mid_epoch and saved is not None and order is not None and saved != order:
            count = "as many, but other samples or settings" if saved["samples"] == order["samples"] else None
            raise UserError(
                f"cannot resume mid-epoch exactly: the checkpoint stopped in an order of {saved['samples']:,}"
                f" training samples, this run's data gives {count or format(order['samples'], ',')}: resume"
                " over the data and --data options it was trained with, or from an epoch-end checkpoint"
            )

    def _check_same_batches(self, state_dict: dict, epoch: int, samples: int) -> None:
        """UserError where a fit resumed mid-epoch takes other batches than the checkpoint's run: other
        samples per step over all devices, or another ``--trainer.accumulate_grad_batches`` (another global
        batch). Lightning counts the resumed epoch's batches, and so its accumulations, on from the
        checkpoint's: with other ones the resumed steps start inside one, and the epoch's last step takes part
        of one."""
        step, world = self._samples_per_step(), self.trainer.world_size
        scheduled = scheduled_accumulation(self.trainer, epoch)
        accumulate = self.trainer.accumulate_grad_batches if scheduled is None else scheduled
        saved_step = state_dict.get("samples_per_step", step)
        saved_accumulate = state_dict.get("accumulate_grad_batches", accumulate)  # absent from older ones
        if (saved_step, saved_accumulate) == (step, accumulate):
            return
        then = f"{saved_step} training samples per step over all devices"
        now = f"{step} ({self.batch_size} per device × {world})"
        options = []
        if saved_step != step and saved_step % world == 0:
            options.append(f"--data.batch_size={saved_step // world}")
        if saved_accumulate != accumulate:
            then, now = f"{then} × {saved_accumulate} accumulated", f"{now} × {accumulate} accumulated"
            option = f"--trainer.accumulate_grad_batches={saved_accumulate}"
            if scheduled is not None:
                option = f"a GradientAccumulationScheduler of {saved_accumulate} in epoch {epoch + 1}"
            options.append(option)
        fix = f"resume with {' '.join(options)}" if options else ""
        if saved_step % world:
            fix = f"{fix} on" if fix else "resume on"
            fix = f"{fix} a device count that divides it"
        raise UserError(
            f"cannot resume mid-epoch exactly: the checkpoint took {then} ({samples} of epoch {epoch + 1}"
            f" done), this run takes {now}: {fix}, or resume from an epoch-end checkpoint"
        )

    def _check_epoch_limit(self, epoch: int, done: int) -> None:
        """UserError where ``--trainer.limit_train_batches`` ends the epoch a fit resumes inside (``done``
        batches per device trained) before its next batch: Lightning ended that epoch without its validation
        (ModelCheckpoint then missed val/acc) or trained past the limit."""
        limit = self.trainer.limit_train_batches
        batches = limit
        if isinstance(limit, float):  # a share of the epoch's batches: of a padded shard, as the sampler's
            train = getattr(self, "train_set", None)
            if limit >= 1.0 or not isinstance(train, Sized):
                return
            batches = int(
                math.ceil(math.ceil(len(train) / self.trainer.world_size) / self.batch_size) * limit
            )
        if done < batches:
            return
        raise UserError(
            f"--trainer.limit_train_batches={limit} ends an epoch after {batches} batches, and the"
            f" checkpoint stopped epoch {epoch + 1} after {done}: that epoch would end without its"
            f" validation; resume with --trainer.limit_train_batches={done + 1} or more (every epoch then"
            " trains that many), or train a new run (no --ckpt_path)"
        )

    def load_state_dict(self, state_dict: dict) -> None:
        saved = tuple(state_dict.get("class_names") or ())
        if saved and self.class_names and saved != tuple(self.class_names):
            raise UserError(
                f"the checkpoint's model learnt the classes {list(saved)}, but the data has"
                f" {list(self.class_names)}: use the data (and class folders) it was trained on, or"
                " fine-tune from it with --model.weights=<checkpoint> instead of --ckpt_path"
            )
        epoch = state_dict["epoch"]
        step = self._samples_per_step()
        if "samples" in state_dict:
            samples = state_dict["samples"]
        else:  # a checkpoint from before samples were counted: its batches, on this run's device count
            samples = state_dict["batches"] * step
        mid_epoch = samples > 0 and not state_dict.get("epoch_complete", False)
        fitting = self.trainer is not None and self.trainer.state.fn == TrainerFn.FITTING
        crops = state_dict.get("crops")
        if not fitting and self.trainer is not None and crops and crops != [self.image_size, self.val_resize]:
            # A note, not a refusal: evaluating at other sizes than the training's can be deliberate (FixRes).
            stage = self.trainer.state.fn.value
            rank_zero_info(
                f"lit_ddp: note: the checkpoint's model was trained with --data.image_size={crops[0]}"
                f" --data.val_resize={crops[1]}, this {stage} crops with --data.image_size={self.image_size}"
                f" --data.val_resize={self.val_resize}: pass the checkpoint's sizes to {stage} on crops like"
                " those it learnt from"
            )
        if fitting and mid_epoch:
            self._check_same_batches(state_dict, epoch, samples)
            self._check_epoch_limit(epoch, samples // step)
        resumes = fitting or self.trainer is None  # validate, test and predict read any checkpoint
        if resumes:
            self._check_same_order(state_dict, mid_epoch)
        now, then = self.training_options(), state_dict.get("training_options") or {}
        changed = [
            f"--data.{k}={_shown(now[k])} (the checkpoint's: {_shown(then[k])})"
            for k in then
            if k in now and now[k] != then[k]
        ]
        if fitting and changed:  # an older checkpoint, which records none, is not compared
            rank_zero_info(
                f"lit_ddp: note: this run trains on with other --data settings: {', '.join(changed)}"
            )
        self._epoch, self._samples = epoch, samples
        self._batches = samples // step
        # A finished epoch resumes at the start of the next. Lightning builds a resumed run's first training
        # iterator before it calls set_epoch, and DataLoader workers take their first indices from the
        # sampler right then: a sampler left at the finished epoch's end gave that next epoch no batch.
        point = (epoch, samples) if mid_epoch else (epoch + 1 if samples > 0 else epoch, 0)
        self._resume = point if resumes else None


def _shown(value) -> str:
    """A setting as a note names it: a described class as ``CropFlip(padding=4)``, None as ``none``."""
    if isinstance(value, dict) and "class_path" in value:
        arguments = ", ".join(f"{k}={v}" for k, v in (value.get("init_args") or {}).items())
        return f"{str(value['class_path']).rsplit('.', 1)[-1]}({arguments})"
    return "none" if value is None else str(value)
