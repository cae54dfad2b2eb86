"""Data: the on-disk CIFAR-10 reader, the embedded Shapes data, splits, batch augmentation."""

import os
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from lit_ddp.data import CropFlip, ShapesDataModule, TensorImageDataset
from lit_ddp.data.batch_transforms import SampleRandom, normalize, random_crop_flip, random_hflip
from lit_ddp.data.datasets import collate_batch, split_indices
from lit_ddp.data.shapes import CLASS_NAMES, draw_shapes
from lit_ddp.data.workers import available_cpus
from lit_ddp.errors import UserError


def test_split_is_a_function_of_the_seed_only() -> None:
    # Every rank calls setup() independently: the split must not depend on the rank or on global RNG.
    torch.manual_seed(1)
    train_a, val_a = split_indices(1000, 100, seed=3)
    torch.manual_seed(2)
    train_b, val_b = split_indices(1000, 100, seed=3)
    assert torch.equal(train_a, train_b) and torch.equal(val_a, val_b)
    assert set(train_a.tolist()).isdisjoint(val_a.tolist()) and len(train_a) + len(val_a) == 1000
    assert not torch.equal(val_a, split_indices(1000, 100, seed=4)[1])


def test_bad_val_size_is_a_user_error() -> None:
    with pytest.raises(UserError, match="val_size"):
        split_indices(100, 100, seed=0)


def test_shapes_are_deterministic_balanced_and_image_like() -> None:
    x1, y1 = draw_shapes(200, seed=5)
    x2, y2 = draw_shapes(200, seed=5)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, draw_shapes(200, seed=6)[0])
    assert x1.shape == (200, 3, 32, 32) and x1.dtype == torch.uint8
    assert torch.bincount(y1, minlength=10).tolist() == [20] * 10
    assert x1.float().std() > 30  # not blank: shapes on coloured backgrounds


def test_shapes_datamodule_sizes_and_disjoint_splits() -> None:
    dm = ShapesDataModule(train_size=64, val_size=33, test_size=20, batch_size=16)
    dm.setup("fit")
    dm.setup("test")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (64, 33, 20)
    assert dm.num_classes == len(CLASS_NAMES) == 10
    train = {tuple(img.flatten().tolist()) for img in dm.train_set.images}
    assert not any(tuple(img.flatten().tolist()) in train for img in dm.val_set.images)


def test_batched_fetch_matches_per_sample_collate() -> None:
    images, labels = draw_shapes(40, seed=0)
    ds = TensorImageDataset(images, labels)
    batched = next(iter(DataLoader(ds, batch_size=16, collate_fn=collate_batch)))
    per_sample = torch.utils.data.default_collate([ds[i] for i in range(16)])
    assert torch.equal(batched[0], per_sample[0]) and torch.equal(batched[1], per_sample[1])


def test_random_crop_matches_torchvision_random_crop_semantics() -> None:
    x = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    out = random_crop_flip(x, padding=4, flip_p=0.0, generator=torch.Generator().manual_seed(0))
    padded = v2.functional.pad(x, [4, 4, 4, 4])  # torchvision pads with zeros
    for img, src in zip(out, padded, strict=True):
        windows = [src[:, i : i + 32, j : j + 32] for i in range(9) for j in range(9)]
        assert any(torch.equal(img, w) for w in windows)


def test_random_crop_flip_yields_padded_windows_half_of_them_mirrored() -> None:
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    out = random_crop_flip(x, padding=4, generator=torch.Generator().manual_seed(0))
    padded = v2.functional.pad(x, [4, 4, 4, 4])
    mirrored = 0
    for img, src in zip(out, padded, strict=True):
        windows = [src[:, i : i + 32, j : j + 32] for i in range(9) for j in range(9)]
        plain = any(torch.equal(img, w) for w in windows)
        flipped = any(torch.equal(img, w.flip(-1)) for w in windows)
        assert plain or flipped
        mirrored += flipped and not plain
    assert 16 < mirrored < 48


