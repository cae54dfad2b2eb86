"""Resume by global samples seen: a run stopped mid-epoch continues at the right sample on another device
count when the samples per step over all devices are unchanged (2 → 1 process with the per-device batch
doubled, 1 → 2 with it halved); anything else mid-epoch is refused in one line before training.

Real processes (the CLI, 2 ranks on gloo), stopped by SIGTERM with tests/fault_probe.py, which records the
labels of every training batch on every rank: the labels of one global step, over all ranks, are the
labels of the same step of one process with the whole batch (rank r takes every W-th sample of the same
(seed, epoch) permutation)."""

import ast
import os
import re
from pathlib import Path

import pytest
import torch
from conftest import REPO, run_cli

from lit_ddp.data import ShapesDataModule
from lit_ddp.errors import UserError

ENV = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"}  # fault_probe
# 256 training images, 32 per step over all devices: 8 steps in the one epoch.
FIT = [
    "fit",
    "--data.train_size=256",
    "--data.val_size=32",
    "--data.test_size=32",
    "--trainer.max_epochs=1",
    "--trainer.accelerator=cpu",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.num_sanity_val_steps=0",
    "--resilience.check_every_n_batches=1",  # stop at the batch after the signal: mid-epoch
]
ONE = ["--trainer.devices=1", "--data.batch_size=32"]
TWO = ["--trainer.devices=2", "--trainer.strategy=ddp", "--data.batch_size=16"]
STEPS = 8


def probe(out: Path, at_step: int = -1) -> list[str]:
    return [
        "--trainer.callbacks+=fault_probe.Fault",
        "--trainer.callbacks.action=sigterm",
        f"--trainer.callbacks.at_step={at_step}",
        f"--trainer.callbacks.out_dir={out}",
    ]


