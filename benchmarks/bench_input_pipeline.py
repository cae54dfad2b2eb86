"""ImageNet input pipeline: images/s of one worker process, lit_ddp vs torchvision ImageFolder + PIL.

    python benchmarks/bench_input_pipeline.py                        # 400 generated 500×375 JPEGs, 224 crops
    python benchmarks/bench_input_pipeline.py --width 1000 --height 750   # larger photos: draft mode pays
    python benchmarks/bench_input_pipeline.py --images 40 --repeats 1     # quick check

A DataLoader worker runs single-threaded, so this measures one process with torch.set_num_threads(1);
images/s per worker × workers per device is what one GPU can be fed. Training work per image:

- torchvision (pytorch/examples' ImageNet recipe): PIL decode → RGB copy → RandomResizedCrop(224) → flip →
  ToTensor → Normalize, per image, in the worker. A second row stops at uint8 (PILToTensor).
- lit_ddp (lit_ddp/data/jpeg.py): header → crop box → decode (libjpeg DCT-domain downscaling when the crop
  affords it, else torchvision's decoder straight into a tensor) → antialiased uint8 resize of the crop →
  uint8 batch. The flip and the normalisation run on the whole batch on the device; a GPU does them in
  microseconds, and the last row times them on this CPU, for information.

The images are generated (no ImageNet here): smooth structure plus texture and noise, compressing to about
the size of an ImageNet photo of that resolution (~80–110 kB at 500×375, quality 90). Every file is read
once first, so all pipelines read from the page cache. Figures are in docs/benchmarks.md.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision import datasets, transforms

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, seconds_per_call  # noqa: E402

from lit_ddp.data import ImageNetDataModule  # noqa: E402
from lit_ddp.data.batch_transforms import normalize, random_hflip  # noqa: E402

MEAN, STD = ImageNetDataModule.mean, ImageNetDataModule.std


def make_images(root: Path, n: int, width: int, height: int, seed: int = 0) -> None:
    """``n`` JPEGs in ImageFolder layout (two classes, and a val/ the data module requires)."""
    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for c in range(2):
            (root / split / f"class{c}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        coarse = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
        texture = Image.fromarray(rng.integers(0, 256, (height // 2, width // 2, 3), dtype=np.uint8))
        img = (
            0.5 * np.asarray(coarse.resize((width, height), Image.BICUBIC), float)
            + 0.5 * np.asarray(texture.resize((width, height), Image.BILINEAR), float)
            + rng.normal(0, 12, (height, width, 3))
        )
        path = root / "train" / f"class{i % 2}" / f"img{i:05d}.JPEG"
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, quality=90)
    for c in range(2):
        (root / "val" / f"class{c}" / "img.JPEG").write_bytes(path.read_bytes())


def best_rates(rows: list, n: int, repeats: int) -> list[float]:
    """images/s of each row: best of ``repeats`` passes over ``n`` images, the rows taking turns in each
    round, so that load from other processes on the machine spreads over all rows alike."""
    samples = interleaved({name: (lambda fn=fn: n / seconds_per_call(fn)()) for name, fn in rows}, repeats)
    return [max(rates) for rates in samples.values()]


def add_image_arguments(parser: argparse.ArgumentParser, images: int) -> None:
    """The generated JPEGs and the crop, shared with ab_input_pipeline.py."""
    parser.add_argument("--images", type=int, default=images)
    parser.add_argument("--width", type=int, default=500)
    parser.add_argument("--height", type=int, default=375)
    parser.add_argument("--size", type=int, default=224, help="crop size")
    parser.add_argument("--val-resize", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--dir", type=Path, default=None, help="keep the generated images here (and reuse)")


def image_dir(args: argparse.Namespace) -> Path:
    """``--dir`` (or a new temporary folder) holding ``--images`` generated JPEGs under train/."""
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench_imagenet_"))
    if not (root / "train").is_dir():
        make_images(root, args.images, args.width, args.height)
    return root


def torchvision_folder(root: Path, steps: list) -> datasets.ImageFolder:
    return datasets.ImageFolder(str(root / "train"), transforms.Compose(steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_image_arguments(parser, images=400)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # what a DataLoader worker gets
    torch.manual_seed(0)
    n, size = args.images, args.size
    root = image_dir(args)
    files = sorted((root / "train").rglob("*.JPEG"))[:n]
    kb = sum(len(p.read_bytes()) for p in files) / len(files) / 1e3  # also warms the page cache

    tv_train = torchvision_folder(
        root,
        [
            transforms.RandomResizedCrop(size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ],
    )
    flip = transforms.RandomHorizontalFlip()
    tv_uint8 = torchvision_folder(root, [transforms.RandomResizedCrop(size), flip, transforms.PILToTensor()])
    tv_val = torchvision_folder(
        root,
        [
            transforms.Resize(args.val_resize),
            transforms.CenterCrop(size),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ],
    )

    def per_image(dataset: datasets.ImageFolder):
        return lambda: [dataset[i] for i in range(n)]

    def lit_ddp(train: bool, draft: bool = True):
        """The worker's share: decode + crop into a uint8 batch (flip and normalise happen on the device)."""
        dm = ImageNetDataModule(
            data_dir=str(root), image_size=size, val_resize=args.val_resize, draft=draft, num_workers=0
        )
        dm.setup("fit")
        dataset = dm.train_set if train else dm.val_set
        dataset.samples = dm.train_set.samples  # the same images for every row

        def run() -> None:
            for start in range(0, n, args.batch_size):
                batch = dataset.__getitems__(range(start, min(start + args.batch_size, n)))
                assert not batch.unreadable

        return run

    batch = torch.randint(0, 256, (args.batch_size, size, size, 3), dtype=torch.uint8).permute(0, 3, 1, 2)

    def on_device() -> None:
        for _ in range(0, n, args.batch_size):
            normalize(random_hflip(batch), MEAN, STD)

    rows = [
        ("train  torchvision ImageFolder: RRC, flip, ToTensor, Normalize", per_image(tv_train)),
        ("train  torchvision ImageFolder: RRC, flip, PILToTensor (uint8)", per_image(tv_uint8)),
        ("train  lit_ddp worker, draft=false", lit_ddp(train=True, draft=False)),
        ("train  lit_ddp worker", lit_ddp(train=True)),
        ("val    torchvision ImageFolder: Resize, CenterCrop, ToTensor, Normalize", per_image(tv_val)),
        ("val    lit_ddp worker", lit_ddp(train=False)),
        ("(info) lit_ddp batched flip + normalise, run here on the CPU", on_device),
    ]
    print(
        f"{n} JPEGs of {args.width}×{args.height}, mean {kb:.0f} kB; crop {size}; one process, one torch"
        f" thread; best of {args.repeats} passes"
    )
    r = best_rates(rows, n, args.repeats)
    for (name, _), rate in zip(rows, r, strict=True):
        print(f"  {name:<72} {rate:7.0f} images/s")
    print(f"train: lit_ddp / torchvision (pytorch/examples transforms) = {r[3] / r[0]:.2f}×")
    print(f"train: lit_ddp / torchvision (uint8 output)                 = {r[3] / r[1]:.2f}×")
    print(f"val:   lit_ddp / torchvision (pytorch/examples transforms) = {r[5] / r[4]:.2f}×")


if __name__ == "__main__":
    main()
