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

# 0.2's names of the classes renamed since. A checkpoint 0.2 wrote names its model so, and LightningCLI
# imports that name: it reads as the new class, and what a run writes names the new one; a short name
# (--model=ResNetImageNet), which no class has, is told the new one (preflight.settings).
RENAMED = {"ResNetImageNet": "ArchClassifier"}


def __getattr__(name: str):
    if name in RENAMED:
        return globals()[RENAMED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def current_name(class_path):
    """``class_path`` with a 0.2 name of a class here (``RENAMED``) replaced by its new one."""
    module, _, name = str(class_path).rpartition(".")
    return f"{module}.{RENAMED[name]}" if module == __name__ and name in RENAMED else class_path


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
