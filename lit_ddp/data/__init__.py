"""DataModules. A new dataset is one ImageDataModule subclass imported here: the CLI finds it by short
name (``--data=CIFAR10DataModule``).

``# family:`` marks the lines that go when a generated project leaves that model family out.
"""

from lit_ddp.data.base import ImageDataModule, TensorImageDataset
from lit_ddp.data.cifar10 import CIFAR10DataModule  # family: lenet_cifar
from lit_ddp.data.imagenet import ImageNetDataModule  # family: resnet_imagenet
from lit_ddp.data.shapes import ShapesDataModule

__all__ = [
    "CIFAR10DataModule",  # family: lenet_cifar
    "ImageDataModule",
    "ImageNetDataModule",  # family: resnet_imagenet
    "ShapesDataModule",
    "TensorImageDataset",
]
