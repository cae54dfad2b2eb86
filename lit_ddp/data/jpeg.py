"""Decode an image file straight to a (size, size, 3) uint8 crop, as cheaply as the crop allows.

JPEG decoding is what limits ImageNet training on CPUs; the tutorials' pipeline (PIL decode → RGB copy →
PIL resize → float tensor → normalise, per image) spends as long again around the decode. Here:

1. ``Image.open`` reads only the header, EXIF included; the crop box is drawn on the upright stored size.
2. If the crop is at least twice the output size on its short side, libjpeg scales by 1/2, 1/4 or 1/8
   while it decodes (in the DCT domain: PIL's "draft" mode), so fewer pixels are ever produced; the
   reduction never takes the crop below ``size`` (evaluation: 4 × ``size``, see ``EVAL_DRAFT_MARGIN``), so
   the final resize is still a downscale. (The idea of DALI's and FFCV's scaled decoding.) At 224 from
   ~500×375 photos this rarely applies; it pays for the larger photos and for small crops.
3. Otherwise JPEGs are decoded by libjpeg-turbo straight into a tensor (TorchCodec's decoder, or
   torchvision's where TorchCodec is not installed: codec.py), which skips the conversion of PIL's internal
   4-byte pixels that ``np.asarray(pil_image)`` costs (a sizeable part of the decode itself:
   docs/benchmarks.md).
4. The pixels are turned upright as the EXIF orientation says (phone photos; ``exif_transpose=False``
   reads them as stored).
5. Torch's antialiased bilinear uint8 kernel resizes (written to match PIL's ``resize``; about three times
   faster than PIL's on a channels-last image): a training crop is a whole-pixel view, resized to
   ``size``; an evaluation crop is what torchvision's ``Resize(resize)`` + ``CenterCrop(size)`` gives
   (``load_eval_crop`` says how it avoids resizing the whole image).

Other files (PNG, also when named .JPEG; grayscale, CMYK, palette and 16-bit images) go through PIL and
are converted to RGB; PIL identifies the format from the content, not the file name.

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
from torchvision.transforms import InterpolationMode, RandomResizedCrop, v2

from lit_ddp.data.codec import decode_jpeg, reason, upright
from lit_ddp.errors import UserError

# What a broken file raises: truncated data and bad markers (OSError, incl. PIL's UnidentifiedImageError,
# and the JPEG decoder's errors, re-raised as OSError below), malformed headers (SyntaxError,
# ValueError, EOFError), absurd sizes (DecompressionBombError).
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)

Box = tuple[float, float, float, float]  # (left, top, right, bottom) in pixels of the upright stored image

ORIENTATION = 0x0112  # the EXIF tag; 1 is upright, 2-8 say how the camera stored the picture turned
SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")  # PIL's modes of 16-bit greyscale (PNG, TIFF)
# Formats whose mode "I" (32-bit integers) holds 16-bit greyscale: PGM with a maxval above 255 (scaled by
# PIL to 0..65535) and PNG in older Pillow. A TIFF's "I" may be any 32-bit range: converted as PIL does.
SIXTEEN_BIT_AS_I = ("PPM", "PNG")
# Evaluation decodes a JPEG reduced in the DCT domain only while the crop keeps 4× the output's pixels
# per side: the antialiased resize that follows then hides the difference between libjpeg's reduction and
# the reference's filter (measured on photos and noisy synthetic images: a margin of 1.2-2 leaves 5-23 gray
# levels at edges, 3-3.5 leaves 2-4, 4 and more leave at most 1-2; mean at most 0.16).
EVAL_DRAFT_MARGIN = 4


def random_resized_crop_box(
    width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> Box:
    """torchvision's RandomResizedCrop box: same distribution, same global torch RNG (seeded per sample).
    ``get_params`` reads only the image's size, so a zero-stride tensor of that shape stands in for it."""
    shape = torch.empty(()).expand(1, height, width)
    top, left, h, w = RandomResizedCrop.get_params(shape, list(scale), list(ratio))
    return (left, top, left + w, top + h)


