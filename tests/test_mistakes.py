"""Mistakes a new user makes, each one line on stderr (exit 2) or a run that does what it says."""

from pathlib import Path

import pytest
from conftest import TINY_RUN
from torch import nn

from lit_ddp.cli import build_cli, main

TINY = TINY_RUN


def one_error_line(capsys, argv: list[str]) -> str:
    """Runs ``main(argv)``; asserts exit 2 and exactly one line on stderr, no traceback; returns the line."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("lit_ddp: error: "), err
    return err.removeprefix("lit_ddp: error: ")


@pytest.mark.parametrize("subcommand", ["validate", "test"])
def test_evaluating_without_a_checkpoint_needs_one_or_says_untrained_on_purpose(
    tmp_path: Path, capsys, subcommand: str
) -> None:
    """It scored the random initial weights, with no word."""
    root = f"--trainer.default_root_dir={tmp_path}"
    line = one_error_line(capsys, [subcommand, *TINY, root])
    assert line.startswith(f"{subcommand} with no --ckpt_path would score the model's random initial weights")
    assert "--ckpt_path=untrained" in line
    assert not (tmp_path / "lightning_logs").exists()
    cli = build_cli([subcommand, *TINY, "--ckpt_path=untrained", root])
    split = "val" if subcommand == "validate" else "test"
    assert 0.0 <= float(cli.trainer.callback_metrics[f"{split}/acc"]) <= 1.0


def test_predicting_without_a_checkpoint_needs_one_or_says_untrained_on_purpose(
    tmp_path: Path, capsys
) -> None:
    """It wrote predictions.csv from the random initial weights, exit 0, with no word."""
    root = f"--trainer.default_root_dir={tmp_path}"
    line = one_error_line(capsys, ["predict", *TINY, root])
    assert line.startswith(
        "predict with no --ckpt_path would label the images with the model's random initial"
    )
    assert "--ckpt_path=untrained" in line
    assert not (tmp_path / "lightning_logs").exists()
    cli = build_cli(["predict", *TINY, "--ckpt_path=untrained", root])
    assert (Path(cli.trainer.log_dir) / "predictions.csv").is_file()


def test_a_batch_larger_than_the_training_set_is_refused_before_the_lr_is_scaled(
    tmp_path: Path, capsys
) -> None:
    """24 images with --data.batch_size=100000: the global batch read 100000 and scale_lr multiplied the lr
    by 390, while every step drew the 24 images."""
    data = ["--data.train_size=24", "--data.val_size=8", "--data.batch_size=100000"]
    argv = ["fit", *TINY, *data, "--model.optim.scale_lr=true", f"--trainer.default_root_dir={tmp_path}"]
    line = one_error_line(capsys, argv)
    assert line.startswith("--data.batch_size=100000 is more than the 24 training images: every step would")
    assert line.endswith("pass --data.batch_size=24 or less")
    assert not list(tmp_path.rglob("*.ckpt"))
    from lit_ddp.data.split_checks import check_training_batch_fits
    from lit_ddp.errors import UserError

    check_training_batch_fits(32, range(63), world_size=2)  # shards of 32 (padded): one full batch each
    with pytest.raises(UserError, match="more than the 32 training images on each of 2 devices"):
        check_training_batch_fits(33, range(63), world_size=2)


def test_a_step_accumulated_beyond_the_training_set_is_refused_as_a_batch_would_be(
    tmp_path: Path, capsys
) -> None:
    """48 images in batches of 16 accumulated 4 at a time: "global batch = 64" was printed (and scaled the
    lr) while every step took the 48, as 2 devices × 16 × 2 did; a batch of 64 alone was refused."""
    data = ["--data.train_size=48", "--data.val_size=8", "--data.batch_size=16"]
    argv = [
        "fit",
        *TINY,
        *data,
        "--trainer.accumulate_grad_batches=4",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    assert one_error_line(capsys, argv) == (
        "--data.batch_size=16 × --trainer.accumulate_grad_batches=4 = 64 is more than the 48 training images:"
        " every step would take 48, not 64 (the global batch and a scaled lr would be wrong): pass"
        " --data.batch_size=12 or less, or --trainer.accumulate_grad_batches=3 or less"
    )
    assert not list(tmp_path.rglob("*.ckpt"))
    from lit_ddp.data.split_checks import check_training_batch_fits
    from lit_ddp.errors import UserError

    check_training_batch_fits(16, range(48), world_size=2, accumulation=1)  # 24 images a device, one step
    with pytest.raises(UserError, match=r"= 32 is more than the 24 training images on each of 2 devices"):
        check_training_batch_fits(16, range(48), world_size=2, accumulation=2)
    with pytest.raises(UserError) as err:  # neither setting alone fits: both at once
        check_training_batch_fits(8, range(3), world_size=1, accumulation=4)
    assert str(err.value).endswith("pass --data.batch_size=3 --trainer.accumulate_grad_batches=1")


def test_a_step_a_gradient_accumulation_scheduler_accumulates_beyond_the_training_set_is_refused(
    tmp_path: Path, capsys
) -> None:
    """The scheduler sets the Trainer's accumulation at each epoch's start: in the data module's setup it
    was 1, so 48 images in batches of 16 accumulated 4 at a time were trained as steps of 48, unrefused."""
    argv = [
        "fit",
        *TINY,
        "--data.train_size=48",
        "--data.batch_size=16",
        "--trainer.callbacks+=GradientAccumulationScheduler",
        "--trainer.callbacks.scheduling={0: 1, 1: 4}",  # the largest, though epoch 1's is 1
        f"--trainer.default_root_dir={tmp_path}",
    ]
    assert one_error_line(capsys, argv) == (
        "--data.batch_size=16 × GradientAccumulationScheduler's 4 = 64 is more than the 48 training images:"
        " every step would take 48, not 64 (the global batch and a scaled lr would be wrong): pass"
        " --data.batch_size=12 or less, or a scheduling of 3 or less"
    )
    from lit_ddp.data.split_checks import check_training_batch_fits
    from lit_ddp.errors import UserError

    with pytest.raises(UserError) as err:
        check_training_batch_fits(8, range(3), world_size=1, accumulation=4, scheduled=True)
    assert str(err.value).endswith("pass --data.batch_size=3 and no GradientAccumulationScheduler")
    assert not list(tmp_path.rglob("*.ckpt"))


def test_an_empty_training_split_is_named_not_answered_with_a_batch_size_of_zero() -> None:
    """A data module of the user's own whose load_split("train") returned no sample was told to "pass
    --data.batch_size=0 or less", a batch size the data module itself refuses."""
    from lit_ddp.data.split_checks import check_training_batch_fits
    from lit_ddp.errors import UserError

    with pytest.raises(UserError) as err:
        check_training_batch_fits(8, range(0), world_size=2)
    assert "training split holds no sample" in str(err.value) and "batch_size=0" not in str(err.value)


