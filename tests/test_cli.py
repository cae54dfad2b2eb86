"""The command line end to end: in process, and as real 2-process DDP runs on CPU."""

from pathlib import Path

import pytest
import torch
from conftest import TINY_SHAPES, assert_single_run, read_scalars, run_cli

from lit_ddp.cli import build_cli
from lit_ddp.data import ShapesDataModule
from lit_ddp.models import LeNetCIFAR

QUICK = [
    *TINY_SHAPES,
    "--trainer.max_epochs=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.log_every_n_steps=1",
]


def test_fit_in_process_logs_metrics_and_writes_one_run(tmp_path: Path) -> None:
    cli = build_cli(["fit", *QUICK, f"--trainer.default_root_dir={tmp_path}"])
    assert isinstance(cli.model, LeNetCIFAR) and isinstance(cli.datamodule, ShapesDataModule)
    metrics = cli.trainer.callback_metrics
    for key in ("train/loss", "train/acc", "val/loss", "val/acc"):
        assert key in metrics and torch.isfinite(metrics[key])
    assert 0.0 <= metrics["val/acc"] <= 1.0
    run = assert_single_run(tmp_path)
    scalars = read_scalars(run)
    assert {"train/loss_step", "train/loss_epoch", "train/acc", "val/loss", "val/acc"} <= set(scalars)


def test_validate_and_test_from_checkpoint_in_process(tmp_path: Path) -> None:
    build_cli(["fit", *QUICK, f"--trainer.default_root_dir={tmp_path}"])
    ckpt = next(tmp_path.rglob("last.ckpt"))
    args = [*QUICK, f"--trainer.default_root_dir={tmp_path / 'eval'}", f"--ckpt_path={ckpt}"]
    val = build_cli(["validate", *args]).trainer.callback_metrics
    test = build_cli(["test", *args]).trainer.callback_metrics
    assert 0.0 <= val["val/acc"] <= 1.0 and "val/loss" in val
    assert 0.0 <= test["test/acc"] <= 1.0 and "test/loss" in test


def test_num_classes_is_linked_from_the_data(tmp_path: Path) -> None:
    cli = build_cli(["fit", *QUICK, "--trainer.fast_dev_run=true", f"--trainer.default_root_dir={tmp_path}"])
    assert cli.model.hparams.num_classes == cli.datamodule.num_classes == 10


def test_predict_returns_one_prediction_per_test_image(tmp_path: Path) -> None:
    cli = build_cli(["predict", *QUICK, f"--trainer.default_root_dir={tmp_path}"])
    # LightningCLI does not return predictions; run predict on the built objects to check their shape.
    out = cli.trainer.predict(cli.model, datamodule=cli.datamodule)
    preds = torch.cat([b["pred"] for b in out])
    assert preds.shape == (64,) and preds.max() < 10


def test_print_config_shows_the_embedded_default(tmp_path: Path) -> None:
    result = run_cli(["fit", "--print_config"], cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "lit_ddp.models.LeNetCIFAR" in result.stdout and "lit_ddp.data.ShapesDataModule" in result.stdout


def test_unknown_config_key_is_rejected(tmp_path: Path) -> None:
    result = run_cli(["fit", "--model.no_such_option=3"], cwd=tmp_path, timeout=120)
    assert result.returncode != 0 and "no_such_option" in result.stderr
    assert not (tmp_path / "logs").exists()


@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_two_process_cpu_ddp_logs_metrics_and_writes_once(tmp_path: Path, strategy: str) -> None:
    args = [
        "fit",
        *QUICK,
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        f"--trainer.strategy={strategy}",
    ]
    result = run_cli(args, cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    run = assert_single_run(tmp_path / "logs")
    scalars = read_scalars(run)
    assert {"train/loss_epoch", "train/acc", "val/loss", "val/acc"} <= set(scalars)
    assert 0.0 <= scalars["val/acc"][-1] <= 1.0
    # The effective global batch is printed once (rank 0), not once per rank.
    assert (result.stdout + result.stderr).count("global batch = 32 per device × 2 devices") == 1


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_embedded_default_reaches_90_percent(tmp_path: Path) -> None:
    """The README's main job: `python -m lit_ddp fit` with no argument at all."""
    result = run_cli(["fit", "--trainer.enable_progress_bar=false"], cwd=tmp_path, timeout=360)
    assert result.returncode == 0, result.stderr[-3000:]
    run = assert_single_run(tmp_path / "logs")
    assert read_scalars(run)["val/acc"][-1] >= 0.90


def test_sparse_step_logging_does_not_change_epoch_metrics(tmp_path: Path) -> None:
    """self.log runs only on batches whose values Lightning writes; metric objects still see every batch."""
    runs = {}
    for every in (1, 50):
        args = [*QUICK, "--trainer.max_epochs=2", f"--trainer.log_every_n_steps={every}"]
        cli = build_cli(["fit", *args, f"--trainer.default_root_dir={tmp_path / str(every)}"])
        runs[every] = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if "step" not in k}
    # Timings differ from run to run; the lr monitor writes on the logging steps only.
    keys = {k for k in runs[1] if not k.startswith(("perf/", "lr-"))}
    assert {"train/loss", "train/acc", "val/loss", "val/acc"} <= keys <= runs[50].keys()
    for key in keys:
        assert runs[1][key] == pytest.approx(runs[50][key], abs=1e-6), key


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_is_frozen_while_training_by_default_and_can_be_turned_off(tmp_path: Path, enabled: bool) -> None:
    import gc

    import lightning as L

    frozen: list[int] = []

    class Probe(L.Callback):
        def on_train_batch_start(self, *args) -> None:
            frozen.append(gc.get_freeze_count())

    switch = [] if enabled else ["--gc_freeze=null"]
    cli = build_cli([*QUICK, *switch, f"--trainer.default_root_dir={tmp_path}"], run=False)
    cli.trainer.callbacks.append(Probe())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert frozen and all((count > 0) == enabled for count in frozen)
    assert gc.get_freeze_count() == 0  # unfrozen when training ends