def reference_resize(width: int, height: int, resize: int) -> tuple[int, int]:
    """(height, width) that torchvision's ``Resize(resize)`` gives: the short side ``resize``, the long one
    scaled alike and truncated."""
    if width <= height:
        return int(resize * height / width), resize
    return resize, int(resize * width / height)


def center_crop_box(width: int, height: int, size: int, resize: int) -> Box:
    """The region that ``Resize(resize)`` (short side) then ``CenterCrop(size)`` keeps, in stored-image pixels
    (to within torchvision's integer rounding): what the draft decision and the crop's scale go by."""
    side = size * min(width, height) / resize
    left, top = (width - side) / 2, (height - side) / 2
    return (left, top, left + side, top + side)


def _draft_reduction(img: Image.Image, box: Box, size: int) -> float | None:
    """Ask libjpeg for the largest DCT-domain reduction that keeps the crop ≥ ``size`` pixels; returns the
    reduction (stored pixels per decoded pixel: 2, 4 or 8), or None if none applies."""
    reduce = min(box[2] - box[0], box[3] - box[1]) / size
    if reduce < 2:
        return None
    width, height = img.size
    # PIL picks the largest of 8, 4, 2, 1 with stored // requested >= it, and returns the reduced image's
    # extent in reduced pixels (fractional where the stored size is not a multiple of the reduction).
    drafted = img.draft(img.mode, (math.ceil(width / reduce), math.ceil(height / reduce)))
    return None if drafted is None else width / drafted[1][2]


def _draft(img: Image.Image, box: Box, size: int) -> Box | None:
    """``_draft_reduction``, returning the box in the reduced image's pixels (or None)."""
    reduction = _draft_reduction(img, box, size)
    return None if reduction is None else tuple(v / reduction for v in box)


def _orientation(img: Image.Image) -> int:
    """The EXIF orientation, 1 (upright) when there is none or it is out of range."""
    value = img.getexif().get(ORIENTATION, 1)
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _pil_pixels(img: Image.Image) -> Tensor:
    """(3, H, W) uint8 RGB of a PIL image (grayscale, CMYK, palette, alpha, 16-bit: rare, converted at full
    size). 16-bit greyscale (PNG, TIFF, PGM) keeps its top byte (value >> 8), as PIL itself does for 16-bit
    RGB PNGs; PIL's ``convert`` would clip every value above 255, which turns most of a 16-bit photo white."""
    if img.mode in SIXTEEN_BIT or (img.mode == "I" and img.format in SIXTEEN_BIT_AS_I):
        grey = torch.from_numpy((np.asarray(img).clip(0, 65535).astype(np.uint16) >> 8).astype(np.uint8))
        return grey.expand(3, *grey.shape)
    if img.mode != "RGB":
        img = img.convert("RGB")
    return torch.from_numpy(np.array(img)).permute(2, 0, 1)


