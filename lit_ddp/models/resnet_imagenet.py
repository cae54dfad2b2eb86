"""ResNets on ImageNet (or any ImageFolder): the training system around ``build_resnet``."""

from lit_ddp.models.classifier import ImageClassifier
from lit_ddp.models.optim import OptimConfig
from lit_ddp.models.resnet import build_resnet


class ResNetImageNet(ImageClassifier):
    """A torchvision ResNet by name; reports top-1 and top-5 accuracy (top-5 capped at the class count).

    Args:
        num_classes: linked from the data module by the CLI (a 3-class folder needs no flag).
        arch: resnet18/34/50/101/152, resnext*, wide_resnet* (``RESNET_ARCHS``).
        zero_init_residual: zero the last BN gamma of each residual block (Goyal et al., 2017).
        optim: SGD with momentum, weight decay 1e-4 kept off BN parameters and biases (He et al., 2019,
            "Bag of Tricks", §3.1), cosine decay; the lr is for a global batch of 256 when ``scale_lr``.
        label_smoothing: training-loss label smoothing (0.1 in "Bag of Tricks").
        channels_last: NHWC weights and inputs, which tensor cores want under bf16/fp16.
        compile: ``torch.compile`` the network (in place, so checkpoints keep their parameter names).
    """

    def __init__(
        self,
        num_classes: int = 1000,
        arch: str = "resnet50",
        zero_init_residual: bool = False,
        optim: OptimConfig = OptimConfig(
            name="sgd", lr=0.1, weight_decay=1e-4, momentum=0.9, schedule="cosine"
        ),
        label_smoothing: float = 0.0,
        channels_last: bool = False,
        compile: bool = False,
    ) -> None:
        super().__init__(
            build_resnet(arch, num_classes, zero_init_residual),
            num_classes=num_classes,
            optim=optim,
            label_smoothing=label_smoothing,
            top_k=(1, 5),
            channels_last=channels_last,
            compile=compile,
        )
        self.save_hyperparameters()
