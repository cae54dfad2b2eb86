"""A fit preempted (SIGTERM) and resumed with ``--ckpt_path=last`` shows what the uninterrupted fit shows.

The weights of such a resume are the uninterrupted run's (test_resume_cut_short.py); this is what a user
reads: TensorBoard's scalars across the run folder's two event files, the CSV logger's metrics.csv and
MLflow's metric history. Every scalar has the uninterrupted run's steps, none missing, none twice, none past
the end, with its values; the wall-clock perf/* values are compared by their steps only: one per epoch. The
train/batch image is the run's first batch's, once.

Tolerance: relative 1e-6. The resume replays the same float32 operations on the same saved states, so the
values match bitwise here; 1e-6 (float32 keeps about 7 digits) leaves room for a last-bit change in a sum's
order only, while a batch trained twice or not at all, or an epoch's metric restarted, moves them by 1e-3 or
more.
"""

import csv
from pathlib import Path

import pytest
from conftest import CPU, DDP2, ONE, WITH_PROBES, run_cli

# 128 training images in batches of 32: 4 steps per epoch, 12 in all, each logged; a cosine schedule, so that
# lr-* shows a step taken from the wrong place on the curve.
FIT = [
    "fit",
    *CPU,
    "--data.train_size=128",
    "--data.val_size=32",
    "--data.test_size=16",
    "--data.batch_size=32",
    "--trainer.max_epochs=3",
    "--trainer.log_every_n_steps=1",
    "--model.optim.schedule=cosine",
]
# SIGTERM as a scheduler sends it, checked after every batch: at the start of the first batch of epoch 2 (the
# run stops after it: mid-epoch, step 5), or at the end of epoch 1 (after its validation and checkpoint).
SIGTERM = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigterm"]
SIGTERM += ["--resilience.check_every_n_batches=1"]
STOPS = {
    "mid-epoch": ["--trainer.callbacks.at_step=4"],
    "epoch end": ["--trainer.callbacks.at_epoch_end=0"],
}
ENV = {**WITH_PROBES, "MLFLOW_ALLOW_FILE_STORE": "true"}  # MLflow 3 asks for this opt-in to a file store


def mlflow_logger(root: Path) -> list[str]:
    return [
        "--trainer.logger=MLFlowLogger",
        f"--trainer.logger.init_args.tracking_uri={(root / 'mlruns').as_uri()}",
        "--trainer.logger.init_args.experiment_name=shapes",
    ]


def fit(root: Path, *args: str) -> None:
    result = run_cli([*FIT, f"--trainer.default_root_dir={root}", *args], cwd=root, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]


def stopped_and_resumed(root: Path, stop: str, *logger: str) -> None:
    fit(root, *logger, *SIGTERM, *STOPS[stop])
    fit(root, *logger, "--ckpt_path=last")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted fit, logged by all three loggers at once (none of them changes what is trained):
    TensorBoard and CSV into lightning_logs/version_0, MLflow into mlruns/."""
    root = tmp_path_factory.mktemp("reference")
    loggers = root / "loggers.yaml"
    loggers.write_text(
        "trainer:\n  logger:\n"
        "    - class_path: lightning.pytorch.loggers.TensorBoardLogger\n"
        f"      init_args: {{save_dir: {root}, name: lightning_logs, default_hp_metric: false}}\n"
        "    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {root}, name: lightning_logs}}\n"
        "    - class_path: lightning.pytorch.loggers.MLFlowLogger\n"
        f"      init_args: {{tracking_uri: {(root / 'mlruns').as_uri()}, experiment_name: shapes}}\n"
    )
    fit(root, f"--config={loggers}")
    return root


def assert_same_curves(got: dict[str, list], want: dict[str, list]) -> None:
    """``got`` and ``want``: tag → its (step, value) pairs in the order logged. The ``epoch`` tag repeats a
    step in both (Lightning logs it with each call), every other tag logs a step once."""
    assert sorted(got) == sorted(want)
    for tag, points in want.items():
        steps = [step for step, _ in got[tag]]
        assert steps == [step for step, _ in points], tag  # none missing, none twice, none past the end
        if tag.startswith("perf/"):  # wall clock: one per epoch, at its last step
            assert all(value > 0 for _, value in got[tag]), tag
        else:
            assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag


# ---- TensorBoard -------------------------------------------------------------------------------------------


def event_files(run: Path) -> list[Path]:
    """The run folder's event files, oldest first (named events.out.tfevents.<time>.<host>.<pid>.<n>)."""
    files = run.glob("events.out.tfevents.*")
    return sorted(files, key=lambda p: (int(p.name.split(".")[3]), int(p.name.rsplit(".", 1)[1])))


