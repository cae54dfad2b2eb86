"""LeNet-5 on CIFAR-10 (or the embedded CIFAR-shaped Shapes data)."""

from collections.abc import Mapping

from lit_ddp.models.classifier import ImageClassifier
from lit_ddp.models.lenet import LeNet
from lit_ddp.models.optim import OptimConfig


class LeNetCIFAR(ImageClassifier):
    """LeNet-5 classifier for 3×32×32 images.

    Args:
        num_classes: linked from the data module by the CLI.
        batch_norm: BatchNorm after each conv and hidden fc layer (exercises SyncBatchNorm cheaply).
        optim: optimizer and schedule; AdamW with cosine decay trains LeNet well without tuning.
        channels_last: NHWC weights and inputs; on CPU faster per LeNet step than NCHW
            (docs/benchmarks.md: benchmarks/bench_lenet_throughput.py).
        **kwargs: ``ImageClassifier``'s (label_smoothing, compile, cuda_graph, top_k).
    """

    def __init__(
        self,
        num_classes: int = 10,
        batch_norm: bool = False,
        optim: OptimConfig = OptimConfig(name="adamw", lr=3e-3, weight_decay=5e-4),
        channels_last: bool = True,
        **kwargs,
    ) -> None:
        net = LeNet(num_classes=num_classes, batch_norm=batch_norm)
        super().__init__(net, num_classes=num_classes, optim=optim, channels_last=channels_last, **kwargs)
        self.save_hyperparameters()

    @classmethod
    def batch_norm_in(cls, init_args: Mapping) -> bool | None:
        return bool(init_args.get("batch_norm", False))
