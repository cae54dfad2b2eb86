"""A checkpoint's run carried on: a fit resumed from a run's last.ckpt logs into that run's folder (every
versioned logger, the CSV rows it holds, an MLflow or W&B run); an explicit checkpoint checked against the
model before any process starts. Which file ``--ckpt_path`` names, and whether its run goes on, the
preflight decided (``lit_ddp.preflight.runs``).
"""

import csv
import os
import tempfile
from pathlib import Path

import yaml
from lightning import LightningModule, Trainer
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from lit_ddp.callbacks.sinks import SHARED_SAVE_DIR
from lit_ddp.compat import logger_version_given, logger_version_unset, pin_logger_version
from lit_ddp.errors import UserError
from lit_ddp.preflight.checkpoint import SPECIAL, UNTRAINED
from lit_ddp.preflight.checkpoint_file import load_checkpoint_file
from lit_ddp.runtime.mlflow_resume import continue_mlflow_run
from lit_ddp.runtime.run_lock import RunLock, hold_run_dir
from lit_ddp.runtime.wandb_resume import continue_wandb_run
from lit_ddp.utils import is_local_path
from lit_ddp.writes import write_file


def _logger_with_versions(trainer: Trainer) -> TensorBoardLogger | CSVLogger | None:
    logger = trainer.logger
    if not isinstance(logger, TensorBoardLogger | CSVLogger):
        return None
    # Not pinned by the user: we may pick the resumed run's. Under SLURM Lightning names the default run
    # after the job id: a requeued job finds its own, a new submission the previous job's.
    if logger_version_unset(logger) or logger_version_given(logger) == SLURMEnvironment.job_id():
        return logger
    return None


def _loggers_of_the_run(trainer: Trainer) -> list[TensorBoardLogger | CSVLogger]:
    """The versioned loggers after the first that would pick their version themselves: they belong to the
    first's run, wherever their ``save_dir`` (an MLflow or W&B run's id names their folder)."""
    if not isinstance(trainer.logger, (TensorBoardLogger, CSVLogger, *SHARED_SAVE_DIR)):
        return []
    return [
        logger
        for logger in trainer.loggers[1:]
        if isinstance(logger, TensorBoardLogger | CSVLogger) and logger_version_unset(logger)
    ]


def hold_shared_run(trainer: Trainer) -> RunLock | None:
    """Every versioned logger after the first (TensorBoard and CSV, say) writes into the first's run, whose
    folder is then locked (``hold_run_dir``). Each picked its own next ``version_N``: under one ``save_dir``
    TensorBoard made version_0 and CSV, finding it, took version_1; under two, their numbers could differ,
    and a resume, which names every logger's folder after the first's, split the others'. After a versioned
    logger, a new run takes the first version free under each of them, before the lock on the first one's
    folder. After an MLflow or W&B logger, whose run the lock starts, they take its run id: its folder
    (``<save_dir>/<name>/<run id>``) is the one a resume of that run goes on in. A CSV logger's folder that
    holds an earlier run's files keeps them (``_keep_csv_files``)."""
    first, others = trainer.logger, _loggers_of_the_run(trainer)
    if others and isinstance(first, TensorBoardLogger | CSVLogger):
        # Asked before reading .version, which sets it (pinned: by the user, or to a resumed run).
        new = logger_version_unset(first)
        version = first.version
        if new:
            version = max(version, *(logger.version for logger in others))  # each one's next version_N
        for logger in (first, *others):
            pin_logger_version(logger, version)
    lock = hold_run_dir(trainer)
    others = _loggers_of_the_run(trainer)  # still unpinned: those after a tracker, whose run is started now
    version = trainer.logger.version if others else None  # None: a rank whose tracker logs nothing
    for logger in others if version is not None else ():
        pin_logger_version(logger, version)
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            _keep_csv_files(logger, trainer)
    return lock


def _continue_run(trainer: Trainer, found: Path, logger_config) -> None:
    """A fit resumed from ``found`` goes on in that checkpoint's run: a versioned logger's ``version_N``
    (every logger that shares the run), an MLflow logger's run (mlflow_resume.py), a W&B logger's run
    (wandb_resume.py)."""
    run_dir = found.parent.parent
    logger = _logger_with_versions(trainer)
    if logger is not None:
        name = run_dir.name
        version = int(name.removeprefix("version_")) if name.startswith("version_") else name
        for each in (logger, *_loggers_of_the_run(trainer)):
            pin_logger_version(each, version)
    continue_mlflow_run(trainer, found, logger_config)
    continue_wandb_run(trainer, found, logger_config)


