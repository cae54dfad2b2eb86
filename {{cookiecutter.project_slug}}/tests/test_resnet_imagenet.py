"""configs/resnet_imagenet.yaml's system and data, end to end on a tiny ImageFolder tree (a small network)."""

from pathlib import Path

import numpy as np
from lightning import Trainer
from lit_ddp.testing import build, resolved_config
from PIL import Image

from {{ cookiecutter.package_name }}.__main__ import main

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
    config = resolved_config(
        main,
        "--config", str(PROJECT / "configs" / "resnet_imagenet.yaml"),
        "--model.arch=resnet18",  # the recipe's ResNet-50, smaller
        f"--data.data_dir={tree}", "--data.image_size=32", "--data.val_resize=36", "--data.batch_size=4",
        "--data.num_workers=0",
    )  # fmt: skip
    model, data = build(config)
    assert model.num_classes == 2  # from the tree's folders
    trainer = Trainer(fast_dev_run=True, accelerator="cpu", logger=False, enable_progress_bar=False)
    trainer.fit(model, datamodule=data)
    assert {"train/loss_epoch", "val/acc"} <= set(trainer.callback_metrics)
