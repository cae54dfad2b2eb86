"""Decode an image file straight to a (size, size, 3) uint8 crop, as cheaply as the crop allows.

JPEG decoding is what limits ImageNet training on CPUs; the tutorials' pipeline (PIL decode → RGB copy →
PIL resize → float tensor → normalise, per image) spends as long again around the decode. Here:

1. ``Image.open`` reads only the header; the crop box is drawn on the stored size.
2. If the crop is at least twice the output size on its short side, libjpeg scales by 1/2, 1/4 or 1/8
   while it decodes (in the DCT domain: PIL's "draft" mode), so fewer pixels are ever produced; the
   reduction never takes the crop below ``size``, so the final resize is still a downscale. (The idea of
   DALI's and FFCV's scaled decoding.) At 224 from ~500×375 photos this rarely applies; it pays for the
   larger photos and for small crops.
3. Otherwise JPEGs are decoded by torchvision's libjpeg-turbo decoder straight into a tensor, which skips
   the conversion of PIL's internal 4-byte pixels that ``np.asarray(pil_image)`` costs (about 0.35 ms for
   a 500×375 image, a third of the decode itself).
4. The crop is a view; torch's antialiased bilinear uint8 kernel resizes it (written to match PIL's
   ``resize``; about three times faster than PIL's on a channels-last crop).

Other files (PNG, also when named .JPEG; grayscale, CMYK and palette images) go through PIL and are
converted to RGB; PIL identifies the format from the content, not the file name.

Training crops are then flipped, and optionally auto-augmented and randomly erased, here, per sample, on the
uint8 crop (``sample_augmentation``). Every random draw (box, flip, policy, erasing) comes from torch's
global RNG, as torchvision's transforms take no generator; the dataset seeds it per sample by (seed, epoch,
index) (image_folder.py), so a sample is augmented the same in whichever worker or run decodes it.
"""

import functools
import io
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import InterpolationMode, RandomResizedCrop, v2

from lit_ddp.errors import UserError

# What a broken file raises: truncated data and bad markers (OSError, incl. PIL's UnidentifiedImageError,
# and torchvision's decoder errors, re-raised as OSError below), malformed headers (SyntaxError,
# ValueError, EOFError), absurd sizes (DecompressionBombError).
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)

Box = tuple[float, float, float, float]  # (left, top, right, bottom) in pixels of the stored image


def random_resized_crop_box(img: Image.Image, scale: tuple[float, float], ratio: tuple[float, float]) -> Box:
    """torchvision's RandomResizedCrop box: same distribution, same global torch RNG (seeded per sample).
    Reads only ``img.size``, so the file is not decoded yet."""
    top, left, h, w = RandomResizedCrop.get_params(img, list(scale), list(ratio))
    return (left, top, left + w, top + h)


def center_crop_box(width: int, height: int, size: int, resize: int) -> Box:
    """The box that ``Resize(resize)`` (short side) then ``CenterCrop(size)`` keeps, in stored-image pixels.

    One resize of this box gives the same picture as resizing the whole image and cropping, without
    resizing pixels that are then thrown away (up to torchvision's integer rounding of the resized size).
    """
    side = size * min(width, height) / resize
    left, top = (width - side) / 2, (height - side) / 2
    return (left, top, left + side, top + side)


def _draft(img: Image.Image, box: Box, size: int) -> Box | None:
    """Ask libjpeg for the largest DCT-domain reduction that keeps the crop ≥ ``size`` pixels; returns the
    box in the reduced image's pixels, or None if no reduction applies."""
    reduce = min(box[2] - box[0], box[3] - box[1]) / size
    if reduce < 2:
        return None
    width, height = img.size
    # PIL picks the largest of 8, 4, 2, 1 with stored // requested >= it, and returns the reduced image's
    # extent in stored pixels, so the box maps by plain division.
    drafted = img.draft(img.mode, (math.ceil(width / reduce), math.ceil(height / reduce)))
    if drafted is None:
        return None
    s = width / drafted[1][2]
    return (box[0] / s, box[1] / s, box[2] / s, box[3] / s)


def _decode(img: Image.Image, data: np.ndarray, box: Box, size: int, draft: bool) -> tuple[Tensor, Box]:
    """(3, H, W) uint8 pixels of the whole (possibly DCT-reduced) image, and the box in those pixels."""
    if img.format == "JPEG":
        reduced = _draft(img, box, size) if draft else None
        if reduced is None:
            try:
                return decode_jpeg(torch.from_numpy(data), mode=ImageReadMode.RGB), box
            except RuntimeError as err:  # torchvision's message names the libjpeg error
                raise OSError(str(err).splitlines()[-1]) from None
        box = reduced
    if img.mode != "RGB":
        img = img.convert("RGB")  # grayscale, CMYK, palette, alpha: rare, converted at full size
    return torch.from_numpy(np.array(img)).permute(2, 0, 1), box


