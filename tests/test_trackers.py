"""The dashboard through the logger a user picks: a real MLflow file store and a CSV log, read back.

What each logger holds: MLflow the scalars, the images (key and step), the texts and the parameters;
CSVLogger the scalars in metrics.csv and the rest as files in its run directory (docs/dashboard.md)."""

import csv
from pathlib import Path

import pytest
from conftest import TINY_RUN, TINY_SHAPES, WITH_PROBES, run_cli

FIT = ["fit", *TINY_RUN, "--trainer.accelerator=cpu"]


@pytest.mark.timeout(180)
def test_a_fit_with_mlflow_records_val_acc_images_and_texts_in_the_file_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in to a file store
    from mlflow.tracking import MlflowClient
    from PIL import Image

    from lit_ddp.cli import build_cli

    uri = (tmp_path / "mlruns").as_uri()
    logger = ["--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={uri}"]
    logger += ["--trainer.logger.init_args.experiment_name=shapes"]
    build_cli([*FIT, *logger, f"--trainer.default_root_dir={tmp_path}"])

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("shapes").experiment_id])
    acc = [m.value for m in client.get_metric_history(run.info.run_id, "val/acc")]
    assert len(acc) == 1 and 0.0 <= acc[0] <= 1.0
    assert {"train/loss_epoch", "val/loss", "perf/images_per_s"} <= set(run.data.metrics)
    params = run.data.params
    assert params["trainer/world_size"] == "1" and params["data/class"] == "ShapesDataModule"

    def artifacts(path: str = "") -> set[str]:
        found = set()
        for item in client.list_artifacts(run.info.run_id, path):
            found |= artifacts(item.path) if item.is_dir else {item.path}
        return found

    files = artifacts()
    assert {"config.yaml", "environment.md"} <= files
    assert any(f.startswith("val/confusion_matrix/") and f.endswith(".md") for f in files)
    # log_image with a key and a step: a PNG per (key, step) under images/ (the name's separators vary
    # between MLflow releases: only the key's words are read here)
    images = [f for f in files if f.startswith("images/") and f.endswith(".png")]
    (batch,) = [f for f in images if "train" in f and "batch" in f]
    assert len([f for f in images if "confusion_matrix" in f]) == 1
    png = Path(client.download_artifacts(run.info.run_id, batch, str(tmp_path / "dl")))
    assert Image.open(png).mode == "RGB" and Image.open(png).size[0] > 64
    local = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path / "dl")))
    assert "ShapesDataModule" in local.read_text()


