"""Plain nn.Module models and the Lightning systems that train them.

A new system is one ImageClassifier subclass imported here: the CLI finds it by short name
(``--model=LeNetCIFAR``) and the tests parametrised over ``SYSTEMS`` cover it.
"""

from lit_ddp.models.classifier import ImageClassifier
from lit_ddp.models.lenet import LeNet
from lit_ddp.models.lenet_cifar import LeNetCIFAR
from lit_ddp.models.optim import OptimConfig
from lit_ddp.models.resnet import RESNET_ARCHS, build_resnet
from lit_ddp.models.resnet_imagenet import ResNetImageNet

SYSTEMS: dict[str, type[ImageClassifier]] = {"LeNetCIFAR": LeNetCIFAR, "ResNetImageNet": ResNetImageNet}

__all__ = [
    "RESNET_ARCHS",
    "SYSTEMS",
    "ImageClassifier",
    "LeNet",
    "LeNetCIFAR",
    "OptimConfig",
    "ResNetImageNet",
    "build_resnet",
]