def test_a_last_training_batch_of_one_image_is_left_out_under_batchnorm(tmp_path: Path, caplog) -> None:
    """65 training images in batches of 32 with BatchNorm: the epoch's third batch held 1 image and
    BatchNorm raised "Expected more than 1 value per channel when training" (a 40-line traceback)."""
    args = [*TINY, "--data.train_size=65", "--model.batch_norm=true", "--trainer.limit_val_batches=0"]
    with caplog.at_level("INFO"):
        cli = build_cli(["fit", *args, f"--trainer.default_root_dir={tmp_path}"])
    assert cli.trainer.num_training_batches == 2 and cli.trainer.global_step == 2
    assert any("would hold 1 image per device (65 = 2 × 32 + 1)" in m for m in caplog.messages)
    # Without BatchNorm the batch is kept: nothing is lost where nothing fails.
    plain = ["fit", *TINY, "--data.train_size=65", "--trainer.limit_val_batches=0"]
    plain = build_cli([*plain, f"--trainer.default_root_dir={tmp_path / 'plain'}"])
    assert plain.trainer.num_training_batches == 3


def test_the_model_says_whether_its_batch_norm_normalises_each_devices_batch() -> None:
    """ImageClassifier.batch_norm_per_device: true with a BatchNorm layer, false without one, and false for
    layers synchronised over several processes (they carry the group they span), true again on one."""
    from types import SimpleNamespace

    from lit_ddp.models import LeNetCIFAR

    assert not LeNetCIFAR().batch_norm_per_device
    model = LeNetCIFAR(batch_norm=True)
    assert model.batch_norm_per_device
    model.net = nn.SyncBatchNorm.convert_sync_batchnorm(model.net)
    model.trainer = SimpleNamespace(world_size=2)
    assert not model.batch_norm_per_device
    model.trainer = SimpleNamespace(world_size=1)
    assert model.batch_norm_per_device


