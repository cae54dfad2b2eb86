"""Weights & Biases as a tracker, offline (no network, no account): the dashboard in the W&B run's files, the
run's folder under logs/, and ``--ckpt_path=last`` that goes on in the same W&B run.

An offline run keeps what it logged in ``<save_dir>/wandb/offline-run-<time>-<run id>/files/``: each image
as a PNG under ``media/images/<key>_<n>_<hash>.png``, each table as JSON under ``media/table/``, each saved
file as it is (docs/dashboard.md)."""

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import TINY_RUN, run_cli

FIT = ["fit", *TINY_RUN, "--trainer.accelerator=cpu"]
OFFLINE = ["--trainer.logger=WandbLogger", "--trainer.logger.init_args.offline=true"]


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """W&B offline, its settings, cache and default folder in ``tmp_path/wandb_home`` (nothing in the home or
    the current directory), for this process and the CLI runs it starts; the run it leaves open, closed."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    yield
    wandb.finish()  # WandbLogger leaves its run open: a later fit in this process would log into it
    # ...and the service that ran it, whose address wandb leaves in the environment: a CLI run started by a
    # later test would log through it, not through a service of its own (and find its resumed id in use)
    wandb.teardown()
    os.environ.pop("WANDB_SERVICE", None)


def offline_files(save_dir: Path, run_id: str) -> list[Path]:
    """The files/ folder of each offline W&B run with ``run_id`` under ``save_dir``, oldest first."""
    return sorted((save_dir / "wandb").glob(f"offline-run-*-{run_id}/files"))


@pytest.mark.timeout(300)
def test_a_fit_with_wandb_records_the_images_the_confusion_matrix_and_the_config_in_the_run(
    tmp_path: Path, offline_wandb
) -> None:
    """The dashboard's images and texts went to ./dashboard/ of the current directory and its checkpoints to
    ./<project>/<run id>/, beside the user's code; they are now the W&B run's, its folder under logs/."""
    import wandb
    from PIL import Image

    from lit_ddp.cli import build_cli

    logs = tmp_path / "logs"
    cli = build_cli([*FIT, *OFFLINE, f"--trainer.default_root_dir={logs}"])
    logger = cli.trainer.logger
    config = dict(logger.experiment.config)
    wandb.finish()

    # The project is the recipe's name (lightning_logs with none), as the TensorBoard logger's folder.
    assert logger.name == "lightning_logs"
    run = logs / "lightning_logs" / logger.version
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert "ShapesDataModule" in (run / "config.yaml").read_text()
    assert sorted(p.name for p in logs.iterdir()) == ["lightning_logs", "wandb"]

    (files,) = offline_files(logs, logger.version)
    (batch,) = (files / "media" / "images" / "train").glob("batch_*.png")
    (matrix,) = (files / "media" / "images" / "val").glob("confusion_matrix_*.png")
    assert Image.open(batch).size[0] > 64 and Image.open(matrix).mode == "RGB"
    (counts,) = (files / "media" / "table" / "val").glob("confusion_matrix_*.table.json")
    table = json.loads(counts.read_text())
    assert table["columns"][0] == "true \\ predicted" and table["columns"][-1] == "total"
    assert sum(row[-1] for row in table["data"]) == 16  # every validation image, counted once
    assert "| world size |" in (files / "lit_ddp" / "environment.md").read_text()
    assert "ShapesDataModule" in (files / "lit_ddp" / "config.yaml").read_text()
    assert config["trainer/world_size"] == 1 and config["data"] == "ShapesDataModule"

    # predict --ckpt_path=last scores that run's checkpoint in a W&B run of its own, whose folder holds its
    # config and its rows (they went to logs/predictions.csv, one file for every run)
    scored = build_cli(
        ["predict", *FIT[1:], *OFFLINE, f"--trainer.default_root_dir={logs}", "--ckpt_path=last"]
    )
    wandb.finish()
    assert scored.trainer.ckpt_path == str(run / "checkpoints" / "last.ckpt")
    rows = logs / "lightning_logs" / scored.trainer.logger.version / "predictions.csv"
    assert rows.is_file() and (rows.parent / "config.yaml").is_file()
    assert sorted(p.name for p in logs.iterdir()) == ["lightning_logs", "wandb"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stopped_wandb_run_resumes_in_the_same_run_to_the_uninterrupted_weights(
    tmp_path: Path, offline_wandb
) -> None:
    """The issue's two commands: the second found no checkpoint (Lightning's warning), trained from epoch 1
    in a new W&B run, exit 0. It now resumes the first run's last.ckpt, epoch 3 only, in the same run id,
    and ends with the weights of an uninterrupted 3-epoch fit; nothing lands in the current directory but
    logs/."""
    from lit_ddp.cli import build_cli

    same = [*FIT, "--model.optim.schedule=constant"]  # a schedule that does not depend on max_epochs
    args = [*same, *OFFLINE, "--trainer.logger.init_args.project=litddp"]
    work = tmp_path / "work"
    first = run_cli([*args, "--trainer.max_epochs=2"], cwd=work)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_cli([*args, "--trainer.max_epochs=3", "--ckpt_path=last"], cwd=work)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    assert sorted(p.name for p in work.iterdir()) == ["logs"]
    (run,) = (work / "logs" / "litddp").iterdir()
    last = run / "checkpoints" / "last.ckpt"
    output = resumed.stdout + resumed.stderr
    assert f"resuming from {last.relative_to(work)}" in output
    assert f"continuing W&B run {run.name} (project litddp)" in output
    assert "epoch 3/3" in output and "epoch 1/3" not in output and "epoch 2/3" not in output
    assert len(offline_files(work / "logs", run.name)) == 2  # the first run and its resume: one run id

    reference = build_cli([*same, "--trainer.max_epochs=3", f"--trainer.default_root_dir={tmp_path / 'ref'}"])
    want = reference.trainer.lightning_module.state_dict()
    got = torch.load(last, weights_only=True)
    assert got["global_step"] == reference.trainer.global_step == 6  # 3 epochs of 2 batches
    for key, value in want.items():
        torch.testing.assert_close(got["state_dict"][key], value, rtol=0, atol=0, msg=key)


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_a_ddp_spawn_wandb_run_resumes_in_the_same_run_and_folder(tmp_path: Path, offline_wandb) -> None:
    """Under ddp_spawn the resume logged into a new W&B run with a checkpoints folder of its own: spawning
    pickles the CLI's config with the trainer, and the logger there (the one the resume replaced) started a
    W&B run without an id, which the resumed logger then joined. Now one run id, one folder, epoch 2 in it."""
    spawn = ["--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    args = [*FIT, *spawn, *OFFLINE, "--trainer.logger.init_args.project=litddp"]
    work = tmp_path / "work"
    first = run_cli(args, cwd=work)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_cli([*args, "--trainer.max_epochs=2", "--ckpt_path=last"], cwd=work)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    logs = work / "logs"
    (run,) = (logs / "litddp").iterdir()
    output = resumed.stdout + resumed.stderr
    assert f"continuing W&B run {run.name} (project litddp)" in output
    assert "wandb run already in progress" not in output  # the replaced logger's, pickled for the ranks
    assert f"run saved in {run.relative_to(work)}" in output
    assert len(offline_files(logs, run.name)) == 2  # the first run and its resume: one run id
    assert {p.name.rsplit("-", 1)[-1] for p in (logs / "wandb").glob("offline-run-*")} == {run.name}
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (1, 2)  # the second epoch (from 0), one batch a rank each


def test_tensorboards_last_leaves_a_wandb_run_in_the_same_recipe_folder_alone(tmp_path: Path, caplog) -> None:
    """W&B's default project is the recipe's name, so its runs' folders sit beside TensorBoard's version_N in
    logs/<recipe>/: TensorBoard's `last` took the newest of either and would have written its events into
    the W&B run's folder. A folder with a W&B run's files in <save_dir>/wandb/ is not a TensorBoard run."""
    import shutil

    from lit_ddp.cli import build_cli

    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli([*FIT, root])
    runs = tmp_path / "lightning_logs"
    wandb_run = runs / "3f2a9xk1"  # a W&B run of the same model and data, newer
    shutil.copytree(runs / "version_0", wandb_run)
    newer = (runs / "version_0" / "checkpoints" / "last.ckpt").stat().st_mtime + 60
    os.utime(wandb_run / "checkpoints" / "last.ckpt", (newer, newer))
    (tmp_path / "wandb" / "offline-run-20260101_000000-3f2a9xk1").mkdir(parents=True)
    with caplog.at_level("INFO"):
        resumed = build_cli([*FIT, root, "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert f"resuming from {runs / 'version_0' / 'checkpoints' / 'last.ckpt'}" in caplog.messages
    assert resumed.trainer.logger.version == 0
    assert len(list(wandb_run.glob("events.out.tfevents.*"))) == 1  # the copy's own, none added


def test_an_online_wandb_run_without_an_api_key_is_one_line_naming_login_and_offline(tmp_path: Path) -> None:
    """README's `fit --trainer.logger=WandbLogger` on a machine not logged in to W&B, with no terminal to ask
    for a key on (a batch job): W&B's UsageError came out as a 40-line traceback, exit 1. It is one line
    with W&B's reason and both ways on (log in, or log offline), exit 2, and nothing is left under logs/."""
    pytest.importorskip("wandb")
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "NETRC": str(home / ".netrc"),  # none: W&B reads no key from it
        "WANDB_API_KEY": "",
        "WANDB_MODE": "online",
        **{name: str(home / name.lower()) for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR")},
    }
    work = tmp_path / "work"
    proc = run_cli([*FIT, "--trainer.logger=WandbLogger", "--trainer.logger.init_args.project=shapes"],
                   cwd=work, env=env, input="")  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("lit_ddp: error:")]
    assert "UsageError: No API key configured" in line
    assert "`wandb login`" in line and "--trainer.logger.init_args.offline=true" in line
    assert not (work / "logs").exists() or not any((work / "logs").rglob("*.ckpt"))


@pytest.mark.parametrize("key", ["id", "version"])
def test_a_new_fit_into_a_wandb_run_id_that_holds_a_run_is_refused(
    tmp_path: Path, offline_wandb, capsys, key: str
) -> None:
    """A second fit with no --ckpt_path given an earlier run's `id` wrote its config.yaml, last.ckpt and best
    over that run's (and a second history into the W&B run): one line before anything is built, naming the
    run's last.ckpt to resume it by. WandbLogger takes the id as `version` too."""
    from lit_ddp.cli import build_cli, main

    given = [
        *FIT,
        *OFFLINE,
        f"--trainer.logger.init_args.{key}=myrun",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    build_cli(given)
    run = tmp_path / "lightning_logs" / "myrun"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()  # the first fit's own lines
    with pytest.raises(SystemExit) as stop:
        main(given)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(
        f"lit_ddp: error: --trainer.logger.init_args.{key} names {run}, which holds an earlier run: a new fit"
        f" would write over its config.yaml and checkpoints; resume that run with"
        f" --ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    ), err
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()} == before
