"""A fit that ``--trainer.max_steps`` or ``--trainer.max_time`` ends inside an epoch resumes inside it.

Lightning ends such an epoch early, runs its epoch-end hooks and saves its checkpoints as if the epoch were
done, and its own resume starts the next epoch: the rest of the stopped one is never trained. lit_ddp saves
those checkpoints as inside the epoch (runtime/preemption.py), so the resumed run trains the rest, and ends
with the uninterrupted run's weights and TensorBoard metrics.
"""

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, read_scalars, run_cli
from lightning import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException
from test_resume_dashboard import tensorboard

from lit_ddp.callbacks import throughput
from lit_ddp.cli import build_cli, main
from lit_ddp.models.optim import lr_lambda

# 128 training images in batches of 32: 4 steps per epoch, 8 in all. A constant learning rate, so that
# max_steps (which the schedule's length follows) changes nothing but where the run stops.
RUN = [
    "--data.train_size=128",
    "--data.val_size=32",
    "--data.test_size=16",
    "--data.batch_size=32",
    "--trainer.max_epochs=2",
    "--trainer.enable_progress_bar=false",
    "--model.optim.schedule=constant",
]
STOP_AT = 6  # epoch 2, after 2 of its 4 batches


class StopAtStep(Callback):
    """Sets ``trainer.should_stop`` after training step ``STOP_AT``, as Lightning's Timer does at
    ``max_time`` (and EarlyStopping, or a user's callback)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == STOP_AT:
            trainer.should_stop = True


class SlowStoppedPart(Callback):
    """Moves the dashboard's clock (throughput.time) 100 s on at step ``STOP_AT``: the part of epoch 2
    before the stop took that long."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == STOP_AT:
            throughput.time = SimpleNamespace(perf_counter=lambda: time.perf_counter() + 100)


def fit(root: Path, *args: str):
    return build_cli(["fit", *RUN, f"--trainer.default_root_dir={root}", *args])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reference")
    fit(root)
    return root / "lightning_logs" / "version_0"