@pytest.mark.timeout(240)
def test_mlflow_on_a_database_saves_the_config_beside_the_checkpoints_and_last_and_best_find_them(
    tmp_path: Path, caplog
) -> None:
    """The README's MLflow command (a SQLite tracking store, no local artifact folder): Lightning's config
    callback stopped on an AssertionError (Trainer.log_dir is None for such a logger), --ckpt_path=last
    started from scratch with only a warning (no versioned folders to search), and predict wrote its rows
    into the working directory."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from lit_ddp.cli import build_cli
    from lit_ddp.runtime.mlflow_resume import CHANGED_TAG

    logger = [
        "--trainer.logger=MLFlowLogger",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/m.db",
        f"--trainer.logger.init_args.artifact_location={tmp_path / 'artifacts'}",  # not ./mlruns
    ]
    root = f"--trainer.default_root_dir={tmp_path / 'logs'}"
    first = build_cli([*FIT, *logger, root])
    run = Path(first.trainer.checkpoint_callback.dirpath).parent
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert "ShapesDataModule" in (run / "config.yaml").read_text()

    # The resume goes on in the same MLflow run (each resume made a new one, with a checkpoint folder of its
    # own), and a setting it changes keeps the run's first value, said once: MLflow refuses a change.
    again = [*FIT, *logger, root, "--ckpt_path=last", "--trainer.max_epochs=2", "--data.num_workers=1"]
    with caplog.at_level("INFO"):
        resumed = build_cli(again)
    assert f"resuming from {run / 'checkpoints' / 'last.ckpt'}" in caplog.messages
    assert resumed.trainer.current_epoch == 2 and resumed.trainer.global_step == 2 * first.trainer.global_step
    assert resumed.trainer.logger.run_id == run.name
    assert Path(resumed.trainer.checkpoint_callback.dirpath).parent == run
    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    (only,) = client.search_runs([run.parent.name])
    assert [m.step for m in client.get_metric_history(only.info.run_id, "val/acc")] == [1, 3]
    assert only.data.params["num_workers"] == "0"
    assert only.data.tags[CHANGED_TAG] == "num_workers: 0 -> 1; trainer/max_epochs: 1 -> 2"
    assert any("this fit changed num_workers (0 -> 1)" in m for m in caplog.messages)
    # The run's own settings too (they kept their first value in silence, the config.yaml saying another)
    assert only.data.params["trainer/max_epochs"] == "1"
    assert any("this fit changed trainer/max_epochs (1 -> 2)" in m for m in caplog.messages)
    scored = build_cli(["validate", *TINY_RUN, *logger, root, "--ckpt_path=best"])
    assert Path(scored.trainer.ckpt_path).parent.parent.parent == run.parent  # a run of that experiment
    # predict's rows go into its own run's folder, beside its config.yaml (they went to the working directory)
    build_cli(["predict", *TINY_RUN, *logger, root, "--ckpt_path=last"])
    (rows,) = (tmp_path / "logs").glob("*/*/predictions.csv")
    assert (rows.parent / "config.yaml").is_file() and rows.parent.parent == run.parent


@pytest.mark.timeout(180)
def test_a_fit_with_csv_logger_records_val_acc_and_writes_the_dashboard_as_files(tmp_path: Path) -> None:
    from PIL import Image

    from lit_ddp.cli import build_cli

    logger = ["--trainer.logger=CSVLogger", f"--trainer.logger.init_args.save_dir={tmp_path / 'csv'}"]
    cli = build_cli([*FIT, *logger, f"--trainer.default_root_dir={tmp_path}"])

    run_dir = Path(cli.trainer.logger.log_dir)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    acc = [float(r["val/acc"]) for r in rows if r.get("val/acc")]
    assert len(acc) == 1 and 0.0 <= acc[0] <= 1.0
    dashboard = run_dir / "dashboard"
    (batch,) = (dashboard / "train" / "batch").glob("step_*.png")
    (matrix,) = (dashboard / "val" / "confusion_matrix").glob("step_*.png")
    assert Image.open(batch).size[0] > 64 and Image.open(matrix).mode == "RGB"
    (counts,) = (dashboard / "val" / "confusion_matrix").glob("step_*.md")
    assert counts.read_text().startswith("| true \\ predicted |")
    assert "| world size |" in (dashboard / "environment.md").read_text()
    assert "trainer/world_size: 1" in (run_dir / "hparams.yaml").read_text()
    assert (run_dir / "config.yaml").is_file()


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_two_processes_with_csv_logger_write_one_run_folder_from_rank_zero(tmp_path: Path) -> None:
    """The sinks run on rank 0 only and ask no collective: a 2-process fit finishes and writes once."""
    args = [*FIT, "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.logger=CSVLogger"]
    args += [f"--trainer.logger.init_args.save_dir={tmp_path / 'csv'}"]
    args += [f"--trainer.default_root_dir={tmp_path}"]
    result = run_cli(args, cwd=tmp_path, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "csv" / "lightning_logs").iterdir()
    with open(run_dir / "metrics.csv") as f:
        assert [r["val/acc"] for r in csv.DictReader(f) if r.get("val/acc")] != []
    assert len(list((run_dir / "dashboard" / "val" / "confusion_matrix").glob("step_*.png"))) == 1


def test_a_failed_runs_cleanup_leaves_a_logger_without_a_local_folder_alone(tmp_path: Path) -> None:
    """A UserError in set-up (bad data) with MLflow on a database: the cleanup of the failed run's folder
    raised a TypeError (Path(None)) over the user's one line; there is no local folder to remove."""
    pytest.importorskip("mlflow")
    import lightning as L
    from lightning.pytorch.loggers import MLFlowLogger

    from lit_ddp.errors import UserError
    from lit_ddp.runtime.failed_run import RemoveFailedRunDir

    logger = MLFlowLogger(tracking_uri=f"sqlite:///{tmp_path}/m.db", artifact_location=str(tmp_path / "a"))
    trainer = L.Trainer(logger=logger, accelerator="cpu", default_root_dir=tmp_path)
    RemoveFailedRunDir().on_exception(trainer, None, UserError("bad data"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.db"]


@pytest.mark.timeout(180)
def test_a_resume_whose_mlflow_run_was_deleted_logs_into_a_new_run(tmp_path: Path, caplog) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from lit_ddp.cli import build_cli

    uri = f"sqlite:///{tmp_path}/m.db"
    args = [*FIT, "--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={uri}"]
    args += [f"--trainer.logger.init_args.artifact_location={tmp_path / 'artifacts'}"]
    args += [f"--trainer.default_root_dir={tmp_path / 'logs'}"]
    first = build_cli(args)
    old = first.trainer.logger.run_id
    MlflowClient(uri).delete_run(old)
    with caplog.at_level("INFO"):
        resumed = build_cli([*args, "--ckpt_path=last", "--trainer.max_epochs=2"])
    said = f"MLflow run {old}, whose folder holds"
    assert any(said in m and "new MLflow run" in m for m in caplog.messages)
    assert resumed.trainer.logger.run_id != old and resumed.trainer.current_epoch == 2


def test_a_resumed_mlflow_run_compares_parameters_flattened_as_mlflow_logger_logs_them() -> None:
    """ResumedMLFlowLogger tells a changed parameter by its key as MLFlowLogger flattens it: should
    Lightning flatten otherwise, a changed value would reach MLflow again (and stop the run)."""
    from argparse import Namespace
    from dataclasses import dataclass

    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict

    from lit_ddp.runtime.mlflow_resume import flat_params

    @dataclass
    class Optim:
        lr: float = 0.1
        betas: tuple = (0.9, 0.999)

    params = {
        "optim": Optim(),
        "data": Namespace(batch_size=32, sizes=[1, 2], none=None),
        "groups": [{"a": 1}, {"b": {"c": 2}}],
        "empty": {},
        "top_k": [1, 5],
        3: "int key",
    }
    assert flat_params(params) == _flatten_dict(_convert_params(params))
    assert flat_params(Namespace(**{"x": {"y": 1}})) == {"x/y": 1}


def test_a_resumed_csv_run_keeps_the_rows_of_its_earlier_epochs(tmp_path: Path) -> None:
    """Lightning's CSV writer deletes metrics.csv when it opens an existing run folder: the resumed run,
    which goes on in its own version_N, kept only its own epoch's rows."""
    from lit_ddp.cli import build_cli

    logger = ["--trainer.logger=CSVLogger", f"--trainer.logger.init_args.save_dir={tmp_path / 'csv'}"]
    args = [*FIT, *logger, f"--trainer.default_root_dir={tmp_path}"]
    build_cli(args)
    metrics = tmp_path / "csv" / "lightning_logs" / "version_0" / "metrics.csv"
    first = list(csv.DictReader(metrics.open()))
    build_cli([*args, "--ckpt_path=last", "--trainer.max_epochs=2"])
    rows = list(csv.DictReader(metrics.open()))
    assert sorted({r["epoch"] for r in rows}) == ["0", "1"]
    assert [r["epoch"] for r in rows if r["val/acc"]] == ["0", "1"]  # one validation per epoch
    # The first run's rows as they were (a column added later is empty in them).
    assert [{k: r[k] for k in first[0]} for r in rows[: len(first)]] == first


def test_a_csv_run_resumed_from_the_path_of_its_last_checkpoint_keeps_its_rows_as_last_does(
    tmp_path: Path,
) -> None:
    """`--ckpt_path=<the run>/checkpoints/last.ckpt` started version_1 with a metrics.csv of its own epoch,
    where `--ckpt_path=last` goes on in version_0's file."""
    from lit_ddp.cli import build_cli

    logger = ["--trainer.logger=CSVLogger", f"--trainer.logger.init_args.save_dir={tmp_path / 'csv'}"]
    args = [*FIT, *logger, f"--trainer.default_root_dir={tmp_path}"]
    build_cli(args)
    run = tmp_path / "csv" / "lightning_logs" / "version_0"
    first = list(csv.DictReader((run / "metrics.csv").open()))
    build_cli([*args, f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "--trainer.max_epochs=2"])
    assert [p.name for p in run.parent.iterdir()] == ["version_0"]
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [r["epoch"] for r in rows if r["val/acc"]] == ["0", "1"]
    assert [{k: r[k] for k in first[0]} for r in rows[: len(first)]] == first


@pytest.mark.timeout(240)
def test_tensorboard_and_csv_loggers_under_one_name_write_one_run_folder_and_a_resume_continues_it(
    tmp_path: Path,
) -> None:
    """Each versioned logger picked its own next version_N: TensorBoard made version_0 and CSV, finding it,
    took version_1, and a resume continued TensorBoard's folder while CSV started version_2."""
    from lit_ddp.cli import build_cli

    config = tmp_path / "loggers.yaml"
    config.write_text(
        "trainer:\n  logger:\n"
        + "".join(
            f"    - class_path: lightning.pytorch.loggers.{kind}\n"
            f"      init_args: {{save_dir: {tmp_path / 'logs'}, name: run}}\n"
            for kind in ("TensorBoardLogger", "CSVLogger")
        )
    )
    args = [*FIT, f"--config={config}", f"--trainer.default_root_dir={tmp_path}"]
    build_cli(args)
    build_cli([*args, "--ckpt_path=last", "--trainer.max_epochs=2"])
    (run_dir,) = (tmp_path / "logs" / "run").iterdir()
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 2  # the first run and its resume
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert [r["epoch"] for r in rows if r["val/acc"]] == ["0", "1"]


@pytest.mark.timeout(240)
def test_tensorboard_and_csv_loggers_in_two_save_dirs_name_the_run_alike_and_a_resume_continues_both(
    tmp_path: Path,
) -> None:
    """TensorBoard in logs/ and CSV in csv/: each picked its own next version_N, and a resume, which goes on
    in the run TensorBoard's folder names, took the CSV logger's next one (csv/.../version_0 and version_1).
    Every versioned logger of a new run takes the first version free under each of them (version_0 in csv/
    is an earlier CSV run's here), and a resume goes on in both folders."""
    from lit_ddp.cli import build_cli

    earlier = tmp_path / "csv" / "lightning_logs" / "version_0" / "metrics.csv"
    earlier.parent.mkdir(parents=True)
    earlier.write_text("epoch,step,val/acc\n0,3,0.25\n")
    config = tmp_path / "loggers.yaml"
    config.write_text(
        "trainer:\n  logger:\n"
        + "".join(
            f"    - class_path: lightning.pytorch.loggers.{kind}\n"
            f"      init_args: {{save_dir: {tmp_path / save_dir}}}\n"
            for kind, save_dir in (("TensorBoardLogger", "logs"), ("CSVLogger", "csv"))
        )
    )
    args = [*FIT, f"--config={config}", f"--trainer.default_root_dir={tmp_path}"]
    build_cli(args)
    build_cli([*args, "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert [p.name for p in (tmp_path / "logs" / "lightning_logs").iterdir()] == ["version_1"]
    assert sorted(p.name for p in earlier.parent.parent.iterdir()) == ["version_0", "version_1"]
    assert earlier.read_text() == "epoch,step,val/acc\n0,3,0.25\n"
    with (earlier.parent.parent / "version_1" / "metrics.csv").open(newline="") as f:
        assert [r["epoch"] for r in csv.DictReader(f) if r["val/acc"]] == ["0", "1"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", ["unknown scheme", "nothing listening"])
def test_an_mlflow_store_that_cannot_be_used_is_one_line_before_the_run(tmp_path: Path, store: str) -> None:
    """An unknown scheme was a 107-line traceback from the logger's creation; a server that does not answer
    was 264 s of retries, then 134 lines. Now one line, with a single try of the store before the run."""
    pytest.importorskip("mlflow")
    import socket
    import time

    from lit_ddp.cli import build_cli
    from lit_ddp.errors import UserError

    with socket.socket() as bound:  # bound, never listening: a connection to it is refused at once
        bound.bind(("127.0.0.1", 0))
        uri = "foo://bar" if store == "unknown scheme" else f"http://127.0.0.1:{bound.getsockname()[1]}"
        logger = ["--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={uri}"]
        started = time.monotonic()
        with pytest.raises(UserError) as err:
            build_cli([*FIT, *logger, f"--trainer.default_root_dir={tmp_path}"])
        elapsed = time.monotonic() - started
    line = str(err.value)
    if store == "unknown scheme":
        assert line.startswith(f"--trainer.logger.init_args.tracking_uri={uri}: MLflow has no tracking store")
        assert "sqlite:" in line and "http:" in line
    else:
        assert line.startswith(f"the MLflow tracking server {uri} does not answer (ConnectionError)")
        assert elapsed < 60  # MLflow's own retries take minutes
    assert not list(tmp_path.iterdir())  # stopped before the run made its folder


@pytest.mark.timeout(60)
def test_the_mlflow_store_is_asked_only_for_the_run_the_logger_is_given() -> None:
    """With a run_id, the preflight also asked a server for the experiment named, whose answer it never used:
    a request more per run. Now the run alone; a server that does not answer is still one line."""
    pytest.importorskip("mlflow")
    import json
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from lit_ddp.preflight.mlflow import store_problem

    run_id, asked = "a" * 32, []

    class Server(BaseHTTPRequestHandler):  # answers every request with an active run in experiment 1
        def do_GET(self) -> None:
            asked.append(self.path.partition("?")[0])
            info = {"run_id": run_id, "experiment_id": "1", "lifecycle_stage": "active"}
            body = json.dumps({"run": {"info": info}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Server) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        uri = f"http://127.0.0.1:{server.server_port}"
        try:
            assert store_problem(uri, "lightning_logs", run_id) is None
        finally:
            server.shutdown()
    assert asked == ["/api/2.0/mlflow/runs/get"]
    with socket.socket() as bound:  # bound, never listening: a connection to it is refused at once
        bound.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{bound.getsockname()[1]}"
        line = store_problem(uri, "lightning_logs", run_id)
    assert line.startswith(f"the MLflow tracking server {uri} does not answer (ConnectionError)")


class _Planned(BaseException):
    """Raised where the CLI would build the classes: the preflight has run, nothing is built."""


@pytest.mark.parametrize("given", [True, False], ids=["run_id", "experiment"])
def test_one_preflight_asks_the_mlflow_store_for_the_run_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: bool
) -> None:
    """`fit --ckpt_path=last` with an MLflow logger asked the store for the run it is given twice (the runs
    `last` searches, then the store row), and for the experiment named twice where it is given none."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    from lit_ddp.cli import LitDDPCLI, build_cli

    store = f"file:{tmp_path / 'mlruns'}"
    client = MlflowClient(store)
    run_id = client.create_run(client.create_experiment("lightning_logs")).info.run_id
    asked = []

    def spy(method: str):
        real = getattr(MlflowClient, method)
        return lambda self, *args, **kwargs: asked.append((method, *args)) or real(self, *args, **kwargs)

    def planned(*_) -> None:
        raise _Planned

    for method in ("get_run", "get_experiment_by_name"):
        monkeypatch.setattr(MlflowClient, method, spy(method))
    monkeypatch.setattr(LitDDPCLI, "instantiate_classes", planned)
    logger = ["--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={store}"]
    logger += [f"--trainer.logger.init_args.run_id={run_id}"] if given else []
    with pytest.raises(_Planned):
        build_cli([*FIT, *logger, "--ckpt_path=last", f"--trainer.default_root_dir={tmp_path}"])
    assert asked == ([("get_run", run_id)] if given else [("get_experiment_by_name", "lightning_logs")])


@pytest.mark.timeout(300)
def test_a_csv_logger_after_mlflow_goes_on_in_the_runs_folder_when_the_fit_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow first and CSV second: `fit --ckpt_path=last` went on in the MLflow run, and the CSV logger
    took its next version_N, so the run's rows were split over two folders. The CSV folder is named after
    the MLflow run, and the resume appends to its metrics.csv."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in to a file store
    from lit_ddp.cli import build_cli

    loggers = tmp_path / "loggers.yaml"
    loggers.write_text(
        "trainer:\n  logger:\n"
        "    - class_path: lightning.pytorch.loggers.MLFlowLogger\n"
        f"      init_args: {{tracking_uri: {(tmp_path / 'mlruns').as_uri()}, experiment_name: shapes}}\n"
        "    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {tmp_path / 'csv'}, name: shapes}}\n"
    )
    args = [*FIT, f"--config={loggers}", f"--trainer.default_root_dir={tmp_path}"]
    run = Path(build_cli(args).trainer.checkpoint_callback.dirpath).parent
    build_cli([*args, "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert [p.name for p in (tmp_path / "csv" / "shapes").iterdir()] == [run.name]  # the MLflow run's id
    with (tmp_path / "csv" / "shapes" / run.name / "metrics.csv").open(newline="") as f:
        assert {row["epoch"] for row in csv.DictReader(f)} == {"0", "1"}


@pytest.mark.timeout(300)
def test_mlflow_on_a_file_store_keeps_each_runs_config_in_its_own_folder_beside_its_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trainer.log_dir is a file store's root for MLflow, which every run shares: each run's config.yaml
    (and predict's rows) went there, over the last run's, and a resume read no config.yaml of its run (its
    seed)."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in to a file store
    import yaml

    from lit_ddp.cli import build_cli

    store = tmp_path / "mlruns"
    logger = ["--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={store.as_uri()}"]
    args = [*FIT, *logger, f"--trainer.default_root_dir={tmp_path}", "--seed_everything=true"]
    runs = [Path(build_cli(args).trainer.checkpoint_callback.dirpath).parent for _ in range(2)]

    def seed(run: Path) -> int:
        return yaml.safe_load((run / "config.yaml").read_text())["seed_everything"]

    assert runs[0] != runs[1] and all((run / "checkpoints" / "last.ckpt").is_file() for run in runs)
    seeds = [seed(run) for run in runs]  # each run's own drawn seed
    assert seeds[0] != seeds[1] and not (store / "config.yaml").exists()
    # The resume of the newest run takes the seed its config.yaml records and leaves that file its own.
    resumed = build_cli([*args, "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert Path(resumed.trainer.checkpoint_callback.dirpath).parent == runs[1]
    assert resumed.config.fit.seed_everything == seeds[1] and seed(runs[1]) == seeds[1]
    build_cli(["predict", *TINY_RUN, *logger, f"--trainer.default_root_dir={tmp_path}", "--ckpt_path=last"])
    (rows,) = store.glob("*/*/predictions.csv")
    assert (rows.parent / "config.yaml").is_file() and not (store / "predictions.csv").exists()


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(900)
def test_sigterm_under_ddp_spawn_with_mlflow_stops_cleanly_and_the_resume_goes_on_in_the_same_run(
    tmp_path: Path,
) -> None:
    """ddp_spawn's rank ended MLflow's run with the status "interrupted", which MLflow has not: the stop that
    had saved last.ckpt ended in a traceback and exit 1, not exit 0 (a requeue script reads it as a crash)."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    args = ["fit", *TINY_SHAPES, "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.max_epochs=2"]
    args += [
        "--trainer.strategy=ddp_spawn",
        "--trainer.enable_progress_bar=false",
        "--trainer.log_every_n_steps=1",
    ]
    args += ["--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={uri}"]
    args += [
        f"--trainer.logger.init_args.artifact_location={tmp_path / 'artifacts'}",
        "--trainer.default_root_dir=logs",
    ]
    fault = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigterm"]
    fault += ["--trainer.callbacks.rank=0", "--trainer.callbacks.at_step=5"]  # epoch 2's second batch
    fault += ["--resilience.check_every_n_batches=1"]  # the stop lands within the epoch
    stopped = run_cli([*args, *fault], cwd=tmp_path, env=WITH_PROBES, timeout=420, new_session=True)
    assert stopped.returncode == 0 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert "stopped by SIGTERM at epoch 2, step 7 (mid-epoch" in stopped.stdout + stopped.stderr
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lightning_logs").experiment_id])
    assert run.info.status == "FAILED"  # as Lightning ends a stopped run under every other strategy
    resumed = run_cli([*args, "--ckpt_path=last"], cwd=tmp_path, timeout=420)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (run,) = client.search_runs([run.info.experiment_id])  # the same run, finished, each step once
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss_step")]
    assert sorted(steps) == list(range(8))


@pytest.mark.timeout(120)
def test_an_mlflow_experiment_deleted_in_the_store_is_one_line_before_the_run(tmp_path: Path) -> None:
    """MLFlowLogger, finding the experiment deleted, created it again under the same name, which the store
    refuses: a 116-line traceback of SQL. Now one line naming the experiment and both ways out."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    gone = client.create_experiment("shapes", artifact_location=str(tmp_path / "artifacts"))
    client.delete_experiment(gone)
    logger = ["--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={uri}"]
    logger += ["--trainer.logger.init_args.experiment_name=shapes"]
    result = run_cli([*FIT, *logger, "--trainer.default_root_dir=logs"], cwd=tmp_path / "work", timeout=100)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"lit_ddp: error: the MLflow experiment 'shapes' in {uri} was deleted: restore it"
        f" (MLFLOW_TRACKING_URI={uri} mlflow experiments restore --experiment-id {gone}), or pass"
        " --trainer.logger.init_args.experiment_name=<another name>"
    )
    assert not (tmp_path / "work" / "logs").exists()
    assert client.get_experiment(gone).lifecycle_stage == "deleted"  # left as it was


@pytest.mark.timeout(240)
def test_a_resume_with_two_mlflow_loggers_continues_the_first_ones_run_alone(tmp_path: Path) -> None:
    """Every plain MLFlowLogger of the list was given the run of the checkpoint's folder: the second logged
    each scalar into the first one's run again (val/acc twice at a step) and its own experiment got none."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from lit_ddp.cli import build_cli

    uri = f"sqlite:///{tmp_path}/m.db"
    config = tmp_path / "loggers.yaml"
    config.write_text(
        "trainer:\n  logger:\n"
        + "".join(
            f"    - class_path: MLFlowLogger\n      init_args: {{tracking_uri: '{uri}',"
            f" experiment_name: {name}, artifact_location: '{tmp_path / name}'}}\n"
            for name in ("a", "b")
        )
    )
    args = [*FIT, f"--config={config}", f"--trainer.default_root_dir={tmp_path / 'logs'}"]
    build_cli(args)
    build_cli([*args, "--ckpt_path=last", "--trainer.max_epochs=2"])
    client = MlflowClient(uri)

    def val_acc_steps(name: str) -> list[list[int]]:
        runs = client.search_runs(
            [client.get_experiment_by_name(name).experiment_id], order_by=["start_time"]
        )
        return [sorted(m.step for m in client.get_metric_history(r.info.run_id, "val/acc")) for r in runs]

    assert val_acc_steps("a") == [[1, 3]]  # the run the checkpoint's folder is named after, continued
    assert sorted(val_acc_steps("b")) == [[1], [3]]  # the second logger's: a new run, as Lightning starts one


@pytest.mark.timeout(240)
def test_last_resumes_a_run_of_the_mlflow_experiment_named_never_another_experiments(
    tmp_path: Path, caplog
) -> None:
    """MLflow keeps each experiment's run folders under its id, beside the others': `--ckpt_path=last`
    searched them all, and a fit of experiment b resumed experiment a's newest run (trained it, logged into
    it, and rewrote its config.yaml with b's name)."""
    pytest.importorskip("mlflow")
    from lit_ddp.cli import build_cli

    uri = f"sqlite:///{tmp_path}/m.db"
    args = [*FIT, "--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={uri}"]
    args += [f"--trainer.logger.init_args.artifact_location={tmp_path / 'artifacts'}"]
    args += [f"--trainer.default_root_dir={tmp_path / 'logs'}"]
    first = build_cli([*args, "--trainer.logger.init_args.experiment_name=a"])
    last = Path(first.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    written = last.stat().st_mtime_ns
    with caplog.at_level("INFO"):
        other = build_cli([*args, "--trainer.logger.init_args.experiment_name=b", "--ckpt_path=last"])
    assert other.trainer.logger.run_id != first.trainer.logger.run_id and other.trainer.current_epoch == 1
    assert any(m.startswith("lit_ddp: note: --ckpt_path=last: no run under") for m in caplog.messages)
    assert last.stat().st_mtime_ns == written  # a's run as it was
    again = [
        *args,
        "--trainer.logger.init_args.experiment_name=a",
        "--ckpt_path=last",
        "--trainer.max_epochs=2",
    ]
    resumed = build_cli(again)
    assert resumed.trainer.logger.run_id == first.trainer.logger.run_id and resumed.trainer.current_epoch == 2


@pytest.mark.timeout(240)
def test_each_mlflow_run_gets_a_name_of_its_own_and_the_seeded_run_trains_alike(tmp_path: Path) -> None:
    """MLflow names a new run from Python's `random`, which the run's seed has just fixed: every run of a
    store was "overjoyed-slug-911". The name is drawn from a fresh state, and the seeded one kept."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from lit_ddp.cli import build_cli

    uri = f"sqlite:///{tmp_path}/m.db"
    args = [*FIT, "--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={uri}"]
    args += [f"--trainer.logger.init_args.artifact_location={tmp_path / 'artifacts'}"]
    args += [f"--trainer.default_root_dir={tmp_path / 'logs'}"]
    runs = [build_cli(args) for _ in range(2)]
    client = MlflowClient(uri)
    names = {client.get_run(cli.trainer.logger.run_id).info.run_name for cli in runs}
    assert len(names) == 2, names
    first, second = (cli.trainer.callback_metrics["val/acc"].item() for cli in runs)
    assert first == second  # the seed's draws are the run's, as before
