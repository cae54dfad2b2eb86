"""Augmentation: crop and flip per sample from (seed, epoch, index), alike on any device count (issue 22);
MixUp/CutMix on the device, reproducible and resumable from their seeds (issue 16). The
ImageFolder workers' auto-augment, random erasing and per-sample crops: test_augment_imagefolder.py.

    python -m pytest tests/test_augment.py -q            # the 2-process runs carry the ddp and slow markers
"""

import math
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import REPO
from lightning import Callback, Trainer
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.trainer.states import RunningStage
from test_ddp_semantics import DDP2, assert_identical, ckpt, final, job, launch, max_diff, records

from lit_ddp.cli import build_cli
from lit_ddp.data import CropFlip, ShapesDataModule
from lit_ddp.data.batch import Batch
from lit_ddp.data.batch_transforms import SampleRandom, draw_mix, mix_batch, random_crop_flip
from lit_ddp.data.shapes import draw_shapes
from lit_ddp.errors import UserError
from lit_ddp.models import LeNetCIFAR

# ---- MixUp / CutMix functions --------------------------------------------------------------------------


def batch(b: int = 8, k: int = 10, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 3, 16, 16, generator=g), torch.arange(b) % k  # neighbours' labels always differ


def test_mixup_blends_each_image_with_its_neighbour_and_the_labels_alike() -> None:
    x, y = batch()
    lam, box = draw_mix(16, 16, mixup_alpha=1.0, cutmix_alpha=0.0, rng=random.Random(3))
    assert box is None and 0 < lam < 1
    mixed, target = mix_batch(x.clone(), y, 10, lam, box)
    torch.testing.assert_close(mixed, lam * x + (1 - lam) * x.roll(1, 0))
    assert target.shape == (8, 10) and target.dtype == torch.float32
    torch.testing.assert_close(target.sum(1), torch.ones(8))
    torch.testing.assert_close(target[torch.arange(8), y], torch.full((8,), lam))
    torch.testing.assert_close(target[torch.arange(8), y.roll(1)], torch.full((8,), 1 - lam))


def test_cutmix_pastes_the_neighbours_box_and_lambda_is_the_area_outside_it() -> None:
    x, y = batch()
    rng = random.Random(0)
    for _ in range(50):
        lam, box = draw_mix(16, 12, mixup_alpha=0.0, cutmix_alpha=1.0, rng=rng)
        x1, y1, x2, y2 = box
        assert 0 <= x1 <= x2 <= 12 and 0 <= y1 <= y2 <= 16
        assert lam == pytest.approx(1 - (x2 - x1) * (y2 - y1) / (16 * 12))
    x, y = batch(b=8)
    lam, box = 0.0, None
    while box is None or box[2] - box[0] < 2 or box[3] - box[1] < 2:  # a box with an inside and an outside
        lam, box = draw_mix(16, 16, 0.0, 1.0, rng)
    mixed, target = mix_batch(x.clone(), y, 10, lam, box)
    x1, y1, x2, y2 = box
    inside = torch.zeros(16, 16, dtype=torch.bool)
    inside[y1:y2, x1:x2] = True
    assert torch.equal(mixed[..., inside], x.roll(1, 0)[..., inside])
    assert torch.equal(mixed[..., ~inside], x[..., ~inside])
    # Each target's own share is the fraction of its pixels that are still its own.
    torch.testing.assert_close(target[torch.arange(8), y], torch.full((8,), 1 - inside.float().mean().item()))
    torch.testing.assert_close(target.sum(1), torch.ones(8))


def test_mixing_draws_are_a_function_of_the_rng_and_both_kinds_take_turns() -> None:
    assert draw_mix(32, 32, 0.2, 1.0, random.Random(7)) == draw_mix(32, 32, 0.2, 1.0, random.Random(7))
    draws = [draw_mix(32, 32, 1.0, 1.0, random.Random(s)) for s in range(400)]
    cutmix = sum(box is not None for _, box in draws)
    assert 150 < cutmix < 250  # one of the two per batch, p = 1/2
    lams = torch.tensor([lam for lam, box in draws if box is None])
    assert 0.4 < float(lams.mean()) < 0.6 and float(lams.std()) > 0.2  # Beta(1, 1) is uniform
    small = torch.tensor([draw_mix(8, 8, 0.2, 0.0, random.Random(s))[0] for s in range(400)])
    assert float(((small < 0.1) | (small > 0.9)).float().mean()) > 0.5  # Beta(0.2, 0.2): mostly near 0 or 1


