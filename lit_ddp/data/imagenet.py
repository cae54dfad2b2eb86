"""ImageNet (or any folder in its layout) decoded from JPEG files, the layout pytorch/examples' ImageNet
script expects::

    data_dir/train/<wnid>/*.JPEG
    data_dir/val/<wnid>/*.JPEG      (valprep.sh sorts the 50,000 validation images into class folders)
    data_dir/test/<wnid>/*.JPEG     (optional; without it the test stage uses val/, as ImageNet's test
                                     labels are not public)

The file lists come from a cache (``index_cache``), checked against the tree's state: local rank 0 lists
each split in ``prepare_data`` when the tree changed since the cached listing, every rank reads the listing
in ``setup`` (folder_index.py says what "changed" means, and why the lists are numpy arrays).

Workers decode with DCT-domain downscaling, crop, flip and (optionally) auto-augment and erase each training
image (``jpeg.py``), all seeded per (seed, epoch, index), and hand over uint8 batches; or, with
``decode=gpu``, read the bytes and draw the crops for the device to decode (decoders.py chooses, once). The
normalisation (and MixUp/CutMix) run on whole batches on the device
(``ImageDataModule.on_after_batch_transfer``).
"""

import hashlib
import time
from collections import Counter
from pathlib import Path

import numpy as np
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_deprecation, rank_zero_info, rank_zero_warn

from lit_ddp.data.augmentation import Augmentation, RandomResizedCropFlip
from lit_ddp.data.base import ImageDataModule
from lit_ddp.data.folder_index import (
    IMAGE_EXTENSIONS,
    SampleIndex,
    SplitListing,
    class_key,
    classes_train_lacks,
    default_cache_dir,
    find_classes,
    left_out_note,
    load_or_scan,
    loose_images,
)
from lit_ddp.data.image_folder import ImageFileDataset, UnreadableFiles
from lit_ddp.errors import UserError
from lit_ddp.utils import from_here, local_path

LAYOUT = "{d}/train/<class>/*.JPEG and {d}/val/<class>/*.JPEG"


def deprecated_gpu_decode(decode: str, gpu_decode: bool | None) -> str:
    """Older configs' ``gpu_decode: true|false``, still read, into ``decode``."""
    if gpu_decode is None:
        return decode
    new = "gpu" if gpu_decode else "cpu"
    was = str(gpu_decode).lower()
    rank_zero_deprecation(f"--data.gpu_decode={was} is deprecated: use --data.decode={new}")
    return new


