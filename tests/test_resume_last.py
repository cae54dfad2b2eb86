"""``--ckpt_path=last`` resumes a run of the same model and data, in that recipe's own folder."""

import csv
import os
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, TINY_RUN, WITH_PROBES, run_cli
from lightning import Callback
from lightning.fabric.utilities.exceptions import MisconfigurationException
from test_resume_dashboard import tensorboard

from lit_ddp.cli import build_cli, main
from lit_ddp.data import ShapesDataModule
from lit_ddp.preflight import experiment_name

TINY = TINY_RUN


class OtherShapes(ShapesDataModule):
    """Another experiment's data, for the tests: the same images under another data class."""


OTHER = f"--data={__name__}.OtherShapes"


def test_last_never_resumes_another_experiments_run_and_names_what_differs(tmp_path: Path, capsys) -> None:
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *TINY, root])
    shapes_run = tmp_path / "lightning_logs" / "version_0"
    before = {p: p.read_bytes() for p in shapes_run.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as stop:
        main(["fit", OTHER, *TINY, "--ckpt_path=last", "--trainer.max_epochs=2", root])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("lit_ddp: error: --ckpt_path=last: the runs under")
    assert "version_0 with data ShapesDataModule (this run: OtherShapes)" in err
    # Nothing of the Shapes run was written to, and the refused run left no folder.
    assert {p: p.read_bytes() for p in shapes_run.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0"]


def test_a_refused_resume_leaves_the_runs_config_yaml_as_it_trained(tmp_path: Path, capsys) -> None:
    """A resume refused once the checkpoint was read (here another --data.seed) had written its own settings
    over the run's config.yaml first: the folder's config then named a seed it never trained with, and
    `--config <run>/config.yaml --ckpt_path=last` was refused in its turn. A resume that runs rewrites it.
    The refused resume also left an empty TensorBoard event file (its writer's, opened at set-up) in the
    folder: the folder is now as it was, file for file."""
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *TINY, root])
    run = tmp_path / "lightning_logs" / "version_0"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY, "--data.seed=1", "--ckpt_path=last", "--trainer.max_epochs=2", root])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "Traceback" not in err, err
    assert "with --data.seed=0, this run has --data.seed=1" in err.splitlines()[-1], err
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()} == before
    assert "seed: 0" in (run / "config.yaml").read_text()
    build_cli(["fit", *TINY, "--ckpt_path=last", "--trainer.max_epochs=2", root])
    assert "max_epochs: 2" in (run / "config.yaml").read_text()


def test_a_resume_with_nothing_to_train_leaves_the_csv_logs_as_they_were(tmp_path: Path, capsys) -> None:
    """Lightning's CSV logger deletes metrics.csv as a resume opens the run's folder (lit_ddp wrote the same
    rows back: a new file) and wrote hparams.yaml afresh with the model's and data's settings alone (the
    run's trainer/* settings were lost). A resume that trains on records its own."""
    csv_logger = ["--trainer.logger=CSVLogger", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    args = ["fit", *TINY, *csv_logger, f"--trainer.default_root_dir={tmp_path}"]
    build_cli(args)
    run = tmp_path / "lightning_logs" / "version_0"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    assert {"metrics.csv", "hparams.yaml"} <= {p.name for p in before}
    capsys.readouterr()
    build_cli([*args, "--ckpt_path=last"])
    assert "nothing to train" in capsys.readouterr().out
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()} == before
    build_cli([*args, "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert "trainer/max_epochs: 2" in (run / "hparams.yaml").read_text()
    with (run / "metrics.csv").open() as f:
        assert {row["epoch"] for row in csv.DictReader(f)} == {"0", "1"}


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_a_resume_refused_in_ddp_spawns_ranks_leaves_the_run_folder_as_it_was(tmp_path: Path) -> None:
    """Under ddp_spawn the refusal is the ranks' (they read the checkpoint), and Lightning leaves their
    loggers unfinalized there: rank 0's empty TensorBoard event file (its header, 88 bytes) stayed."""
    build_cli(["fit", *TINY, f"--trainer.default_root_dir={tmp_path}"])
    run = tmp_path / "lightning_logs" / "version_0"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    spawn = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    args = ["fit", *TINY, *spawn, "--data.seed=1", "--ckpt_path=last", "--trainer.max_epochs=2"]
    refused = run_cli([*args, f"--trainer.default_root_dir={tmp_path}"], tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "with --data.seed=0, this run has --data.seed=1" in refused.stderr
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()} == before


def test_last_picks_the_newest_run_of_this_model_and_data_and_says_which(tmp_path: Path, caplog) -> None:
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *TINY, root])  # version_0: Shapes
    build_cli(["fit", OTHER, *TINY, root])  # version_1: the newer run, another experiment
    other_ckpt = tmp_path / "lightning_logs" / "version_1" / "checkpoints" / "last.ckpt"
    other_bytes = other_ckpt.read_bytes()
    with caplog.at_level("INFO"):
        cli = build_cli(["fit", *TINY, "--ckpt_path=last", "--trainer.max_epochs=2", root])
    shapes_ckpt = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert f"resuming from {shapes_ckpt}" in caplog.messages
    assert cli.trainer.current_epoch == 2 and cli.trainer.logger.version == 0
    assert other_ckpt.read_bytes() == other_bytes


