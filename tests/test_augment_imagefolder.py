"""Auto-augment and random erasing in the ImageFolder workers, reproducible from (seed, epoch, index)
(issue 16), and ImageFolder crops seeded per (seed, epoch, index) (issue 14). MixUp/CutMix: test_augment.py.
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from imagenet_tree import make_tree

from lit_ddp.data import ImageNetDataModule, RandomResizedCropFlip
from lit_ddp.data.jpeg import sample_augmentation
from lit_ddp.errors import UserError

# ---- auto-augment and random erasing in the ImageFolder workers --------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagenet")
    make_tree(root)
    return root


def imagenet(tree: Path, workers: int, **kwargs) -> ImageNetDataModule:
    dm = ImageNetDataModule(
        data_dir=str(tree), image_size=32, val_resize=36, batch_size=4, num_workers=workers, **kwargs
    )
    dm.setup("fit")
    return dm


def epoch_images(dm: ImageNetDataModule, epoch: int, replicas: int = 1) -> dict[int, torch.Tensor]:
    """Sample index → the training crop its loader produced in ``epoch``, over ``replicas`` ranks' shards."""
    out = {}
    for rank in range(replicas):
        dm.trainer = SimpleNamespace(
            distributed_sampler_kwargs={"num_replicas": replicas, "rank": rank}, lightning_module=None
        )
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(epoch)
        order = [i for i, _ in loader.sampler]
        images = torch.cat([batch.images for batch in loader])
        out.update(zip(order, images, strict=True))
    dm.trainer = None
    return out


AUGMENT = {"augmentation": RandomResizedCropFlip(auto_augment="trivialaugment", random_erasing=0.5)}


def test_worker_augmentation_is_a_function_of_seed_epoch_and_index(tree: Path) -> None:
    dm = imagenet(tree, 0, **AUGMENT)
    before = torch.get_rng_state()
    dm.train_set.__getitems__([(0, 11), (1, 12)])  # what a loader with num_workers=0 does in training
    assert torch.equal(torch.get_rng_state(), before)  # the training process's RNG is left as it was
    in_process = epoch_images(dm, epoch=3)
    # Two worker processes, the set split over two ranks: each image cropped and augmented the same.
    in_workers = epoch_images(imagenet(tree, 2, **AUGMENT), epoch=3, replicas=2)
    assert in_process.keys() == in_workers.keys() and len(in_process) == 27
    for index, image in in_process.items():
        assert torch.equal(image, in_workers[index]), index
    next_epoch = epoch_images(imagenet(tree, 0, **AUGMENT), epoch=4)
    differ = sum(not torch.equal(image, next_epoch[i]) for i, image in in_process.items())
    assert differ >= 24  # all but the unreadable file's black placeholder, barring a coincidence
    plain = epoch_images(imagenet(tree, 0), epoch=3)  # the same crops and flips, without the policy
    assert sum(not torch.equal(image, plain[i]) for i, image in in_process.items()) >= 20


def test_random_erasing_fills_with_the_mean_colour() -> None:
    erase = sample_augmentation("none", 1.0, fill=(124, 116, 104))
    out = erase(torch.full((3, 64, 64), 7, dtype=torch.uint8))
    erased = out[0] != 7
    assert erased.any()
    assert (out[:, erased] == torch.tensor([[124], [116], [104]], dtype=torch.uint8)).all()
    assert sample_augmentation() is None


def test_unknown_auto_augment_is_one_line(tree: Path, capsys) -> None:
    with pytest.raises(UserError, match="auto_augment='rand' is not one of: none, trivialaugment"):
        RandomResizedCropFlip(auto_augment="rand")
    with pytest.raises(UserError, match=r"random_erasing=1.5 must be a probability"):
        RandomResizedCropFlip(random_erasing=1.5)
    from lit_ddp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        augment = "--data.augmentation.auto_augment=rand"
        main(["fit", "--data=ImageNetDataModule", f"--data.data_dir={tree}", augment])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("lit_ddp: error: auto_augment='rand' is not one of")