def test_the_kit_asks_a_batch_of_one_as_fit_asks() -> None:
    """doctor and the kit read ``batch_norm_per_device`` where fit asks ``batch_of_one_failure()``: a model
    whose override says it trains on one image was refused by doctor and not by fit."""
    from lit_ddp.errors import UserError
    from lit_ddp.models import LeNetCIFAR
    from lit_ddp.models.classifier import BATCH_OF_ONE, check_batch_of_one, fails_on_one

    class Trains(LeNetCIFAR):
        def batch_of_one_failure(self) -> str | None:
            return None

    class OwnLine(LeNetCIFAR):
        def batch_of_one_failure(self) -> str | None:
            return "batch_size=1: this model's own reason"

    check_batch_of_one(1, Trains(batch_norm=True))
    with pytest.raises(UserError, match="this model's own reason"):
        check_batch_of_one(1, OwnLine())
    assert fails_on_one(LeNetCIFAR(batch_norm=True)) == BATCH_OF_ONE
    assert fails_on_one(type("Declared", (), {"batch_norm_per_device": True})()) == BATCH_OF_ONE  # yours
    assert fails_on_one(nn.Linear(2, 2)) is None


def test_the_data_module_asks_what_the_model_declares_not_its_layers(tmp_path: Path) -> None:
    """A model that declares batch_norm_per_device gets its one-image last batch left out, whatever its layers
    hold (none here): the model hands the data module the question as it is set up, and the data module
    looks at no model (tests/test_architecture.py)."""
    from lightning import Trainer

    from lit_ddp.data import ShapesDataModule
    from lit_ddp.models import LeNetCIFAR
    from lit_ddp.models.classifier import BATCH_NORM_TYPES

    class Declared(LeNetCIFAR):
        batch_norm_per_device = True

    model = Declared()
    assert not any(isinstance(m, BATCH_NORM_TYPES) for m in model.modules())
    data = ShapesDataModule(train_size=65, val_size=16, test_size=16, batch_size=32, num_workers=0)
    trainer = Trainer(
        max_epochs=1, limit_val_batches=0, accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model, data)
    assert trainer.num_training_batches == 2 and trainer.global_step == 2


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model.optim.lr=-1"], "--model.optim.lr=-1.0 must be a finite number ≥ 0 (try 0.1 for sgd"),
        (["--model.optim.weight_decay=-0.1"], "--model.optim.weight_decay=-0.1 must be a finite number ≥ 0"),
        # sgd took a momentum of 1.5 without a word (a run that diverges); nesterov with no momentum was
        # torch's ValueError traceback, exit 1, a run folder left; adamw dropped nesterov without a word.
        (
            ["--model.optim.name=sgd", "--model.optim.momentum=1.5"],
            "--model.optim.momentum=1.5 must be below 1 (0.9 is usual): at 1 or more every earlier gradient",
        ),
        (
            ["--model.optim.name=sgd", "--model.optim.nesterov=true", "--model.optim.momentum=0"],
            "--model.optim.nesterov=true needs a momentum above 0: pass --model.optim.momentum=0.9, or",
        ),
        # torch's generators overflowed at the first epoch: a ValueError traceback.
        (["--data.seed=99999999999999999999"], "--data.seed=99999999999999999999 is out of range"),
        # A k below 1 was dropped without a word: no such metric, no line.
        (["--model.top_k=[1,0]"], "--model.top_k=[1, 0]: each k must be 1 or more (top-1 and top-5"),
        (
            ["--model.optim.nesterov=true"],
            "--model.optim.nesterov=true would not be used: adamw has no Nesterov momentum; pass",
        ),
        # adam and adamw dropped a momentum without a word (they have none); the default 0.9 that every
        # recipe's sgd sets stays accepted when a run picks adam instead.
        (
            ["--model.optim.name=adam", "--model.optim.momentum=0.8"],
            "--model.optim.momentum=0.8 would not be used: adam has no momentum setting (its first beta",
        ),
    ],
)
def test_model_and_optimizer_settings_it_cannot_use_are_one_line(
    tmp_path: Path, capsys, args: list[str], expected: str
) -> None:
    """lr=-1 failed with torch's ValueError from inside the optimizer. (The precisions and accumulation
    counts a run cannot take: tests/test_preflight.py.)"""
    line = one_error_line(capsys, ["fit", *TINY, *args, f"--trainer.default_root_dir={tmp_path}"])
    assert line.startswith(expected), line
    assert not (tmp_path / "lightning_logs").exists()


def test_16_mixed_on_a_cpu_is_recorded_as_the_bf16_mixed_that_ran(tmp_path: Path) -> None:
    """Lightning runs 16-mixed as bf16-mixed on a CPU; config.yaml said 16-mixed, so a re-run of it on a GPU
    would train in another precision than the run it reproduces."""
    import yaml

    cli = build_cli(["fit", *TINY, "--trainer.precision=16-mixed", f"--trainer.default_root_dir={tmp_path}"])
    assert cli.trainer.precision == "bf16-mixed"
    saved = yaml.safe_load((tmp_path / "lightning_logs" / "version_0" / "config.yaml").read_text())
    assert saved["trainer"]["precision"] == "bf16-mixed"


