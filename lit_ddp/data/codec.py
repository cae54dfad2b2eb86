"""The JPEG decoder every lit_ddp path uses: TorchCodec's (libjpeg-turbo on the CPU, nvJPEG on CUDA; pip
wheels, no system FFmpeg), or torchvision's where TorchCodec is not installed. torchvision's image decoders
are deprecated since torchvision 0.29 in favour of TorchCodec's (>= 0.16), which give the same pixels.

TorchCodec always turns a JPEG upright as its EXIF orientation says; torchvision's, as lit_ddp calls it,
never does. ``decode_jpeg`` hides the difference: its caller says how it wants the picture turned.
"""

import functools
import re
from collections.abc import Callable

import torch
from torch import Tensor

# EXIF orientation → the flips that follow the transpose of orientations 5-8 (``ImageOps.exif_transpose``'s
# turns, and TorchCodec's), on (3, H, W) pixels.
FLIPS = {2: (2,), 3: (1, 2), 4: (1,), 6: (2,), 7: (1, 2), 8: (1,)}

# A C++ check's message starts with where it failed ("read_header_and_start, /path/DecodeJpeg.cpp:208, ").
SOURCE_LOCATION = re.compile(r"^\w+, \S+:\d+, ")


def upright(pixels: Tensor, orientation: int) -> Tensor:
    """(3, H, W) stored pixels turned as EXIF ``orientation`` says (1: as stored)."""
    if orientation in (5, 6, 7, 8):  # stored a quarter turn away: rows become columns
        pixels = pixels.transpose(1, 2)
    flips = FLIPS.get(orientation)
    return pixels.flip(flips) if flips else pixels


def as_stored(pixels: Tensor, orientation: int) -> Tensor:
    """``upright`` undone: the stored pixels of (3, H, W) pixels turned as ``orientation`` says."""
    flips = FLIPS.get(orientation)
    pixels = pixels.flip(flips) if flips else pixels
    return pixels.transpose(1, 2) if orientation in (5, 6, 7, 8) else pixels


@functools.cache
def torchcodec_decoder() -> Callable | None:
    """TorchCodec's ``decode_jpeg``, or None where TorchCodec is not installed or its libraries do not load
    with this torch (OSError, RuntimeError). Imported on first use: a process that never decodes a JPEG
    does not load it."""
    try:
        from torchcodec.decoders import decode_jpeg
    except (ImportError, OSError, RuntimeError):
        return None
    return decode_jpeg


def reason(err: RuntimeError) -> str:
    """The decoder's own words for a file it refused, without the C++ source location."""
    lines = str(err).strip().splitlines() or [type(err).__name__]
    return SOURCE_LOCATION.sub("", lines[-1])


def decode_jpeg(data: Tensor, orientation: int, exif: int) -> Tensor:
    """(3, H, W) uint8 RGB of a JPEG's bytes (a 1-d uint8 tensor on the CPU), turned as EXIF ``orientation``
    says (1: as stored). ``exif``: the orientation the file's EXIF block holds (jpeg.py ``_orientation``),
    the one TorchCodec applies. Raises RuntimeError for data the decoder refuses (``reason`` says why)."""
    codec = torchcodec_decoder()
    if codec is None:
        import torchvision.io  # looked up per call: the fallback is torchvision's current function

        return upright(torchvision.io.decode_jpeg(data, mode=torchvision.io.ImageReadMode.RGB), orientation)
    pixels = codec(data, mode="RGB")
    if orientation == exif:
        return pixels
    return upright(as_stored(pixels, exif), orientation)


def decode_jpegs(data: list[Tensor], device: torch.device) -> list[Tensor]:
    """(3, H, W) uint8 RGB of JPEGs stored upright (EXIF orientation 1 or none), decoded on ``device``: one
    call for the batch (nvJPEG on CUDA). The bytes stay on the CPU. Raises RuntimeError if the decoder
    refuses any of them."""
    codec = torchcodec_decoder()
    if codec is None:
        import torchvision.io

        return torchvision.io.decode_jpeg(data, mode=torchvision.io.ImageReadMode.RGB, device=device)
    return codec(data, mode="RGB", device=device)
