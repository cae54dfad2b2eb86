"""Plain nn.Module models and the Lightning systems that train them.

A new network is one ``nn.Module`` composed into ``ImageClassifier`` (``--model.net=Net``); a new
system is one ImageClassifier subclass: the CLI finds either by short name once imported
(``--model=LeNetCIFAR``), and tests/test_models.py covers every subclass.
"""

from lit_ddp.models.accuracy import TopKAccuracy
from lit_ddp.models.arch_classifier import ArchClassifier
from lit_ddp.models.backbones import RESNET_ARCHS, TORCHVISION_ARCHS, build_net
from lit_ddp.models.classifier import ImageClassifier, NetFactory
from lit_ddp.models.lenet import LeNet
from lit_ddp.models.lenet_cifar import LeNetCIFAR
from lit_ddp.models.optim import OptimConfig
from lit_ddp.models.weights import load_weights

__all__ = [
    "RESNET_ARCHS",
    "ArchClassifier",
    "TORCHVISION_ARCHS",
    "ImageClassifier",
    "LeNet",
    "LeNetCIFAR",
    "NetFactory",
    "OptimConfig",
    "TopKAccuracy",
    "build_net",
    "load_weights",
]