def test_last_with_no_run_in_the_recipes_folder_starts_a_new_run_and_names_this_models_run_elsewhere(
    tmp_path: Path, caplog
) -> None:
    """`fit`, then `fit --print_config > my.yaml` and `fit --config my.yaml --ckpt_path=last`: the recipe's
    folder (my/) holds no run, and the fit started over at epoch 1 with Lightning's warning alone, whose
    hint (`ModelCheckpoint(..., save_last=True)`) lit_ddp already does; the run meant, under
    lightning_logs/, went unnamed. One note says the fit starts a new run and names that checkpoint."""
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *TINY, root])
    meant = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    my = tmp_path / "my.yaml"
    my.write_text("model:\n  class_path: lit_ddp.models.LeNetCIFAR\n")
    with caplog.at_level("INFO"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = build_cli(["fit", f"--config={my}", *TINY, "--ckpt_path=last", root])
    assert cli.trainer.global_step == 2 and cli.trainer.logger.log_dir == str(tmp_path / "my" / "version_0")
    assert not [w for w in caught if "no last checkpoint available" in str(w.message)]
    notes = [m for m in caplog.messages if m.startswith("lit_ddp: note: --ckpt_path=last")]
    assert notes == [
        f"lit_ddp: note: --ckpt_path=last: no run under {tmp_path / 'my'} to resume, so this fit starts a new"
        f" one; {meant} is a run of this model and data: pass --ckpt_path={meant} to resume it"
    ], caplog.messages


def test_each_recipe_logs_into_its_own_folder(tmp_path: Path) -> None:
    preset = tmp_path / "debug.yaml"
    preset.write_text("trainer:\n  max_epochs: 1\n")
    recipe = tmp_path / "configs" / "lenet_cifar.yaml"  # a recipe: it chooses the model or the data
    recipe.parent.mkdir()
    recipe.write_text("model:\n  class_path: lit_ddp.models.LeNetCIFAR\ntrainer:\n  max_epochs: 3\n")
    saved = tmp_path / "lenet_cifar" / "version_3" / "config.yaml"
    saved.parent.mkdir(parents=True)
    saved.write_text("model:\n  class_path: lit_ddp.models.LeNetCIFAR\n")
    assert experiment_name([recipe, preset]) == "lenet_cifar"
    assert experiment_name([preset, recipe]) == "lenet_cifar"  # a preset is not the experiment
    assert experiment_name([preset]) == experiment_name(None) == "lightning_logs"
    assert experiment_name([saved]) == "lenet_cifar"  # a run's own config, given back
    shapes_recipe = f"--config={REPO / 'configs' / 'lenet_shapes.yaml'}"
    cli = build_cli([shapes_recipe, *TINY, f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert Path(cli.trainer.logger.log_dir) == tmp_path / "lenet_shapes" / "version_0"


def test_best_is_the_best_checkpoint_of_the_run_last_would_resume(tmp_path: Path, caplog) -> None:
    """In a new process Lightning has no best (it knows it only where it trained); lit_ddp reads the run's."""
    fitted = build_cli(["fit", *TINY, "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}/a"])
    best = Path(fitted.trainer.checkpoint_callback.best_model_path)
    assert best.parent.name == "checkpoints" and best.name.startswith("epoch")
    with caplog.at_level("INFO"):
        cli = build_cli(["validate", *TINY, "--ckpt_path=best", f"--trainer.default_root_dir={tmp_path}/a"])
    assert cli.trainer.ckpt_path == str(best)
    assert f"validate: {best} (best val/acc)" in caplog.messages
    # A folder of runs moved elsewhere keeps each run's checkpoints together: best is found beside last.ckpt.
    (tmp_path / "a").rename(tmp_path / "b")
    cli = build_cli(["test", *TINY, "--ckpt_path=best", f"--trainer.default_root_dir={tmp_path}/b"])
    assert cli.trainer.ckpt_path == str(
        tmp_path / "b" / "lightning_logs" / "version_0" / "checkpoints" / best.name
    )


@pytest.mark.parametrize(
    "fixed",
    [
        ["--checkpoint.dirpath=best"],
        [
            "--trainer.callbacks+=ModelCheckpoint",
            "--trainer.callbacks.dirpath=theirs",
            "--trainer.callbacks.monitor=val/loss",
        ],
    ],
    ids=["checkpoint-dirpath", "their-checkpoint-dirpath"],
)
def test_last_and_best_find_the_run_when_a_checkpoint_callback_has_a_folder_of_its_own(
    tmp_path: Path, caplog, fixed: list[str]
) -> None:
    """`--checkpoint.dirpath=DIR` (or a ModelCheckpoint of the user's with a dirpath) left `last` to
    Lightning's lookup, in the fixed folders alone: `fit --ckpt_path=last` found no last.ckpt there and
    started a new run from scratch, and `test --ckpt_path=last` said there was no earlier run, while
    last.ckpt was in the run's folder as ever."""
    fixed = [arg.replace("dirpath=", f"dirpath={tmp_path}/") for arg in fixed]
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *TINY, *fixed, root])
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    with caplog.at_level("INFO"):
        resumed = build_cli(["fit", *TINY, *fixed, "--trainer.max_epochs=2", "--ckpt_path=last", root])
    assert f"resuming from {last}" in caplog.messages
    assert resumed.trainer.current_epoch == 2 and resumed.trainer.logger.version == 0
    assert build_cli(["test", *TINY, *fixed, "--ckpt_path=last", root]).trainer.ckpt_path == str(last)
    # The best of the first checkpoint callback that monitors a metric (Lightning's choice): in its folder.
    best = resumed.trainer.checkpoint_callback.best_model_path
    assert Path(best).parent.parent == tmp_path
    assert build_cli(["test", *TINY, *fixed, "--ckpt_path=best", root]).trainer.ckpt_path == best


def test_a_stop_signal_saves_the_runs_last_checkpoint_beside_a_checkpoint_folder_of_the_users(
    tmp_path: Path,
) -> None:
    """SIGTERM saved last.ckpt into the first checkpoint callback's folder, a ModelCheckpoint of the user's
    with a dirpath: the run's own last.ckpt, which --ckpt_path=last resumes, held the epoch before, so the
    resume trained the stopped epoch's batches again. Here the stop is after step 3 (mid-epoch), of 4."""
    theirs = ["--trainer.callbacks+=ModelCheckpoint", f"--trainer.callbacks.dirpath={tmp_path}/theirs"]
    stop = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigterm"]
    stop += ["--trainer.callbacks.at_step=2", "--resilience.check_every_n_batches=1"]
    args = ["fit", *TINY, "--trainer.accelerator=cpu", "--trainer.max_epochs=2", *theirs]
    stopped = run_cli([*args, *stop, f"--trainer.default_root_dir={tmp_path}"], tmp_path, env=WITH_PROBES)
    run = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    assert f"step 3 (mid-epoch, after 1 of 2 batches): saved {run / 'last.ckpt'}" in stopped.stderr, (
        stopped.stderr
    )
    assert torch.load(run / "last.ckpt", weights_only=True)["global_step"] == 3
    assert not (tmp_path / "theirs" / "last.ckpt").exists()
    resumed = build_cli([*args, "--ckpt_path=last", f"--trainer.default_root_dir={tmp_path}"])
    assert resumed.trainer.global_step == 4 and resumed.trainer.logger.version == 0


def test_fit_from_best_starts_a_new_run_and_leaves_the_best_runs_files(tmp_path: Path) -> None:
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *TINY, "--trainer.max_epochs=2", root])
    run = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    cli = build_cli(["fit", *TINY, "--trainer.max_epochs=3", "--ckpt_path=best", root])
    assert cli.trainer.logger.version == 1 and cli.trainer.current_epoch == 3
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    # Its config.yaml names the file it started from, not `best`, which a re-run would look up anew.
    saved = yaml.safe_load((tmp_path / "lightning_logs" / "version_1" / "config.yaml").read_text())
    assert saved["ckpt_path"] == cli.trainer.ckpt_path and Path(saved["ckpt_path"]).parent == run


