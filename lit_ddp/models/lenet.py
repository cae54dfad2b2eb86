"""LeNet-5 as a plain nn.Module (no Lightning here: see lenet_cifar.py for the training system)."""

from torch import Tensor, nn


def _maybe_bn(kind: type[nn.Module], channels: int, enabled: bool) -> nn.Module:
    return kind(channels) if enabled else nn.Identity()


class LeNet(nn.Module):
    """LeNet-5 for 3×32×32 inputs: conv 6@5×5 → pool → conv 16@5×5 → pool → fc 120 → fc 84 → fc classes.

    Returns logits. There is deliberately no softmax: ``F.cross_entropy`` applies log-softmax itself,
    and a softmax in front of it (the classic tutorial bug) flattens the gradients.
    Each conv block pools before its ReLU: max-pooling and ReLU commute (ReLU is monotone), so the
    function is that of conv → ReLU → pool, with the ReLU on 4× fewer elements (BatchNorm, whose scale may
    be negative, stays before the pool). ``batch_norm=True`` adds BatchNorm after each conv and hidden fc
    layer, so DDP + SyncBatchNorm can be exercised on a model that trains in seconds.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, batch_norm: bool = False) -> None:
        super().__init__()
        bias = not batch_norm  # BN's shift makes a preceding bias redundant
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, bias=bias),  # (B, 6, 28, 28)
            _maybe_bn(nn.BatchNorm2d, 6, batch_norm),
            nn.MaxPool2d(2),  # (B, 6, 14, 14)
            nn.ReLU(inplace=True),
            nn.Conv2d(6, 16, 5, bias=bias),  # (B, 16, 10, 10)
            _maybe_bn(nn.BatchNorm2d, 16, batch_norm),
            nn.MaxPool2d(2),  # (B, 16, 5, 5)
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120, bias=bias),
            _maybe_bn(nn.BatchNorm1d, 120, batch_norm),
            nn.ReLU(inplace=True),
            nn.Linear(120, 84, bias=bias),
            _maybe_bn(nn.BatchNorm1d, 84, batch_norm),
            nn.ReLU(inplace=True),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))  # (B, num_classes) logits