def fit(cwd: Path, *args: str, ok: bool = True):
    cwd.mkdir(parents=True, exist_ok=True)
    result = run_cli([*FIT, *args], cwd=cwd, env=ENV, timeout=240)
    if ok:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def steps(out: Path) -> dict[int, list[int]]:
    """{global step: the sorted labels it trained on, over all ranks}."""
    found: dict[int, list[int]] = {}
    for path in out.glob("batches_rank*.txt"):
        for line in path.read_text().splitlines():
            _, step, labels = line.split(" ", 2)
            found.setdefault(int(step), []).extend(ast.literal_eval(labels))
    return {step: sorted(labels) for step, labels in found.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[int]]:
    """One process, batch 32, uninterrupted."""
    cwd = tmp_path_factory.mktemp("reference")
    fit(cwd, *ONE, *probe(cwd / "probe"))
    found = steps(cwd / "probe")
    assert sorted(found) == list(range(STEPS)) and all(len(v) == 32 for v in found.values())
    return found


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("before, after", [(TWO, ONE), (ONE, TWO)], ids=["2to1", "1to2"])
def test_a_mid_epoch_resume_on_another_device_count_trains_the_samples_left(
    tmp_path: Path, reference: dict[int, list[int]], before: list[str], after: list[str]
) -> None:
    fit(tmp_path, *before, *probe(tmp_path / "probe", at_step=3))
    stopped = steps(tmp_path / "probe")
    fit(tmp_path, *after, "--ckpt_path=last", *probe(tmp_path / "probe2"))
    resumed = steps(tmp_path / "probe2")
    first = min(resumed)
    assert 0 < first < STEPS and sorted(resumed) == list(range(first, STEPS)), sorted(resumed)
    # The steps before the checkpoint, then the resumed ones: the uninterrupted run's samples, step by step
    # (none skipped, none twice).
    merged = {step: labels for step, labels in stopped.items() if step < first} | resumed
    assert merged == reference


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_mid_epoch_resume_with_other_samples_per_step_is_refused_in_one_line(tmp_path: Path) -> None:
    fit(tmp_path, *TWO, *probe(tmp_path / "probe", at_step=3))
    result = fit(tmp_path, "--trainer.devices=1", "--data.batch_size=16", "--ckpt_path=last", ok=False)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("lit_ddp: error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "cannot resume mid-epoch exactly: the checkpoint took 32 training samples per step" in lines[0]
    # counted as the console counts epochs ("epoch 1/2", "stopped by SIGINT at epoch 1"), not from 0
    assert re.search(r"over all devices \(\d+ of epoch 1 done\)", lines[0]), lines[0]
    assert "this run takes 16 (16 per device × 1): resume with --data.batch_size=32" in lines[0]


class _Trainer:
    """What load_state_dict reads of a trainer: the device count, whether it is fitting, the batch limit and
    the accumulation."""

    def __init__(self, world_size: int, fn: str = "fit", accumulate: int = 1) -> None:
        from lightning.pytorch.trainer.states import TrainerFn, TrainerState

        self.world_size = world_size
        self.state = TrainerState(fn=TrainerFn(fn))
        self.num_training_batches = STEPS
        self.limit_train_batches = 1.0  # Trainer's default: the whole epoch
        self.accumulate_grad_batches = accumulate


def resumed_module(
    state: dict, world_size: int, batch_size: int, fn: str = "fit", accumulate: int = 1
) -> ShapesDataModule:
    dm = ShapesDataModule(train_size=256, batch_size=batch_size)
    dm.trainer = _Trainer(world_size, fn, accumulate)
    dm.load_state_dict(state)
    return dm


def test_the_state_counts_samples_over_all_ranks_and_old_checkpoints_still_load() -> None:
    dm = ShapesDataModule(train_size=256, batch_size=16)
    dm.trainer = _Trainer(world_size=2)
    for _ in range(3):
        dm._count_training_batch(epoch=0, world_size=2)
    state = dm.state_dict()
    assert state["samples"] == 96 and state["samples_per_step"] == 32 and not state["epoch_complete"]
    assert state["class_names"] == list(ShapesDataModule.class_names)
    # 1 process with the whole batch: rank 0 starts at sample 96 of the permutation.
    one = resumed_module(state, world_size=1, batch_size=32)
    assert one.resume_point == (0, 96)
    sampler = one.train_sampler(range(256), num_replicas=1, rank=0)
    full = list(ShapesDataModule(train_size=256).train_sampler(range(256), num_replicas=1, rank=0))
    assert list(sampler) == full[96:]
    # A checkpoint of the lit_ddp before samples were counted ({"epoch", "batches"}): its batches, taken
    # as this run's, as that lit_ddp resumed them.
    old = resumed_module({"epoch": 0, "batches": 3}, world_size=1, batch_size=32)
    assert old.resume_point == (0, 96)


def test_what_cannot_resume_exactly_is_refused_and_what_can_is_not() -> None:
    state = {"epoch": 1, "samples": 96, "samples_per_step": 32, "epoch_complete": False, "batches": 3}
    with pytest.raises(
        UserError, match=r"took 32 training samples per step .*\(96 of epoch 2 done\), this run takes 64"
    ):
        resumed_module(state, world_size=2, batch_size=32)
    with pytest.raises(UserError, match="resume on a device count that divides it"):
        resumed_module(state, world_size=3, batch_size=8)
    assert resumed_module(state, world_size=4, batch_size=8).resume_point == (1, 96)
    # At an epoch's end, or outside fit (validate, test, predict), nothing is resumed mid-epoch: a finished
    # epoch resumes at the start of the next.
    finished = resumed_module({**state, "epoch_complete": True}, world_size=2, batch_size=32)
    assert finished.resume_point == (2, 0)
    assert resumed_module(state, world_size=2, batch_size=32, fn="validate").resume_point is None


def test_a_mid_epoch_resume_with_another_accumulation_is_refused_naming_the_checkpoints() -> None:
    """Stopped on 2 × 16 with 2 accumulated batches (a step of 64), resumed with 4 accumulated batches of 32
    on one process, as the line for another per-device batch said (--data.batch_size=32): it went on with
    steps of 128, the epoch's last one on half of them, without a word. The same accumulation resumes."""
    dm = ShapesDataModule(train_size=256, batch_size=16)
    dm.trainer = _Trainer(world_size=2, accumulate=2)
    for _ in range(4):
        dm._count_training_batch(epoch=0, world_size=2)
    state = dm.state_dict()
    assert state["accumulate_grad_batches"] == 2
    with pytest.raises(UserError) as err:
        resumed_module(state, world_size=1, batch_size=32, accumulate=4)
    assert str(err.value) == (
        "cannot resume mid-epoch exactly: the checkpoint took 32 training samples per step over all devices"
        " × 2 accumulated (128 of epoch 1 done), this run takes 32 (32 per device × 1) × 4 accumulated:"
        " resume with --trainer.accumulate_grad_batches=2, or resume from an epoch-end checkpoint"
    )
    with pytest.raises(
        UserError, match="resume with --data.batch_size=32 --trainer.accumulate_grad_batches=2,"
    ):
        resumed_module(state, world_size=1, batch_size=16, accumulate=4)
    assert resumed_module(state, world_size=1, batch_size=32, accumulate=2).resume_point == (0, 128)
    # At an epoch's end another global batch goes on (the schedule says so); a checkpoint that did not
    # record its accumulation resumes as before.
    finished = resumed_module({**state, "epoch_complete": True}, world_size=1, batch_size=32, accumulate=4)
    assert finished.resume_point == (1, 0)
    older = {k: v for k, v in state.items() if k != "accumulate_grad_batches"}
    assert resumed_module(older, world_size=1, batch_size=32, accumulate=4).resume_point == (0, 128)


def test_a_resume_with_another_data_seed_is_refused_in_one_line() -> None:
    """The seed orders every epoch (and draws a held-out split): a fit resumed mid-epoch with another one
    trained the rest of the epoch on another permutation, some samples twice and others never."""
    state = {"epoch": 1, "samples": 96, "samples_per_step": 32, "epoch_complete": False}
    state["split_options"] = {"seed": 1}
    with pytest.raises(UserError) as err:
        resumed_module(state, world_size=1, batch_size=32)  # --data.seed=0
    assert str(err.value).startswith(
        "the checkpoint's run shuffled (and split) its data with --data.seed=1, this run has --data.seed=0:"
        " resume with --data.seed=1"
    )
    with pytest.raises(UserError):  # at an epoch's end too: the held-out split would change
        resumed_module({**state, "epoch_complete": True}, world_size=1, batch_size=32)
    assert resumed_module(state, world_size=1, batch_size=32, fn="test").resume_point is None
    del state["split_options"]  # a checkpoint from before they were saved: resumed as before
    assert resumed_module(state, world_size=1, batch_size=32).resume_point == (1, 96)
    assert ShapesDataModule(seed=7).state_dict()["split_options"] == {"seed": 7}


def test_a_fit_resumed_with_other_augmentation_or_mixing_says_so(caplog) -> None:
    """The augmentation and MixUp/CutMix are not part of the order: a fit resumed without them (a 0.2 run
    trained with augment=false, resumed with the recipe's CropFlip) trained on with other batches, without
    a word."""
    state = {"epoch": 1, "samples": 0, "samples_per_step": 32, "epoch_complete": True}
    state["training_options"] = {**ShapesDataModule(augmentation=None).training_options(), "mixup_alpha": 0.2}
    with caplog.at_level("INFO"):
        resumed_module(state, world_size=1, batch_size=32)
        resumed_module(state, world_size=1, batch_size=32, fn="validate")  # evaluation trains nothing
        del state["training_options"]  # a checkpoint from before they were saved: not compared
        resumed_module(state, world_size=1, batch_size=32)
    notes = [m for m in caplog.messages if "--data settings" in m]
    assert notes == [
        "lit_ddp: note: this run trains on with other --data settings:"
        " --data.augmentation=CropFlip(padding=4) (the checkpoint's: none),"
        " --data.mixup_alpha=0.0 (the checkpoint's: 0.2)"
    ]


def test_a_checkpoints_classes_are_checked_against_the_datas(tmp_path: Path) -> None:
    state = ShapesDataModule().state_dict()
    state["class_names"] = ["cat", "dog", *ShapesDataModule.class_names[2:]]
    with pytest.raises(UserError) as err:
        resumed_module(state, world_size=1, batch_size=32, fn="predict")
    message = str(err.value)
    assert "learnt the classes ['cat', 'dog', 'square'" in message
    assert "the data has ['disc', 'ring'" in message
    assert "\n" not in message
    torch.save({"datamodule": state}, tmp_path / "x.pt")  # plain data: a weights-only load reads it
    assert torch.load(tmp_path / "x.pt", weights_only=True)["datamodule"] == state


@pytest.mark.timeout(240)
def test_a_resume_at_an_epochs_end_with_loader_workers_trains_the_next_epoch(tmp_path: Path) -> None:
    """With DataLoader workers, the epoch after a resume at an epoch's end trained no batch (its workers took
    their indices from the sampler still at the finished epoch's end): the run lost that epoch silently,
    its console line "train loss nan acc 0.0000"."""
    from lit_ddp.cli import build_cli

    run = [
        "fit",
        "--data.train_size=64",
        "--data.val_size=16",
        "--data.test_size=16",
        "--data.batch_size=32",
        "--data.num_workers=1",
        "--model.optim.schedule=constant",  # max_epochs changes nothing but where the run stops
        "--trainer.enable_progress_bar=false",
    ]
    reference = build_cli([*run, "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path / 'ref'}"])
    root = f"--trainer.default_root_dir={tmp_path / 'run'}"
    build_cli([*run, "--trainer.max_epochs=1", root])
    resumed = build_cli([*run, "--trainer.max_epochs=2", root, "--ckpt_path=last"])
    assert resumed.trainer.global_step == reference.trainer.global_step == 4
    got, want = (cli.trainer.lightning_module.state_dict() for cli in (resumed, reference))
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)