def test_soft_targets_give_the_same_loss_and_accuracy_as_their_labels() -> None:
    model = LeNetCIFAR(label_smoothing=0.1)
    x, y = torch.randn(16, 3, 32, 32), torch.arange(16) % 10
    hard, _ = model._shared_step((x, y), "train")
    soft, _ = model._shared_step((x, F.one_hot(y, 10).float()), "train")
    torch.testing.assert_close(hard, soft)
    acc = model.train_metrics.compute()["train/acc"]
    model.train_metrics.reset()
    model._shared_step((x, y), "train")
    torch.testing.assert_close(model.train_metrics.compute()["train/acc"], acc)


# ---- crop and flip: per sample, from (seed, epoch, index) -------------------------------------------------


def test_per_sample_draws_give_every_offset_and_flip_uniformly_and_independently() -> None:
    # Channel 0 holds each pixel's row + 1, channel 1 its column + 1: the centre pixel of a crop names the
    # crop's offset, and the column order names the flip (as test_data.py's generator version).
    n, size, pad = 8100, 16, 4
    rows = torch.arange(1, size + 1, dtype=torch.uint8).view(size, 1).expand(size, size)
    x = torch.stack([rows, rows.T, rows]).expand(n, 3, size, size).contiguous()
    out = random_crop_flip(x, padding=pad, rand=SampleRandom(torch.arange(n), key=7)).long()
    c = size // 2
    dy = out[:, 0, c, c] - 1 - c + pad
    flipped = out[:, 1, c, c + 1] < out[:, 1, c, c]
    dx = torch.where(flipped, out[:, 1, c, size - 1 - c], out[:, 1, c, c]) - 1 - c + pad
    cell = (flipped.long() * (2 * pad + 1) + dy) * (2 * pad + 1) + dx  # the joint (flip, dy, dx) cell
    counts = torch.bincount(cell, minlength=2 * (2 * pad + 1) ** 2)
    assert counts.numel() == 162 and counts.min() > 20 and counts.max() < 100  # expected 50 each
    # Samples far apart in index (beyond 2^32 too) and neighbouring keys draw unrelated numbers.
    index = torch.tensor([3, 3 + 2**32, 4])
    assert len(set(SampleRandom(index, 1).bits(0).tolist())) == 3
    u, v = SampleRandom(torch.arange(n), 7).uniform(0), SampleRandom(torch.arange(n), 8).uniform(0)
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 0.05


def training_step_batches(dm: ShapesDataModule, batches, rank: int = 0, epoch: int = 1) -> list:
    """What the training step receives for each (x, y, index) batch on ``rank``."""
    dm.trainer = fake_trainer(True, epoch, rank)
    return [dm.on_after_batch_transfer(Batch(x, y, index=i), 0) for x, y, i in batches]


def test_each_sample_is_augmented_alike_on_any_device_count_batch_and_after_a_resume() -> None:
    images, labels = draw_shapes(64, seed=0)
    order = torch.randperm(64, generator=torch.Generator().manual_seed(1))  # one epoch's global order
    one = ShapesDataModule(augmentation=CropFlip(padding=4))
    # One process with batch 32: two global batches. Two processes with batch 16: rank r takes every 2nd.
    big = [(images[o], labels[o], o) for o in order.view(2, 32)]
    (a0, a1) = training_step_batches(one, big)
    seen_one = dict(zip(order.tolist(), torch.cat([a0[0], a1[0]]), strict=True))
    seen_two = {}
    for rank in range(2):
        shard = order[rank::2].view(2, 16)
        dm = ShapesDataModule(augmentation=CropFlip(padding=4))
        out = training_step_batches(dm, [(images[o], labels[o], o) for o in shard], rank)
        seen_two.update(zip(shard.flatten().tolist(), torch.cat([b[0] for b in out]), strict=True))
        assert all(len(b) == 2 for b in out)  # the step gets (x, y): the indices stay in the data module
    assert seen_one.keys() == seen_two.keys()
    assert all(torch.equal(seen_one[i], seen_two[i]) for i in seen_one)  # byte-identical
    plain = ShapesDataModule(augmentation=None)
    (p0,) = training_step_batches(plain, big[:1])
    assert sum(not torch.equal(a, p) for a, p in zip(a0[0], p0[0], strict=True)) > 24  # augmented
    resumed = ShapesDataModule(augmentation=CropFlip(padding=4))
    resumed.load_state_dict({"epoch": 1, "batches": 1})
    assert torch.equal(training_step_batches(resumed, big[1:])[0][0], a1[0])
    (later,) = training_step_batches(ShapesDataModule(augmentation=CropFlip(padding=4)), big[:1], epoch=2)
    assert not torch.equal(later[0], a0[0])  # a new epoch draws anew


