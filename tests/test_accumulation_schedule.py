"""A GradientAccumulationScheduler (``--trainer.callbacks+=GradientAccumulationScheduler
--trainer.callbacks.scheduling='{0: 2, 1: 4}'``): the Trainer's ``accumulate_grad_batches`` says 1 until the
scheduler sets each epoch's as it starts, so what is read before (the global batch printed and logged, the lr
scaled for it, the schedule's length, a resume's place on it) reads the scheduling.

    python -m pytest tests/test_accumulation_schedule.py -n 0 -q
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import CPU, DDP2, ONE, TINY_RUN, run_cli
from lenet_fits import StopAfterFirstEpoch, assert_close, fit, lenet, trainer
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from test_dashboard import hparams, read_run, texts

from lit_ddp.cli import build_cli
from lit_ddp.utils import later_global_batches

SCHEDULE = [
    "--trainer.callbacks+=GradientAccumulationScheduler",
    "--trainer.callbacks.scheduling={0: 2, 1: 4}",
]


def test_the_global_batch_and_the_scaled_lr_are_the_scheduled_ones(tmp_path: Path, caplog) -> None:
    """128 images in batches of 32, 2 then 4 accumulated: the console, the dashboard and the lr said 1
    accumulated (a global batch of 32), and the cosine spanned 8 steps where the run takes 3."""
    args = [*TINY_RUN, "--data.train_size=128", "--trainer.max_epochs=2", *SCHEDULE]
    scaled = [
        "--model.optim.scale_lr=true",
        "--model.optim.base_batch_size=32",
        "--model.optim.warmup_epochs=0",
    ]
    with caplog.at_level("INFO"):
        cli = build_cli(["fit", *args, *scaled, f"--trainer.default_root_dir={tmp_path}"])
    line = "global batch = 32 per device × 1 devices × 2 accumulation = 64 images per optimizer step"
    assert f"{line}; 128 (4 accumulated) from epoch 2" in caplog.messages
    # The lr is scaled for the first epoch's global batch, and kept as the scheduler grows it.
    schedule = cli.model.lr_schedulers()
    assert schedule.base_lrs[0] == pytest.approx(cli.model.optim.lr * 64 / 32)
    assert cli.trainer.global_step == 3 and schedule.built_for["steps"] == 3  # 4 / 2 + 4 / 4
    (events,) = {path.parent for path in tmp_path.rglob("events.out.tfevents.*")}
    run = read_run(events)
    params, _ = hparams(run)
    assert (params["global_batch_size"], params["trainer/accumulate_grad_batches"]) == (64, 2)
    assert params["trainer/accumulation_scheduling"] == "{0: 2, 1: 4}"
    assert "| global batch | 64; 128 (4 accumulated) from epoch 2 |" in texts(run, "environment")[0]


@pytest.mark.timeout(300)
def test_a_resume_in_a_later_epoch_logs_the_first_epochs_batch_and_notes_no_change_of_it(
    tmp_path: Path, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume in epoch 2 of {0: 1, 1: 2} logged epoch 2's accumulation as the run's hparam: MLflow, which
    keeps a run's first values, noted 'this fit changed trainer/accumulate_grad_batches (1 -> 2)' (and
    tagged the run so), though nothing was changed but the budget."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in to a file store
    store = tmp_path / "mlruns"
    args = [
        *TINY_RUN,
        "--trainer.logger=MLFlowLogger",
        f"--trainer.logger.init_args.tracking_uri={store.as_uri()}",
    ]
    args += [
        "--trainer.callbacks+=GradientAccumulationScheduler",
        "--trainer.callbacks.scheduling={0: 1, 1: 2}",
    ]
    args += [f"--trainer.default_root_dir={tmp_path}"]
    build_cli(["fit", *args])
    with caplog.at_level("INFO"):
        resumed = build_cli(["fit", *args, "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert resumed.trainer.current_epoch == 2
    (note,) = [m for m in caplog.messages if "keeps the first value of each parameter" in m]
    assert note.endswith("this fit changed trainer/max_epochs (1 -> 2)"), note


def test_a_resume_at_an_epochs_end_goes_on_as_the_uninterrupted_run(tmp_path: Path, caplog) -> None:
    """3 epochs of 4 batches, 2 accumulated, then 3 (a step of 3 batches and one of 1): the warmup (1 epoch)
    spanned 4 steps, and the resume after the first epoch stood at step 4 of the curve, where the run had
    taken 2 (a note, another lr)."""

    def scheduled(root: Path, *callbacks):
        return trainer(root, epochs=3, callbacks=[GradientAccumulationScheduler({0: 2, 1: 3}), *callbacks])

    model = lenet(False)
    whole = fit(model, scheduled(tmp_path / "whole"))
    schedule = model.lr_schedulers()
    assert model.trainer.global_step == 6 and schedule.built_for == {"steps": 6, "warmup_steps": 2}
    fit(lenet(False), scheduled(tmp_path / "part", StopAfterFirstEpoch()))
    with caplog.at_level("INFO"):
        resumed = fit(lenet(False), scheduled(tmp_path / "resumed"), tmp_path / "part" / "last.ckpt")
    assert not [m for m in caplog.messages if "lit_ddp: note" in m]
    assert_close(whole, resumed, atol=1e-6)


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_processes_with_a_scheduling_train_the_same_model_as_one_with_twice_the_batch(
    tmp_path: Path,
) -> None:
    """2 × 16 and 1 × 32 on 128 augmented images, 1 then 3 accumulated: 4 steps, then 2 (one of 3 batches,
    one of 1: the short step of the epoch's end weighs each image as the others)."""
    scheduled = [
        "--trainer.callbacks+=GradientAccumulationScheduler",
        "--trainer.callbacks.scheduling={1: 3}",
    ]
    common = [*CPU, "--data.train_size=128", "--data.val_size=32", "--trainer.max_epochs=2", *scheduled]
    common += ["--model.optim.name=sgd", "--model.optim.lr=0.05", "--model.optim.warmup_epochs=0"]
    runs = {"two": [*DDP2, "--data.batch_size=16"], "one": [*ONE, "--data.batch_size=32"]}
    states, said = {}, {}
    for name, args in runs.items():
        result = run_cli(["fit", *common, *args], cwd=tmp_path / name, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        said[name] = result.stdout + result.stderr
        (last,) = (tmp_path / name).rglob("last.ckpt")
        states[name] = torch.load(last, map_location="cpu", weights_only=True)
    assert "16 per device × 2 devices × 1 accumulation = 32 images per optimizer step; 96 (3" in said["two"]
    assert "32 per device × 1 devices × 1 accumulation = 32 images per optimizer step; 96 (3" in said["one"]
    assert states["two"]["global_step"] == states["one"]["global_step"] == 4 + 2
    two, one = states["two"]["state_dict"], states["one"]["state_dict"]
    assert two.keys() == one.keys()
    deviation = max(float((two[k].double() - one[k].double()).abs().max()) for k in one)
    assert deviation < 1e-5, deviation


@pytest.mark.parametrize(
    ("current_epoch", "expected"),
    [
        (0, "; 64 (2 accumulated) from epoch 2; 128 (4 accumulated) from epoch 3"),
        (1, "; 128 (4 accumulated) from epoch 3"),
        (2, ""),
    ],
)
def test_the_later_global_batches_are_those_after_the_epoch_a_run_starts_or_resumes_in(
    current_epoch: int, expected: str
) -> None:
    """A run resumed in epoch 2 goes on with its batch: the change into epoch 2 is not a later one."""
    scheduler = GradientAccumulationScheduler({0: 1, 1: 2, 2: 4})
    run = SimpleNamespace(
        callbacks=[scheduler],
        current_epoch=current_epoch,
        world_size=2,
        datamodule=SimpleNamespace(batch_size=16),
        accumulate_grad_batches=1,
    )
    assert later_global_batches(run) == expected