@pytest.mark.parametrize(
    "stop", [f"--trainer.max_steps={STOP_AT}", f"--trainer.callbacks+={__name__}.StopAtStep"]
)
def test_a_fit_stopped_inside_an_epoch_resumes_there_and_ends_as_the_uninterrupted_run(
    tmp_path: Path, reference: Path, stop: str, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(throughput, "time", time)  # put back after the test, as SlowStoppedPart moves it
    stopped = fit(tmp_path, stop, f"--trainer.callbacks+={__name__}.SlowStoppedPart")
    assert stopped.trainer.global_step == STOP_AT
    out = capsys.readouterr().out
    # The budget that stopped it must be raised to go on: the same max_steps would stop the resume at once.
    budget = " and a larger --trainer.max_steps" if "max_steps" in stop else ""
    (line,) = [line for line in out.splitlines() if line.startswith("epoch 2/2 stopped after 2 of 4 batches")]
    assert f"(resume with --ckpt_path=last{budget} to train the rest)" in line
    assert "img/s" not in line  # epoch 1's would be all there is to show
    run = tmp_path / "lightning_logs" / "version_0"
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == STOP_AT

    resumed = fit(tmp_path, "--ckpt_path=last")
    assert resumed.trainer.global_step == 8 and resumed.trainer.logger.version == 0
    final, expected = (
        torch.load(r / "checkpoints" / "last.ckpt", weights_only=True) for r in (run, reference)
    )
    for key, value in expected["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][key], value, rtol=0, atol=0, msg=key)
    # Each epoch's training metrics once, over the whole epoch: none for the epoch while it was cut short.
    got, want = read_scalars(run), read_scalars(reference)
    for key in ("train/acc", "train/loss_epoch"):
        assert got[key] == pytest.approx(want[key], abs=1e-6), key
    # Validation: the uninterrupted run's at each epoch end, and at a should_stop also where it stopped
    # (Lightning validates when a callback stops the fit early: EarlyStopping, max_time).
    assert got["val/acc"][-2:] == pytest.approx(want["val/acc"], abs=1e-6)
    # One perf/* point per epoch, at its last step, as in the uninterrupted run; epoch 2's time is both parts.
    perf = {tag: points for tag, points in tensorboard(run)[0].items() if tag.startswith("perf/")}
    assert sorted(perf) == [
        "perf/data_wait",
        "perf/epoch_time_s",
        "perf/images_per_s",
        "perf/images_per_s_per_device",
    ]
    assert all([step for step, _ in points] == [3, 7] for points in perf.values()), perf
    assert perf["perf/epoch_time_s"][1][1] > 100


def test_a_resume_whose_batch_limit_ends_the_stopped_epoch_already_is_one_line(
    tmp_path: Path, capsys
) -> None:
    """A --trainer.limit_train_batches at or below the batches the stopped epoch had trained ended that epoch
    without its validation (ModelCheckpoint warned that val/acc was missing) and exited 0. One line now,
    with the run's files as they were; the limit it names resumes, and the epoch validates."""
    fit(tmp_path, f"--trainer.max_steps={STOP_AT}")  # epoch 2 stopped after 2 of its 4 batches
    run = tmp_path / "lightning_logs" / "version_0"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    for limit in ("2", "0.5"):  # 2 batches, or half of 4
        with pytest.raises(SystemExit) as stop:
            main(
                [
                    "fit",
                    *RUN,
                    f"--trainer.default_root_dir={tmp_path}",
                    "--ckpt_path=last",
                    f"--trainer.limit_train_batches={limit}",
                ]
            )
        err = capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == 2 and len(err) == 1, err
        assert err[0] == (
            f"lit_ddp: error: --trainer.limit_train_batches={limit} ends an epoch after 2 batches, and the"
            " checkpoint stopped epoch 2 after 2: that epoch would end without its validation; resume with"
            " --trainer.limit_train_batches=3 or more (every epoch then trains that many), or train a new run"
            " (no --ckpt_path)"
        )
        assert {p: p.read_bytes() for p in before} == before
    resumed = fit(tmp_path, "--ckpt_path=last", "--trainer.limit_train_batches=3")
    assert resumed.trainer.global_step == STOP_AT + 1 and "val/acc" in resumed.trainer.callback_metrics
    assert "epoch 2/2 | train loss" in capsys.readouterr().out


# ---- a stop inside a gradient accumulation -------------------------------------------------------------
# A checkpoint holds no gradients: a stop after the first batch of an accumulation of 2 lost that batch's
# gradient, while the data module counted the batch as trained, so the resumed run never trained it.
ACCUMULATE = [*RUN, "--trainer.accumulate_grad_batches=2", "--trainer.num_sanity_val_steps=0"]


class StopAfterFirstBatchOfEpoch2(Callback):
    """``should_stop`` after epoch 2's first batch, the middle of an accumulation (max_time's route)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == 1 and batch_idx == 0:
            trainer.should_stop = True


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("accumulated")
    build_cli(["fit", *ACCUMULATE, f"--trainer.default_root_dir={root}"])
    return torch.load(root / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=True)


def _same_weights(run: Path, reference: dict) -> None:
    final = torch.load(run / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=True)
    assert final["global_step"] == reference["global_step"] == 4
    for key, value in reference["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][key], value, rtol=0, atol=0, msg=key)


def test_a_should_stop_inside_a_gradient_accumulation_waits_for_its_step(
    tmp_path: Path, accumulated: dict, capsys
) -> None:
    root = f"--trainer.default_root_dir={tmp_path}"
    stop = f"--trainer.callbacks+={__name__}.StopAfterFirstBatchOfEpoch2"
    stopped = build_cli(["fit", *ACCUMULATE, root, stop])
    assert stopped.trainer.global_step == 3  # epoch 2's first step, after its 2nd batch: not after its 1st
    assert "epoch 2/2 stopped after 2 of 4 batches" in capsys.readouterr().out
    build_cli(["fit", *ACCUMULATE, root, "--ckpt_path=last"])
    _same_weights(tmp_path, accumulated)


def test_a_stop_inside_a_scheduled_accumulation_resumes_with_the_scheduler(
    tmp_path: Path, accumulated: dict, capsys
) -> None:
    """A GradientAccumulationScheduler sets the Trainer's accumulation at each epoch's start, after the
    checkpoint is loaded: the resume compared the checkpoint's 2 with the Trainer's 1 and was refused."""
    root = f"--trainer.default_root_dir={tmp_path}"
    scheduled = [
        *RUN,
        "--trainer.num_sanity_val_steps=0",
        "--trainer.callbacks+=GradientAccumulationScheduler",
    ]
    scheduled += ["--trainer.callbacks.scheduling={0: 2}", root]
    stopped = build_cli(["fit", *scheduled, f"--trainer.callbacks+={__name__}.StopAfterFirstBatchOfEpoch2"])
    assert stopped.trainer.global_step == 3
    assert "epoch 2/2 stopped after 2 of 4 batches" in capsys.readouterr().out
    build_cli(["fit", *scheduled, "--ckpt_path=last"])
    _same_weights(tmp_path, accumulated)


class SignalAtFitStart(Callback):
    """SIGUSR1 to this process after fit's set-up: PreemptionCheckpoint records it, and the ranks agree on it
    as training starts, before the first step."""

    def on_fit_start(self, trainer, pl_module) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)  # handled on the main thread once it runs Python again


def test_a_stop_as_a_scheduled_resume_starts_saves_the_epochs_accumulation(
    tmp_path: Path, accumulated: dict
) -> None:
    """A resume inside an epoch stopped again as training starts (a signal during its set-up), before the
    scheduler's accumulation was set: its last.ckpt said 1 accumulated, and the next resume was refused."""
    root = f"--trainer.default_root_dir={tmp_path}"
    scheduled = [*RUN, "--trainer.num_sanity_val_steps=0", root]
    scheduled += [
        "--trainer.callbacks+=GradientAccumulationScheduler",
        "--trainer.callbacks.scheduling={0: 2}",
    ]
    build_cli(["fit", *scheduled, f"--trainer.callbacks+={__name__}.StopAfterFirstBatchOfEpoch2"])
    with pytest.raises(SIGTERMException):
        build_cli(
            ["fit", *scheduled, "--ckpt_path=last", f"--trainer.callbacks+={__name__}.SignalAtFitStart"]
        )
    build_cli(["fit", *scheduled, "--ckpt_path=last"])
    _same_weights(tmp_path, accumulated)


@pytest.mark.timeout(240)
def test_a_preemption_inside_a_gradient_accumulation_waits_for_its_step(
    tmp_path: Path, accumulated: dict
) -> None:
    """SIGTERM during the first batch, with a check after every batch: the stop came after that batch, the
    first of an accumulation. Real processes: the signal and the exit are the CLI's."""
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"}  # fault_probe
    args = ["fit", *ACCUMULATE, f"--trainer.default_root_dir={tmp_path}"]
    probe = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigterm"]
    probe += ["--trainer.callbacks.at_step=0", "--resilience.check_every_n_batches=1"]
    stopped = run_cli([*args, *probe], cwd=tmp_path, env=env)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert "stopped by SIGTERM at epoch 1, step 1 (mid-epoch, after 2 of 4 batches)" in stopped.stderr
    resumed = run_cli([*args, "--ckpt_path=last"], cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _same_weights(tmp_path, accumulated)


def test_the_stop_line_names_the_budget_a_resume_must_raise() -> None:
    from datetime import timedelta
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import Timer

    from lit_ddp.callbacks.summary import _budget_to_raise

    def trainer(max_steps: int = -1, callbacks=()) -> SimpleNamespace:
        return SimpleNamespace(max_steps=max_steps, global_step=6, callbacks=list(callbacks))

    assert _budget_to_raise(trainer(max_steps=6)) == " and a larger --trainer.max_steps"
    spent, left = Timer(duration=timedelta(0)), Timer(duration=timedelta(hours=1))
    assert _budget_to_raise(trainer(callbacks=[spent])) == " and a larger --trainer.max_time"
    assert _budget_to_raise(trainer(max_steps=100, callbacks=[left])) == ""  # a callback's should_stop


def test_a_resume_of_a_finished_run_names_the_budget_to_raise(tmp_path: Path, capsys, caplog) -> None:
    """Lightning skips the training loop of a run that has reached its max_epochs and says so; the line
    now also says how to train on, as for a run cut short. It leaves the run's folder as it was: no empty
    TensorBoard event file (its writer's, opened at set-up), no file written again."""
    cosine = "--model.optim.schedule=cosine"  # a schedule whose curve the budget decides
    fit(tmp_path, "--trainer.max_epochs=1", cosine)
    run = tmp_path / "lightning_logs" / "version_0"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    with caplog.at_level("INFO"):
        cli = fit(tmp_path, "--trainer.max_epochs=1", cosine, "--ckpt_path=last")
    assert cli.trainer.global_step == 4  # the checkpoint's: nothing trained
    out = capsys.readouterr().out
    assert "ends a finished run (resume it with --ckpt_path=last and a larger --trainer.max_epochs" in out
    assert not [m for m in caplog.messages if "schedule spans" in m]  # the same budget: the same schedule
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()} == before
    caplog.clear()
    every_step = "--trainer.log_every_n_steps=1"
    with caplog.at_level("INFO"):
        # trains on: no such line
        cli = fit(tmp_path, "--trainer.max_epochs=2", cosine, "--ckpt_path=last", every_step)
    assert "nothing to train" not in capsys.readouterr().out
    # ...on a schedule rebuilt for the new budget, which it says once
    note = "lit_ddp: note: the checkpoint's learning-rate schedule spans 4 steps, this run's 8 steps"
    notes = [m for m in caplog.messages if "schedule spans" in m]
    assert len(notes) == 1 and notes[0].startswith(note), notes
    # from its first step: that one trained at the old curve's last lr (0 for a cosine), and showed it
    lrs = read_scalars(tmp_path / "lightning_logs" / "version_0")["lr-AdamW/pg1"]  # steps 4-7
    base, new_curve = cli.trainer.optimizers[0].param_groups[0]["initial_lr"], lr_lambda("cosine", 8, 0)
    assert lrs == pytest.approx([base * new_curve(step) for step in range(4, 8)], rel=1e-6)
