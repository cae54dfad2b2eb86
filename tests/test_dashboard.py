"""The TensorBoard dashboard, read back from the event files of short CPU runs on 1 and 2 processes.

Every tag the README's "TensorBoard dashboard" section lists must exist in exactly one run directory, with
values that make sense, and what depends on the sharding (validation counts) must not change with it.
"""

import csv
import re
import time
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import TINY_RUN, TINY_SHAPES, run_cli, run_dirs
from lightning import LightningModule, Trainer
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lit_ddp.callbacks.summary import EpochSummary
from lit_ddp.callbacks.throughput import Throughput
from lit_ddp.data.samplers import stable_seed
from lit_ddp.data.shapes import CLASS_NAMES, draw_shapes
from lit_ddp.models import LeNetCIFAR

VAL_SIZE = 101  # odd: 2 ranks get 51 + 50 images, and a padded sampler would count one twice
EPOCHS = 2
COMMON = [
    "fit",
    *TINY_SHAPES,
    f"--trainer.max_epochs={EPOCHS}",
    "--trainer.accelerator=cpu",
    "--trainer.log_every_n_steps=2",
    "--trainer.enable_progress_bar=false",
]
SCALARS = [
    "train/loss_step",
    "train/loss_epoch",
    "train/acc",
    "val/loss",
    "val/acc",
    "lr-AdamW/pg1",  # two param groups: weights with weight decay, biases without
    "lr-AdamW/pg2",
    "perf/images_per_s",
    "perf/images_per_s_per_device",
    "perf/epoch_time_s",
    "perf/data_wait",
    *(f"val_class_acc/{name}" for name in CLASS_NAMES),
]
IMAGES = ["train/batch", "val/confusion_matrix"]
TEXTS = ["config", "environment", "val/confusion_matrix"]