def test_a_warmup_longer_than_the_run_is_cut_with_a_note(tmp_path: Path, caplog) -> None:
    """--trainer.max_steps=3 with a 2-epoch warmup (4 steps): the warmup was cut to 3 steps without a word."""
    args = [*TINY, "--trainer.max_steps=3", "--model.optim.warmup_epochs=2", "--trainer.max_epochs=5"]
    with caplog.at_level("INFO"):
        build_cli(["fit", *args, f"--trainer.default_root_dir={tmp_path}"])
    assert (
        "lit_ddp: note: --model.optim.warmup_epochs=2.0 is 4 steps, more than the run's 3: the warmup is cut"
        " to 3 steps, so the lr reaches its peak only at the last step"
    ) in caplog.messages


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (
            "--trainer.callbacks.at_step=5",
            "stopped by SIGTERM at epoch 2, step 6 (mid-epoch, after 2 of 4 batches)",
        ),
        ("--trainer.callbacks.at_epoch_end=0", "stopped by SIGTERM at the end of epoch 1, step 4: saved"),
    ],
)
def test_the_stop_message_counts_epochs_as_the_progress_bar_does(
    tmp_path: Path, caplog, monkeypatch, stop: str, expected: str
) -> None:
    """4 batches per epoch, SIGTERM in the second epoch or right after the first: the message said
    "epoch 1" for both (Lightning's current_epoch, from 0) while the bar and the summary count from 1."""
    from conftest import REPO

    monkeypatch.syspath_prepend(str(REPO / "tests" / "helpers"))  # fault_probe, for --trainer.callbacks
    probe = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigterm", stop]
    args = [*TINY, "--data.train_size=128", "--trainer.max_epochs=2", "--resilience.check_every_n_batches=1"]
    with caplog.at_level("INFO"), pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, *probe, f"--trainer.default_root_dir={tmp_path}"])
    assert exit_info.value.code in (0, None)
    assert any(m.startswith(f"lit_ddp: {expected}") for m in caplog.messages), caplog.messages
    if "mid-epoch" not in expected:
        return
    # The exact mid-epoch resume: Lightning warned that the dataloader "is not resumable", which it is.
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = build_cli(["fit", *args, "--ckpt_path=last", f"--trainer.default_root_dir={tmp_path}"])
    assert cli.trainer.global_step == 8
    assert not [w for w in caught if "not resumable" in str(w.message)], [str(w.message) for w in caught]


def test_a_group_of_settings_given_one_value_is_one_line_naming_how_to_set_it(tmp_path: Path, capsys) -> None:
    """`--model.optim=adam` (meant: --model.optim.name=adam) said `--model.optim=NestedArg(key='optim',
    val='adam'): expected null`, and `optim: adam` in a config the same."""
    line = one_error_line(capsys, ["fit", "--model.optim=adam", f"--trainer.default_root_dir={tmp_path}"])
    assert line.startswith(
        "--model.optim=adam: model.optim is a group of settings, not one value: set them"
    ), line
    assert "--model.optim.FIELD=VALUE (python -m lit_ddp fit --help lists them)" in line
    config = tmp_path / "my.yaml"
    config.write_text("model:\n  class_path: lit_ddp.models.LeNetCIFAR\n  init_args:\n    optim: adam\n")
    line = one_error_line(capsys, ["fit", f"--config={config}", f"--trainer.default_root_dir={tmp_path}"])
    assert line.startswith(f"{config}, line 4: model.optim: adam: model.optim is a group of settings"), line
    assert "write them on the lines below it, indented" in line


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_validating_or_testing_an_empty_split_is_one_line_not_a_silent_success(stage: str) -> None:
    """A data module of the user's own with an empty test split: `test` logged no metric, printed only
    Lightning's "Total length of DataLoader across ranks is zero" and exited 0."""
    from lightning.pytorch.trainer.states import TrainerFn

    from lit_ddp.data.split_checks import check_split_evaluated
    from lit_ddp.errors import UserError

    check_split_evaluated(stage, range(1))
    split = "val" if stage == "validate" else "test"
    with pytest.raises(
        UserError, match=rf"^the {split} split holds no sample: {stage} would report no metric"
    ):
        check_split_evaluated(TrainerFn(stage), range(0))  # as Lightning's hooks pass it
