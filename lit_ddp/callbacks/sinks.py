"""Where the dashboard's images, texts and value lists go: one sink per Lightning logger of the run.

Scalars travel through ``LightningModule.log`` and reach every logger already. What a logger has no scalar
for (an image, a markdown table, a list of per-class values, the run's description) goes through the sink
of each logger, with that logger's public API:

* ``TensorBoardLogger``: its ``SummaryWriter`` (Images, Text, Histograms and HParams tabs);
* ``MLFlowLogger``: its ``MlflowClient``: ``log_image`` with key and step (the run's image view),
  ``log_text`` and ``log_dict`` as artifacts, and the run's parameters;
* ``WandbLogger``: ``log_image``, ``log_table`` (a markdown table as a W&B table) and a histogram at
  ``trainer/global_step``, the run's config, and the config and environment as the run's files;
* any other logger (``CSVLogger``, ...): files in its run directory, under ``dashboard/``, and the
  parameters through ``log_hyperparams``.

Call on rank 0 only: other ranks' loggers are dummies, and creating a writer creates the run directory.
"""

import io
import json
import os
from pathlib import Path
from typing import Protocol

from lightning import Trainer
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.loggers.logger import DummyLogger
from PIL import Image
from torch import Tensor

from lit_ddp.writes import write_file


def _hwc(image: Tensor):
    """(3, H, W) uint8 → (H, W, 3) numpy array, what PIL and MLflow take."""
    return image.permute(1, 2, 0).contiguous().numpy()


def _file_name(tag: str, step: int, suffix: str) -> str:
    return f"{tag}/step_{step:07d}{suffix}"


class Sink(Protocol):
    """What a dashboard callback writes besides scalars; each method is one thing a logger can hold."""

    def image(self, tag: str, image: Tensor, step: int) -> None:
        """A (3, H, W) uint8 image (a grid of samples, a figure drawn by render.py)."""

    def text(self, tag: str, markdown: str, step: int) -> None:
        """A markdown text (a table of counts)."""

    def values(self, tag: str, values: Tensor, step: int) -> None:
        """A 1-d tensor of values (per-class accuracies) shown as their distribution."""

    def run_info(
        self, params: dict, metric_tags: list[str], config: str, environment: str, step: int
    ) -> None:
        """Once per run: the flat hyperparameters, the metrics that judge the run, the resolved config
        (YAML) and the environment (markdown)."""


class TensorBoardSink:
    def __init__(self, logger: TensorBoardLogger) -> None:
        self.writer = logger.experiment

    def image(self, tag: str, image: Tensor, step: int) -> None:
        self.writer.add_image(tag, image, step)

    def text(self, tag: str, markdown: str, step: int) -> None:
        self.writer.add_text(tag, markdown, step)

    def values(self, tag: str, values: Tensor, step: int) -> None:
        self.writer.add_histogram(tag, values, step)

    def run_info(
        self, params: dict, metric_tags: list[str], config: str, environment: str, step: int
    ) -> None:
        from torch.utils.tensorboard.summary import hparams

        # Only the metric names go into the summary; TensorBoard reads their values from the scalars.
        for summary in hparams(params, {tag: 0.0 for tag in metric_tags}):
            self.writer.file_writer.add_summary(summary)
        code = "\n".join("    " + line for line in config.splitlines())  # markdown: indented = verbatim
        self.writer.add_text("config", code, step)
        self.writer.add_text("environment", environment, step)


class MLflowSink:
    def __init__(self, logger: MLFlowLogger) -> None:
        self.logger = logger
        self.client = logger.experiment
        self.run_id = logger.run_id

    def image(self, tag: str, image: Tensor, step: int) -> None:
        self.client.log_image(self.run_id, _hwc(image), key=tag, step=step)

    def text(self, tag: str, markdown: str, step: int) -> None:
        self.client.log_text(self.run_id, markdown, _file_name(tag, step, ".md"))

    def values(self, tag: str, values: Tensor, step: int) -> None:
        record = {"step": step, "values": values.tolist()}
        self.client.log_dict(self.run_id, record, _file_name(tag, step, ".json"))

    def run_info(
        self, params: dict, metric_tags: list[str], config: str, environment: str, step: int
    ) -> None:
        # A file store keeps a parameter as a file named by its key: "model" (the class name) cannot sit
        # beside "model/lr", so a key that is also a folder becomes "<key>/class".
        folders = {k.rsplit("/", 1)[0] for k in params if "/" in k}
        params = {f"{k}/class" if k in folders else k: v for k, v in params.items()}
        # An MLflow parameter cannot change once logged: keep what Lightning logged under the same key. A
        # resumed run's logger keeps each first value itself, and says which of the run's settings changed.
        logged = self.client.get_run(self.run_id).data.params
        resumed = getattr(self.logger, "keeps_first_values", False)
        mine = {k: v for k, v in params.items() if k not in logged or (resumed and k.startswith("trainer/"))}
        self.logger.log_hyperparams(mine)
        self.client.log_text(self.run_id, config, "config.yaml")
        self.client.log_text(self.run_id, environment, "environment.md")


