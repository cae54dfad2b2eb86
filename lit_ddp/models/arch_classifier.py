"""A classifier over any torchvision or timm network named by ``arch`` (ResNet-50 by default), optionally
started from a weights file and trained head-only: the ImageNet recipes' system, and any ImageFolder's."""

from collections.abc import Mapping

from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lit_ddp.models.backbones import build_net, freeze_all_but_head, freeze_norm_stats
from lit_ddp.models.classifier import CompileMode, ImageClassifier, _batch_norm_on_meta
from lit_ddp.models.optim import OptimConfig
from lit_ddp.models.weights import load_weights


class ArchClassifier(ImageClassifier):
    """A classification network by name; reports top-1 and top-5 accuracy (top-5 capped at the class count).

    Args:
        num_classes: linked from the data module by the CLI (a 3-class folder needs no flag).
        arch: any torchvision classification model (``torchvision.models.list_models()``: resnet50,
            convnext_tiny, efficientnet_b0, vit_b_16 …), or ``timm/<name>`` with timm installed.
        weights: a state_dict file or a Lightning checkpoint to start from (README: Models and weights).
            Tensors of another shape (a 1000-class head in a 3-class network) keep their fresh
            initialisation. Loaded here, in every process that builds the model, so every rank starts
            from the same weights; a ``--ckpt_path`` checkpoint, restored later, replaces them, so validate,
            test and predict with one do not read the file (fit's resume does: it rebuilds the run).
        freeze_backbone: train the head only (the last layer with ``num_classes`` outputs): the other
            parameters get no gradient and no optimizer state, and their BatchNorm layers keep their
            loaded statistics (eval mode while training).
        zero_init_residual: zero the last BN gamma of each residual block (Goyal et al., 2017); torchvision
            ResNets only.
        optim: SGD with momentum, weight decay 1e-4 kept off BN parameters and biases (He et al., 2019,
            "Bag of Tricks", §3.1), cosine decay; the lr is for a global batch of 256 when ``scale_lr``.
        label_smoothing: training-loss label smoothing (0.1 in "Bag of Tricks").
        channels_last: NHWC weights and inputs, which tensor cores want under bf16/fp16.
        compile: ``torch.compile`` the network (in place, so checkpoints keep their parameter names): true
            in torch's default mode, or the mode named (``reduce-overhead``: CUDA graphs).
    """

    def __init__(
        self,
        num_classes: int = 1000,
        arch: str = "resnet50",
        weights: str | None = None,
        freeze_backbone: bool = False,
        zero_init_residual: bool = False,
        optim: OptimConfig = OptimConfig(
            name="sgd", lr=0.1, weight_decay=1e-4, momentum=0.9, schedule="cosine"
        ),
        label_smoothing: float = 0.0,
        channels_last: bool = False,
        compile: bool | CompileMode = False,
    ) -> None:
        net = build_net(arch, num_classes, zero_init_residual)
        if weights is not None:
            rank_zero_info(load_weights(net, weights, num_classes, arch))
        if freeze_backbone:
            trained = freeze_all_but_head(net, num_classes)
            rank_zero_info(f"freeze_backbone: training {', '.join(trained)}; BatchNorm statistics frozen")
        super().__init__(
            net,
            num_classes=num_classes,
            optim=optim,
            label_smoothing=label_smoothing,
            top_k=(1, 5),
            channels_last=channels_last,
            compile=compile,
        )
        self.freeze_backbone = freeze_backbone
        # Not `weights`: a checkpoint's hyperparameters override the command line when it is restored
        # (LightningCLI), so a saved path would have to exist wherever the checkpoint is used, though the
        # checkpoint replaces what it loads. The run's config.yaml records it.
        self.save_hyperparameters(ignore=["weights"])
        self.train()  # freezes the BatchNorm statistics (see train)

    @classmethod
    def batch_norm_in(cls, init_args: Mapping) -> bool | None:
        # The named network, built on the meta device: no memory, no weights read. None where it cannot be
        # built so (an unknown name or timm missing, which building the model says; regnet's constructor
        # reads a tensor's values, which the meta device has none of). A frozen backbone's BatchNorm layers
        # normalise with their frozen statistics, not the batch's.
        def build() -> nn.Module:
            net = build_net(str(init_args.get("arch", "resnet50")))
            if init_args.get("freeze_backbone"):
                freeze_norm_stats(net)
            return net

        return _batch_norm_on_meta(build)

    def train(self, mode: bool = True) -> "ArchClassifier":
        # Lightning's fit keeps the modules' modes as it finds them (and restores them after validation),
        # so frozen statistics set here stay frozen; this override covers anyone who calls train() again.
        super().train(mode)
        if mode and self.freeze_backbone:
            freeze_norm_stats(self.net)
        return self
