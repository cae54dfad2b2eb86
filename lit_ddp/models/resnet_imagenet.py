"""The old name of ``ArchClassifier``, which builds any torchvision or timm network, not only ResNets: kept so
that configs and checkpoints that name ``ResNetImageNet`` still load."""

from lit_ddp.models.arch_classifier import ArchClassifier


class ResNetImageNet(ArchClassifier):
    """``ArchClassifier`` under its old name (same arguments, same checkpoints); new configs name
    ``ArchClassifier``."""
