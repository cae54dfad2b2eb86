"""The network: LeNet-5 to start from. Edit it, or add a file beside it, and name it in configs/."""

from torch import Tensor, nn


class Net(nn.Module):
    """LeNet-5 for 3×32×32 images; ``width`` multiplies the channels and hidden units.

    Returns logits: ``F.cross_entropy`` applies log-softmax itself, and a softmax in front of it would
    flatten the gradients. ``batch_norm`` adds BatchNorm after each conv and hidden layer; under DDP pass
    ``--trainer.sync_batchnorm=true`` so its statistics are those of the global batch.
    """

    def __init__(self, num_classes: int = 10, width: int = 1, batch_norm: bool = False) -> None:
        super().__init__()
        c1, c2, h1, h2 = 6 * width, 16 * width, 120 * width, 84 * width
        norm2d = (lambda c: nn.BatchNorm2d(c)) if batch_norm else (lambda c: nn.Identity())
        norm1d = (lambda c: nn.BatchNorm1d(c)) if batch_norm else (lambda c: nn.Identity())
        self.features = nn.Sequential(
            nn.Conv2d(3, c1, 5),  # (B, c1, 28, 28)
            norm2d(c1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # (B, c1, 14, 14)
            nn.Conv2d(c1, c2, 5),  # (B, c2, 10, 10)
            norm2d(c2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # (B, c2, 5, 5)
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c2 * 5 * 5, h1),
            norm1d(h1),
            nn.ReLU(inplace=True),
            nn.Linear(h1, h2),
            norm1d(h2),
            nn.ReLU(inplace=True),
            nn.Linear(h2, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))  # (B, num_classes) logits