def test_random_crop_flip_makes_its_shape_constants_once_and_crops_each_batch_size_as_slicing_does() -> None:
    """The parts of the row starts that only the shapes decide are made once per shape: the second batch
    of a shape runs no ``arange`` (on a GPU, four kernel launches less a step). Batches of two sizes in
    turns, as an epoch's full and last batches come, each crop as slicing each padded image (mirrored
    when its flip is drawn) at its drawn offsets does."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_step_overhead import DispatchedOps

    pad, n = 3, 7
    g = torch.Generator().manual_seed(0)
    for b in (16, 5, 16, 5):
        x = torch.randint(0, 256, (b, 2, 9, 13), dtype=torch.uint8, generator=g)
        rand = SampleRandom(torch.randint(0, 10**6, (b,), generator=g), key=b)
        with DispatchedOps() as ops:
            out = random_crop_flip(x, padding=pad, rand=rand)
        dy, dx, flip = rand.integers(0, n), rand.integers(1, n), rand.uniform(2) < 0.5
        padded = v2.functional.pad(x, [pad] * 4)
        for i in range(b):
            src = padded[i].flip(-1) if flip[i] else padded[i]
            assert torch.equal(out[i], src[:, dy[i] : dy[i] + 9, dx[i] : dx[i] + 13]), (b, i)
        assert 0 < flip.sum() < b
    assert "arange" not in ops.names, ops.names  # the last call: its shape was seen two calls before


def test_random_crop_flip_draws_every_offset_and_flip_uniformly() -> None:
    # Channel 0 holds each pixel's row + 1, channel 1 its column + 1: the centre pixel of a crop names
    # the crop's offset, and the column order names the flip.
    n, size, pad = 8100, 16, 4
    rows = torch.arange(1, size + 1, dtype=torch.uint8).view(size, 1).expand(size, size)
    x = torch.stack([rows, rows.T, rows]).expand(n, 3, size, size).contiguous()
    out = random_crop_flip(x, padding=pad, generator=torch.Generator().manual_seed(0)).long()
    centre = size // 2
    dy = out[:, 0, centre, centre] - 1 - centre + pad
    flipped = out[:, 1, centre, centre + 1] < out[:, 1, centre, centre]
    # A mirrored crop holds the source's column ``centre`` at ``size - 1 - centre``.
    dx = (
        torch.where(flipped, out[:, 1, centre, size - 1 - centre], out[:, 1, centre, centre])
        - 1
        - centre
        + pad
    )
    cell = (flipped.long() * (2 * pad + 1) + dy) * (2 * pad + 1) + dx
    counts = torch.bincount(cell, minlength=2 * (2 * pad + 1) ** 2)
    assert counts.numel() == 162 and counts.min() > 20 and counts.max() < 100  # expected 50 each


def test_hflip_flips_about_half_and_keeps_others() -> None:
    x = torch.randint(0, 256, (400, 3, 4, 4), dtype=torch.uint8)
    out = random_hflip(x, generator=torch.Generator().manual_seed(0))
    flipped = (out == x.flip(-1)).flatten(1).all(1)
    kept = (out == x).flatten(1).all(1)
    assert (flipped | kept).all() and 150 < flipped.sum() < 250


def test_normalize_matches_torchvision() -> None:
    x = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    expected = v2.functional.normalize(x.float() / 255, mean, std)
    assert torch.allclose(normalize(x, mean, std), expected, atol=1e-5)


def test_negative_crop_padding_is_one_clear_error() -> None:
    with pytest.raises(UserError, match=r"padding=-2 must be 0 or more"):
        ShapesDataModule(augmentation=CropFlip(padding=-2))


def test_num_workers_none_is_resolved_for_the_trainers_devices_and_a_number_is_kept(monkeypatch) -> None:
    monkeypatch.setattr("lit_ddp.data.base.available_cpus", lambda: 12)
    monkeypatch.setattr("lit_ddp.data.workers.available_memory", lambda: None)  # no memory bound here
    auto, fixed = ShapesDataModule(num_workers=None), ShapesDataModule(num_workers=5)
    auto.trainer = fixed.trainer = SimpleNamespace(num_devices=2)  # what fit() attaches; devices per node
    assert (auto.workers_per_device(), fixed.workers_per_device()) == (5, 5)  # 12 // 2 - 1 and as given
    assert ShapesDataModule().workers_per_device() == 0  # in-memory data keeps 0 by default
    with pytest.raises(UserError, match="num_workers=-1 must be 0 or more"):
        ShapesDataModule(num_workers=-1)
    assert 1 <= available_cpus() <= (os.cpu_count() or 1)


def test_random_crop_flip_without_padding_only_flips() -> None:
    x = torch.randint(0, 256, (400, 3, 8, 8), dtype=torch.uint8)
    out = random_crop_flip(x, padding=0, generator=torch.Generator().manual_seed(0))
    flipped = (out == x.flip(-1)).flatten(1).all(1)
    kept = (out == x).flatten(1).all(1)
    assert (flipped | kept).all() and 150 < flipped.sum() < 250


def test_training_sampler_is_torchs_distributed_shuffle_on_every_device_count() -> None:
    """Rank r of W takes every W-th index of the (seed, epoch) permutation, with one process too, so one
    process with batch W·b draws the same global batches as W processes with batch b."""
    from torch.utils.data import DistributedSampler

    from lit_ddp.data.samplers import ResumableShuffleSampler

    data = range(10)
    for world in (1, 2, 3):
        for epoch in (0, 1):
            ours, theirs = [], []
            for rank in range(world):
                for sampler, out in (
                    (ResumableShuffleSampler(data, world, rank, seed=5), ours),
                    (DistributedSampler(data, world, rank, shuffle=True, seed=5), theirs),
                ):
                    sampler.set_epoch(epoch)
                    out.append(list(sampler))
            assert ours == theirs
    one = ResumableShuffleSampler(data, 1, 0, seed=5)
    two = [ResumableShuffleSampler(data, 2, r, seed=5) for r in range(2)]
    b = 2  # per device; the one process takes 2·b
    global_batches = [sorted(list(one)[s * 2 * b : (s + 1) * 2 * b]) for s in range(2)]
    per_rank = [list(s) for s in two]
    assert global_batches == [
        sorted(per_rank[0][s * b : (s + 1) * b] + per_rank[1][s * b : (s + 1) * b]) for s in range(2)
    ]


def test_training_sampler_resumes_mid_epoch_and_only_in_that_epoch() -> None:
    from lit_ddp.data.samplers import ResumableShuffleSampler

    data = range(10)
    full = ResumableShuffleSampler(data, 2, 1, seed=5)
    full.set_epoch(3)
    order = list(full)
    resumed = ResumableShuffleSampler(data, 2, 1, seed=5)
    resumed.resume(3, 2)
    resumed.set_epoch(3)  # what Lightning calls at the resumed epoch's start
    assert list(resumed) == order[2:] and list(resumed) == order[2:]
    assert len(resumed) == len(order)  # Lightning counts the epoch's batches from it: the whole shard
    resumed.set_epoch(4)
    full.set_epoch(4)
    assert list(resumed) == list(full)


def test_augmentation_depends_on_seed_epoch_and_sample_index_only() -> None:
    # More: tests/test_augment.py (per-sample draws, any split of the batch, any device count).
    dm = ShapesDataModule(train_size=64, val_size=16, batch_size=16, augmentation=CropFlip(padding=4))
    x = draw_shapes(16, seed=0)[0]
    index = torch.arange(100, 116)

    def augment(epoch: int, index: torch.Tensor = index) -> torch.Tensor:
        return dm.augment_batch(x, dm.augmentation_random(index, epoch))

    assert torch.equal(augment(1), augment(1))  # reproducible, whatever ran in between
    assert not torch.equal(augment(1), augment(2))  # another epoch
    assert not torch.equal(augment(1), augment(1, index + 16))  # other samples
    assert not torch.equal(augment(1), x)
