"""Augmentation: MixUp/CutMix on the device, reproducible and resumable from their seeds (issue 16). The
ImageFolder workers' auto-augment, random erasing and per-sample crops: test_augment_imagefolder.py.

    python -m pytest tests/test_augment.py -q            # the 2-process runs carry the ddp and slow markers
"""

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from lightning import Callback, Trainer
from test_ddp_semantics import DDP2, assert_identical, ckpt, final, job, launch, max_diff, records

from lit_ddp.cli import build_cli
from lit_ddp.data import ShapesDataModule
from lit_ddp.data.batch_transforms import draw_mix, mix_batch
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


# ---- MixUp / CutMix in the data module ----------------------------------------------------------------


def fake_trainer(training: bool, epoch: int = 0, rank: int = 0) -> SimpleNamespace:
    return SimpleNamespace(training=training, current_epoch=epoch, global_rank=rank)


def test_mixing_is_per_seed_rank_epoch_and_batch_and_survives_a_resume() -> None:
    x, y = batch(b=16)
    x = (x.abs() * 60).clamp(0, 255).to(torch.uint8)

    def run(dm: ShapesDataModule, epoch: int = 1, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        dm.trainer = fake_trainer(True, epoch, rank)
        return dm.on_after_batch_transfer((x, y), 0)

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
    assert torch.equal(dm.on_after_batch_transfer((x, y), 0)[1], y)
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