def tensorboard(run: Path) -> tuple[dict[str, list], dict[str, list[int]], dict]:
    """(scalar tag → (step, value) pairs, other tag → steps, the last HParams session start), read from every
    event file as written: EventAccumulator would drop the points of a step that a later file writes again."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    scalars: dict[str, list] = {}
    others: dict[str, list[int]] = {}
    hparams = {}
    for path in event_files(run):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "scalars":  # the loader's form of simple_value
                    point = (event.step, tensor_util.make_ndarray(value.tensor).item())
                    scalars.setdefault(value.tag, []).append(point)
                    continue
                others.setdefault(value.tag, []).append(event.step)
                if value.tag == "_hparams_/session_start_info":
                    content = value.metadata.plugin_data.content
                    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
                    hparams = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    return scalars, others, hparams


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stop", STOPS)
def test_tensorboard_shows_the_uninterrupted_runs_scalars_in_one_run_folder(
    tmp_path: Path, reference: Path, stop: str
) -> None:
    stopped_and_resumed(tmp_path, stop)  # the default logger: TensorBoard
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == ["version_0"]
    run = tmp_path / "lightning_logs" / "version_0"
    assert len(event_files(run)) == 2  # the stopped part's and the resume's
    got, got_others, got_hparams = tensorboard(run)
    want, want_others, want_hparams = tensorboard(reference / "lightning_logs" / "version_0")
    assert_same_curves(got, want)
    assert max(step for _, points in got.items() for step, _ in points) == 11  # 12 steps: 0-11
    # The confusion matrix at each validation once; the run's settings (the same for both parts) with
    # the hparam metrics, whose values are the scalars above.
    assert got_others["val/confusion_matrix"] == want_others["val/confusion_matrix"] == [3, 7, 11]
    assert got_others["train/batch"] == want_others["train/batch"] == [0]  # once per run, not at the resume
    assert got_hparams == want_hparams and got_hparams["trainer/max_epochs"] == 3
    assert got_others["_hparams_/experiment"] == [0, 0]  # its metric tags, as each part starts


# ---- CSV and MLflow ----------------------------------------------------------------------------------------


def csv_curves(path: Path) -> dict[str, list]:
    """metrics.csv's columns → (step, value) of each row that has one, in the file's order."""
    curves: dict[str, list] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key != "step" and value != "":
                    curves.setdefault(key, []).append((int(row["step"]), float(value)))
    return curves


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_csv_log_holds_the_uninterrupted_runs_rows(tmp_path: Path, reference: Path) -> None:
    csv_logger = ["--trainer.logger=CSVLogger", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    stopped_and_resumed(tmp_path, "mid-epoch", *csv_logger)
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == ["version_0"]
    got = csv_curves(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")
    assert_same_curves(got, csv_curves(reference / "lightning_logs" / "version_0" / "metrics.csv"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mlflow_holds_the_uninterrupted_runs_history_in_one_run(
    tmp_path: Path, reference: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    stopped_and_resumed(tmp_path, "mid-epoch", *mlflow_logger(tmp_path))

    def history(root: Path) -> dict[str, list]:
        client = MlflowClient(tracking_uri=(root / "mlruns").as_uri())
        (run,) = client.search_runs([client.get_experiment_by_name("shapes").experiment_id])  # one run
        metrics = {}
        for key in run.data.metrics:
            logged = client.get_metric_history(run.info.run_id, key)
            metrics[key] = [(m.step, m.value) for m in sorted(logged, key=lambda m: (m.step, m.timestamp))]
        return metrics

    assert_same_curves(history(tmp_path), history(reference))


# ---- perf/* of an epoch resumed on another device count -----------------------------------------------


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_an_epoch_stopped_on_1_device_and_resumed_on_2_counts_its_images_once(tmp_path: Path) -> None:
    """Stopped mid-epoch on 1 device × 32, resumed on 2 × 16 (README: keep per-device batch × devices): the
    checkpoint holds the count of the epoch's images so far, and each resumed rank counted all of them as
    its own: perf/images_per_s, and the epoch line's img/s, counted the part before the stop twice."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # 1024 images: 32 steps an epoch on one device; SIGTERM at step 26, a few steps before the end, each
    # step 0.3 s longer: the part before the stop is most of the epoch's step time.
    fit1 = [*FIT[:4], "--data.train_size=1024", "--data.batch_size=32", "--trainer.max_epochs=1", *ONE]
    fit1 += [*SIGTERM, "--trainer.callbacks.at_step=26", "--trainer.callbacks.step_s=0.3"]
    stopped = run_cli([*fit1, f"--trainer.default_root_dir={tmp_path}"], cwd=tmp_path, env=ENV)
    assert stopped.returncode == 0 and "(mid-epoch, after " in stopped.stderr, stopped.stderr[-3000:]
    run = tmp_path / "lightning_logs" / "version_0"
    saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    before = saved["callbacks"]["Dashboard"]["Throughput"]  # the images, wait and busy seconds so far
    fit2 = [*FIT[:4], "--data.train_size=1024", "--data.batch_size=16", "--trainer.max_epochs=1", *DDP2]
    resumed = run_cli([*fit2, f"--trainer.default_root_dir={tmp_path}", "--ckpt_path=last"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    acc = EventAccumulator(str(run))
    acc.Reload()
    (rate,) = [e.value for e in acc.Scalars("perf/images_per_s")]
    # The sum over the ranks of (its images) / (its step time, the part before the stop's included): at
    # most the epoch's 1024 images over the step time before the stop, whatever the part after took.
    assert before["images"] > 512 and rate <= 1024 / (before["wait"] + before["busy"]) * (1 + 1e-6), before
