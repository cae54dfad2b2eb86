"""ImageNet (or any folder in its layout) decoded from JPEG files, the layout pytorch/examples' ImageNet
script expects::

    data_dir/train/<wnid>/*.JPEG
    data_dir/val/<wnid>/*.JPEG      (valprep.sh sorts the 50,000 validation images into class folders)
    data_dir/test/<wnid>/*.JPEG     (optional; without it the test stage uses val/, as ImageNet's test
                                     labels are not public)

Workers decode with DCT-domain downscaling, crop, flip and (optionally) auto-augment and erase each training
image (``jpeg.py``), all seeded per (seed, epoch, index), and hand over uint8 batches; the normalisation (and
MixUp/CutMix) run on whole batches on the device (``ImageDataModule.on_after_batch_transfer``).
"""

import functools
from pathlib import Path

import torch
from torch import Tensor

from lit_ddp.data.base import ImageDataModule
from lit_ddp.data.image_folder import (
    ImageFileDataset,
    find_classes,
    list_images,
)
from lit_ddp.data.jpeg import load_eval_crop, load_train_crop, sample_augmentation
from lit_ddp.errors import UserError

LAYOUT = "{d}/train/<class>/*.JPEG and {d}/val/<class>/*.JPEG"


class ImageNetDataModule(ImageDataModule):
    """ImageFolder-layout JPEGs: RandomResizedCrop + flip for training, resize + centre crop for evaluation.

    Args:
        data_dir: folder holding ``train/`` and ``val/`` (and optionally ``test/``) class folders.
        image_size: side of the square crops fed to the model.
        val_resize: evaluation images are resized to this short side, then centre-cropped to image_size.
        batch_size: per device.
        num_workers: decoding processes per device; each decodes a few hundred images/s
            (docs/benchmarks.md), so a fast GPU needs about 8. None: the CPU cores this process may use,
            shared over the node's devices, less one per device, at most 8 (``base.auto_num_workers``).
        strict: stop at the first unreadable image file, naming it, instead of skipping it with a warning.
        crop_scale / crop_ratio: RandomResizedCrop's area fraction and aspect-ratio ranges.
        draft: JPEG DCT-domain downscaling before the crop (off: full decode, as torchvision does).
        predict_dir: predict on every image file under this folder (unlabelled) instead of the test split.
        auto_augment: none | trivialaugment | randaugment | autoaugment (torchvision's, ImageNet policy), on
            each training crop after its flip, in the workers.
        random_erasing: probability of torchvision's RandomErasing on each training crop, to the mean colour.
        mixup_alpha / cutmix_alpha: MixUp / CutMix of the training batches with Beta(α, α); 0 is off.
    """

    mean = (0.485, 0.456, 0.406)
    std = (0.229, 0.224, 0.225)
    reads_image_files = True
    per_sample_seeds = True  # the workers crop, flip and augment each image: seeded by (seed, epoch, index)

    def __init__(
        self,
        data_dir: str = "data/imagenet",
        image_size: int = 224,
        val_resize: int = 256,
        batch_size: int = 256,
        num_workers: int | None = None,
        seed: int = 0,
        augment: bool = True,
        strict: bool = False,
        crop_scale: tuple[float, float] = (0.08, 1.0),
        crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
        draft: bool = True,
        predict_dir: str | None = None,
        auto_augment: str = "none",
        random_erasing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            num_workers=num_workers,
            seed=seed,
            augment=augment,
            predict_dir=predict_dir,
            mixup_alpha=mixup_alpha,
            cutmix_alpha=cutmix_alpha,
        )
        self.save_hyperparameters()
        if val_resize < image_size:
            raise UserError(f"val_resize={val_resize} must be at least image_size={image_size}")
        self.data_dir = Path(data_dir)
        self.image_size = image_size
        self.val_resize = val_resize
        self.strict = strict
        self.crop_scale = crop_scale
        self.crop_ratio = crop_ratio
        self.draft = draft
        # Checked here, in the launching process; erasing fills with the mean colour (jpeg.py says why).
        fill = tuple(round(255 * m) for m in self.mean)
        self.sample_augment = sample_augmentation(auto_augment, random_erasing, fill)
        # Classes come from the training folder, here in the launching process: the CLI links
        # num_classes to the model, and a missing folder fails before any rank is spawned.
        self.class_names = tuple(find_classes(self.data_dir / "train"))
        self.num_classes = len(self.class_names)
        if not self.class_names or not (self.data_dir / "val").is_dir():
            raise UserError(
                f"no image folders in {self.data_dir}: expected {LAYOUT.format(d=self.data_dir)}"
                " (pass --data.data_dir=<folder holding train/ and val/>)"
            )
        if self.num_classes == 1:
            raise UserError(
                f"{self.data_dir / 'train'} has one class folder ({self.class_names[0]}): a classifier"
                " needs at least two, one folder per class"
            )

    def _split(self, name: str, train: bool) -> ImageFileDataset:
        root = self.data_dir / name
        class_to_idx = {c: i for i, c in enumerate(self.class_names)}
        unknown = sorted(set(find_classes(root)) - set(class_to_idx))
        if unknown:
            raise UserError(
                f"{root} has class folders that train/ lacks ({', '.join(unknown[:5])}): fix the layout"
            )
        samples = list_images(root, class_to_idx)
        if not samples:
            raise UserError(f"no image files in {root}: expected {LAYOUT.format(d=self.data_dir)}")
        decode = dict(size=self.image_size, draft=self.draft)
        if train:
            augment = dict(flip_p=0.5, augment=self.sample_augment) if self.augment else {}
            load = functools.partial(
                load_train_crop, scale=self.crop_scale, ratio=self.crop_ratio, **augment, **decode
            )
        else:
            load = functools.partial(load_eval_crop, resize=self.val_resize, **decode)
        return ImageFileDataset(samples, load, self.image_size)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit":
            self.train_set = self._split("train", train=True)
        if stage in ("fit", "validate"):
            self.val_set = self._split("val", train=False)
        if stage in ("test", "predict"):
            self.test_split = "test" if (self.data_dir / "test").is_dir() else "val"
            self.test_set = self._split(self.test_split, train=False)

    def augment_batch(self, x: Tensor, generator: torch.Generator) -> Tensor:
        return x  # the workers flipped and augmented each image already, seeded per sample (see _split)