def test_a_resumed_runs_config_yaml_trains_the_run_again_and_still_resumes_it(tmp_path: Path, capsys) -> None:
    """A resume's config.yaml recorded its `ckpt_path: last`: `fit --config RUN/config.yaml` resumed the
    finished run and printed "nothing to train" instead of training it again. The file records the run."""
    build_cli(["fit", *TINY, f"--trainer.default_root_dir={tmp_path}"])
    build_cli(
        ["fit", *TINY, "--ckpt_path=last", "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}"]
    )
    config = tmp_path / "lightning_logs" / "version_0" / "config.yaml"
    assert yaml.safe_load(config.read_text())["ckpt_path"] is None
    capsys.readouterr()
    again = build_cli(["fit", f"--config={config}"])
    assert again.trainer.logger.version == 1 and again.trainer.global_step == 4  # 2 epochs of 2 steps
    assert "nothing to train" not in capsys.readouterr().out
    resumed = build_cli(["fit", f"--config={config}", "--ckpt_path=last", "--trainer.max_epochs=3"])
    assert resumed.trainer.logger.version == 1 and resumed.trainer.global_step == 6


@pytest.mark.parametrize(
    ("first_run", "expected"),
    [
        (None, "lit_ddp: error: validate --ckpt_path=best: no checkpoint from an earlier run under"),
        (["--trainer.limit_val_batches=0"], "lit_ddp: error: --ckpt_path=best: the run of"),
        ([OTHER], "lit_ddp: error: --ckpt_path=best: the runs under"),
    ],
    ids=["no-run", "no-validation", "another-experiment"],
)
def test_best_with_nothing_to_find_is_one_line(tmp_path: Path, capsys, first_run, expected) -> None:
    root = f"--trainer.default_root_dir={tmp_path}"
    if first_run is not None:
        build_cli(["fit", *first_run, *TINY, root])
    with pytest.raises(SystemExit) as stop:
        main(["validate", *TINY, "--ckpt_path=best", root])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(expected), err


