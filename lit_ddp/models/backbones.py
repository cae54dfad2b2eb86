"""Classification networks by name, as plain nn.Modules, randomly initialised: any torchvision model
(``resnet50``, ``convnext_tiny``, ``vit_b_16`` …) and, with timm installed, ``timm/<name>``.

weights.py loads a file into them; resnet_imagenet.py is the training system around them.
"""

import difflib

from torch import nn
from torchvision import models

from lit_ddp.errors import UserError

# torchvision's classification models, read from its registry: a release that adds one adds it here.
TORCHVISION_ARCHS: tuple[str, ...] = tuple(models.list_models(module=models))
# The ones built by torchvision's ResNet class, the only ones that take ``zero_init_residual``.
RESNET_ARCHS: tuple[str, ...] = tuple(
    name for name in TORCHVISION_ARCHS if name.startswith(("resnet", "resnext", "wide_resnet"))
)
TIMM_PREFIX = "timm/"
# With their auxiliary classifiers these return a tuple of logits when training, which the cross-entropy
# step cannot take; init_weights=True is torchvision's current default, passed to silence its warning.
ARCH_KWARGS: dict[str, dict] = {
    "googlenet": {"aux_logits": False, "init_weights": True},
    "inception_v3": {"aux_logits": False, "init_weights": True},
}


def _unknown_arch(arch: str, choices: tuple[str, ...] | list[str], where: str) -> UserError:
    close = difflib.get_close_matches(arch, choices, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return UserError(f"unknown arch {arch!r}: {hint}pass a name from {where}")


def _import_timm(arch: str):
    try:
        import timm
    except ImportError:
        raise UserError(
            f'--model.arch={arch} needs timm, which is not installed: pip install "lit_ddp[timm]"'
        ) from None
    return timm


def build_net(arch: str = "resnet50", num_classes: int = 1000, zero_init_residual: bool = False) -> nn.Module:
    """``arch`` with a ``num_classes``-way head, returning (B, num_classes) logits.

    ``zero_init_residual`` zeroes the last BN gamma of every residual block, so each block starts as the
    identity (Goyal et al., 2017, "Accurate, Large Minibatch SGD", §5.1); torchvision's ResNets only.
    """
    # The name first (a missing timm included), then its options: advice about an option of a network
    # that cannot be built would send the user round twice.
    timm = _import_timm(arch) if arch.startswith(TIMM_PREFIX) else None
    if timm is not None and not timm.is_model(arch.removeprefix(TIMM_PREFIX)):
        raise _unknown_arch(
            arch, [TIMM_PREFIX + n for n in timm.list_models()], "timm.list_models(), after timm/"
        )
    if timm is None and arch not in TORCHVISION_ARCHS:
        raise _unknown_arch(arch, TORCHVISION_ARCHS, "torchvision.models.list_models(), or timm/<name>")
    if zero_init_residual and arch not in RESNET_ARCHS:
        raise UserError(
            f"--model.zero_init_residual=true applies to torchvision's ResNets only, not {arch}:"
            " pass --model.zero_init_residual=false"
        )
    if timm is not None:
        return timm.create_model(arch.removeprefix(TIMM_PREFIX), pretrained=False, num_classes=num_classes)
    kwargs = {"zero_init_residual": True} if zero_init_residual else {}
    return models.get_model(
        arch, weights=None, num_classes=num_classes, **ARCH_KWARGS.get(arch, {}), **kwargs
    )


def find_head(net: nn.Module, num_classes: int) -> nn.Module:
    """The classifier head: the last Linear or Conv2d layer with ``num_classes`` outputs (ResNet's ``fc``,
    EfficientNet's ``classifier[1]``, ViT's ``heads.head``, SqueezeNet's 1×1 conv, timm's classifier)."""
    heads = [
        m
        for m in net.modules()
        if (isinstance(m, nn.Linear) and m.out_features == num_classes)
        or (isinstance(m, nn.Conv2d) and m.out_channels == num_classes)
    ]
    if not heads:
        raise UserError(
            f"no layer of {type(net).__name__} has {num_classes} outputs to train alone:"
            " pass --model.freeze_backbone=false"
        )
    return heads[-1]


def freeze_all_but_head(net: nn.Module, num_classes: int) -> list[str]:
    """Stops gradients to every parameter outside the head; returns the names of those still trained."""
    head = set(find_head(net, num_classes).parameters())
    for p in net.parameters():
        p.requires_grad_(p in head)
    return [name for name, p in net.named_parameters() if p.requires_grad]


def freeze_norm_stats(net: nn.Module) -> None:
    """Puts every layer with running statistics (BatchNorm, SyncBatchNorm, the CPU all-reduce BatchNorm) in
    eval mode: it normalises with, and no longer updates, the statistics it was loaded with."""
    for m in net.modules():
        if getattr(m, "running_mean", None) is not None:
            m.eval()
