"""Decode an image file straight to a (size, size, 3) uint8 crop, decoding no more pixels than the crop needs.

JPEG decoding is what limits ImageNet training on CPUs. libjpeg can scale by 1/2, 1/4 or 1/8 while it
decodes (in the DCT domain, PIL's "draft" mode), which skips most of the inverse-DCT and colour-conversion
work. The crop box is drawn first, on the stored image size (``Image.open`` reads only the header), then
the largest reduction that still leaves the crop at least ``size`` pixels on its short side is requested,
so the final resize is a downscale, as in torchvision's full-decode pipeline. (The same idea as DALI's and
FFCV's ROI/scaled decoding.)

Other files (grayscale, CMYK, palette or alpha PNGs, also when named .JPEG) are decoded in full and
converted to RGB; PIL identifies the format from the content, not the file name.
"""

import math

import numpy as np
from PIL import Image
from torchvision.transforms import RandomResizedCrop

# What a broken file raises in PIL: truncated data and bad markers (OSError, incl. UnidentifiedImageError),
# malformed headers (SyntaxError, ValueError, EOFError), absurd sizes (DecompressionBombError).
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)

Box = tuple[float, float, float, float]  # (left, top, right, bottom) in pixels of the stored image


def random_resized_crop_box(img: Image.Image, scale: tuple[float, float], ratio: tuple[float, float]) -> Box:
    """torchvision's RandomResizedCrop box: same distribution, same (per-worker seeded) global torch RNG.
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


def resized_crop(img: Image.Image, box: Box, size: int, draft: bool = True) -> np.ndarray:
    """Crop ``box`` out of the (lazily opened) ``img`` and resize it to (size, size, 3) RGB uint8."""
    if draft and img.format == "JPEG":
        reduce = max(min(box[2] - box[0], box[3] - box[1]) / size, 1.0)  # most reduction the crop affords
        width, height = img.size
        # PIL picks the largest of 8, 4, 2, 1 with stored // requested >= it; it returns the reduced
        # image's extent in stored pixels, so the box maps by plain division.
        drafted = img.draft(img.mode, (math.ceil(width / reduce), math.ceil(height / reduce)))
        if drafted is not None:
            s = width / drafted[1][2]
            box = (box[0] / s, box[1] / s, box[2] / s, box[3] / s)
    if img.mode not in ("RGB", "L"):
        # Before resizing: PIL resizes palette images with nearest neighbour, and CMYK/alpha/16-bit
        # need converting anyway. RGB and L are resized first, then (L only) converted: fewer pixels.
        img = img.convert("RGB")
    out = img.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if out.mode != "RGB":
        out = out.convert("RGB")
    return np.asarray(out)  # (size, size, 3) uint8


def load_train_crop(
    path: str, size: int, scale: tuple[float, float], ratio: tuple[float, float], draft: bool = True
) -> np.ndarray:
    """Decode + RandomResizedCrop(size, scale, ratio). The flip is done later, on the batch, on the device."""
    with Image.open(path) as img:
        return resized_crop(img, random_resized_crop_box(img, scale, ratio), size, draft)


def load_eval_crop(path: str, size: int, resize: int, draft: bool = True) -> np.ndarray:
    """Decode + Resize(resize) + CenterCrop(size)."""
    with Image.open(path) as img:
        return resized_crop(img, center_crop_box(*img.size, size, resize), size, draft)
