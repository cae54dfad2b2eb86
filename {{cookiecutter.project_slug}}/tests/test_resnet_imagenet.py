"""configs/resnet_imagenet.yaml's system and data, end to end on a tiny ImageFolder tree (a small network)."""

from pathlib import Path

import numpy as np
from lit_ddp.cli import build_cli
from PIL import Image

from {{ cookiecutter.package_name }}.__main__ import MODEL
from {{ cookiecutter.package_name }}.data import MyDataModule

PROJECT = Path(__file__).resolve().parents[1]


def image_tree(root: Path, classes: int = 2, per_class: int = 4) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.jpg")
    return root


def test_the_recipe_trains_and_validates_on_an_image_folder(in_tmp: Path) -> None:
    tree = image_tree(in_tmp / "tree")
    args = [
        "fit",
        "--config", str(PROJECT / "configs" / "resnet_imagenet.yaml"),
        "--model.arch=resnet18",  # the recipe's ResNet-50, smaller
        f"--data.data_dir={tree}", "--data.image_size=32", "--data.val_resize=36", "--data.batch_size=4",
        "--data.num_workers=0", "--trainer.precision=32", "--trainer.sync_batchnorm=false",
        "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false",
    ]  # fmt: skip
    trainer = build_cli(args, model=MODEL, data=MyDataModule, prog="test").trainer
    assert trainer.model.num_classes == 2  # from the tree's folders
    assert {"train/loss_epoch", "val/acc"} <= set(trainer.callback_metrics)
