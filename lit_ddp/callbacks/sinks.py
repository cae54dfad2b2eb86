"""Where the dashboard's images, texts and value lists go: one sink per Lightning logger of the run.

Scalars travel through ``LightningModule.log`` and reach every logger already. What a logger has no scalar
for (an image, a markdown table, a list of per-class values, the run's description) goes through the sink
of each logger, with that logger's public API:

* ``TensorBoardLogger``: its ``SummaryWriter`` (Images, Text, Histograms and HParams tabs);
* ``MLFlowLogger``: its ``MlflowClient``: ``log_image`` with key and step (the run's image view),
  ``log_text`` and ``log_dict`` as artifacts, and the run's parameters;
* any other logger (``CSVLogger``, ...): files in its run directory, under ``dashboard/``, and the
  parameters through ``log_hyperparams``.

Call on rank 0 only: other ranks' loggers are dummies, and creating a writer creates the run directory.
"""

import json
import os
from pathlib import Path
from typing import Protocol

from lightning import Trainer
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger
from PIL import Image
from torch import Tensor


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
        # An MLflow parameter cannot change once logged: keep what Lightning logged under the same key.
        logged = self.client.get_run(self.run_id).data.params
        self.logger.log_hyperparams({k: v for k, v in params.items() if k not in logged})
        self.client.log_text(self.run_id, config, "config.yaml")
        self.client.log_text(self.run_id, environment, "environment.md")


class FileSink:
    """Files under ``<directory>/dashboard/``: PNG images, markdown texts, JSON value lists."""

    def __init__(self, logger: Logger, directory: str | os.PathLike) -> None:
        self.logger = logger
        self.root = Path(directory)
        self.dashboard = self.root / "dashboard"

    def _path(self, name: str) -> Path:
        path = self.dashboard / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def image(self, tag: str, image: Tensor, step: int) -> None:
        Image.fromarray(_hwc(image)).save(self._path(_file_name(tag, step, ".png")))

    def text(self, tag: str, markdown: str, step: int) -> None:
        self._path(_file_name(tag, step, ".md")).write_text(markdown)

    def values(self, tag: str, values: Tensor, step: int) -> None:
        record = {"step": step, "values": values.tolist()}
        self._path(_file_name(tag, step, ".json")).write_text(json.dumps(record))

    def run_info(
        self, params: dict, metric_tags: list[str], config: str, environment: str, step: int
    ) -> None:
        self.logger.log_hyperparams(params)
        self._path("environment.md").write_text(environment)
        if not (self.root / "config.yaml").is_file():  # LightningCLI saves it there for most loggers
            self._path("config.yaml").write_text(config)


def sinks(trainer: Trainer) -> list[Sink]:
    """One sink per logger of the trainer, in the trainer's order; none without a logger."""
    out: list[Sink] = []
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            out.append(TensorBoardSink(logger))
        elif isinstance(logger, MLFlowLogger):
            out.append(MLflowSink(logger))
        else:
            directory = getattr(logger, "log_dir", None) or logger.save_dir or trainer.default_root_dir
            out.append(FileSink(logger, directory))
    return out


def run_dir(trainer: Trainer) -> str:
    """The run's folder, where config.yaml is saved: ``Trainer.log_dir``'s rule, without its broadcast (a
    collective that would wait forever when only rank 0 asks). A logger with no local folder (MLflow on a
    database or a server) has none there; its run's folder is then the one its checkpoints/ go into
    (ModelCheckpoint's rule): ``default_root_dir/<experiment>/<run>``."""
    if not trainer.loggers:
        return trainer.default_root_dir
    first = trainer.loggers[0]
    found = first.log_dir if isinstance(first, (TensorBoardLogger, CSVLogger)) else first.save_dir
    return found or os.path.join(trainer.default_root_dir, str(first.name), str(first.version))
