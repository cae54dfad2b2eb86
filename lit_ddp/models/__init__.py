"""Plain nn.Module models and the Lightning systems that train them.

A new system is one ImageClassifier subclass imported here: the CLI finds it by short name
(``--model=LeNetCIFAR``) and the tests parametrised over ``SYSTEMS`` cover it.
"""

from lit_ddp.models.classifier import ImageClassifier
from lit_ddp.models.lenet import LeNet
from lit_ddp.models.lenet_cifar import LeNetCIFAR
from lit_ddp.models.optim import OptimConfig

SYSTEMS: dict[str, type[ImageClassifier]] = {"LeNetCIFAR": LeNetCIFAR}

__all__ = ["SYSTEMS", "ImageClassifier", "LeNet", "LeNetCIFAR", "OptimConfig"]
