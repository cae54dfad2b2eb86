"""Augmentation: MixUp/CutMix on the device, auto-augment and random erasing in the ImageFolder workers, all
reproducible from their seeds (issue 16), and ImageFolder crops seeded per (seed, epoch, index) (issue 14).

    python -m pytest tests/test_augment.py -q            # the 2-process runs carry the ddp and slow markers
"""

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from imagenet_tree import make_tree
from lightning import Callback, Trainer
from test_ddp_semantics import DDP2, assert_identical, ckpt, final, job, launch, max_diff, records

from lit_ddp.cli import build_cli
from lit_ddp.data import ImageNetDataModule, ShapesDataModule
from lit_ddp.data.batch_transforms import draw_mix, mix_batch
from lit_ddp.data.jpeg import sample_augmentation
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
        dm.trainer = SimpleNamespace(distributed_sampler_kwargs={"num_replicas": replicas, "rank": rank})
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(epoch)
        order = [i for i, _ in loader.sampler]
        images = torch.cat([x for x, _, _ in loader])
        out.update(zip(order, images, strict=True))
    dm.trainer = None
    return out


AUGMENT = {"auto_augment": "trivialaugment", "random_erasing": 0.5}


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
        ImageNetDataModule(data_dir=str(tree), auto_augment="rand")
    with pytest.raises(UserError, match=r"random_erasing=1.5 must be a probability"):
        ImageNetDataModule(data_dir=str(tree), random_erasing=1.5)
    from lit_ddp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--data=ImageNetDataModule", f"--data.data_dir={tree}", "--data.auto_augment=rand"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("lit_ddp: error: auto_augment='rand' is not one of")
