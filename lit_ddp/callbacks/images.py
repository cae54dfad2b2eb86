"""One augmented training batch as an image grid, once per run: what the model really sees."""

import os

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor

from lit_ddp.callbacks.render import image_grid
from lit_ddp.callbacks.sinks import run_dir, sinks
from lit_ddp.errors import UserError


def denormalize(x: Tensor, mean, std) -> Tensor:
    """(B, C, H, W) float ``(x/255 - mean) / std`` → uint8, the inverse of data.batch_transforms.normalize."""
    m = torch.tensor(mean, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, device=x.device).view(1, -1, 1, 1)
    return ((x.float() * s + m) * 255).round().clamp(0, 255).to(torch.uint8)


def _run_of(trainer: Trainer) -> list[str]:
    """Which run the loggers write: its folder, and each logger's version (an MLflow or W&B run id)."""
    return [os.path.realpath(run_dir(trainer)), *(str(logger.version) for logger in trainer.loggers)]


class TrainBatchImages(Callback):
    """Logs ``train/batch``: the first ``max_images`` images of rank 0's first training batch, after
    augmentation, de-normalised with the data module's mean/std and captioned with class names.

    Once per run: a resumed fit that goes on in the run (``--ckpt_path=last``) logs none, as the uninterrupted
    run would not (its checkpoint says which run has the image); one that starts a new run from a
    checkpoint logs its own."""

    def __init__(self, max_images: int = 32, tile: int = 64) -> None:
        # Else found at the first batch: -1 kept all but one image, a negative tile crashed the run.
        for name, value, what in (("max_images", max_images, "images"), ("tile", tile, "pixels per image")):
            if value < 1:
                raise UserError(
                    f"--dashboard.{name}={value} must be 1 or more ({what} in train/batch), or"
                    " --dashboard.batch_images=false for no image"
                )
        self.max_images = max_images
        self.tile = tile
        self._done = False
        self._logged_in: list[str] | None = None  # the run that has the image (rank 0)

    def state_dict(self) -> dict:
        return {"logged_in": self._logged_in} if self._logged_in else {}

    def load_state_dict(self, state_dict: dict) -> None:
        self._logged_in = state_dict.get("logged_in")

    @rank_zero_only  # a side effect only: no collective here
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        if self._done:
            return
        self._done = True  # once per fit, also when the first batch is not batch 0 (resumed runs)
        if self._logged_in is not None and self._logged_in == _run_of(trainer):
            return
        targets = sinks(trainer)
        if not targets or not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            return
        x, y = batch[0][: self.max_images].detach(), batch[1][: self.max_images]
        y = (y.argmax(dim=-1) if y.ndim == 2 else y).tolist()  # MixUp/CutMix targets: the dominant label
        dm = trainer.datamodule
        mean, std = getattr(dm, "mean", None), getattr(dm, "std", None)
        if mean is not None and std is not None and x.is_floating_point():
            x = denormalize(x, mean, std)
        elif x.is_floating_point():  # unknown normalisation: stretch each image to [0, 255]
            lo = x.amin(dim=(1, 2, 3), keepdim=True)
            hi = x.amax(dim=(1, 2, 3), keepdim=True)
            x = ((x - lo) / (hi - lo).clamp(min=1e-8) * 255).round().to(torch.uint8)
        names = list(getattr(dm, "class_names", ()) or ())
        captions = [names[i] if i < len(names) else str(i) for i in y]
        grid = image_grid(x.cpu(), captions, tile=self.tile)
        for sink in targets:
            sink.image("train/batch", grid, trainer.global_step)
        self._logged_in = _run_of(trainer)
