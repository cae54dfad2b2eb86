"""torchvision's ResNets by name, as plain nn.Modules, randomly initialised. Any other network, timm's
included: backbones.py; the training system: resnet_imagenet.py."""

from torch import nn

from lit_ddp.errors import UserError
from lit_ddp.models.backbones import RESNET_ARCHS, build_net

__all__ = ["RESNET_ARCHS", "build_resnet"]


def build_resnet(
    arch: str = "resnet50", num_classes: int = 1000, zero_init_residual: bool = False
) -> nn.Module:
    """``arch`` (resnet18 … resnet152, resnext*, wide_resnet*) with a ``num_classes``-way head."""
    if arch not in RESNET_ARCHS:
        raise UserError(f"{arch!r} is not a torchvision ResNet: choose one of {', '.join(RESNET_ARCHS)}")
    return build_net(arch, num_classes, zero_init_residual)
