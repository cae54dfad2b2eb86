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


def random_crop(x: Tensor, padding: int, generator: torch.Generator | None = None) -> Tensor:
    """torchvision's RandomCrop(size, padding) per image, batched: zero-pad, then crop at a random offset."""
    if padding <= 0:
        return x
    b, _, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))  # zeros = black, as torchvision pads PIL images
    offsets = torch.randint(0, 2 * padding + 1, (2, b, 1), device=x.device, generator=generator)
    rows = offsets[0] + torch.arange(h, device=x.device)  # (B, H)
    cols = offsets[1] + torch.arange(w, device=x.device)  # (B, W)
    batch = torch.arange(b, device=x.device).view(b, 1, 1)
    # Advanced indexing gathers (B, H, W, C); move channels back to dim 1.
    return (
        padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()
    )


def random_hflip(x: Tensor, p: float = 0.5, generator: torch.Generator | None = None) -> Tensor:
    flip = torch.rand(x.shape[0], device=x.device, generator=generator) < p
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
