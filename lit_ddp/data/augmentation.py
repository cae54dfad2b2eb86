"""Training augmentation as an object a data module takes (``--data.augmentation=CropFlip``), not flags.

An augmentation says where it runs (``on_device``):

* on the device (``CropFlip``): whole uint8 batches after the copy, each sample's random numbers from
  ``SampleRandom`` (a function of seed, epoch and the sample's index): cheap for small images;
* in the DataLoader workers (``RandomResizedCropFlip``): each image as it is decoded, seeded per
  (seed, epoch, index) through the (index, seed) pairs the training sampler hands out: for image files,
  where the crop decides how much of the file is decoded.

Either way a sample's augmentation is the same on any device count and after a resume. ``None`` trains on
the images as they are.
"""

from torch import Tensor

from lit_ddp.data.batch_transforms import SampleRandom, random_crop_flip
from lit_ddp.data.jpeg import sample_augmentation
from lit_ddp.errors import UserError
from lit_ddp.utils import imported

__all__ = ["Augmentation", "CropFlip", "RandomResizedCropFlip", "describe"]


class Augmentation:
    """Base: no change. A subclass that runs on the device overrides ``augment_batch``; one that runs in the
    workers sets ``on_device = False`` and the data module's training split applies it."""

    on_device: bool = True

    def augment_batch(self, x: Tensor, rand: SampleRandom) -> Tensor:
        """(B, C, H, W) uint8 on its device → the same shape. Every random number comes from ``rand`` (its
        draws 0, 1, 2 ... per sample), so that the result does not depend on the device count."""
        return x

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)


class CropFlip(Augmentation):
    """A random crop of the image zero-padded by ``padding`` pixels per side, then a horizontal flip with
    probability 1/2, on whole batches on the device (the CIFAR recipe; draws 0-2 of each sample)."""

    def __init__(self, padding: int = 4) -> None:
        if padding < 0:
            raise UserError(f"padding={padding} must be 0 or more (pixels of padding per side)")
        self.padding = padding

    def augment_batch(self, x: Tensor, rand: SampleRandom) -> Tensor:
        return random_crop_flip(x, self.padding, rand=rand)


class RandomResizedCropFlip(Augmentation):
    """Inception-style RandomResizedCrop (area fraction ``scale``, aspect ratio ``ratio``) and a horizontal
    flip, then optionally torchvision's ``auto_augment`` policy (none | trivialaugment | randaugment |
    autoaugment) and RandomErasing with probability ``random_erasing``; each image in the DataLoader workers,
    as it is decoded (for data modules that read image files: ImageNetDataModule)."""

    on_device = False

    def __init__(
        self,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        auto_augment: str = "none",
        random_erasing: float = 0.0,
    ) -> None:
        sample_augmentation(auto_augment, random_erasing)  # checks the policy name and the probability
        if not (0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1]):
            raise UserError(
                f"scale={tuple(scale)} / ratio={tuple(ratio)}: expected 0 < low <= high (scale at most 1)"
            )
        self.scale = tuple(scale)
        self.ratio = tuple(ratio)
        self.auto_augment = auto_augment
        self.random_erasing = random_erasing


def describe(augmentation: Augmentation | None) -> dict | None:
    """``augmentation`` as plain data, as a config names it: ``{"class_path": ..., "init_args": {...}}``."""
    if augmentation is None:
        return None
    cls = type(augmentation)
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": dict(vars(augmentation))}


def rebuild(description: dict) -> Augmentation:
    """The augmentation ``describe`` wrote (a checkpoint's hyperparameters, which ``load_from_checkpoint``
    passes back), of a class already imported: a name in a file imports no code."""
    name = description["class_path"]
    cls = imported(name)
    if not (isinstance(cls, type) and issubclass(cls, Augmentation)):
        raise UserError(
            f"the checkpoint's augmentation is {name}, which is not imported: import its module first, or"
            " pass augmentation= yourself"
        )
    return cls(**description.get("init_args", {}))