def resized_crop(path: str, box_of, size: int, draft: bool = True) -> np.ndarray:
    """Decode ``path``, crop ``box_of(img)`` (a Box from the header-only PIL image) and resize the crop to
    (size, size, 3) RGB uint8."""
    data = np.fromfile(path, dtype=np.uint8)  # one read; writable, so torch takes it without a copy
    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise OSError("not an image file that PIL can identify") from None  # PIL would name the BytesIO
    with img:
        pixels, box = _decode(img, data, box_of(img), size, draft)
    h, w = pixels.shape[1:]
    left, top = min(int(box[0]), w - 1), min(int(box[1]), h - 1)  # whole pixels, as torchvision's crops
    right, bottom = max(min(round(box[2]), w), left + 1), max(min(round(box[3]), h), top + 1)
    crop = pixels[:, top:bottom, left:right].unsqueeze(0).contiguous(memory_format=torch.channels_last)
    # uint8 in, uint8 out: torch's antialiased kernel has a fast path for channels-last uint8 images.
    out = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return out[0].permute(1, 2, 0).numpy()  # (size, size, 3) uint8


def load_train_crop(
    path: str,
    size: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    draft: bool = True,
    flip_p: float = 0.0,
    augment: Callable[[Tensor], Tensor] | None = None,
) -> np.ndarray:
    """Decode + RandomResizedCrop(size, scale, ratio) + RandomHorizontalFlip(flip_p), then ``augment`` (see
    ``sample_augmentation``) on the (3, size, size) uint8 crop."""
    crop = resized_crop(path, lambda img: random_resized_crop_box(img, scale, ratio), size, draft)
    if flip_p == 0 and augment is None:
        return crop
    image = torch.from_numpy(crop).permute(2, 0, 1)  # (3, H, W) view, what torchvision's transforms take
    if flip_p > 0 and float(torch.rand(())) < flip_p:
        image = image.flip(-1)
    if augment is not None:
        image = augment(image)
    return image.permute(1, 2, 0).numpy()  # (H, W, 3) uint8 again; the batch's np.stack copies it


def load_eval_crop(path: str, size: int, resize: int, draft: bool = True) -> np.ndarray:
    """Decode + Resize(resize) + CenterCrop(size)."""
    return resized_crop(path, lambda img: center_crop_box(*img.size, size, resize), size, draft)


# torchvision's policies, with the bilinear interpolation its classification reference gives them.
AUTO_AUGMENT: dict[str, Callable[[], v2.Transform] | None] = {
    "none": None,
    "trivialaugment": functools.partial(v2.TrivialAugmentWide, interpolation=InterpolationMode.BILINEAR),
    "randaugment": functools.partial(v2.RandAugment, interpolation=InterpolationMode.BILINEAR),
    "autoaugment": functools.partial(
        v2.AutoAugment, v2.AutoAugmentPolicy.IMAGENET, interpolation=InterpolationMode.BILINEAR
    ),
}


def sample_augmentation(
    auto_augment: str = "none", random_erasing: float = 0.0, fill: tuple[int, ...] = (0, 0, 0)
) -> v2.Transform | None:
    """What follows the crop and flip of a (3, H, W) uint8 training crop: the ``auto_augment`` policy, then
    RandomErasing with probability ``random_erasing``; None when neither is on.

    Erasing runs here, on the uint8 crop, rather than on the normalised batch on the device: torchvision's
    RandomErasing works on one image at a time (a loop of small kernels on a GPU), and here its draws come
    from the same per-sample seed as the crop's. It erases to ``fill``, the data set's mean colour in
    uint8, which is what torchvision's reference gets by erasing to 0 after normalisation.
    """
    if auto_augment not in AUTO_AUGMENT:
        raise UserError(f"auto_augment={auto_augment!r} is not one of: {', '.join(AUTO_AUGMENT)}")
    if not 0 <= random_erasing <= 1:
        raise UserError(f"random_erasing={random_erasing} must be a probability, in [0, 1]")
    steps = [AUTO_AUGMENT[auto_augment]()] if AUTO_AUGMENT[auto_augment] is not None else []
    if random_erasing > 0:
        steps.append(v2.RandomErasing(random_erasing, value=list(fill)))
    return v2.Compose(steps) if steps else None
