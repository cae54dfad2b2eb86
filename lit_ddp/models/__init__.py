"""Plain nn.Module models and the Lightning systems that train them.

A new system is one ImageClassifier subclass imported here: the CLI finds it by short name
(``--model=LeNetCIFAR``), and tests/test_models.py covers every subclass.
``# family:`` marks the lines that go when a generated project leaves that model family out.
"""

from lit_ddp.models.backbones import TORCHVISION_ARCHS, build_net
from lit_ddp.models.classifier import ImageClassifier
from lit_ddp.models.lenet import LeNet
from lit_ddp.models.lenet_cifar import LeNetCIFAR
from lit_ddp.models.optim import OptimConfig
from lit_ddp.models.resnet import RESNET_ARCHS, build_resnet  # family: resnet_imagenet
from lit_ddp.models.resnet_imagenet import ResNetImageNet  # family: resnet_imagenet
from lit_ddp.models.weights import load_weights

__all__ = [
    "RESNET_ARCHS",  # family: resnet_imagenet
    "TORCHVISION_ARCHS",
    "ImageClassifier",
    "LeNet",
    "LeNetCIFAR",
    "OptimConfig",
    "ResNetImageNet",  # family: resnet_imagenet
    "build_net",
    "build_resnet",  # family: resnet_imagenet
    "load_weights",
]