def test_the_draws_are_hashed_before_the_copy_and_the_device_runs_no_hashing() -> None:
    """Lightning's order: on_before_batch_transfer (host), the copy (Lightning moves objects with ``to``),
    on_after_batch_transfer (device). The draws made before the copy augment exactly as draws made after
    it; the device then runs only the crop, the flip and the normalisation: on a GPU every integer op of
    the hash would be one more kernel launch per step."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_step_overhead import DispatchedOps

    images, labels = draw_shapes(32, seed=0)
    index = torch.arange(100, 132)
    dm = ShapesDataModule(augmentation=CropFlip(padding=4))
    dm.trainer = fake_trainer(True, epoch=3)
    on_host = dm.on_before_batch_transfer((images, labels, index), 0)
    assert isinstance(on_host.draws, SampleRandom)
    moved = move_data_to_device(on_host, "cpu")  # Lightning's batch transfer (objects with `to` move)
    with DispatchedOps() as device_ops:
        x, y = dm.on_after_batch_transfer(moved, 0)
    hashing = {"bitwise_xor", "bitwise_xor_", "bitwise_and", "bitwise_and_"}  # the hash rounds alone
    assert not hashing & set(device_ops.names), device_ops.names
    expected = ShapesDataModule(augmentation=CropFlip(padding=4))
    expected.trainer = fake_trainer(True, epoch=3)
    x_after, _ = expected.on_after_batch_transfer(
        Batch(images, labels, index=index), 0
    )  # drawn on the device
    assert torch.equal(x, x_after)
    evaluating = ShapesDataModule(augmentation=CropFlip(padding=4))
    evaluating.trainer = fake_trainer(False)
    unaugmented = evaluating.on_before_batch_transfer(
        (images, labels), 0
    )  # evaluation batches carry no index
    assert unaugmented.images is images and unaugmented.draws is None  # nothing drawn


def test_an_epochs_draws_hashed_at_once_are_the_draws_each_batch_would_hash(monkeypatch) -> None:
    """A training split small enough has its epoch's draws hashed once (base.py ``_epoch_draws``): a
    batch's draws are its rows, the very bits hashing its indices gives, for any order and repeats, in
    every epoch; made once an epoch; indices past the split, and a split too large to hold, are hashed."""
    import lit_ddp.data.base as base
    from lit_ddp.data.datasets import TensorImageDataset
    from lit_ddp.data.samplers import stable_seed

    images, labels = draw_shapes(50, seed=0)
    dm = ShapesDataModule(augmentation=CropFlip(padding=4))
    dm.train_set = TensorImageDataset(images, labels)
    draws = range(SampleRandom.BLOCK + 3)  # the hashed block and draws hashed where they are used

    def assert_hashed(rand: SampleRandom, index: torch.Tensor, epoch: int) -> None:
        hashed = SampleRandom(index, stable_seed(dm.seed, epoch))
        assert all(torch.equal(rand.bits(d), hashed.bits(d)) for d in draws)

    index = torch.tensor([0, 49, 7, 7, 23])
    for epoch in (3, 4):
        assert_hashed(dm.augmentation_random(index, epoch), index, epoch)
        table = dm._draws_of[1]
        assert_hashed(dm.augmentation_random(index.flip(0), epoch), index.flip(0), epoch)
        assert dm._draws_of[1] is table  # one table an epoch, not one a batch
    past = torch.tensor([3, 50, 10**9])
    assert_hashed(dm.augmentation_random(past, 4), past, 4)
    monkeypatch.setattr(base, "EPOCH_DRAWS_MAX", 49)  # a split too large to hold: every batch hashed
    dm._draws_of = None
    assert_hashed(dm.augmentation_random(index, 5), index, 5)
    assert dm._draws_of is None


def test_draws_moved_with_the_batch_are_the_draws_and_travel_as_one_tensor() -> None:
    """``to`` is how Lightning moves the draws with the batch: every draw number (the hashed block and the
    later ones hashed where they are used) reads the same after the move, and the move is one copy (on a
    GPU: one transfer a step, from pinned memory, test_cuda.py)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_step_overhead import DispatchedOps

    rand = SampleRandom(torch.tensor([0, 5, 2**33 + 1, 77]), key=2**40 + 3)
    with DispatchedOps() as ops:
        moved = rand.to("cpu")
    # Nothing hashed or assembled for the move: the block of draws is already one tensor.
    assert not {"cat", "stack", "bitwise_xor", "bitwise_xor_"} & set(ops.names), ops.names
    storages = {moved.bits(draw).untyped_storage().data_ptr() for draw in range(SampleRandom.BLOCK)}
    assert len(storages) == 1
    for draw in range(SampleRandom.BLOCK + 3):
        assert torch.equal(moved.bits(draw), rand.bits(draw)), draw
    assert torch.equal(moved.integers(1, 9), rand.integers(1, 9))
    assert torch.equal(moved.uniform(2), rand.uniform(2))