def decode(
    path: str, region: Callable[[int, int], Box], draft_size: int | None, exif_transpose: bool
) -> tuple[Tensor, float, tuple[int, int], Box]:
    """Decode ``path`` upright (EXIF orientation applied unless ``exif_transpose`` is off). ``region(width,
    height)``: the box of the upright stored image that the output is made from; a JPEG is reduced in the
    DCT domain as far as keeps that box at least ``draft_size`` pixels on its short side (None: never).
    Returns (3, h, w) uint8 pixels (channels-last memory for JPEGs), the reduction
    (stored pixels per decoded pixel: 1, 2, 4 or 8), the upright stored (width, height), and the region."""
    # One read; writable, so torch takes it without a copy. An array: the file's bytes, read from a shard.
    data = path if isinstance(path, np.ndarray) else np.fromfile(path, dtype=np.uint8)
    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise OSError("not an image file that PIL can identify") from None  # PIL would name the BytesIO
    with img:
        if img.format == "JPEG":  # the EXIF block is in the header: the region is known before decoding
            exif = _orientation(img)
            orientation = exif if exif_transpose else 1
            width, height = img.size[::-1] if orientation >= 5 else img.size
            box = region(width, height)
            reduction = _draft_reduction(img, box, draft_size) if draft_size else None
            if reduction is None:
                try:
                    return decode_jpeg(torch.from_numpy(data), orientation, exif), 1.0, (width, height), box
                except RuntimeError as err:  # the decoder's message names the libjpeg error
                    raise OSError(reason(err)) from None
            pixels = _pil_pixels(img)
        else:  # decoded first: a PNG's EXIF chunk may follow its pixels
            pixels, reduction = _pil_pixels(img), 1.0
            orientation = _orientation(img) if exif_transpose else 1
            width, height = img.size[::-1] if orientation >= 5 else img.size
            box = region(width, height)
    return upright(pixels, orientation), reduction, (width, height), box


def crop_region(pixels: Tensor, box: Box) -> Tensor:
    """The (3, h, w) view of (3, H, W) ``pixels`` that ``box`` (in these pixels) covers at whole pixels, as
    torchvision's crops take it."""
    h, w = pixels.shape[1:]
    left, top = min(int(box[0]), w - 1), min(int(box[1]), h - 1)
    right, bottom = max(min(round(box[2]), w), left + 1), max(min(round(box[3]), h), top + 1)
    return pixels[:, top:bottom, left:right]


def crop_resize(pixels: Tensor, box: Box, size: int) -> Tensor:
    """(3, size, size) uint8 from (3, H, W) uint8 ``pixels``: the ``box`` (in these pixels) at whole pixels,
    as torchvision's crops, resized antialiased; on the pixels' device."""
    crop = crop_region(pixels, box).unsqueeze(0).contiguous(memory_format=torch.channels_last)
    out = resize_uint8(crop, size=(size, size))
    return out[0]  # (3, size, size), channels-last memory


# PIL's resize, as torchvision's Resize asks it of F.interpolate
ANTIALIASED_BILINEAR = dict(mode="bilinear", antialias=True, align_corners=False)


def resize_uint8(x: Tensor, **kwargs) -> Tensor:
    """Antialiased bilinear resize of (N, 3, H, W) uint8 (``F.interpolate``'s size or scale arguments). On
    the CPU uint8 in, uint8 out: torch's kernel has a fast path for channels-last uint8 images; elsewhere
    (CUDA's antialiased kernel takes floating point only) ``resize_float``, rounded back."""
    if x.device.type == "cpu":
        return F.interpolate(x, **kwargs, **ANTIALIASED_BILINEAR)
    return to_uint8_(resize_float(x, **kwargs))


def resize_float(x: Tensor, **kwargs) -> Tensor:
    """``resize_uint8`` before its rounding: float32 out, for a caller that rounds a whole batch at once."""
    return F.interpolate(x.float(), **kwargs, **ANTIALIASED_BILINEAR)


def to_uint8_(x: Tensor) -> Tensor:
    """Resized float pixels as uint8: rounded to the nearest and clamped (in place), then cast."""
    return x.round_().clamp_(0, 255).to(torch.uint8)


def load_train_crop(
    path: str,
    size: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    draft: bool = True,
    flip_p: float = 0.0,
    augment: Callable[[Tensor], Tensor] | None = None,
    exif_transpose: bool = True,
) -> np.ndarray:
    """Decode + RandomResizedCrop(size, scale, ratio) + RandomHorizontalFlip(flip_p), then ``augment`` (see
    ``sample_augmentation``) on the (3, size, size) uint8 crop; (size, size, 3) uint8 out."""
    region = functools.partial(random_resized_crop_box, scale=scale, ratio=ratio)
    pixels, reduction, _, box = decode(path, region, size if draft else None, exif_transpose)
    image = crop_resize(pixels, tuple(v / reduction for v in box), size)
    if flip_p > 0 and float(torch.rand(())) < flip_p:
        image = image.flip(-1)
    if augment is not None:
        image = augment(image)
    return image.permute(1, 2, 0).numpy()  # (H, W, 3) uint8; the batch's np.stack copies it


