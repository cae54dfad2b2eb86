"""DataModules. A new dataset is one ImageDataModule subclass imported here: the CLI finds it by short
name (``--data=CIFAR10DataModule``).
"""

from lit_ddp.data.base import ImageDataModule, TensorImageDataset
from lit_ddp.data.cifar10 import CIFAR10DataModule
from lit_ddp.data.imagenet import ImageNetDataModule
from lit_ddp.data.shapes import ShapesDataModule, draw_shapes

__all__ = [
    "CIFAR10DataModule",
    "ImageDataModule",
    "ImageNetDataModule",
    "ShapesDataModule",
    "TensorImageDataset",
    "draw_shapes",
]
