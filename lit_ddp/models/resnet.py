"""torchvision's ResNets by name, as plain nn.Modules, randomly initialised (no Lightning here: see
resnet_imagenet.py for the training system)."""

from torch import nn
from torchvision import models

from lit_ddp.errors import UserError

# Every architecture torchvision builds with its ResNet class (resnet18 … resnet152, resnext*, wide_resnet*),
# read from torchvision's model registry, so a torchvision release that adds one adds it here.
RESNET_ARCHS: tuple[str, ...] = tuple(
    name
    for name in models.list_models(module=models)
    if name.startswith(("resnet", "resnext", "wide_resnet"))
)


def build_resnet(
    arch: str = "resnet50", num_classes: int = 1000, zero_init_residual: bool = False
) -> nn.Module:
    """``arch`` with a ``num_classes``-way head, returning logits.

    ``zero_init_residual`` zeroes the last BN gamma of every residual block, so each block starts as the
    identity (Goyal et al., 2017, "Accurate, Large Minibatch SGD", §5.1), which helps large-batch training.
    """
    if arch not in RESNET_ARCHS:
        raise UserError(f"unknown arch {arch!r}: choose one of {', '.join(RESNET_ARCHS)}")
    return models.get_model(
        arch, weights=None, num_classes=num_classes, zero_init_residual=zero_init_residual
    )
