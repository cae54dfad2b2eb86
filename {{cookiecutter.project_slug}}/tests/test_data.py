"""Your data module on its own, as configs/default.yaml builds it: what each split holds, and that every
rank (each builds the data itself) would hold the same."""

import torch
from lit_ddp.testing import build

SPLITS = ("train", "val", "test")
LOOK_AT = 16  # samples per split, spread over it


def splits(config: dict) -> tuple[object, dict]:
    _, data = build(config)
    data.setup("fit")
    data.setup("test")
    return data, {split: getattr(data, f"{split}_set") for split in SPLITS}


def some(dataset) -> list[int]:
    return sorted({i * len(dataset) // LOOK_AT for i in range(LOOK_AT)})


def test_splits_hold_uint8_images_with_labels_in_range(default_config: dict) -> None:
    data, held = splits(default_config)
    assert len(data.class_names) == data.num_classes
    for split, dataset in held.items():
        assert len(dataset) > 0, f"the {split} split is empty"
        for i in some(dataset):
            image, label = dataset[i]
            assert image.dtype == torch.uint8 and image.ndim == 3, (split, i, image.dtype, image.shape)
            assert 0 <= int(label) < data.num_classes, (split, i, int(label))


def test_every_rank_would_hold_the_same_splits(default_config: dict) -> None:
    # DDP starts one process per device, each building the data itself: they must agree.
    (_, first), (_, again) = splits(default_config), splits(default_config)
    for split in SPLITS:
        for i in some(first[split]):
            assert torch.equal(first[split][i][0], again[split][i][0]), (split, i)
    # The validation split is not a copy of the training split.
    assert not all(torch.equal(first["train"][i][0], first["val"][i][0]) for i in some(first["val"]))
