"""DataModules. A new dataset is one ImageDataModule subclass imported here: the CLI finds it by short
name (``--data=CIFAR10DataModule``).
"""

from lit_ddp.data.augmentation import Augmentation, CropFlip, RandomResizedCropFlip
from lit_ddp.data.base import ImageDataModule
from lit_ddp.data.cifar10 import CIFAR10DataModule
from lit_ddp.data.datasets import TensorImageDataset
from lit_ddp.data.imagenet import ImageNetDataModule
from lit_ddp.data.shapes import ShapesDataModule, draw_shapes
from lit_ddp.data.streaming import StreamingDataModule

__all__ = [
    "Augmentation",
    "CIFAR10DataModule",
    "CropFlip",
    "ImageDataModule",
    "ImageNetDataModule",
    "RandomResizedCropFlip",
    "ShapesDataModule",
    "StreamingDataModule",
    "TensorImageDataset",
    "draw_shapes",
]
