"""Shapes: the embedded default dataset. CIFAR-shaped (3×32×32, 10 classes), drawn procedurally from a
seed, so ``python -m lit_ddp fit`` needs no download and no file.

Each image is one shape (disc, ring, square, ...) at a random position and size, in a random colour on
a random shaded background, with pixel noise: easy enough for LeNet to learn in a minute on a CPU,
hard enough that the accuracy curve means something, and it looks like images in TensorBoard.
"""

import math

import torch
from torch import Tensor

from lit_ddp.data.base import ImageDataModule, TensorImageDataset, stable_seed
from lit_ddp.errors import UserError

CLASS_NAMES = (
    "disc",
    "ring",
    "square",
    "diamond",
    "triangle",
    "plus",
    "h-stripes",
    "v-stripes",
    "checker",
    "x",
)


def _mask(label: int, dx: Tensor, dy: Tensor, r: Tensor, phase: Tensor) -> Tensor:
    """Boolean (n, H, W) mask of shape ``label``; dx, dy are offsets from the centre, r the radius."""
    ax, ay = dx.abs(), dy.abs()
    box = torch.maximum(ax, ay) <= r
    stripes = lambda u: ((u + phase) / 3.0).floor().remainder(2) == 0  # noqa: E731 - 3-pixel bands
    shapes = {
        0: lambda: dx**2 + dy**2 <= r**2,
        1: lambda: (dx**2 + dy**2 <= r**2) & (dx**2 + dy**2 >= (0.55 * r) ** 2),
        2: lambda: torch.maximum(ax, ay) <= 0.8 * r,
        3: lambda: ax + ay <= 1.1 * r,
        4: lambda: (dy <= 0.8 * r) & (ax <= 0.6 * (dy + r)),
        5: lambda: ((ax <= 0.3 * r) | (ay <= 0.3 * r)) & box,
        6: lambda: stripes(dy) & box,
        7: lambda: stripes(dx) & box,
        8: lambda: (stripes(dx) ^ stripes(dy)) & box,
        9: lambda: ((ax - ay).abs() <= 0.3 * r) & box,
    }
    return shapes[label]()


def draw_shapes(n: int, seed: int, size: int = 32) -> tuple[Tensor, Tensor]:
    """``n`` images (n, 3, size, size) uint8 and balanced labels (n,), a pure function of ``seed``."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randperm(n, generator=g) % len(CLASS_NAMES)
    u = lambda *shape: torch.rand(*shape, generator=g)  # noqa: E731
    s = size / 32.0
    cx, cy = (9 + 14 * u(2, n, 1, 1)) * s  # centre within the middle of the image
    r = (4.5 + 5 * u(n, 1, 1)) * s
    phase = 3 * u(n, 1, 1)
    grid = torch.arange(size, dtype=torch.float32) + 0.5
    dx, dy = grid.view(1, 1, -1) - cx, grid.view(1, -1, 1) - cy  # (n, 1, W), (n, H, 1)
    dx, dy = dx.expand(n, size, size), dy.expand(n, size, size)

    mask = torch.zeros(n, size, size, dtype=torch.bool)
    for label in range(len(CLASS_NAMES)):
        idx = (labels == label).nonzero().squeeze(1)
        mask[idx] = _mask(label, dx[idx], dy[idx], r[idx], phase[idx])

    # Background: a colour with a linear shade in a random direction; foreground: a colour shifted by
    # 0.25–0.75 on every channel (mod 1), so the shape always contrasts with what is behind it.
    bg = u(n, 3, 1, 1)
    angle = 2 * math.pi * u(n, 1, 1)
    shade = 0.15 * ((dx * angle.cos() + dy * angle.sin()) / size).unsqueeze(1)  # (n, 1, H, W)
    fg = (bg + 0.25 + 0.5 * u(n, 3, 1, 1)).remainder(1.0)
    img = torch.where(mask.unsqueeze(1), fg, bg + shade)
    img = img + 0.15 * torch.randn(n, 3, size, size, generator=g)
    return (img.clamp(0, 1) * 255).round().to(torch.uint8), labels


class ShapesDataModule(ImageDataModule):
    """The embedded default: procedurally drawn CIFAR-shaped images, any size, no file needed.

    Args:
        train_size / val_size / test_size: number of images in each split (each drawn from its own seed, a
            function of ``seed``: the same on every rank).
        num_workers: 0 by default: the images are in memory, no decoding to spread, and no IPC is fastest.
        **kwargs: ``ImageDataModule``'s (batch_size, seed, augmentation, predict_dir, mixup_alpha, ...).
    """

    num_classes = len(CLASS_NAMES)
    class_names = CLASS_NAMES
    mean = (0.5, 0.5, 0.5)
    std = (0.29, 0.29, 0.29)

    def __init__(
        self,
        train_size: int = 20000,
        val_size: int = 2000,
        test_size: int = 2000,
        num_workers: int | None = 0,
        **kwargs,
    ) -> None:
        super().__init__(num_workers=num_workers, **kwargs)
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        for split, size in self.sizes.items():
            if size < 1:
                raise UserError(f"--data.{split}_size={size} must be 1 or more (images drawn for that split)")

    def load_split(self, split: str) -> TensorImageDataset:
        split_id = ("train", "val", "test").index(split)
        return TensorImageDataset(*draw_shapes(self.sizes[split], stable_seed(self.seed, split_id)))