def test_last_with_a_version_given_to_the_logger_reads_that_run_and_names_the_others(
    tmp_path: Path, capsys
) -> None:
    """`predict --ckpt_path=last` with `--trainer.logger.version=mine` said "no last.ckpt from an earlier run
    under lightning_logs" beside version_0's: a version given names the one run `last` reads, and the line
    says so and names the runs that have one. Given a run's version, `last` is that run's file (a fit goes on
    in it)."""
    build_cli(["fit", *TINY, f"--trainer.default_root_dir={tmp_path}"])
    logger = ["--trainer.logger=TensorBoardLogger", f"--trainer.logger.save_dir={tmp_path}"]
    with pytest.raises(SystemExit) as stop:
        main(["predict", *TINY, "--ckpt_path=last", *logger, "--trainer.logger.version=mine"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(
        f"lit_ddp: error: predict --ckpt_path=last: the logger's version names the run"
        f" {tmp_path / 'lightning_logs' / 'mine'}, which has no last.ckpt (runs under"
        f" {tmp_path / 'lightning_logs'} with one: version_0): "
    ), err
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0"]
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    cli = build_cli(["validate", *TINY, "--ckpt_path=last", *logger, "--trainer.logger.version=0"])
    assert cli.trainer.ckpt_path == str(last)
    cli = build_cli(
        ["fit", *TINY, "--ckpt_path=last", *logger, "--trainer.logger.version=0", "--trainer.max_epochs=2"]
    )
    assert cli.trainer.global_step == 4 and cli.trainer.logger.log_dir == str(last.parent.parent)


def test_hpc_with_no_hpc_checkpoint_is_one_line_naming_last(tmp_path: Path, capsys) -> None:
    """`--ckpt_path=hpc` is Lightning's SLURM checkpoint (hpc_ckpt_N.ckpt in default_root_dir), which
    lit_ddp's stop never writes (it saves last.ckpt): with none there, Lightning's ValueError was a
    traceback after the run had started."""
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *TINY, root])
    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY, "--ckpt_path=hpc", "--trainer.max_epochs=2", root])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"lit_ddp: error: --ckpt_path=hpc: no hpc_ckpt_N.ckpt in {tmp_path}"), err
    assert "--ckpt_path=last" in err
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0"]


def test_last_and_best_find_the_checkpoints_of_a_run_without_a_logger(tmp_path: Path, caplog) -> None:
    """--trainer.logger=false: ModelCheckpoint writes into default_root_dir/checkpoints. fit found them
    (Lightning's own lookup), but validate/test/predict with last or best refused: no runs to search."""
    root, off = f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"
    fitted = build_cli(["fit", *TINY, off, "--trainer.max_epochs=2", root])
    best = fitted.trainer.checkpoint_callback.best_model_path
    scored = build_cli(["validate", *TINY, off, "--ckpt_path=last", root])
    assert scored.trainer.ckpt_path == str(tmp_path / "checkpoints" / "last.ckpt")
    assert build_cli(["test", *TINY, off, "--ckpt_path=best", root]).trainer.ckpt_path == best
    with caplog.at_level("INFO"):
        resumed = build_cli(["fit", *TINY, off, "--trainer.max_epochs=3", "--ckpt_path=last", root])
    assert f"resuming from {tmp_path / 'checkpoints' / 'last.ckpt'}" in caplog.messages
    assert resumed.trainer.current_epoch == 3


def test_last_holds_the_final_epoch_when_validation_skips_it(tmp_path: Path) -> None:
    """With --trainer.check_val_every_n_epoch=2, last.ckpt was saved where validation ended only: after 3
    epochs it held epoch 2's weights, and ``test --ckpt_path=last`` scored them without a word."""
    root = f"--trainer.default_root_dir={tmp_path}"
    fit = build_cli(["fit", *TINY, root, "--trainer.max_epochs=3", "--trainer.check_val_every_n_epoch=2"])
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    assert saved["global_step"] == fit.trainer.global_step == 6 and saved["epoch"] == 2
    final = fit.trainer.lightning_module.state_dict()
    assert all(torch.equal(saved["state_dict"][key], value) for key, value in final.items())
    assert sorted(p.name for p in last.parent.iterdir()) == ["epoch001-step4.ckpt", "last.ckpt"]


