"""The data module on its own: what each split holds, and that every rank would hold the same."""

import torch

from {{ cookiecutter.package_name }}.data import MyDataModule


def splits(**kwargs) -> dict:
    data = MyDataModule(train_size=64, val_size=16, test_size=8, **kwargs)
    data.setup("fit")
    data.setup("test")
    return {"train": data.train_set, "val": data.val_set, "test": data.test_set}


def test_splits_are_uint8_images_with_labels_in_range() -> None:
    for name, size in {"train": 64, "val": 16, "test": 8}.items():
        images, labels = splits()[name][:]
        assert images.shape == (size, 3, 32, 32) and images.dtype == torch.uint8, name
        assert labels.dtype == torch.int64 and 0 <= labels.min() and labels.max() < MyDataModule.num_classes
    assert len(MyDataModule.class_names) == MyDataModule.num_classes


def test_each_split_is_a_function_of_the_seed() -> None:
    # DDP starts one process per device, each building the data itself: they must agree.
    first, again, other = splits(seed=1), splits(seed=1), splits(seed=2)
    assert torch.equal(first["train"][:][0], again["train"][:][0])
    assert not torch.equal(first["train"][:][0], other["train"][:][0])
    assert not torch.equal(first["train"][:16][0], first["val"][:][0])  # splits are not copies
