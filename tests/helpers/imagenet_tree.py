"""A tiny ImageNet-layout tree of real image files, with the awkward files real ImageNet has.

    python tests/helpers/imagenet_tree.py /tmp/tiny_imagenet   # for trying the CLI by hand

Each class has its own dominant colour, so a ResNet separates the classes within a few epochs.
"""

import sys
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ("n01440764", "n01443537", "n01484850")  # three real wnids: folder names as in ImageNet
SIZES = ((96, 72), (80, 120), (150, 100), (64, 64), (200, 150), (120, 90), (72, 96), (110, 110))


def draw(label: int, size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """An RGB picture whose channel ``label`` dominates, with a random bright block and noise."""
    w, h = size
    img = rng.uniform(20, 90, (h, w, 3))
    img[..., label] += 120
    y, x = rng.integers(0, h // 2), rng.integers(0, w // 2)
    img[y : y + h // 3, x : x + w // 3] += 40
    return Image.fromarray(np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8))


def make_tree(root: Path, train_per_class: int = 8, val_per_class: int = 4, seed: int = 0) -> dict[str, Path]:
    """Write the tree and return the special files by kind: grayscale, cmyk, png (named .JPEG), and the
    unreadable truncated (train) and corrupt (val) files."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", train_per_class), ("val", val_per_class)):
        for label, wnid in enumerate(CLASSES):
            folder = root / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                size = SIZES[(i + label) % len(SIZES)]
                draw(label, size, rng).save(folder / f"{wnid}_{i}.JPEG", quality=90)
    special = {
        "grayscale": root / "train" / CLASSES[0] / "gray.JPEG",
        "cmyk": root / "train" / CLASSES[1] / "cmyk.JPEG",
        "png": root / "val" / CLASSES[2] / "png.JPEG",
        "truncated": root / "train" / CLASSES[0] / "truncated.JPEG",
        "corrupt": root / "val" / CLASSES[1] / "corrupt.JPEG",
    }
    draw(0, (90, 70), rng).convert("L").save(special["grayscale"], quality=90)
    draw(1, (100, 80), rng).convert("CMYK").save(special["cmyk"], quality=90)
    draw(2, (70, 90), rng).save(special["png"], format="PNG")
    draw(0, (300, 200), rng).save(special["truncated"], quality=90)
    data = special["truncated"].read_bytes()
    special["truncated"].write_bytes(data[: len(data) // 2])  # a download cut off half-way
    special["corrupt"].write_bytes(b"\xff\xd8\xff\xe0" + rng.bytes(2000))  # JPEG magic, then garbage
    return special


# An AppleDouble file's header (magic 0x00051607, version 2, "Mac OS X" filler): not an image.
APPLEDOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(64)


def add_macos_junk(root: Path) -> list[Path]:
    """What unzipping a Finder-made archive (or browsing with Finder) leaves in a tree: ``__MACOSX/`` and a
    hidden folder beside the class folders, ``._<image>.JPEG`` (AppleDouble) and ``.DS_Store`` files beside
    the images. Returns the junk entries made."""
    junk = []
    for split in ("train", "val"):
        for folder in (root / split / "__MACOSX" / CLASSES[0], root / split / ".thumbnails"):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"._{CLASSES[0]}_0.JPEG").write_bytes(APPLEDOUBLE)
        junk += [root / split / "__MACOSX", root / split / ".thumbnails"]
        for wnid in CLASSES:
            junk += [root / split / wnid / ".DS_Store", root / split / wnid / f"._{wnid}_0.JPEG"]
            junk[-2].write_bytes(b"\x00\x00\x00\x01Bud1")
            junk[-1].write_bytes(APPLEDOUBLE)
    return junk


if __name__ == "__main__":
    make_tree(Path(sys.argv[1]))
    print(f"wrote {sys.argv[1]}/train and {sys.argv[1]}/val")
