"""Where a data module's encoded images (image files, or their bytes in shards) are decoded: chosen once,
by ``--data.decode``, and used by every split, predict's included.

- ``cpu``: the DataLoader workers decode, crop, flip (and auto-augment, erase) each image to uint8 (jpeg.py);
  batches of pixels travel to the device.
- ``gpu``: the workers read the bytes and draw each crop; the batch is decoded, cropped, resized and flipped
  on the training device, a batch ahead of training (device_decode.py), for nodes with few CPU cores per
  GPU. The same crops and flips; on a CPU device the same pixels as ``cpu`` with ``draft=false``.

A data module of images from elsewhere uses one through three calls (docs/data-module.md): ``reader(train)``
for its Dataset's per-sample ``load(source)`` (source: a path, or the encoded bytes as a uint8 numpy
array), ``collate(train)`` for the function that batches those samples, ``loader(dataset, device,
**kwargs)`` for the DataLoader; the base data module decodes what arrives encoded (``decode``) after the
copy.
"""

import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lit_ddp.data.augmentation import Augmentation, RandomResizedCropFlip
from lit_ddp.data.device_decode import (
    DecodeAheadLoader,
    DecodedAhead,
    Encoded,
    EncodedBatch,
    read_eval_sample,
    read_train_sample,
)
from lit_ddp.data.image_folder import stack_crops
from lit_ddp.data.jpeg import load_eval_crop, load_train_crop, sample_augmentation
from lit_ddp.errors import UserError


class ImageDecode:
    """The CPU path (``cpu``): each image decoded to its (size, size, 3) uint8 crop in the workers.

    Args:
        size: side of the square crops.
        resize: evaluation's short side before the centre crop (torchvision's Resize + CenterCrop).
        augmentation: the data module's; a ``RandomResizedCropFlip`` crops training images here (with its
            auto_augment and random_erasing, which erase to ``mean``'s colour: jpeg.py says why), any other
            takes evaluation's centre crop.
        mean: the data module's normalisation mean, in [0, 1] per channel.
        draft: JPEG DCT-domain downscaling before the crop (off: full decode, as torchvision does).
        exif_transpose: turn each image upright as its EXIF orientation says.
    """

    name = "cpu"
    on_device = False

    def __init__(
        self,
        size: int,
        resize: int,
        augmentation: Augmentation | None,
        mean: Sequence[float],
        draft: bool = True,
        exif_transpose: bool = True,
    ) -> None:
        self.size, self.resize, self.draft, self.exif_transpose = size, resize, draft, exif_transpose
        self.crop = augmentation if isinstance(augmentation, RandomResizedCropFlip) else None
        self.sample_augment = None
        if self.crop is not None:
            fill = tuple(round(255 * m) for m in mean)
            self.sample_augment = sample_augmentation(self.crop.auto_augment, self.crop.random_erasing, fill)

    def reader(self, train: bool) -> Callable:
        """The per-sample ``load(source)``: a training crop (with the augmentation's crop) or evaluation's
        centre crop."""
        decode = dict(size=self.size, draft=self.draft, exif_transpose=self.exif_transpose)
        if train and self.crop is not None:
            crop = dict(scale=self.crop.scale, ratio=self.crop.ratio, flip_p=0.5, augment=self.sample_augment)
            return functools.partial(load_train_crop, **crop, **decode)
        return functools.partial(load_eval_crop, resize=self.resize, **decode)

    def collate(self, train: bool) -> Callable[[Sequence, Sequence[str]], object]:
        """``collate(samples, names)``: the batch of ``reader(train)``'s samples (an unreadable file's: a
        black crop) named by their paths (or a shard's names for them)."""
        return stack_crops

    def loader(self, dataset, device: Callable[[], torch.device | None], **kwargs) -> DataLoader:
        """The DataLoader of a split; ``device()`` names the training device (None outside a Trainer)."""
        return DataLoader(dataset, **kwargs)

    def decode(self, images, device: torch.device) -> tuple[Tensor, dict[int, tuple[str, str]]]:
        """(B, 3, size, size) uint8 on ``device`` and the files the decoder refused: here, already pixels."""
        return images, {}


class DeviceDecode(ImageDecode):
    """``gpu``: the workers read the bytes and draw each crop (``reader``), the device decodes (nvJPEG on
    CUDA, libjpeg-turbo on a CPU device), a batch ahead of training unless ``ahead`` is off. Always a full
    decode (``draft`` does not apply); auto_augment and random_erasing, which run on each image in the
    workers, are refused."""

    name = "gpu"
    on_device = True

    def __init__(self, *args, ahead: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.sample_augment is not None:
            # Each one that is on, and the value that turns it off (a recipe may set both).
            settings = (
                ("auto_augment", self.crop.auto_augment, "none"),
                ("random_erasing", self.crop.random_erasing, 0),
            )
            on = [
                (f"--data.augmentation.{name}", value, off) for name, value, off in settings if value != off
            ]
            raise UserError(
                f"--data.decode=gpu cannot run {' and '.join(f'{o}={v}' for o, v, _ in on)} (per-image"
                " augmentation in the loader workers, which then decode no image): pass --data.decode=cpu,"
                f" or {' '.join(f'{o}={off}' for o, _, off in on)}"
            )
        self.ahead = ahead

    def reader(self, train: bool) -> Callable:
        decode = dict(size=self.size, draft=self.draft, exif_transpose=self.exif_transpose)
        if train and self.crop is not None:
            crop = dict(scale=self.crop.scale, ratio=self.crop.ratio, flip_p=0.5)
            return functools.partial(read_train_sample, **crop, **decode)
        return functools.partial(read_eval_sample, resize=self.resize, **decode)

    def collate(self, train: bool) -> Callable[[Sequence, Sequence[str]], EncodedBatch]:
        resize = None if train and self.crop is not None else self.resize  # None: the boxes drawn
        return functools.partial(_encoded_batch, size=self.size, resize=resize)

    def loader(self, dataset, device: Callable[[], torch.device | None], **kwargs) -> DataLoader:
        if self.ahead:
            return DecodeAheadLoader(dataset, device=device, **kwargs)
        return DataLoader(dataset, **kwargs)

    def decode(
        self, images: EncodedBatch | DecodedAhead, device: torch.device
    ) -> tuple[Tensor, dict[int, tuple[str, str]]]:
        return images.decode(device)


def _encoded_batch(
    samples: Sequence[Encoded | np.ndarray], names: Sequence[str], size: int, resize: int | None
) -> EncodedBatch:
    return EncodedBatch(samples, names, size, resize)


# --data.decode's choices
DECODERS: dict[str, type[ImageDecode]] = {"cpu": ImageDecode, "gpu": DeviceDecode}


def image_decode(decode: str, *args, ahead: bool = True, **kwargs) -> ImageDecode:
    """The ``decode`` choice's strategy ("cpu" or "gpu"), or a UserError naming the choices."""
    if decode not in DECODERS:
        raise UserError(f"--data.decode={decode} is not one of: {', '.join(DECODERS)}")
    extra = {"ahead": ahead} if DECODERS[decode].on_device else {}
    return DECODERS[decode](*args, **kwargs, **extra)