def _markdown_table(markdown: str) -> tuple[list[str], list[list]] | None:
    """A markdown pipe table (as ``counts_markdown`` writes one) as its header and rows, cells without their
    bold marks and counts as numbers; None for any other text."""
    lines = markdown.strip().splitlines()
    if len(lines) < 2 or not all(line.startswith("|") and line.endswith("|") for line in lines):
        return None
    cells = [[cell.strip().strip("*") for cell in line[1:-1].split("|")] for line in lines]
    if not all(set(cell) <= set("-: ") for cell in cells[1]):  # the |---|---| line under the header
        return None
    rows = [[int(cell) if cell.isdigit() else cell for cell in row] for row in cells[2:]]  # counts sort
    return cells[0], rows


class WandbSink:
    """Everything at the trainer's step, as WandbLogger logs its scalars (``trainer/global_step``, the x axis
    it defines); the texts of the run as files under ``lit_ddp/`` in the run's Files (``config.yaml`` is the
    name W&B keeps for the run's config)."""

    def __init__(self, logger: WandbLogger) -> None:
        self.logger = logger

    def image(self, tag: str, image: Tensor, step: int) -> None:
        self.logger.log_image(key=tag, images=[_hwc(image)], step=step)

    def text(self, tag: str, markdown: str, step: int) -> None:
        table = _markdown_table(markdown)
        columns, rows = table if table is not None else (["markdown"], [[markdown]])
        self.logger.log_table(key=tag, columns=columns, data=rows, step=step)

    def values(self, tag: str, values: Tensor, step: int) -> None:
        import wandb

        self.logger.log_metrics({tag: wandb.Histogram(values.tolist())}, step=step)

    def run_info(
        self, params: dict, metric_tags: list[str], config: str, environment: str, step: int
    ) -> None:
        self.logger.log_hyperparams(params)
        run = self.logger.experiment
        for name, text in (("config.yaml", config), ("environment.md", environment)):
            path = Path(run.dir) / "lit_ddp" / name  # in the run's files folder: saved as it is now
            write_file(path, text, "the W&B run file")
            run.save(str(path), base_path=run.dir, policy="now")


class FileSink:
    """Files under ``<directory>/dashboard/``: PNG images, markdown texts, JSON value lists."""

    def __init__(self, logger: Logger, directory: str | os.PathLike) -> None:
        self.logger = logger
        self.root = Path(directory)
        self.dashboard = self.root / "dashboard"

    def _write(self, name: str, data: str | bytes) -> None:
        write_file(self.dashboard / name, data, "the dashboard file")

    def image(self, tag: str, image: Tensor, step: int) -> None:
        png = io.BytesIO()
        Image.fromarray(_hwc(image)).save(png, format="PNG")
        self._write(_file_name(tag, step, ".png"), png.getvalue())

    def text(self, tag: str, markdown: str, step: int) -> None:
        self._write(_file_name(tag, step, ".md"), markdown)

    def values(self, tag: str, values: Tensor, step: int) -> None:
        record = {"step": step, "values": values.tolist()}
        self._write(_file_name(tag, step, ".json"), json.dumps(record))

    def run_info(
        self, params: dict, metric_tags: list[str], config: str, environment: str, step: int
    ) -> None:
        self.logger.log_hyperparams(params)
        self._write("environment.md", environment)
        if not (self.root / "config.yaml").is_file():  # LightningCLI saves it there for most loggers
            self._write("config.yaml", config)


def sinks(trainer: Trainer) -> list[Sink]:
    """One sink per logger of the trainer, in the trainer's order; none without a logger."""
    out: list[Sink] = []
    for logger in trainer.loggers:
        if isinstance(logger, DummyLogger):  # fast_dev_run's stand-in: Lightning promises it logs nothing
            continue
        if isinstance(logger, TensorBoardLogger):
            out.append(TensorBoardSink(logger))
        elif isinstance(logger, MLFlowLogger):
            out.append(MLflowSink(logger))
        elif isinstance(logger, WandbLogger):
            out.append(WandbSink(logger))
        else:
            directory = getattr(logger, "log_dir", None) or logger.save_dir or trainer.default_root_dir
            out.append(FileSink(logger, directory))
    return out


SHARED_SAVE_DIR = (WandbLogger, MLFlowLogger)  # Trainer.log_dir is their save_dir, shared by every run


def run_dir(trainer: Trainer) -> str:
    """The run's folder, where config.yaml is saved: ``Trainer.log_dir``'s rule, without its broadcast (a
    collective that would wait forever when only rank 0 asks). A logger with no local folder (MLflow on a
    database or a server) has none there, and the ``save_dir`` of W&B and of MLflow's file store holds every
    run; its run's folder is then the one its checkpoints/ go into (ModelCheckpoint's rule):
    ``save_dir/<experiment>/<run>``, under ``default_root_dir`` without a ``save_dir``."""
    if not trainer.loggers:
        return trainer.default_root_dir
    first = trainer.loggers[0]
    if isinstance(first, (TensorBoardLogger, CSVLogger)):
        found = first.log_dir
    else:
        found = None if isinstance(first, SHARED_SAVE_DIR) else first.save_dir
    root = first.save_dir or trainer.default_root_dir
    return found or os.path.join(root, str(first.name), str(first.version))