def read_run(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def texts(acc, tag: str) -> list[str]:
    return [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(f"{tag}/text_summary")]


def hparams(acc) -> tuple[dict, list[str]]:
    """(hyperparameters, hparam metric tags) of the run's HParams summary."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    def plugin_data(tag):
        return plugin_data_pb2.HParamsPluginData.FromString(acc.summary_metadata[tag].plugin_data.content)

    start = plugin_data("_hparams_/session_start_info").session_start_info
    params = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    metrics = [m.name.tag for m in plugin_data("_hparams_/experiment").experiment.metric_infos]
    return params, metrics


def confusion_counts(table: str) -> list[list[int]]:
    """Rows of the markdown counts table (without the header and the total column)."""
    rows = [line for line in table.splitlines() if line.startswith("| **")]
    return [[int(v) for v in re.findall(r"\| (\d+)", row)][:-1] for row in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, tuple[Path, str]]:
    """devices → (the single run directory, stdout) of a 2-epoch fit; 2 devices: Lightning's ``ddp``
    (it relaunches ``python -m lit_ddp`` for rank 1), as real multi-GPU runs use."""
    out = {}
    for devices, extra in ((1, []), (2, ["--trainer.strategy=ddp"])):
        root = tmp_path_factory.mktemp(f"dashboard{devices}")
        args = [*COMMON, f"--trainer.devices={devices}", *extra, f"--trainer.default_root_dir={root}"]
        result = run_cli(args, cwd=root, timeout=240)
        assert result.returncode == 0, result.stderr[-3000:]
        dirs = run_dirs(root)
        assert len(dirs) == 1, dirs  # one run directory, written by rank 0 alone
        out[devices] = (dirs[0], result.stdout)
    return out


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("devices", [1, 2])
def test_every_tag_is_in_the_one_run_directory(runs, devices: int) -> None:
    acc = read_run(runs[devices][0])
    tags = acc.Tags()
    assert set(SCALARS) <= set(tags["scalars"]), sorted(set(SCALARS) - set(tags["scalars"]))
    assert set(IMAGES) <= set(tags["images"])
    assert {f"{t}/text_summary" for t in TEXTS} <= set(tags["tensors"])
    assert "_hparams_/session_start_info" in acc.summary_metadata
    assert "hp_metric" not in tags["scalars"]  # Lightning's placeholder is replaced by real metrics
    assert "perf/peak_memory_gib" not in tags["scalars"]  # CUDA only


@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("devices", [1, 2])
def test_values_are_sane(runs, devices: int) -> None:
    acc = read_run(runs[devices][0])
    values = {tag: [e.value for e in acc.Scalars(tag)] for tag in SCALARS}
    for tag in (
        "train/loss_epoch",
        "train/acc",
        "val/loss",
        "val/acc",
        "perf/images_per_s",
        "perf/epoch_time_s",
    ):
        assert len(values[tag]) == EPOCHS, tag  # once per epoch
    for tag in ("train/acc", "val/acc", "perf/data_wait", *(f"val_class_acc/{n}" for n in CLASS_NAMES)):
        assert all(0.0 <= v <= 1.0 for v in values[tag]), (tag, values[tag])
    assert all(v > 0 for v in values["perf/images_per_s"] + values["perf/epoch_time_s"])
    # Summed over ranks: all ranks together ≈ devices × one device (equal up to float rounding).
    for total, per_device in zip(
        values["perf/images_per_s"], values["perf/images_per_s_per_device"], strict=True
    ):
        assert total == pytest.approx(devices * per_device, rel=1e-5)
    assert all(0 < v < 0.1 for v in values["lr-AdamW/pg1"])
    assert len(acc.Images("train/batch")) == 1  # once per run
    assert len(acc.Images("val/confusion_matrix")) == EPOCHS  # each validation, not the sanity check


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_confusion_matrix_counts_every_validation_image_once(runs) -> None:
    labels = draw_shapes(VAL_SIZE, stable_seed(0, 1))[1]  # ShapesDataModule's validation split, seed 0
    per_class = Counter(labels.tolist())
    expected_rows = [per_class[i] for i in range(len(CLASS_NAMES))]
    row_sums = {}
    for devices in (1, 2):
        acc = read_run(runs[devices][0])
        tables = texts(acc, "val/confusion_matrix")
        assert len(tables) == EPOCHS
        for table in tables:
            counts = confusion_counts(table)
            assert sum(map(sum, counts)) == VAL_SIZE
            row_sums[devices] = [sum(row) for row in counts]
            assert row_sums[devices] == expected_rows  # each true class: its images, once
        # The per-class accuracy scalars are the matrix's diagonal over its rows.
        last = confusion_counts(tables[-1])
        for i, name in enumerate(CLASS_NAMES):
            logged = acc.Scalars(f"val_class_acc/{name}")[-1].value
            assert logged == pytest.approx(last[i][i] / max(sum(last[i]), 1), abs=1e-6)
    assert row_sums[1] == row_sums[2]


@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("devices", [1, 2])
def test_hparams_and_text_describe_the_run(runs, devices: int) -> None:
    acc = read_run(runs[devices][0])
    params, metrics = hparams(acc)
    assert params["trainer/devices"] == devices and params["trainer/num_nodes"] == 1
    assert params["global_batch_size"] == 32 * devices
    assert params["trainer/strategy"] == ("ddp" if devices == 2 else "single_device")
    assert params["trainer/precision"] == "32-true"
    assert params["model"] == "LeNetCIFAR" and params["model/optim/name"] == "adamw"
    assert params["data"] == "ShapesDataModule" and params["data/val_size"] == VAL_SIZE
    assert set(metrics) == {"val/loss", "val/acc"}  # their last values: the final validation metrics
    (config,) = texts(acc, "config")
    assert "class_path: lit_ddp.data.ShapesDataModule" in config and f"devices: '{devices}'" in config
    (env,) = texts(acc, "environment")
    assert f"| world size | {devices} = 1 node(s) × {devices} device(s) |" in env
    assert "| torch |" in env and "| lightning |" in env and "| precision | 32-true |" in env


@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("devices", [1, 2])
def test_one_console_line_per_epoch(runs, devices: int) -> None:
    lines = [line for line in runs[devices][1].splitlines() if line.startswith("epoch ")]
    assert [line.split(" | ")[0] for line in lines] == [f"epoch {e}/{EPOCHS}" for e in range(1, EPOCHS + 1)]
    assert all(
        re.search(r"train loss [\d.]+ acc [\d.]+ \| val loss [\d.]+ acc [\d.]+ \| \d+ img/s", x)
        for x in lines
    )


@pytest.mark.timeout(120)
def test_dashboard_callbacks_turn_off_one_by_one(tmp_path: Path) -> None:
    from lit_ddp.cli import build_cli

    args = ["fit", *TINY_SHAPES, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"]
    args += ["--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false"]
    args += ["--dashboard.confusion_matrix=false", "--dashboard.batch_images=false"]
    args += [f"--trainer.default_root_dir={tmp_path}"]
    cli = build_cli(args)
    names = {type(part).__name__ for cb in cli.trainer.callbacks for part in getattr(cb, "members", [cb])}
    assert {"Throughput", "RunInfo", "EpochSummary", "DashboardLearningRate"} <= names
    assert not {"ConfusionMatrix", "TrainBatchImages"} & names
    (run_dir,) = run_dirs(tmp_path)
    tags = read_run(run_dir).Tags()
    assert tags["images"] == [] and "perf/images_per_s" in tags["scalars"]


@pytest.mark.parametrize(
    ("option", "line"),
    [
        # -1 drew every image of the batch but one; a negative tile crashed the run at its first batch.
        ("--dashboard.max_images=-1", "--dashboard.max_images=-1 must be 1 or more (images in train/batch)"),
        ("--dashboard.tile=-5", "--dashboard.tile=-5 must be 1 or more (pixels per image in train/batch)"),
        ("--dashboard.max_classes=-1", "--dashboard.max_classes=-1 must be 0 or more (the most classes"),
    ],
)
def test_dashboard_sizes_it_cannot_draw_are_one_line(tmp_path: Path, capsys, option: str, line: str) -> None:
    from lit_ddp.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY_SHAPES, option, f"--trainer.default_root_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and err.startswith(f"lit_ddp: error: {line}") and len(err.splitlines()) == 1
    assert run_dirs(tmp_path) == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "extra",
    [
        [],
        # validation after a batch that accumulates (no optimizer step): at global_step, not one before
        ["--trainer.accumulate_grad_batches=2", "--trainer.val_check_interval=3"],
    ],
)
def test_the_confusion_matrix_is_at_the_step_of_its_validations_scalars(tmp_path: Path, extra) -> None:
    """TensorBoard showed the confusion matrix of a validation one step after that validation's val/acc
    (Lightning logs epoch-end metrics at the step before the count of optimizer steps): its image and
    table sat beside the next validation's curves' points."""
    from lit_ddp.cli import build_cli

    args = ["fit", *TINY_SHAPES, "--data.batch_size=16", "--trainer.max_epochs=2"]
    args += ["--trainer.limit_train_batches=4", "--trainer.limit_val_batches=1"]
    args += ["--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}", *extra]
    build_cli(args)
    (run_dir,) = run_dirs(tmp_path)
    acc = read_run(run_dir)
    val_steps = [e.step for e in acc.Scalars("val/acc")]
    assert len(val_steps) == 2, val_steps
    assert [e.step for e in acc.Images("val/confusion_matrix")] == val_steps
    assert [e.step for e in acc.Tensors("val/confusion_matrix/text_summary")] == val_steps
    assert [e.step for e in acc.Scalars("val_class_acc/disc")] == val_steps


@pytest.mark.timeout(240)
def test_under_gradient_accumulation_each_logged_step_has_one_learning_rate_point(tmp_path: Path) -> None:
    """--trainer.accumulate_grad_batches=2: every batch of an optimizer step passes Lightning's logging
    check, and its learning-rate monitor wrote lr-* twice at each logged step: two rows per step in
    metrics.csv (and in MLflow's history), two points in TensorBoard."""
    loggers = tmp_path / "loggers.yaml"
    loggers.write_text(
        "trainer:\n  logger:\n"
        f"    - {{class_path: TensorBoardLogger, init_args: {{save_dir: {tmp_path}, name: runs}}}}\n"
        f"    - {{class_path: CSVLogger, init_args: {{save_dir: {tmp_path}, name: runs}}}}\n"
    )
    # 16 batches of 16 an epoch, 8 optimizer steps: 16 steps in all, logged at every third (2, 5, ...).
    args = ["fit", "--data.train_size=256", "--data.val_size=17", "--data.batch_size=16"]
    args += ["--trainer.max_epochs=2", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false"]
    args += ["--trainer.accumulate_grad_batches=2", "--trainer.log_every_n_steps=3", f"--config={loggers}"]
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = run_dirs(tmp_path)
    acc = read_run(run_dir)
    logged = [2, 5, 8, 11, 14]
    assert [e.step for e in acc.Scalars("train/loss_step")] == logged
    for tag in ("lr-AdamW/pg1", "lr-AdamW/pg2"):
        assert [e.step for e in acc.Scalars(tag)] == logged, tag
    with (run_dir / "metrics.csv").open() as f:
        lr_rows = [int(row["step"]) for row in csv.DictReader(f) if row["lr-AdamW/pg1"]]
    assert lr_rows == logged


@pytest.mark.timeout(240)
def test_a_learning_rate_monitor_of_the_users_writes_each_point_once(tmp_path: Path) -> None:
    """--trainer.callbacks+=LearningRateMonitor: it and the dashboard's both wrote lr-* at every logged step,
    two points per step in TensorBoard. The user's takes the dashboard's place, as a user's bar takes the
    console's."""
    from lit_ddp.cli import build_cli

    args = ["fit", *TINY_RUN, "--trainer.log_every_n_steps=1", f"--trainer.default_root_dir={tmp_path}"]
    users = ["--trainer.callbacks+=lightning.pytorch.callbacks.LearningRateMonitor"]
    build_cli([*args, *users, "--trainer.callbacks.log_momentum=true"])
    (run_dir,) = run_dirs(tmp_path)
    acc = read_run(run_dir)
    for tag in ("lr-AdamW/pg1", "lr-AdamW/pg2"):
        assert [e.step for e in acc.Scalars(tag)] == [0, 1], tag
    assert "lr-AdamW/pg1-momentum" in acc.Tags()["scalars"]  # the user's monitor, with its own settings


@pytest.mark.timeout(120)
def test_a_run_without_logger_still_trains_and_prints(tmp_path: Path, capsys) -> None:
    from lit_ddp.cli import build_cli

    args = ["fit", *TINY_SHAPES, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"]
    args += ["--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false", "--trainer.logger=false"]
    build_cli([*args, f"--trainer.default_root_dir={tmp_path}"])
    assert run_dirs(tmp_path) == []
    assert capsys.readouterr().out.count("epoch 1/1 | train loss") == 1


def test_a_fast_dev_run_writes_no_dashboard_file(tmp_path: Path) -> None:
    """Lightning promises that fast_dev_run logs nothing (its loggers become a DummyLogger); the dashboard
    wrote its images, texts and a config.yaml into <default_root_dir>/dashboard/ all the same."""
    from lit_ddp.cli import build_cli

    args = ["fit", *TINY_SHAPES, "--trainer.fast_dev_run=2", "--trainer.enable_progress_bar=false"]
    cli = build_cli([*args, f"--trainer.default_root_dir={tmp_path}"])
    assert cli.trainer.global_step == 2  # it trained
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == []


def test_a_fast_dev_run_names_no_run_folder_and_a_resume_past_it_names_fast_dev_run(
    tmp_path: Path, capsys
) -> None:
    """A fast_dev_run ended with `run saved in <default_root_dir>`, a folder it never wrote; from a
    checkpoint past its steps it said to resume with a larger --trainer.max_steps, which fast_dev_run
    overrides."""
    from lit_ddp.cli import build_cli

    root = f"--trainer.default_root_dir={tmp_path}"
    args = ["fit", *TINY_RUN, "--trainer.fast_dev_run=true", root]
    build_cli(args)
    assert "run saved in" not in capsys.readouterr().out
    build_cli(["fit", *TINY_RUN, root])  # 2 steps
    capsys.readouterr()
    build_cli([*args, "--ckpt_path=last"])
    out = capsys.readouterr().out
    assert "nothing to train: --trainer.fast_dev_run=1 stops a fit at step 1, and " in out, out
    assert "is at step 2: leave --trainer.fast_dev_run out to resume it" in out and "max_steps" not in out


class SlowSteps(LightningModule):
    """A linear model whose training step takes ~20 ms and whose validation takes ``val_s`` in all."""

    def __init__(self, val_s: float, step_s: float = 0.02) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.val_s, self.step_s = val_s, step_s

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        time.sleep(self.step_s)
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx: int) -> None:
        time.sleep(self.val_s)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.timeout(120)
def test_validation_inside_an_epoch_is_not_counted_as_data_wait(tmp_path: Path) -> None:
    """--trainer.val_check_interval=0.5: the validation between two training steps is neither data wait
    nor step time (on Shapes it was counted as 75 % data wait, and cut img/s by 2.5×)."""
    loader = DataLoader(TensorDataset(torch.zeros(8 * 4, 4)), batch_size=4)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        val_check_interval=0.5,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        callbacks=[Throughput()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(SlowSteps(val_s=1.0), loader, loader)
    # 8 steps of ≥ 20 ms: the 1 s validation counted as waiting would be ≥ 85 % of the step time.
    wait, rate = (float(trainer.callback_metrics[k]) for k in ("perf/data_wait", "perf/images_per_s"))
    assert wait < 0.5, wait
    assert rate > 32 / 1.0, rate  # 32 images in well under the validation's 1 s of step time


class SlowData(Dataset):
    """A loader that holds training back: each sample takes ``seconds`` to read, the step almost none."""

    def __init__(self, seconds: float, n: int = 16) -> None:
        self.seconds, self.n = seconds, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor]:
        time.sleep(self.seconds)  # the workload of a slow reader, not a wait for an event
        return (torch.zeros(4),)


class SlowDataModule(L.LightningDataModule):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def train_dataloader(self) -> DataLoader:
        return DataLoader(SlowData(self.seconds), batch_size=4)

    def loader_remedies(self) -> list[str]:
        return ["more loader workers: --data.num_workers=3 (now 0, 4 CPUs)"]


def _fit_with_the_epoch_line(tmp_path: Path, seconds: float, capsys, step_s: float = 0.02) -> str:
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        limit_val_batches=0,
        callbacks=[Throughput(), EpochSummary()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(SlowSteps(val_s=0.0, step_s=step_s), datamodule=SlowDataModule(seconds))
    return capsys.readouterr().out


@pytest.mark.timeout(120)
def test_the_epoch_line_shows_the_data_wait_and_a_slow_loader_gets_one_hint_naming_the_fix(
    tmp_path: Path, capsys
) -> None:
    """The devices waiting for the loader were visible only as perf/data_wait in TensorBoard: the epoch line
    shows the share, and above the threshold one line, once per fit, names the data module's remedies."""
    out = _fit_with_the_epoch_line(tmp_path, seconds=0.05, capsys=capsys)  # 200 ms to load, 20 ms to train
    waits = [float(w) for w in re.findall(r"\| data wait (\d+)% \|", out)]
    assert len(waits) == 2 and all(w > 50 for w in waits), out
    hints = [line for line in out.splitlines() if line.startswith("training waited for data")]
    assert len(hints) == 1, out
    assert "of each step" in hints[0] and "--data.num_workers=3" in hints[0]


@pytest.mark.timeout(120)
def test_a_loader_that_keeps_up_gets_no_hint(tmp_path: Path, capsys) -> None:
    # Steps long enough that Lightning's own time between them stays a small share on a loaded machine.
    out = _fit_with_the_epoch_line(tmp_path, seconds=0.0, capsys=capsys, step_s=0.25)
    assert re.search(r"\| data wait \d+% \|", out), out
    assert "training waited for data" not in out


def test_an_image_data_module_names_the_remedies_that_apply_to_its_run(tmp_path: Path, monkeypatch) -> None:
    """The remedies follow the data module, the machine and the device: spare CPUs → more workers; JPEG files
    decoded in the workers → the GPU decoder first, only where training runs on a GPU; images in memory on a
    CPU → none (the wait is their augmentation in the training process, which no loader worker shortens)."""
    from imagenet_tree import make_tree

    from lit_ddp.data import ImageNetDataModule, ShapesDataModule, base

    monkeypatch.setattr(base, "available_cpus", lambda: 8)
    cuda = lambda: torch.device("cuda")  # noqa: E731 - only the device's type is read
    shapes = ShapesDataModule(train_size=16, val_size=8, num_workers=1)
    shapes.setup("fit")
    assert shapes.loader_remedies() == []
    monkeypatch.setattr(shapes, "_training_device", cuda)
    assert shapes.loader_remedies() == ["more loader workers: --data.num_workers=7 (now 1, 8 CPUs)"]
    make_tree(tmp_path, train_per_class=1, val_per_class=1)
    imagenet = ImageNetDataModule(data_dir=str(tmp_path), num_workers=7)
    assert imagenet.loader_remedies() == ["more CPUs per device (now 7 loader workers and training, 8 CPUs)"]
    monkeypatch.setattr(imagenet, "_training_device", cuda)
    assert imagenet.loader_remedies() == [
        "decode the images on the GPU: --data.decode=gpu",
        "more CPUs per device (now 7 loader workers and training, 8 CPUs)",
    ]


def test_a_training_loader_that_sets_its_own_workers_is_named_not_the_option(monkeypatch) -> None:
    """An override's ``self.loader(..., num_workers=2)`` holds over --data.num_workers: the remedy said
    ``--data.num_workers=7 (now 0, ...)``, which changes nothing, with another count than the loader's."""
    from lit_ddp.data import ShapesDataModule, base

    class OwnWorkers(ShapesDataModule):
        def train_dataloader(self):
            return self.loader(self.train_set, train=True, num_workers=2)

    monkeypatch.setattr(base, "available_cpus", lambda: 8)
    data = OwnWorkers(train_size=16, val_size=8, num_workers=0)
    data.setup("fit")
    monkeypatch.setattr(data, "_training_device", lambda: torch.device("cuda"))
    assert data.train_dataloader().num_workers == 2
    assert data.loader_remedies() == [
        "more loader workers: num_workers=7 in OwnWorkers.train_dataloader's self.loader(...) (now 2, 8 CPUs)"
    ]


@pytest.mark.timeout(120)
def test_images_in_memory_on_a_cpu_get_no_hint_to_add_workers(tmp_path: Path, capsys) -> None:
    """Training on the CPU from memory, the data wait is the batch's crop, flip and normalisation in the
    training process: more loader workers (what the hint said) only add a copy between processes, and the
    GPU decoder it could name is no remedy without a GPU. The epoch line still shows the share."""
    from lit_ddp.data import ShapesDataModule

    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_val_batches=0,
        callbacks=[Throughput(), EpochSummary(wait_hint_above=0.0)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(LeNetCIFAR(), datamodule=ShapesDataModule(train_size=64, val_size=8, batch_size=16))
    out = capsys.readouterr().out
    assert re.search(r"\| data wait \d+% \|", out), out
    assert "training waited for data" not in out, out