def _scale_to_cover(length: int, scale: float, needed: int) -> float:
    """``scale`` nudged up by a few ulps until interpolate's floor(length · scale) output length reaches
    ``needed`` (the exact quotient can land a hair below an integer)."""
    while math.floor(length * scale) < needed:
        scale = math.nextafter(scale, math.inf)
    return scale


def load_eval_crop(
    path: str, size: int, resize: int, draft: bool = True, exif_transpose: bool = True
) -> np.ndarray:
    """Decode + Resize(resize) + CenterCrop(size): torchvision's reference evaluation transform, to within
    1 gray level of it on PIL images and equal to it on uint8 tensors (JPEGs decoded in full; a DCT-reduced
    decode, ``draft``, differs by its own filter). (size, size, 3) uint8 out.

    The reference resizes the whole image and crops at whole pixels of the resized image, which in stored
    pixels is a fractional box; cropping the stored image at whole pixels first shifts the picture (large
    errors at edges). Resizing the whole image is exact but costs more than the crop's resize.
    So only the rows and columns up to the crop's far edge (plus the filter's reach) are resized, with the
    reference's scale given explicitly: torch's kernel places output pixel i at (i + 0.5) / scale input
    pixels from the first one, as the reference does, so the pixels before the crop still sit right.
    """
    region = functools.partial(center_crop_box, size=size, resize=resize)
    draft_size = EVAL_DRAFT_MARGIN * size if draft else None
    pixels, reduction, (width, height), _ = decode(path, region, draft_size, exif_transpose)
    return resize_center_crop(pixels, reduction, (width, height), size, resize).permute(1, 2, 0).numpy()


def center_crop_band(
    pixels: Tensor, reduction: float, stored: tuple[int, int], size: int, resize: int
) -> tuple[Tensor, dict, tuple[int, int]]:
    """What ``resize_center_crop`` resizes and keeps: the (3, h, w) view of ``pixels`` its crop reads, the
    resize's ``F.interpolate`` arguments, and the crop's (top, left) corner in the resized band."""
    width, height = stored
    out_h, out_w = reference_resize(width, height, resize)
    top, left = round((out_h - size) / 2), round((out_w - size) / 2)  # CenterCrop's rounding
    scales, bands = [], []
    for length, stored_length, out, end in (
        (pixels.shape[1], height, out_h, top + size),
        (pixels.shape[2], width, out_w, left + size),
    ):
        scale = out * reduction / stored_length  # output pixels per decoded pixel
        # The last output pixel kept reads input up to its centre plus the filter's support (1 / scale
        # when shrinking, 1 when enlarging); one pixel more for the kernel's rounding.
        band = min(length, math.ceil(end / scale + max(1 / scale, 1.0)) + 1)
        scales.append(_scale_to_cover(band, scale, end))
        bands.append(band)
    arguments = dict(scale_factor=scales, recompute_scale_factor=False)
    return pixels[:, : bands[0], : bands[1]], arguments, (top, left)


def resize_center_crop(
    pixels: Tensor, reduction: float, stored: tuple[int, int], size: int, resize: int
) -> Tensor:
    """``load_eval_crop``'s resize and centre crop of decoded ``pixels`` (3, h, w) uint8, ``reduction``
    stored pixels per decoded pixel, of an upright stored image of ``stored`` (width, height): (3, size,
    size) uint8 on the pixels' device."""
    band, arguments, (top, left) = center_crop_band(pixels, reduction, stored, size, resize)
    out = resize_uint8(band.unsqueeze(0).contiguous(memory_format=torch.channels_last), **arguments)
    return out[0, :, top : top + size, left : left + size]


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