def _keep_csv_files(logger: CSVLogger, trainer: Trainer) -> None:
    """Lightning's CSV writer deletes ``metrics.csv`` when it opens a run folder that exists ("Previous log
    files in this directory will be deleted"), before any callback's hook: a resumed run kept only its own
    epochs' rows, and a predict or test given that run's version lost them all. The file is moved aside while
    the writer opens the folder, and back, unwritten; the writer starts from its columns, so the new rows are
    appended (a new column rewrites the file with the old rows in it, as Lightning does within one process).
    The writer also wrote ``hparams.yaml`` afresh with the first settings it was given (the model's and
    data's): it now starts from the file's, and writes the file only when a fit changes them, so that a
    resume with nothing to train, or an evaluation, leaves both files as they were."""
    if rank_zero_only.rank != 0 or not Path(logger.log_dir).is_dir():
        return
    folder = Path(logger.log_dir)
    path, aside = folder / "metrics.csv", folder / ".metrics.csv.resumed"
    kept = path.is_file()
    if kept:
        os.replace(path, aside)
    try:
        writer = logger.experiment  # opens the folder, deleting metrics.csv
    finally:
        if kept:
            os.replace(aside, path)
    if kept:
        with path.open(newline="") as f:
            writer.metrics_keys = next(csv.reader(f), [])
    hparams = folder / writer.NAME_HPARAMS_FILE
    try:
        saved = yaml.safe_load(hparams.read_bytes())
    except (OSError, yaml.YAMLError):
        saved = None
    if not isinstance(saved, dict):
        return  # none to keep, or not a file of settings: Lightning's writer writes it afresh
    writer.hparams = saved

    def log_changed_hparams(params: dict) -> None:
        if trainer.state.fn != TrainerFn.FITTING:  # an evaluation's settings are not the run's
            return
        writer.hparams.update(params)
        with tempfile.TemporaryDirectory() as tmp:  # Lightning's writer, for its format
            save_hparams_to_yaml(Path(tmp) / hparams.name, writer.hparams)
            text = (Path(tmp) / hparams.name).read_bytes()
        if not (hparams.is_file() and hparams.read_bytes() == text):
            write_file(hparams, text, "the CSV logger's hparams")

    writer.log_hparams = log_changed_hparams


def check_compatible(model: LightningModule, checkpoint: dict, path: Path) -> None:
    """UserError unless ``checkpoint``'s weights fit ``model`` (same keys, same shapes)."""
    saved = checkpoint["state_dict"]
    expected = model.state_dict()
    missing = [k for k in expected if k not in saved]
    unexpected = [k for k in saved if k not in expected]
    mismatched = [
        f"{k} {tuple(saved[k].shape)} in the file vs {tuple(v.shape)} in the model"
        for k, v in expected.items()
        if k in saved and hasattr(saved[k], "shape") and saved[k].shape != v.shape
    ]
    if not (missing or unexpected or mismatched):
        return
    problems = []
    if mismatched:
        problems.append(f"{len(mismatched)} tensors of another shape (first: {mismatched[0]})")
    if missing:
        problems.append(f"{len(missing)} weights missing (first: {missing[0]})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected weights (first: {unexpected[0]})")
    saved_as = checkpoint.get("hyper_parameters", {}).get("_class_path") or checkpoint.get(
        "hparams_name", "?"
    )
    # The run's own config.yaml (beside checkpoints/) builds the model that fits; --model.* options alone
    # often cannot (the data decides num_classes).
    config = path.parent.parent / "config.yaml"
    fix = (
        f"run with --config {config}, the settings it was trained with (your own options after it)"
        if config.is_file()
        else "run with the config it was trained with (its run's config.yaml)"
    )
    raise UserError(
        f"checkpoint {path} does not fit {type(model).__name__}: {'; '.join(problems)}. It was saved by"
        f" {saved_as} with {_hparams_summary(checkpoint)}: {fix}"
    )


def _hparams_summary(checkpoint: dict) -> str:
    hparams = checkpoint.get("hyper_parameters", {})
    shown = {k: v for k, v in hparams.items() if not k.startswith("_") and not isinstance(v, dict)}
    return ", ".join(f"{k}={v}" for k, v in shown.items()) or "no recorded hyperparameters"


def prepare_ckpt_path(
    ckpt_path: str | None,
    trainer: Trainer,
    model: LightningModule,
    checkpoint: dict | None = None,
    logger_config=None,
    goes_on: bool = False,
) -> Path | None:
    """An explicit checkpoint file checked against ``model`` (``checkpoint``: that file, if already loaded);
    where the preflight found that a fit goes on in its run (``goes_on``: a run's last.ckpt, from ``last`` or
    by its path), that run's loggers are continued (``logger_config``: the CLI's ``trainer.logger`` as given,
    which MLflow's run is rebuilt from) and its folder returned; else None."""
    if ckpt_path in (None, UNTRAINED, *SPECIAL) or not is_local_path(ckpt_path):
        return None
    path = Path(ckpt_path)
    check_compatible(model, checkpoint or load_checkpoint_file(path, mmap=True), path)
    if not goes_on:
        return None
    rank_zero_info(f"resuming from {path}")
    _continue_run(trainer, path, logger_config)
    return path.parent.parent


def recorded_seed(run: Path) -> int | None:
    """The seed ``run``'s config.yaml records (``seed_everything``: the number a run of ``true`` drew), or
    None where it records none or cannot be read."""
    try:
        seed = yaml.safe_load((run / "config.yaml").read_text()).get("seed_everything")
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):  # AttributeError: not a mapping
        return None
    return seed if type(seed) is int else None