def test_the_hosts_numpy_hash_and_a_devices_torch_hash_give_the_same_bits() -> None:
    """The host hashes in numpy, a device (draws made after the copy, or a draw beyond the block) in torch:
    one function of (key, index, draw), whatever runs it. Checked with torch on the CPU, which runs the
    device's code path."""
    from lit_ddp.data.batch_transforms import _base_hash, _draws

    index = torch.tensor([0, 1, 5, 77, 2**31 - 1, 2**32, 2**33 + 1, 2**62 + 3])
    for key in (0, 7, 2**40 + 3, 2**63 - 1):
        host = SampleRandom(index, key)
        base = _base_hash(index.clone(), key)  # torch tensors: the code a device runs
        on_device = _draws(base, torch.arange(SampleRandom.BLOCK + 3))
        for draw in range(SampleRandom.BLOCK + 3):
            assert torch.equal(host.bits(draw), on_device[:, draw]), (key, draw)


def test_below_and_draws_read_together_are_the_single_draws_values() -> None:
    """``below(draw, p)`` compares the bits in one op where ``uniform(draw) < p`` takes four: the same
    values, checked at the bits on each side of every threshold; ``bits(draw, count)`` reads several
    draws in one tensor, inside the hashed block or beyond it."""
    for p in (0.0, 0.1, 1 / 3, 0.5, 0.7, 1 - 2**-25, 1.0, 1.5, -0.2, 2**-25):
        edge = math.ceil(float(np.float32(p)) * 2**24)  # where uniform's 24 bits cross p
        tops = [k for k in range(edge - 3, edge + 3) if 0 <= k < 2**24] + [0, 2**24 - 1]
        bits = torch.tensor([top * 256 + low for top in tops for low in (0, 1, 255)])
        packed = torch.zeros(len(bits), 1 + SampleRandom.BLOCK, dtype=torch.long)
        packed[:, 1 + 2] = bits  # draw 2
        rand = SampleRandom._of(packed)
        assert torch.equal(rand.below(2, p), rand.uniform(2) < p), p
    rand = SampleRandom(torch.arange(10_000), key=3)
    assert torch.equal(rand.below(2, 0.5), rand.uniform(2) < 0.5)
    for first, count in ((0, 2), (2, 2), (3, 3), (5, 2)):
        together = rand.bits(first, count)
        for j in range(count):
            assert torch.equal(together[:, j], rand.bits(first + j)), (first, count, j)


