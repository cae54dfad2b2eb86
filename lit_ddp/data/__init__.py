"""DataModules. A new dataset is one ImageDataModule subclass imported here: the CLI finds it by
short name (``--data=CIFAR10DataModule``) and the tests parametrised over ``DATAMODULES`` cover it."""

from lit_ddp.data.base import ImageDataModule, TensorImageDataset
from lit_ddp.data.cifar10 import CIFAR10DataModule
from lit_ddp.data.imagenet import ImageNetDataModule
from lit_ddp.data.shapes import ShapesDataModule

DATAMODULES: dict[str, type[ImageDataModule]] = {
    "ShapesDataModule": ShapesDataModule,
    "CIFAR10DataModule": CIFAR10DataModule,
    "ImageNetDataModule": ImageNetDataModule,
}

__all__ = [
    "DATAMODULES",
    "CIFAR10DataModule",
    "ImageDataModule",
    "ImageNetDataModule",
    "ShapesDataModule",
    "TensorImageDataset",
]