class ImageNetDataModule(ImageDataModule):
    """ImageFolder-layout JPEGs: RandomResizedCrop + flip for training, resize + centre crop for evaluation.

    Args:
        data_dir: folder of class folders: ``train/`` (the classes), ``val/`` for fit and validate, ``test/``
            for test (``val/`` where there is none).
        image_size: side of the square crops fed to the model.
        val_resize: evaluation images are resized to this short side, then centre-cropped to image_size.
        batch_size: per device.
        augmentation: ``RandomResizedCropFlip`` (crop scale and ratio, flip, then optionally
            ``auto_augment`` and ``random_erasing``) on each training image in the DataLoader workers; null:
            training images are resized and centre-cropped as evaluation images are; an on-device one
            (``CropFlip``) works on those centre crops.
        strict: stop at the first unreadable image file, naming it, instead of skipping it with a warning.
        draft: JPEG DCT-domain downscaling before the crop (off: full decode, as torchvision does).
        exif_transpose: turn each image upright as its EXIF orientation says (phone photos), in training,
            evaluation and predict alike; off: the pixels as stored, as torchvision's readers give them.
        index_cache: folder for the splits' file lists; None: ``$XDG_CACHE_HOME/lit_ddp/image_index``
            (``~/.cache/...``). A list is used while its split and class folders are unchanged.
        decode: where images are decoded (decoders.py): ``cpu``, in the DataLoader workers; ``gpu``, the
            workers only read the files and draw each crop, and the batch is decoded, cropped, resized and
            flipped on the training device (nvJPEG on a GPU), for nodes with few CPU cores per GPU. ``gpu``
            is always a full decode (``draft`` does not apply), and not with auto_augment or
            random_erasing, which run in the workers.
        decode_ahead: with decode=gpu, each batch is decoded on a thread while the batch before it trains;
            false: in the training loop, between steps (device_decode.py says why ahead is the default).
        class_names: the classes in the model's label order; each split's class folders are read as the class
            of their name. None: train/'s class folders, sorted. With them, validate, test and predict need no
            train/: the CLI passes those of the --ckpt_path checkpoint where data_dir has none.
        gpu_decode: deprecated: ``decode`` (true is ``gpu``, false ``cpu``).
        **kwargs: ``ImageDataModule``'s (num_workers, seed, predict_dir, mixup_alpha, cutmix_alpha). With
            num_workers None (the default), the CPU cores this process may use, shared over the node's
            devices, less one per device, as memory allows (``workers.auto_num_workers``; docs/gpu.md).
    """

    mean = (0.485, 0.456, 0.406)
    std = (0.229, 0.224, 0.225)

    def __init__(
        self,
        data_dir: str = "data/imagenet",
        image_size: int = 224,
        val_resize: int = 256,
        batch_size: int = 256,
        augmentation: Augmentation | None = RandomResizedCropFlip(),
        strict: bool = False,
        draft: bool = True,
        exif_transpose: bool = True,
        index_cache: str | None = None,
        decode: str = "cpu",
        decode_ahead: bool = True,
        class_names: list[str] | None = None,
        gpu_decode: bool | None = None,
        **kwargs,
    ) -> None:
        super().__init__(batch_size=batch_size, augmentation=augmentation, **kwargs)
        if val_resize < image_size:
            raise UserError(f"val_resize={val_resize} must be at least image_size={image_size}")
        self.data_dir = Path(local_path(data_dir, "--data.data_dir"))  # a YAML config's ~, $VAR unexpanded
        self.unreadable = UnreadableFiles(strict=strict)
        decode = deprecated_gpu_decode(decode, gpu_decode)
        self.decode_images(decode, image_size, val_resize, draft, exif_transpose, ahead=decode_ahead)
        self.index_cache = (
            Path(local_path(index_cache, "--data.index_cache"))
            if index_cache is not None
            else default_cache_dir()
        )
        # Any listing written since now was made by this run's local rank 0 (its prepare_data comes after
        # every rank has started), so every rank may use it as is, and they all see the same files.
        self._created_at = time.time()
        self.index_source: dict[str, str] = {}  # split → "listed" or "cache": how its last list was got
        self.scans: dict[str, int] = {}  # split → how often this process listed its folder
        self._order: tuple[SampleIndex, dict] | None = None  # the training files' digest (order_inputs)
        # Classes come from the training folder (or class_names), here in the launching process: the CLI links
        # num_classes to the model, and a missing folder fails before any rank is spawned. Compared and
        # shown in NFC (folder_index.class_key); the folders keep their names on disk.
        self._classes_given = class_names is not None
        self.class_names = self._classes(class_names)
        self.num_classes = len(self.class_names)

    def _classes(self, given: list[str] | None) -> tuple[str, ...]:
        """``given`` in NFC, or train/'s class folders; UserError where they are not two or more classes."""
        if given is not None:
            names = tuple(class_key(c) for c in given)
            if len(set(names)) < max(2, len(names)):
                raise UserError(
                    f"--data.class_names={list(given)} must name two or more classes, each once: the model's"
                    " classes, in the order of its labels"
                )
            return names
        train = self.data_dir / "train"
        folders = find_classes(train)
        names = tuple(class_key(f) for f in folders)
        counts = Counter(names)
        twins = sorted(f for f, key in zip(folders, names, strict=True) if counts[key] > 1)
        if twins:
            raise UserError(
                f"{train} has class folders whose names differ only in their Unicode form"
                f" ({', '.join(map(ascii, twins))}): merge each pair into one folder"
            )
        if not names and not train.is_dir() and any((self.data_dir / s).is_dir() for s in ("val", "test")):
            raise UserError(
                f"{self.data_dir} has no train/, whose class folders are the classes: to fit, put the"
                f" training images in {train}/<class>/; to validate, test or predict, pass"
                " --ckpt_path=PATH to a fit's checkpoint file (it records the classes)"
            )
        if not names:
            raise UserError(
                f"no image folders in {from_here(self.data_dir)}: expected {LAYOUT.format(d=self.data_dir)}"
                " (pass --data.data_dir=<folder holding train/ and val/>)"
            )
        if len(names) == 1:
            raise UserError(
                f"{train} has one class folder ({names[0]}): a classifier needs at least two, one folder per"
                " class"
            )
        return names

    def _no_split(self, name: str) -> str:
        d = self.data_dir
        if not (d / "train").is_dir():  # an evaluation folder, its classes given (class_names)
            if name == "train":
                return f"{d} has no train/: fit trains on {d / 'train'}/<class>/, one folder per class"
            if name == "test":
                return (
                    f"{d} has no test/ (nor val/, which test reads where there is no test/): put the images"
                    f" to test on in {d / 'test'}/<class>/"
                )
            return f"{d} has no val/: put the images to validate on in {d / 'val'}/<class>/"
        # The folder is right (it holds train/'s class folders): --data.data_dir elsewhere is not the fix.
        if name == "test":
            return (
                f"{self.data_dir} has train/ but no test/ (nor val/, which test reads where there is no"
                f" test/): put the images to test on in {self.data_dir / 'test'}/<class>/, the class folders"
                " of train/"
            )
        return (
            f"{self.data_dir} has train/ but no val/: set some images of each class aside in"
            f" {self.data_dir / 'val'}/<class>/, the class folders of train/, to validate on"
        )

    @property
    def strict(self) -> bool:
        return self.unreadable.strict

    def check_stage(self, stage: str) -> None:
        self._splits(stage)

    def _splits(self, stage: str) -> list[str]:
        """The folders ``stage`` reads, or UserError naming the one it lacks: test/ for test and predict, or
        val/ where there is none (ImageNet's test labels are not public); none for a predict_dir (the
        classes are train/'s)."""
        if stage == "predict" and self.predict_dir is not None:
            return []
        names = {"fit": ["train", "val"], "validate": ["val"]}.get(stage)
        if names is None:
            has_test = (self.data_dir / "test").is_dir() or not (self.data_dir / "val").is_dir()
            names = ["test" if has_test else "val"]
        for name in names:
            if not (self.data_dir / name).is_dir():
                raise UserError(self._no_split(name))
        return names

    def _listing(self, name: str, trusted_since: float | None) -> SplitListing:
        started = time.perf_counter()
        listing, not_saved = load_or_scan(self.data_dir / name, self.index_cache, trusted_since)
        self.index_source[name] = listing.source
        if listing.source == "listed":
            self.scans[name] = self.scans.get(name, 0) + 1
            how = f"listed in {time.perf_counter() - started:.1f} s"
            note = left_out_note(listing.others)
            rank_zero_info(f"{self.data_dir / name}: {len(listing):,} image files ({how}){note}")
        if not_saved:
            rank_zero_warn(
                f"could not save the file list of {self.data_dir / name} in {self.index_cache} ({not_saved}):"
                " every process lists the folder itself; pass --data.index_cache=<a writable folder>"
            )
        return listing

    def prepare_data(self) -> None:
        # Lightning calls this on each node's local rank 0, then setup on every rank: one listing per node,
        # and none at all while the cached one is current.
        if self.trainer is None:  # called by hand: every split there is
            names = [n for n in ("train", "val", "test") if (self.data_dir / n).is_dir()]
        else:
            stage = {
                TrainerFn.FITTING: "fit",
                TrainerFn.VALIDATING: "validate",
                TrainerFn.PREDICTING: "predict",
            }
            names = self._splits(stage.get(self.trainer.state.fn, "test"))
        for name in names:
            self._listing(name, trusted_since=None)

    def _split(self, name: str, train: bool) -> ImageFileDataset:
        root = self.data_dir / name
        if not root.is_dir():  # a data module used without the CLI, which checks before any process starts
            raise UserError(self._no_split(name))
        listing = self._listing(name, trusted_since=self._created_at)
        class_to_idx = {c: i for i, c in enumerate(self.class_names)}
        unknown = [f for f in listing.folders if class_key(f) not in class_to_idx]
        if unknown and self._classes_given:
            known = ", ".join(map(ascii, self.class_names[:5])) + (", ..." if self.num_classes > 5 else "")
            raise UserError(
                f"{root} has class folders that the model did not learn ({', '.join(map(ascii, unknown[:5]))}"
                f"; its classes, --data.class_names: {known}): remove them, or use a model that learnt them"
            )
        if unknown:
            raise UserError(classes_train_lacks(root, unknown))
        samples = listing.samples([class_to_idx[class_key(f)] for f in listing.folders])
        loose = loose_images(root)
        if not len(samples) and loose:
            raise UserError(
                f"{root} holds {len(loose):,} image files but no class folder (such as {root / loose[0]}):"
                f" sort them into folders named as the classes in train/ ({root}/<class>/{loose[0]})"
            )
        if not len(samples):
            raise UserError(f"no image files in {root}: expected {LAYOUT.format(d=self.data_dir)}")
        if loose:  # every rank finds them; rank 0 says it
            files = f"{len(loose):,} image file" + ("s lie" if len(loose) > 1 else " lies")
            rank_zero_warn(
                f"{root}: {files} beside the class folders, in no class, and the {name} split leaves them out"
                f" (such as {root / loose[0]}): move each into the folder of its class"
            )
        if train:  # a class without a training image would be a class the model never sees
            counts = np.bincount(samples.labels, minlength=self.num_classes)
            empty = [self.class_names[i] for i in np.flatnonzero(counts == 0)]
            if empty:
                raise UserError(
                    f"{root} has class folders with no image file ({', '.join(map(ascii, empty[:5]))}): add"
                    f" images ({', '.join(IMAGE_EXTENSIONS[:4])}, ...) or remove the folders"
                )
        decoder = self.decoder
        return ImageFileDataset(samples, decoder.reader(train), self.image_size, decoder.collate(train))

    def load_split(self, split: str) -> ImageFileDataset:
        if split == "test":
            (self.test_split,) = self._splits("test")
            return self._split(self.test_split, train=False)
        return self._split(split, train=split == "train")

    def order_inputs(self) -> dict | None:
        """The training files and their labels, as their count and a digest (paths relative to train/, so a
        moved data_dir resumes): a file added, removed or moved to another class folder is another order;
        None before setup or for a split someone replaced."""
        samples = getattr(self.train_set, "samples", None)
        if not isinstance(samples, SampleIndex):
            return None
        if self._order is None or self._order[0] is not samples:  # ImageNet's 1.28 M paths: ~40 MB to hash
            digest = hashlib.blake2b(samples.blob.tobytes(), digest_size=16)
            digest.update(samples.offsets.tobytes())
            digest.update(samples.labels.tobytes())
            self._order = (samples, {"samples": len(samples), "digest": digest.hexdigest()})
        return self._order[1]
