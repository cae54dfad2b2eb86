"""Decoding image files (lit_ddp/data/jpeg.py): evaluation crops equal torchvision's reference transform,
EXIF orientation, 16-bit PNGs. Small generated files in the real formats."""

import functools
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.io
import torchvision.transforms.v2.functional as TF
from PIL import Image, ImageOps
from torchvision.io import decode_image
from torchvision.transforms import v2

from lit_ddp.data import ImageNetDataModule
from lit_ddp.data.codec import torchcodec_decoder
from lit_ddp.data.device_decode import Encoded, EncodedBatch, read_eval_sample
from lit_ddp.data.jpeg import EVAL_DRAFT_MARGIN, center_crop_box, decode, load_eval_crop, load_train_crop


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """Photo-like RGB: smooth structure, texture and sensor noise (the bench's recipe, smaller)."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(
        (width, height), Image.BICUBIC
    )
    texture = Image.fromarray(rng.integers(0, 256, (height // 2, width // 2, 3), dtype=np.uint8))
    pixels = (
        0.6 * np.asarray(coarse, float)
        + 0.4 * np.asarray(texture.resize((width, height), Image.BILINEAR), float)
        + rng.normal(0, 6, (height, width, 3))
    )
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def reference(path: Path, size: int, resize: int, pil: bool) -> torch.Tensor:
    """torchvision's evaluation transform, Resize(resize) on the short side then CenterCrop(size), on the
    PIL image (what ImageFolder gives the published weights' evaluation) or on the decoded uint8 tensor."""
    if pil:
        with Image.open(path) as img:
            image = img.convert("RGB")
    else:
        image = decode_image(str(path))
    out = v2.CenterCrop(size)(v2.Resize(resize, antialias=True)(image))
    return (TF.pil_to_tensor(out) if pil else out).permute(1, 2, 0)  # (size, size, 3) uint8


# (width, height, size, resize, format): landscape, portrait, square, panorama, upscaled, large, PNG.
CASES = [
    (640, 427, 224, 256, "JPEG"),
    (333, 500, 64, 72, "JPEG"),
    (300, 300, 96, 110, "JPEG"),
    (1200, 480, 224, 256, "JPEG"),
    (150, 100, 224, 256, "JPEG"),  # smaller than the crop: the reference enlarges
    (800, 600, 64, 72, "JPEG"),  # draft: libjpeg reduces 2× (600 / 2 ≥ 4 · 72)
    (1600, 1200, 56, 64, "JPEG"),  # draft: 4×
    (427, 640, 64, 72, "PNG"),
]


@pytest.mark.parametrize("draft", [False, True], ids=["draft_off", "draft_on"])
@pytest.mark.parametrize("pil", [False, True], ids=["tensor_reference", "pil_reference"])
def test_eval_crops_match_torchvision_resize_then_center_crop(tmp_path: Path, pil: bool, draft: bool) -> None:
    """The issue's bound: mean |d| ≤ 0.5 and max ≤ 2 gray levels. (Before, the crop box was cut to whole
    stored pixels before one resize: mean 3-6, max about 100 on real photos.)"""
    for i, (width, height, size, resize, fmt) in enumerate(CASES):
        path = tmp_path / f"photo{i}.{fmt.lower()}"
        photo(width, height, seed=i).save(path, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        ours = torch.from_numpy(load_eval_crop(str(path), size, resize, draft=draft)).int()
        d = (ours - reference(path, size, resize, pil).int()).abs().float()
        assert ours.shape == (size, size, 3)
        assert d.mean() <= 0.5 and d.max() <= 2, (width, height, size, resize, fmt, d.mean(), d.max())


def test_eval_drafts_the_large_photos_only(tmp_path: Path) -> None:
    """What the parity test's draft cases stand on: libjpeg reduces where the crop keeps 4× its pixels."""
    for (width, height), expected in (((800, 600), 2), ((1600, 1200), 4), ((640, 427), 1)):
        path = tmp_path / f"{width}.jpg"
        photo(width, height).save(path, quality=90)
        size = 64
        region = functools.partial(center_crop_box, size=size, resize=72)
        assert decode(str(path), region, EVAL_DRAFT_MARGIN * size, True)[1] == expected


# ---- EXIF orientation -------------------------------------------------------------------------------


def blocks(width: int, height: int) -> Image.Image:
    """Four coloured quadrants and a white corner block: any turn or mirror changes most pixels."""
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[: height // 2, : width // 2] = (220, 30, 30)
    pixels[: height // 2, width // 2 :] = (30, 220, 30)
    pixels[height // 2 :, : width // 2] = (30, 30, 220)
    pixels[height // 2 :, width // 2 :] = (200, 200, 40)
    pixels[: height // 6, : width // 6] = 255
    return Image.fromarray(pixels)


def save_with_orientation(image: Image.Image, path: Path, orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    image.save(path, quality=95, exif=exif)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_in_train_and_eval_crops(tmp_path: Path, orientation: int) -> None:
    """A phone stores its photos as the sensor read them and says in EXIF how to turn them; PIL's
    ``ImageOps.exif_transpose`` is the reference for the upright picture."""
    path = tmp_path / "phone.jpg"
    save_with_orientation(blocks(64, 48), path, orientation)
    with Image.open(path) as img:
        upright = torch.from_numpy(np.array(ImageOps.exif_transpose(img).convert("RGB"))).permute(2, 0, 1)
        stored = torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1)
    height, width = upright.shape[1:]
    short = min(height, width)  # 48: the short side is resized to itself, then the centre cropped
    expected_eval = v2.CenterCrop(short)(upright).permute(1, 2, 0).int()
    # The whole upright picture, squeezed to a square: scale (1, 1) at the upright aspect ratio.
    ratio = (width / height,) * 2
    expected_train = v2.Resize([48, 48], antialias=True)(upright).permute(1, 2, 0).int()
    ours_eval = torch.from_numpy(load_eval_crop(str(path), short, short)).int()
    ours_train = torch.from_numpy(load_train_crop(str(path), 48, (1.0, 1.0), ratio)).int()
    assert (ours_eval - expected_eval).abs().float().mean() < 1.5
    assert (ours_train - expected_train).abs().float().mean() < 1.5
    # Switched off, the stored pixels are read as they are (what every decoder did before).
    off = torch.from_numpy(load_eval_crop(str(path), 48, 48, exif_transpose=False)).int()
    assert (off - v2.CenterCrop(48)(stored).permute(1, 2, 0).int()).abs().float().mean() < 1.5
    if orientation != 1:
        assert (ours_eval - off).abs().float().mean() > 20


def test_a_png_is_turned_upright_too(tmp_path: Path) -> None:
    """A PNG's EXIF chunk may follow its pixels: it is read after decoding."""
    exif = Image.Exif()
    exif[0x0112] = 6
    blocks(64, 48).save(tmp_path / "phone.png", exif=exif)
    with Image.open(tmp_path / "phone.png") as img:
        upright = np.array(ImageOps.exif_transpose(img).convert("RGB"))  # (64, 48, 3)
    np.testing.assert_array_equal(load_eval_crop(str(tmp_path / "phone.png"), 48, 48), upright[8:56])


# ---- 16-bit images --------------------------------------------------------------------------------


def test_16_bit_greyscale_png_keeps_its_top_byte(tmp_path: Path) -> None:
    """A 16-bit PNG opens in PIL as mode I;16, and ``convert("RGB")`` clips every value above 255: 95-98 %
    of a photo's pixels came out white. The 8-bit picture is the top byte (value >> 8), as PIL does for
    16-bit RGB PNGs."""
    rng = np.random.default_rng(0)
    values = rng.integers(0, 65536, (40, 40), dtype=np.uint16)
    values[0, :6] = (0, 255, 256, 32767, 32768, 65535)
    path = tmp_path / "scan.png"
    Image.fromarray(values).save(path)
    with Image.open(path) as img:
        assert img.mode == "I;16"  # what the test is about
    expected = np.repeat((values >> 8).astype(np.uint8)[..., None], 3, axis=-1)
    assert expected[0, :6, 0].tolist() == [0, 0, 1, 127, 128, 255]
    # 40 → 40: the resize is the identity, so the pixels are the decoder's.
    eval_crop = load_eval_crop(str(path), 40, 40)
    train_crop = load_train_crop(str(path), 40, (1.0, 1.0), (1.0, 1.0))
    np.testing.assert_array_equal(eval_crop, expected)
    np.testing.assert_array_equal(train_crop, expected)
    assert (eval_crop == 255).mean() < 0.01


@pytest.mark.parametrize("maxval", [65535, 4095])
def test_16_bit_greyscale_pgm_keeps_its_top_byte(tmp_path: Path, maxval: int) -> None:
    """PIL opens a PGM of maxval above 255 (a scanner's or a camera's 12- or 16-bit frame) as mode I, scaled
    to 0..65535, and ``convert("RGB")`` clips it as it clips I;16: the picture came out all but white."""
    rng = np.random.default_rng(0)
    values = rng.integers(0, maxval + 1, (40, 40), dtype=np.uint16)
    path = tmp_path / "frame.pgm"
    path.write_bytes(b"P5\n40 40\n%d\n" % maxval + values.astype(">u2").tobytes())
    with Image.open(path) as img:
        assert img.mode == "I"  # what the test is about
        full = np.asarray(img)  # PIL's scaling of maxval to 65535
    expected = np.repeat((full >> 8).astype(np.uint8)[..., None], 3, axis=-1)
    np.testing.assert_array_equal(load_eval_crop(str(path), 40, 40), expected)
    np.testing.assert_array_equal(load_train_crop(str(path), 40, (1.0, 1.0), (1.0, 1.0)), expected)
    assert abs(float(expected.mean()) - 127.5) < 4


def test_the_data_module_switch_reaches_train_eval_and_predict(tmp_path: Path) -> None:
    """``--data.exif_transpose`` (default true) decides for fit, validate and predict alike."""
    for split in ("train", "val"):
        for wnid in ("n01", "n02"):
            (tmp_path / "tree" / split / wnid).mkdir(parents=True)
            save_with_orientation(blocks(64, 48), tmp_path / "tree" / split / wnid / "phone.jpg", 6)
    (tmp_path / "mine").mkdir()
    path = tmp_path / "mine" / "phone.jpg"
    save_with_orientation(blocks(64, 48), path, 6)
    crops = {}
    for exif in (True, False):
        dm = ImageNetDataModule(
            data_dir=str(tmp_path / "tree"),
            image_size=32,
            val_resize=36,
            num_workers=0,
            exif_transpose=exif,
            predict_dir=str(tmp_path / "mine"),
            index_cache=str(tmp_path / "cache"),
        )
        dm.setup("fit")
        torch.manual_seed(0)
        train = dm.train_set.load(str(path))
        torch.manual_seed(0)
        aug = dm.augmentation
        assert np.array_equal(
            train, load_train_crop(str(path), 32, aug.scale, aug.ratio, flip_p=0.5, exif_transpose=exif)
        )
        expected = load_eval_crop(str(path), 32, 36, exif_transpose=exif)
        assert np.array_equal(dm.val_set.load(str(path)), expected)
        dm.predict_dataloader()
        assert np.array_equal(dm.predict_set.load(str(path)), expected)
        crops[exif] = expected
    assert np.abs(crops[True].astype(int) - crops[False]).mean() > 20  # the switch changes the picture


# ---- the decoder: TorchCodec's where it is installed -------------------------------------------------


@pytest.mark.skipif(torchcodec_decoder() is None, reason="TorchCodec is not installed")
def test_where_torchcodec_is_installed_no_path_calls_torchvisions_deprecated_decoders(
    tmp_path: Path, monkeypatch
) -> None:
    """torchvision's image decoders warn on every call since 0.29 and are to be removed: the CPU path (train
    and eval crops, a photo stored turned) and the device path (decoded here on the CPU) use TorchCodec's."""

    def refuse(*args, **kwargs):
        raise AssertionError("torchvision's image decoder was called")

    for name in ("decode_jpeg", "decode_jpegs_cuda", "decode_image", "decode_png"):
        monkeypatch.setattr(torch.ops.image, name, refuse)  # what torchvision.io's functions call
        monkeypatch.setattr(torchvision.io, name, refuse, raising=False)
    path, turned = tmp_path / "photo.jpg", tmp_path / "turned.jpg"
    photo(120, 90).save(path, quality=90)
    save_with_orientation(blocks(64, 48), turned, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for exif in (True, False):
            assert load_eval_crop(str(turned), 32, 36, draft=False, exif_transpose=exif).shape == (32, 32, 3)
        crop = load_train_crop(str(path), 32, (0.5, 1.0), (0.75, 1.33), draft=False)
        samples = [read_eval_sample(str(p), 32, 36, draft=False) for p in (path, turned)]
        x, bad = EncodedBatch(samples, [str(path), str(turned)], 32, 36).decode(torch.device("cpu"))
    assert crop.shape == (32, 32, 3) and x.shape == (2, 3, 32, 32) and not bad
    assert isinstance(samples[0], Encoded) and not isinstance(samples[1], Encoded)  # the device took one
    cpu = torch.from_numpy(load_eval_crop(str(path), 32, 36, draft=False))
    assert torch.equal(x[0].permute(1, 2, 0), cpu)