def test_a_fit_without_validation_has_no_best_checkpoint_to_warn_about(tmp_path: Path) -> None:
    """--trainer.limit_val_batches=0 turns validation off: the best checkpoint, which monitors val/acc, is
    left out (Lightning warned that it could not find val/acc); last.ckpt is still written."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_cli(["fit", *TINY, f"--trainer.default_root_dir={tmp_path}", "--trainer.limit_val_batches=0"])
    assert not [w for w in caught if "monitored key" in str(w.message)], [str(w.message) for w in caught]
    checkpoints = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt"]


def test_a_fit_stopped_by_its_budget_before_validating_does_not_ask_for_the_metric(tmp_path: Path) -> None:
    """A fit that max_steps (or max_time) stops inside its first epoch has run no validation: Lightning's best
    checkpoint warned that it "could not find the monitored key" val/acc, with a hint to log it, after the
    console's line that the epoch stopped and how to resume. last.ckpt is written; a later epoch that
    validates is still refused where its metric is missing (a --checkpoint.monitor typo)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_cli(["fit", *TINY, f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=1"])
    assert not [w for w in caught if "monitored key" in str(w.message)], [str(w.message) for w in caught]
    assert (tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    with pytest.raises(MisconfigurationException, match="val/acc5"):
        build_cli(["fit", *TINY, f"--trainer.default_root_dir={tmp_path}", "--checkpoint.monitor=val/acc5"])


class SavedSteps(Callback):
    """The global step of every checkpoint the fit writes."""

    steps: list[int] = []

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        SavedSteps.steps.append(checkpoint["global_step"])


@pytest.mark.parametrize(
    ("schedule", "saved"),
    [([], [1, 2, 3, 4]), (["--last_checkpoint.every_n_train_steps=3"], [3])],
    ids=["after-each-validation-and-epoch", "the-users-schedule-alone"],
)
def test_last_is_saved_after_each_validation_unless_the_user_set_a_schedule(
    tmp_path: Path, schedule: list[str], saved: list[int]
) -> None:
    SavedSteps.steps = []
    args = ["fit", *TINY, "--data.train_size=128", "--trainer.val_check_interval=0.25", "--checkpoint=null"]
    args += [f"--trainer.callbacks+={__name__}.SavedSteps", f"--trainer.default_root_dir={tmp_path}"]
    build_cli([*args, *schedule])
    assert SavedSteps.steps == saved


@pytest.mark.timeout(240)
def test_a_killed_run_resumes_from_its_last_validation_inside_an_epoch(tmp_path: Path) -> None:
    """--trainer.val_check_interval=0.5: last.ckpt is saved after the validation inside the epoch too, so a
    rank killed after it (no signal, no checkpoint of its own) resumes from there, exactly."""
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"}  # fault_probe
    args = ["fit", *TINY, "--data.train_size=128", "--model.optim.schedule=constant"]
    args += ["--trainer.val_check_interval=0.5", "--trainer.num_sanity_val_steps=0"]
    assert run_cli([*args, "--trainer.default_root_dir=ref"], cwd=tmp_path, env=env).returncode == 0
    kill = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigkill"]
    kill += ["--trainer.callbacks.at_step=3"]  # the 4th batch: after the validation at batch 2
    assert run_cli([*args, *kill], cwd=tmp_path, env=env).returncode == -9
    last = tmp_path / "logs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 2
    resumed = run_cli([*args, "--ckpt_path=last"], cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = torch.load(last, weights_only=True)
    want = torch.load(tmp_path / "ref/lightning_logs/version_0/checkpoints/last.ckpt", weights_only=True)
    assert got["global_step"] == want["global_step"] == 4
    for key, value in want["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][key], value, rtol=0, atol=0, msg=key)


def test_a_resumed_fit_logs_its_config_at_the_step_it_resumes_from(tmp_path: Path) -> None:
    """RunInfo wrote the resumed run's config and environment at step 0 again: TensorBoard's data server
    keeps one value per step, so the Text tab showed the resumed settings as the run's from its start and
    the first ones were gone (config.yaml is rewritten too). Each part of the run now has its own step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *TINY, root])  # 2 steps
    build_cli(["fit", *TINY, "--ckpt_path=last", "--trainer.max_epochs=2", root])
    acc = EventAccumulator(str(tmp_path / "lightning_logs" / "version_0"), size_guidance={"tensors": 0})
    acc.Reload()
    for tag in ("config", "environment"):
        assert [e.step for e in acc.Tensors(f"{tag}/text_summary")] == [0, 2], tag
    first, resumed = (e.tensor_proto.string_val[0].decode() for e in acc.Tensors("config/text_summary"))
    assert "max_epochs: 1" in first and "max_epochs: 2" in resumed


def test_fit_from_a_path_to_a_runs_last_checkpoint_goes_on_in_that_run_as_last_does(
    tmp_path: Path, caplog, monkeypatch
) -> None:
    """`fit --ckpt_path=lightning_logs/version_0/checkpoints/last.ckpt` (the path `resuming from` prints, or
    an sbatch script holds) trained into a new version_1, while `--ckpt_path=last` goes on in version_0: the
    run's curves, checkpoints and best were split over two folders. The path now resumes the run as `last`
    does; the folders hold the same files either way."""
    runs = {}
    for how in ("last", "path"):
        root = tmp_path / how
        build_cli(["fit", *TINY, f"--trainer.default_root_dir={root}"])
        monkeypatch.chdir(root)  # the path as a user copies it: relative to where the command runs
        ckpt = "last" if how == "last" else "lightning_logs/version_0/checkpoints/last.ckpt"
        resume = [f"--ckpt_path={ckpt}", "--trainer.max_epochs=2", f"--trainer.default_root_dir={root}"]
        with caplog.at_level("INFO"):
            cli = build_cli(["fit", *TINY, *resume])
        assert cli.trainer.current_epoch == 2 and cli.trainer.logger.version == 0, how
        runs[how] = sorted(
            "events" if p.name.startswith("events.out.tfevents.") else str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file()
        )
    assert any(
        m.startswith("resuming from lightning_logs/version_0/checkpoints/last.ckpt") for m in caplog.messages
    )
    assert runs["path"] == runs["last"]
    assert runs["path"].count("events") == 2  # the first run and its resume, in one folder
    assert not (tmp_path / "path" / "lightning_logs" / "version_1").exists()
    # The run's own bookkeeping goes on: `best` for it is found among that run's checkpoints.
    scored = build_cli(
        ["validate", *TINY, "--ckpt_path=best", f"--trainer.default_root_dir={tmp_path / 'path'}"]
    )
    assert (
        Path(scored.trainer.ckpt_path).parent
        == tmp_path / "path" / "lightning_logs" / "version_0" / "checkpoints"
    )


def test_fit_from_a_path_to_any_other_checkpoint_starts_a_new_run(tmp_path: Path) -> None:
    """An epoch's checkpoint of a run (or best), or a last.ckpt outside the runs `last` searches, is a branch
    from that point: a new run, as Lightning makes it, leaving the run's files as they are."""
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *TINY, "--trainer.max_epochs=2", root])
    run = tmp_path / "lightning_logs" / "version_0"
    epoch = min((run / "checkpoints").glob("epoch*.ckpt"))
    outside = tmp_path / "elsewhere" / "checkpoints" / "last.ckpt"
    outside.parent.mkdir(parents=True)
    outside.write_bytes((run / "checkpoints" / "last.ckpt").read_bytes())
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for version, ckpt in enumerate((epoch, outside), start=1):
        cli = build_cli(["fit", *TINY, f"--ckpt_path={ckpt}", "--trainer.max_epochs=3", root])
        assert cli.trainer.logger.version == version, ckpt
        # A new run's dashboard: its own train/batch image, though the checkpoint's run has one.
        assert "train/batch" in tensorboard(Path(cli.trainer.log_dir))[1], ckpt
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_the_fits_last_line_names_the_last_checkpoint_that_last_resumes(tmp_path: Path, capsys) -> None:
    """With `--checkpoint.monitor=null` the fit's last line named that callback's newest epoch file as the one
    `--ckpt_path=last` resumes; it resumes last.ckpt, and a path to the epoch's file starts a new run."""
    build_cli(["fit", *TINY, "--checkpoint.monitor=null", f"--trainer.default_root_dir={tmp_path}"])
    (saved,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("run saved in ")]
    assert saved.endswith(": last checkpoints/last.ckpt (--ckpt_path=last resumes it)"), saved


PINNED = {
    "TensorBoardLogger": "--trainer.logger.init_args.version=version_0",
    "CSVLogger": "--trainer.logger.init_args.version=0",
}


@pytest.mark.parametrize("logger", PINNED)
def test_a_new_fit_into_a_pinned_version_that_holds_a_run_is_refused_and_last_resumes_it(
    tmp_path: Path, capsys, logger: str
) -> None:
    """A second fit with no --ckpt_path, its logger given the version of an earlier run, wrote its own
    config.yaml, last.ckpt and best over the run's (TensorBoard kept both event files). It is one line before
    anything is built, naming the folder and the fixes; --ckpt_path=last into that version still resumes."""
    given = [f"--trainer.logger={logger}", f"--trainer.logger.init_args.save_dir={tmp_path}", PINNED[logger]]
    build_cli(["fit", *TINY, *given, f"--trainer.default_root_dir={tmp_path}"])
    run = tmp_path / "lightning_logs" / "version_0"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY, *given, "--seed_everything=1", f"--trainer.default_root_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(
        f"lit_ddp: error: --trainer.logger.init_args.version names {run}, which holds an earlier run: a new"
        " fit would write over its config.yaml and checkpoints; resume that run with --ckpt_path=last"
    ), err
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()} == before
    assert build_cli([*TINY, *given], run=False).plan.pinned_run is None  # doctor's check runs log nowhere
    resumed = build_cli(["fit", *TINY, *given, "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert resumed.trainer.global_step == 4 and resumed.trainer.log_dir == str(run)


def test_a_pinned_version_whose_folder_holds_no_run_is_a_new_run_there(tmp_path: Path) -> None:
    """A folder made by hand, or holding another tool's event files alone (no config.yaml, no checkpoint),
    is no run of lit_ddp's to lose: the fit runs in it."""
    for version, files in (("empty", ()), ("events", ("events.out.tfevents.1.host.1.0",))):
        folder = tmp_path / "lightning_logs" / version
        folder.mkdir(parents=True)
        for name in files:
            (folder / name).write_bytes(b"")
        logger = ["--trainer.logger=TensorBoardLogger", f"--trainer.logger.init_args.save_dir={tmp_path}"]
        cli = build_cli(["fit", *TINY, *logger, f"--trainer.logger.init_args.version={version}"])
        assert cli.trainer.log_dir == str(folder) and (folder / "checkpoints" / "last.ckpt").is_file()
        assert all((folder / name).is_file() for name in files)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("logger", PINNED)
def test_a_checkpoint_from_elsewhere_into_a_pinned_version_that_holds_a_run_is_refused(
    tmp_path: Path, capsys, logger: str
) -> None:
    """`version=0 --ckpt_path=<version_1's last.ckpt>` trained version_1's weights into version_0 over its
    last.ckpt and config.yaml, and a file outside any run did the same: one line naming both runs and the
    fixes. Run A's own last.ckpt still resumes it, and a file from elsewhere into an empty version starts
    there; dropping the version resumes version_1 in its own folder."""
    given = [f"--trainer.logger={logger}", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    for seed in (0, 1):
        build_cli(["fit", *TINY, *given, f"--seed_everything={seed}"])
    a, b = (tmp_path / "lightning_logs" / f"version_{n}" for n in (0, 1))
    outside = tmp_path / "downloaded.ckpt"
    outside.write_bytes((b / "checkpoints" / "last.ckpt").read_bytes())
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in a.rglob("*") if p.is_file()}
    pinned = [*given, "--trainer.logger.init_args.version=0", "--trainer.max_epochs=2"]
    option = "--trainer.logger.init_args.version"
    for ckpt, line in (
        (
            b / "checkpoints" / "last.ckpt",
            f"is the run {b}'s, and {option} names {a}, which holds another run: the fit would train"
            f" version_1's weights over version_0's config.yaml and checkpoints; resume version_1 in its own"
            f" run with {option}=version_1, or none ({option}=null), or give the logger a new version",
        ),
        (
            outside,
            f"starts a new run, and {option} names {a}, which holds an earlier run: the fit would write over"
            f" its config.yaml and checkpoints; give the logger a new version, or none ({option}=null: a new"
            " run from that checkpoint)",
        ),
    ):
        with pytest.raises(SystemExit) as stop:
            main(["fit", *TINY, *pinned, f"--ckpt_path={ckpt}"])
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and len(err.splitlines()) == 1, err
        assert err == f"lit_ddp: error: --ckpt_path={ckpt} {line}", err
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in a.rglob("*") if p.is_file()} == before
    resumed = build_cli(["fit", *TINY, *pinned, f"--ckpt_path={a / 'checkpoints' / 'last.ckpt'}"])
    assert resumed.trainer.global_step == 4 and resumed.trainer.log_dir == str(a)
    empty = build_cli(
        ["fit", *TINY, *given, "--trainer.logger.init_args.version=5", f"--ckpt_path={outside}"]
    )
    assert empty.trainer.log_dir == str(tmp_path / "lightning_logs" / "version_5")
    own = build_cli(
        ["fit", *TINY, *given, f"--ckpt_path={b / 'checkpoints' / 'last.ckpt'}", "--trainer.max_epochs=2"]
    )
    assert own.trainer.global_step == 4 and own.trainer.log_dir == str(b)


def test_a_pinned_tensorboard_version_with_a_sub_dir_holding_a_config_alone_is_refused(
    tmp_path: Path, capsys
) -> None:
    """TensorBoard's `sub_dir` puts the run's config.yaml (its log_dir) in version_0/<sub_dir>: a run that
    stopped before its first checkpoint left it alone there, and a new fit into version_0 wrote over it."""
    given = [
        "--trainer.logger=TensorBoardLogger",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.logger.init_args.sub_dir=sub",
        "--trainer.logger.init_args.version=0",
    ]
    build_cli(["fit", *TINY, *given])
    run = tmp_path / "lightning_logs" / "version_0"
    for checkpoint in (run / "checkpoints").iterdir():  # stopped before its first checkpoint
        checkpoint.unlink()
    assert (run / "sub" / "config.yaml").is_file() and not (run / "config.yaml").exists()
    config = (run / "sub" / "config.yaml").read_bytes()
    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY, *given, "--seed_everything=1"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"lit_ddp: error: --trainer.logger.init_args.version names {run}, which holds"), err
    assert (run / "sub" / "config.yaml").read_bytes() == config


def test_a_new_fit_into_a_pinned_mlflow_run_that_holds_a_run_is_refused(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow's run_id of an earlier fit: its checkpoints folder and config.yaml were written over, and a
    second history logged into the run's metrics at the same steps. --ckpt_path=last resumes it."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in to a file store
    store = tmp_path / "mlruns"
    logger = ["--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={store.as_uri()}"]
    build_cli(["fit", *TINY, *logger])
    (run,) = [p.parent.parent for p in store.glob("*/*/checkpoints/last.ckpt")]
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    pinned = [*logger, f"--trainer.logger.init_args.run_id={run.name}"]
    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY, *pinned])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(
        f"lit_ddp: error: --trainer.logger.init_args.run_id names {run}, which holds an earlier run: a new"
        " fit would write over its config.yaml and checkpoints; resume that run with --ckpt_path=last"
    ), err
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()} == before
    resumed = build_cli(["fit", *TINY, *pinned, "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert resumed.trainer.global_step == 4 and resumed.trainer.logger.run_id == run.name


@pytest.mark.timeout(240)
def test_another_mlflow_runs_last_ckpt_into_a_pinned_run_is_refused(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run_id=A --ckpt_path=<B's last.ckpt>` trained B's weights into A's folder over A's last.ckpt and
    config.yaml (and logged B's steps into A's metrics): one line naming both; run_id=B resumes B."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in to a file store
    store = tmp_path / "mlruns"
    logger = ["--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={store.as_uri()}"]
    a, b = (Path(build_cli(["fit", *TINY, *logger]).trainer.checkpoint_callback.dirpath).parent for _ in "ab")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in a.rglob("*") if p.is_file()}
    b_last = f"--ckpt_path={b / 'checkpoints' / 'last.ckpt'}"
    option = "--trainer.logger.init_args.run_id"
    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY, *logger, f"{option}={a.name}", b_last, "--trainer.max_epochs=2"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert err == (
        f"lit_ddp: error: {b_last} is the run {b}'s, and {option} names {a}, which holds another run: the fit"
        f" would train {b.name}'s weights over {a.name}'s config.yaml and checkpoints; resume {b.name} in its"
        f" own run with {option}={b.name}, or none ({option}=null), or give the logger a new run_id"
    ), err
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in a.rglob("*") if p.is_file()} == before
    resumed = build_cli(["fit", *TINY, *logger, f"{option}={b.name}", b_last, "--trainer.max_epochs=2"])
    assert resumed.trainer.global_step == 4 and resumed.trainer.logger.run_id == b.name


@pytest.mark.timeout(240)
def test_last_and_best_with_a_pinned_mlflow_run_read_that_run_alone(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--ckpt_path=last` with the logger given run A's run_id resumed the experiment's newest run, B, and
    trained it into A's folder over A's last.ckpt. The run given is the one `last` and `best` read; a run
    with no last.ckpt, or one the store does not have (a traceback at the logger's creation), is one line."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in to a file store
    store = tmp_path / "mlruns"
    logger = ["--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={store.as_uri()}"]
    a, b = (Path(build_cli(["fit", *TINY, *logger]).trainer.checkpoint_callback.dirpath).parent for _ in "ab")
    b_files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in b.rglob("*") if p.is_file()}
    pinned = [*logger, f"--trainer.logger.init_args.run_id={a.name}"]
    resumed = build_cli(["fit", *TINY, *pinned, "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert resumed.plan.ckpt_path == str(a / "checkpoints" / "last.ckpt")
    assert resumed.trainer.global_step == 4 and resumed.trainer.logger.run_id == a.name
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in b.rglob("*") if p.is_file()} == b_files
    best = build_cli(["validate", *TINY, *pinned, "--ckpt_path=best"]).plan.ckpt_path
    assert Path(best).parent == a / "checkpoints", best
    empty = MlflowClient(store.as_uri()).create_run(a.parent.name).info.run_id
    unknown = "0" * 32
    for command, run_id, line in (
        ("validate", empty, f"the logger's run_id names the run {a.parent / empty}, which has no last.ckpt"),
        (
            "fit",
            unknown,
            f"--trainer.logger.init_args.run_id={unknown}: the MLflow store {store.as_uri()} has no",
        ),
    ):
        with pytest.raises(SystemExit) as stop:
            main([command, *TINY, *logger, f"--trainer.logger.init_args.run_id={run_id}", "--ckpt_path=last"])
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and len(err.splitlines()) == 1 and line in err, err


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_a_fit_resumed_inside_an_epoch_on_two_ranks_stops_inside_it_again(tmp_path: Path) -> None:
    """Every rank holds the resumed epoch open: a checkpoint inside it sums the training metric states over
    the ranks (a collective), which rank 0 alone ran, and the ranks hung (max_time, max_steps, a signal)."""
    spawn = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    args = ["fit", *TINY, *spawn, "--data.train_size=256", "--data.batch_size=16", "--dist_timeout=60"]
    args += [f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=2"]
    first = run_cli([*args, "--trainer.max_steps=2"], tmp_path, timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_cli([*args, "--trainer.max_steps=4", "--ckpt_path=last"], tmp_path, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 4