@pytest.mark.timeout(240)
def test_a_mid_epoch_resume_over_another_number_of_training_samples_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """An in-memory data module (Shapes, CIFAR-10, a project's own) saved nothing of its training set: a fit
    stopped after 2 of 4 steps and resumed with --data.train_size=256 skipped the first 64 samples of an
    order of 256, training some of the stopped epoch's samples twice and others never, with no word."""
    run = ["fit", "--data.val_size=16", "--data.test_size=16", "--data.batch_size=32"]
    run += ["--trainer.max_epochs=1", "--trainer.enable_progress_bar=false"]
    run += ["--model.optim.schedule=constant"]
    stopped = run_cli([*run, "--data.train_size=128", "--trainer.max_steps=2"], cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    result = run_cli([*run, "--data.train_size=256", "--ckpt_path=last"], cwd=tmp_path)
    err = result.stderr.strip()
    assert result.returncode == 2 and "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("lit_ddp: error:")]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(
        "lit_ddp: error: cannot resume mid-epoch exactly: the checkpoint stopped in an order of 128 training"
        " samples, this run's data gives 256: resume over the data and --data options it was trained with"
    ), lines[0]
    # The same data resumes; an epoch-end checkpoint takes other data (a finished epoch is not continued).
    resumed = run_cli([*run, "--data.train_size=128", "--ckpt_path=last"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    grown = [*run, "--data.train_size=256", "--trainer.max_epochs=2", "--ckpt_path=last"]
    grown = run_cli(grown, cwd=tmp_path)
    assert grown.returncode == 0, grown.stderr[-3000:]


@pytest.mark.timeout(240)
def test_a_data_module_fitted_again_in_the_same_process_trains_its_whole_first_epoch(tmp_path: Path) -> None:
    """A data module used in one Trainer's fit, a resumed one above all, and then in another Trainer's fit (a
    notebook, a sweep, a second stage of training) kept the first fit's resume point and sample count: the
    fresh fit's first epoch trained only the samples after the old resume point, and its mid-epoch
    checkpoint recorded the first fit's count (an epoch 'complete' after 3 of 4 steps)."""
    import lightning as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint

    from lit_ddp.models import ImageClassifier, LeNet

    class Trained(Callback):
        def __init__(self) -> None:
            self.samples = 0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.samples += len(batch[1])

    def fit(data: ShapesDataModule, *callbacks: Callback, ckpt_path: str | None = None) -> int:
        trained = Trained()
        trainer = L.Trainer(
            max_epochs=1,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=tmp_path,
            callbacks=[trained, *callbacks],
        )
        trainer.fit(ImageClassifier(net=LeNet), datamodule=data, ckpt_path=ckpt_path)
        return trained.samples

    data = ShapesDataModule(train_size=64, val_size=16, test_size=16, batch_size=16)  # 4 steps an epoch
    every = dict(every_n_train_steps=1, save_top_k=-1, filename="{step}")
    assert fit(data, ModelCheckpoint(dirpath=tmp_path / "first", **every)) == 64
    assert fit(data, ckpt_path=str(tmp_path / "first" / "step=2.ckpt")) == 32  # the 2 steps left
    assert fit(data, ModelCheckpoint(dirpath=tmp_path / "again", **every)) == 64
    state = torch.load(tmp_path / "again" / "step=3.ckpt", weights_only=True)["ShapesDataModule"]
    assert (state["epoch"], state["samples"], state["epoch_complete"]) == (0, 48, False), state


@pytest.mark.timeout(600)
def test_an_epoch_end_resume_with_another_global_batch_goes_on_along_the_schedule(tmp_path: Path) -> None:
    """A run stopped at an epoch's end and resumed with another global batch (as on more GPUs) counted its
    schedule as if every epoch had taken the new batch's steps: its cosine reached 0 an epoch early and the
    last epoch trained at lr 0. And --model.optim.scale_lr printed the new batch's lr while the run trained
    at the checkpoint's. The lr now goes on from where an uninterrupted run of the new batch stands at that
    epoch, scaled to that batch, and says so."""
    import math

    from conftest import read_scalars

    run = [
        "--trainer.max_epochs=3",
        "--trainer.log_every_n_steps=1",
        "--model.optim.name=sgd",
        "--model.optim.lr=0.1",
        "--model.optim.schedule=cosine",
        "--model.optim.scale_lr=true",
        "--model.optim.base_batch_size=32",
    ]
    stop = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigterm"]
    fit(tmp_path, *run, *ONE, *stop, "--trainer.callbacks.at_epoch_end=0")  # epoch 1: 8 steps of 32
    resumed = fit(tmp_path, *run, "--trainer.devices=1", "--data.batch_size=64", "--ckpt_path=last")
    said = resumed.stdout + resumed.stderr
    assert "lr scaled by global batch: 0.1 × 64/32 = 0.2" in said
    assert (
        "lit_ddp: note: the checkpoint is at step 8, where a run of this global batch from the start would be"
        " at step 4 (another number of optimizer steps an epoch): the learning-rate schedule goes on from its"
        " step 4"
    ) in said
    assert "the checkpoint's run trained at a base lr of 0.1, this run's is 0.2" in said
    lrs = read_scalars(tmp_path / "logs" / "lightning_logs" / "version_0")["lr-SGD/pg1"]
    cosine = lambda step, steps: 0.5 * (1 + math.cos(math.pi * step / steps))  # noqa: E731
    # Epoch 1 on a curve of 3 × 8 steps; epochs 2 and 3 on the 3 × 4 steps' curve, from its step 4 on (the
    # same third of the run), at the lr scaled to 64 images.
    expected = [0.1 * cosine(s, 24) for s in range(8)] + [0.2 * cosine(s, 12) for s in range(4, 12)]
    assert lrs == pytest.approx(expected, rel=1e-6), said
