"""What a lit_ddp loader hands over: one typed batch, from the workers to the data module's hooks.

Lightning moves a batch to the device through its ``to`` (``Batch.to``): tensors and objects with ``to``
(``SampleRandom``) move; anything else stays as it is, which is how encoded images (decoders.py's batches of
file bytes) stay on the host until the decoder takes them.
"""

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from lit_ddp.data.batch_transforms import SampleRandom


@dataclass
class Batch:
    """One batch: ``images`` (B, C, H, W) uint8, or the decoder's encoded batch (decoded after the copy);
    ``labels`` (B,); ``index`` the samples' (B,) indices in their split, where the step needs them (training
    augmented on the device, predict); ``draws`` the per-sample random numbers of an on-device augmentation,
    drawn on the host; ``unreadable`` the slots of files that could not be read, {slot: (name, why)}, each a
    placeholder until ``drop`` takes it out."""

    images: object
    labels: Tensor
    index: Tensor | None = None
    draws: SampleRandom | None = None
    unreadable: dict[int, tuple[str, str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)

    def pin_memory(self) -> "Batch":
        """The DataLoader's pinning (pin_memory=True) of the tensors; encoded images stay as they are."""
        pin = lambda t: t.pin_memory() if isinstance(t, Tensor) else t  # noqa: E731
        return replace(self, images=pin(self.images), labels=pin(self.labels), index=pin(self.index))

    def to(self, device: torch.device | str) -> "Batch":
        """This batch on ``device``: each field as Lightning's ``move_data_to_device`` moves one (tensors
        non-blocking where the copy can be, onto a GPU; ``draws`` by its own ``to``; encoded images, which
        have no ``to``, stay), the unreadable slots as they are. Lightning calls it for the whole batch;
        without it, Lightning would walk the dataclass field by field, deep-copying it first, every step."""
        device = torch.device(device)
        non_blocking = device.type not in ("cpu", "mps")  # Lightning's blocking device types

        def move(value):
            if isinstance(value, Tensor):
                return value.to(device, non_blocking=non_blocking)
            return value.to(device) if callable(getattr(value, "to", None)) else value

        images, labels, index, draws = (move(v) for v in (self.images, self.labels, self.index, self.draws))
        return Batch(images, labels, index, draws, self.unreadable)

    def drop(self, bad: dict[int, tuple[str, str]]) -> "Batch":
        """Without the slots in ``bad`` (unreadable files). If that would empty a batch that carries no
        ``index`` (training, evaluation: an empty batch has no loss), the placeholders stay; a predict batch
        drops them too: no row beats a wrong one. Works before the copy and after it (on the labels'
        device)."""
        if not bad or (self.index is None and len(bad) >= len(self)):
            return replace(self, unreadable={})
        keep = torch.ones(len(self), dtype=torch.bool)
        keep[list(bad)] = False
        keep = keep.to(self.labels.device)
        take = lambda t: t[keep] if t is not None else None  # noqa: E731
        return Batch(take(self.images), take(self.labels), take(self.index), take(self.draws))
