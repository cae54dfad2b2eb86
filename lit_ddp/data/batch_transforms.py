"""Augmentation and normalisation of whole uint8 batches, on the device the batch landed on.

Per-sample PIL transforms in DataLoader workers are what limits the tutorials' throughput on small
images; here a (B, 3, H, W) uint8 batch costs a few tensor ops. Randomness comes from an explicit
``torch.Generator`` so each rank draws its own crops and flips (the global RNG is seeded identically
on every rank by ``seed_everything``, which would give every rank the same augmentation).
"""

import torch
import torch.nn.functional as F
from torch import Tensor


def normalize(x: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """(B, C, H, W) uint8 in [0, 255] → float32 ``(x/255 - mean) / std``."""
    m = torch.tensor(mean, device=x.device, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
    s = torch.tensor(std, device=x.device, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
    return (x.float() - m) / s


def random_crop_flip(
    x: Tensor, padding: int, flip_p: float = 0.5, generator: torch.Generator | None = None
) -> Tensor:
    """torchvision's RandomCrop(size, padding) then RandomHorizontalFlip(flip_p), per image, batched.

    Zero-pads (black, as torchvision pads PIL images), then takes each image's window with two gathers
    (rows, then columns, the flip folded into the column index): ~2.5× faster on CPU than advanced
    indexing plus a separate flip, which matters when the model is as small as LeNet.
    """
    b, c, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    offsets = torch.randint(0, 2 * padding + 1, (2, b, 1), device=x.device, generator=generator)
    flip = torch.rand(b, 1, device=x.device, generator=generator) < flip_p
    rows = torch.arange(h, device=x.device) + offsets[0]  # (B, h) source rows
    cols = torch.arange(w, device=x.device)
    cols = torch.where(flip, (w - 1) - cols, cols) + offsets[1]  # (B, w) source columns, mirrored if flipped
    rows = rows.view(b, 1, h, 1).expand(b, c, h, w + 2 * padding)
    return padded.gather(2, rows).gather(3, cols.view(b, 1, 1, w).expand(b, c, h, w))


def random_crop(x: Tensor, padding: int, generator: torch.Generator | None = None) -> Tensor:
    """torchvision's RandomCrop(size, padding) per image, batched."""
    return random_crop_flip(x, padding, flip_p=0.0, generator=generator) if padding > 0 else x


def random_hflip(x: Tensor, p: float = 0.5, generator: torch.Generator | None = None) -> Tensor:
    flip = torch.rand(x.shape[0], device=x.device, generator=generator) < p
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
