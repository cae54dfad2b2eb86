"""The ImageNet-layout recipes train with RandomResizedCropFlip in the workers, as their headers say: the
CLI's default data module (Shapes, CropFlip on the device) must not lend them its augmentation when the
config switches --data to ImageNetDataModule."""

import pytest
from conftest import REPO

from lit_ddp.cli import main
from lit_ddp.testing import resolved_config


@pytest.mark.parametrize("recipe", ["resnet_imagenet", "finetune_imagefolder", "resnet50_imagenet_modern"])
def test_imagenet_recipes_crop_with_random_resized_crops(recipe: str) -> None:
    config = resolved_config(main, "--config", str(REPO / "configs" / f"{recipe}.yaml"))
    assert config["data"]["init_args"]["augmentation"]["class_path"] == "lit_ddp.data.RandomResizedCropFlip"


def test_the_policy_and_erasing_are_fields_of_the_recipes_augmentation() -> None:
    config = resolved_config(
        main,
        "--config",
        str(REPO / "configs" / "resnet_imagenet.yaml"),
        "--data.augmentation.auto_augment=trivialaugment",
        "--data.augmentation.random_erasing=0.1",
    )
    fields = config["data"]["init_args"]["augmentation"]["init_args"]
    assert (fields["auto_augment"], fields["random_erasing"]) == ("trivialaugment", 0.1)