def test_lightning_moves_a_batch_in_one_call_of_its_to_and_leaves_encoded_images_on_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lightning's transfer (``move_data_to_device``) takes any object with ``to`` whole: the batch moves in
    one call instead of Lightning's walk over a dataclass's fields, which deep-copies it every step. Each
    field moves as that walk moved it: tensors and the draws go, what has no ``to`` (a decoder's encoded
    images) and the unreadable slots stay as they are."""
    calls = []
    to = Batch.to
    monkeypatch.setattr(Batch, "to", lambda self, device: calls.append(device) or to(self, device))
    index = torch.arange(4)
    encoded = object()  # as device_decode.EncodedBatch: no ``to``, not a tensor
    draws = SampleRandom(index, 1)
    batch = Batch(encoded, torch.arange(4), index=index, draws=draws, unreadable={2: ("c", "x")})
    moved = move_data_to_device(batch, "meta")
    assert calls == [torch.device("meta")]
    assert moved.images is encoded and moved.unreadable == {2: ("c", "x")}
    assert moved.labels.device.type == moved.index.device.type == moved.draws.bits(0).device.type == "meta"
    images = torch.zeros(4, 3, 2, 2, dtype=torch.uint8)
    assert move_data_to_device(Batch(images, torch.arange(4)), "meta").images.device.type == "meta"


def test_the_copy_recorder_of_the_gpu_draws_test_reads_a_copy_to_another_device() -> None:
    """test_cuda.py checks with HostToDeviceCopies that the draws reach a GPU in one pinned, non-blocking
    copy; here its reading of torch's dispatch is checked with a copy to the meta device, so that a change
    in torch that would blind it fails in CI, not first on a GPU node."""
    from copies import HostToDeviceCopies

    with HostToDeviceCopies("meta") as mode:
        torch.arange(4).to("meta", non_blocking=True)
        torch.empty(3, device="meta").copy_(torch.ones(3))
        torch.arange(2).to("cpu")  # host to host: not a copy to the device
    assert mode.copies == [(False, True), (False, False)]


# ---- MixUp / CutMix in the data module ----------------------------------------------------------------


def fake_trainer(training: bool, epoch: int = 0, rank: int = 0) -> SimpleNamespace:
    stage = RunningStage.TRAINING if training else RunningStage.VALIDATING
    return SimpleNamespace(
        training=training,
        predicting=False,
        current_epoch=epoch,
        global_rank=rank,
        world_size=1,
        state=SimpleNamespace(stage=stage),
    )


def test_mixing_is_per_seed_rank_epoch_and_batch_and_survives_a_resume() -> None:
    x, y = batch(b=16)
    x = (x.abs() * 60).clamp(0, 255).to(torch.uint8)

    def run(dm: ShapesDataModule, epoch: int = 1, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        dm.trainer = fake_trainer(True, epoch, rank)
        return dm.on_after_batch_transfer(Batch(x, y, index=torch.arange(16)), 0)

    def module() -> ShapesDataModule:
        return ShapesDataModule(mixup_alpha=0.4, cutmix_alpha=1.0)

    full = module()
    batches = [run(full) for _ in range(4)]  # batches 0-3 of epoch 1
    resumed = module()
    resumed.load_state_dict({"epoch": 1, "batches": 2})  # a checkpoint after batch 1
    for expected in batches[2:]:
        got = run(resumed)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not torch.equal(batches[0][1], batches[1][1])  # another batch index, another mix
    assert not torch.equal(run(module(), rank=1)[1], batches[0][1])  # another rank
    assert not torch.equal(run(module(), epoch=2)[1], batches[0][1])  # another epoch
    for _, target in batches:
        assert target.shape == (16, 10)
        torch.testing.assert_close(target.sum(1), torch.ones(16))


def test_only_training_batches_are_mixed_and_bad_alphas_are_refused() -> None:
    dm = ShapesDataModule(mixup_alpha=1.0, cutmix_alpha=1.0)
    x, y = batch(b=4)
    x = x.abs().mul(60).to(torch.uint8)
    dm.trainer = fake_trainer(training=False)
    assert torch.equal(dm.on_after_batch_transfer(Batch(x, y), 0)[1], y)
    with pytest.raises(UserError, match=r"mixup_alpha=-0.1 must be 0 \(off\) or more"):
        ShapesDataModule(mixup_alpha=-0.1)


MIX_ARGS = ["--data.mixup_alpha=0.4", "--data.cutmix_alpha=1.0"]


class BatchTargets(Callback):
    """What the training and validation steps receive as targets."""

    def __init__(self) -> None:
        self.train: list[torch.Tensor] = []
        self.val: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.train.append(batch[1])

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.val.append(batch[1])


def test_fit_with_mixup_trains_on_soft_targets_and_validates_on_labels(tmp_path: Path) -> None:
    dm = ShapesDataModule(
        train_size=128, val_size=32, test_size=32, batch_size=32, mixup_alpha=0.2, cutmix_alpha=1.0
    )
    seen = BatchTargets()
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=1,
        callbacks=[seen],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(LeNetCIFAR(), datamodule=dm)
    assert len(seen.train) == 4 and all(t.shape == (32, 10) and t.dtype == torch.float32 for t in seen.train)
    assert any((t.max(1).values < 1).any() for t in seen.train)  # mixed, not one-hot
    assert seen.val and all(t.ndim == 1 and t.dtype == torch.int64 for t in seen.val)
    metrics = trainer.callback_metrics
    assert 0 <= float(metrics["train/acc"]) <= 1 and torch.isfinite(metrics["train/loss_epoch"])
    assert 0 <= float(metrics["val/acc"]) <= 1


def test_fit_command_with_mixup_and_cutmix_runs_every_default_callback(tmp_path: Path) -> None:
    # The dashboard's callbacks see the mixed targets too (the batch-images grid captions its labels).
    args = ["fit", "--data.train_size=64", "--data.val_size=32", "--data.batch_size=32", *MIX_ARGS]
    args += ["--trainer.accelerator=cpu", "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false"]
    cli = build_cli([*args, f"--trainer.default_root_dir={tmp_path}"])
    metrics = cli.trainer.callback_metrics
    assert 0 <= float(metrics["train/acc"]) <= 1 and 0 <= float(metrics["val/acc"]) <= 1


# ---- a 2-process DDP run with MixUp and CutMix --------------------------------------------------------

RUN = ["--data.train_size=256", "--data.val_size=64", "--data.test_size=64", "--data.batch_size=32"]
RUN += ["--trainer.max_epochs=2", "--model.optim.lr=0.02", *DDP2]


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_process_mixup_cutmix_runs_are_reproducible_and_resume_exactly(tmp_path: Path) -> None:
    jobs = [
        job(tmp_path, "mix_a", [*RUN, *MIX_ARGS]),
        job(tmp_path, "mix_b", [*RUN, *MIX_ARGS]),
        job(tmp_path, "plain", RUN),
        job(tmp_path, "mix_stopped", [*RUN, *MIX_ARGS], stop_after_epochs=1),
        job(tmp_path, "mix_resumed", [*RUN, *MIX_ARGS, f"--ckpt_path={ckpt(tmp_path, 'mix_stopped')}"]),
    ]
    launch(2, jobs, tmp_path, timeout=280)
    a, b = records(tmp_path, "mix_a"), records(tmp_path, "mix_b")
    plain, resumed = records(tmp_path, "plain"), records(tmp_path, "mix_resumed")
    assert_identical(final(a[0]), final(a[1]))  # one model over the ranks
    assert_identical(final(a[0]), final(b[0]))  # and the same model in an identical run
    assert max_diff(final(a[0]), a[0]["init"]) > 1e-3
    assert max_diff(final(a[0]), final(plain[0])) > 1e-4  # mixing changed what was learnt
    assert max_diff(final(resumed[0]), final(a[0])) < 1e-6  # epoch 2 after a resume, mixed alike
    assert all(0 <= r["val"][-1]["val/acc"] <= 1 for r in a)


# ---- the augmentation in a checkpoint --------------------------------------------------------------------


def test_an_augmentation_described_in_a_checkpoint_is_rebuilt_from_an_imported_class_only() -> None:
    from lit_ddp.data.augmentation import CropFlip, RandomResizedCropFlip, describe, rebuild

    for augmentation in (CropFlip(padding=2), RandomResizedCropFlip(scale=(0.5, 1.0), random_erasing=0.25)):
        again = rebuild(describe(augmentation))
        assert type(again) is type(augmentation) and vars(again) == vars(augmentation)
    # ShapesDataModule.load_from_checkpoint passes the description back as the argument.
    assert ShapesDataModule(augmentation=describe(CropFlip(padding=3))).augmentation.padding == 3
    with pytest.raises(UserError, match="^the checkpoint's augmentation is notebook_code.Evil, which is not"):
        rebuild({"class_path": "notebook_code.Evil", "init_args": {}})
    assert "notebook_code" not in sys.modules
