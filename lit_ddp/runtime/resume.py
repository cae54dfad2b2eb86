"""``--ckpt_path`` checked before any process starts: ``last`` and ``best`` find the previous run, a bad file
fails once.

Lightning resolves ``--ckpt_path=last`` inside the *new* run's directory (``version_N+1/checkpoints``),
which is empty, so a plain ``fit --ckpt_path=last`` would silently start from scratch. Here ``last`` means
the newest ``last*.ckpt`` of an earlier run *of the same model and data* under the logger's directory, and
the resumed run keeps logging into that run's directory (one TensorBoard run, one checkpoint folder), as does
a fit given that ``last.ckpt``'s path. With no earlier checkpoint it starts fresh, so an sbatch script can
pass ``--ckpt_path=last`` on every (re)submission; with only other experiments' runs there it is an error
naming the run and what differs, since resuming one would train (and overwrite) another experiment.

``best`` is that same run's best checkpoint, as its ModelCheckpoint recorded it in ``last.ckpt``: Lightning
knows the best only in the process that trained (``trainer.validate(ckpt_path="best")`` after ``fit``), so
in a new process its ``best`` is always an error.

Each recipe logs into a folder of its own (``logs/<recipe>/version_N``, see ``preflight.experiment_name``),
so runs of different recipes never share the folder ``last`` searches.
"""

import csv
import os
import tempfile
from pathlib import Path

import yaml
from lightning import LightningModule, Trainer
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from lit_ddp.compat import logger_version_given, logger_version_unset, pin_logger_version
from lit_ddp.errors import UserError
from lit_ddp.preflight.checkpoint import SPECIAL, UNTRAINED
from lit_ddp.preflight.checkpoint_file import load_checkpoint_file
from lit_ddp.runtime.mlflow_resume import continue_mlflow_run, is_mlflow_run_id
from lit_ddp.runtime.wandb_resume import continue_wandb_run, is_wandb_run
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


def _class_name(class_path: str | None) -> str | None:
    return class_path.rsplit(".", 1)[-1] if class_path else None


def _differences(checkpoint: dict, model: LightningModule, datamodule) -> list[str]:
    """What a checkpoint's run was, where it is not this run: its model class and its data class."""
    saved_model = _class_name((checkpoint.get("hyper_parameters") or {}).get("_class_path"))
    saved_data = _class_name((checkpoint.get("datamodule_hyper_parameters") or {}).get("_class_path"))
    this_data = type(datamodule).__name__ if datamodule is not None else None
    differs = []
    if saved_model and saved_model != type(model).__name__:
        differs.append(f"model {saved_model} (this run: {type(model).__name__})")
    if saved_data and this_data and saved_data != this_data:
        differs.append(f"data {saved_data} (this run: {this_data})")
    return differs


def find_last_checkpoint(
    trainer: Trainer, model: LightningModule, datamodule, asked: str = "last"
) -> Path | None:
    """The newest ``last*.ckpt`` of the runs of this model and data under the logger's ``save_dir/name``,
    or None when there is none at all; UserError when there are only other experiments' runs (``asked``:
    the ``--ckpt_path`` value the error names)."""
    searched = _runs_lasts(trainer)
    if searched is None:
        return None  # a fixed checkpoint dirpath or a pinned version: Lightning's own "last" is right
    runs, lasts = searched
    candidates = sorted(lasts, key=lambda p: p.stat().st_mtime, reverse=True)
    if not candidates:
        return None
    newest_other = None
    for path in candidates:  # newest first; only the hyperparameters are read (memory-mapped)
        differs = _differences(load_checkpoint_file(path, mmap=True), model, datamodule)
        if not differs:
            return path
        newest_other = newest_other or (path, differs)
    path, differs = newest_other
    raise UserError(
        f"--ckpt_path={asked}: the runs under {runs} are other experiments', the newest"
        f" {path.parent.parent.name} with {' and '.join(differs)}: resuming it would train another model or"
        " data: pass --ckpt_path=PATH to a checkpoint of this one, or leave --ckpt_path out for a new run"
    )


def _runs_lasts(trainer: Trainer) -> tuple[Path, list[Path]] | None:
    """The folder ``last`` searches and the ``last*.ckpt`` of every run of the trainer's logger in it, of
    any model and data; None where ``last`` is Lightning's to find (``_last_searched``)."""
    searched = _last_searched(trainer)
    if searched is None:
        return None
    runs, pattern = searched
    return runs, [p for p in runs.glob(pattern) if p.is_file() and _is_run(p.parent.parent, trainer)]


def _is_runs_last(trainer: Trainer, path: Path, checkpoint: dict, model: LightningModule, datamodule) -> bool:
    """Whether ``path`` is a file ``--ckpt_path=last`` could resume: a run's ``last*.ckpt`` in the folder it
    searches, of this model and data. The same file under another name (a relative path, a link to the
    folder) is the same run; a link named last.ckpt to an epoch's file is still the run's last."""
    searched = _runs_lasts(trainer)
    if searched is None:
        return False
    where = (path.parent.resolve(), path.name)
    if not any((last.parent.resolve(), last.name) == where for last in searched[1]):
        return False
    return not _differences(checkpoint, model, datamodule)


def _last_searched(trainer: Trainer) -> tuple[Path, str] | None:
    """``_runs_searched``, where ``last`` is lit_ddp's to find: None for a checkpoint callback with a fixed
    dirpath, or none at all."""
    checkpoint = trainer.checkpoint_callback
    if not isinstance(checkpoint, ModelCheckpoint) or checkpoint.dirpath is not None:
        return None
    return _runs_searched(trainer)


def _new_run_note(trainer: Trainer, model: LightningModule, datamodule) -> str | None:
    """The line for ``fit --ckpt_path=last`` that found no run of its own to resume, or None where Lightning
    looks itself. A recipe's folder is named after its --config file, so a run of this model and data under
    another name (a config printed to my.yaml from a run without one) is named: the user may mean it."""
    searched = _last_searched(trainer)
    if searched is None:
        return None
    runs, pattern = searched
    # Other recipes' folders beside this one: a versioned logger's (MLflow's and W&B's are not by recipe).
    siblings = runs.parent.glob(f"*/{pattern}") if _logger_with_versions(trainer) is not None else ()
    elsewhere = sorted(
        (
            p
            for p in siblings
            if p.is_file() and p.parent.parent.parent != runs and _is_run(p.parent.parent, trainer)
        ),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    line = f"--ckpt_path=last: no run under {runs} to resume, so this fit starts a new one"
    for path in elsewhere:
        try:
            differs = _differences(load_checkpoint_file(path, mmap=True), model, datamodule)
        except UserError:  # not a checkpoint lit_ddp reads: not the run meant
            continue
        if not differs:
            return f"{line}; {path} is a run of this model and data: pass --ckpt_path={path} to resume it"
    return line


def _fixed_dir_lasts(trainer: Trainer) -> list[Path]:
    """The last*.ckpt files in the checkpoint callbacks' fixed dirpaths, where Lightning's own lookup goes."""
    return [
        path
        for cb in trainer.checkpoint_callbacks
        if isinstance(cb, ModelCheckpoint) and cb.dirpath is not None and Path(cb.dirpath).is_dir()
        for path in Path(cb.dirpath).glob("last*.ckpt")
        if path.is_file()
    ]


def _newest_last_for_best(trainer: Trainer, model: LightningModule, datamodule) -> Path | None:
    """The ``last*.ckpt`` that ``--ckpt_path=last`` resumes: this recipe's newest run of this model and data,
    or the newest in a checkpoint callback's fixed dirpath."""
    found = find_last_checkpoint(trainer, model, datamodule, asked="best")
    return found or max(_fixed_dir_lasts(trainer), key=lambda p: p.stat().st_mtime, default=None)


def best_of_run(last: Path) -> tuple[Path, str]:
    """The best checkpoint of ``last``'s run and the metric it was chosen by, from the run's first
    monitoring ModelCheckpoint's state saved in ``last`` (Lightning's own choice among several). The file is
    looked for beside ``last`` too: a run folder that was moved or copied keeps its checkpoints together."""
    states = (load_checkpoint_file(last, mmap=True).get("callbacks") or {}).values()
    recorded = [
        state
        for state in states
        if isinstance(state, dict) and state.get("monitor") and state.get("best_model_path")
    ]
    if not recorded:
        raise UserError(
            f"--ckpt_path=best: the run of {last} recorded no best checkpoint (no validation ran, or no"
            " checkpoint monitors a metric): pass --ckpt_path=last, or --ckpt_path=PATH to a checkpoint"
        )
    best = Path(recorded[0]["best_model_path"])
    for candidate in (best, last.parent / best.name):
        if candidate.is_file():
            return candidate, recorded[0]["monitor"]
    raise UserError(
        f"--ckpt_path=best: the run of {last} recorded {best} as its best, and it is gone (not beside"
        f" {last.name} either): pass --ckpt_path=last, or --ckpt_path=PATH to a checkpoint"
    )


def _runs_searched(trainer: Trainer) -> tuple[Path, str] | None:
    """The folder ``last`` searches and the glob of the runs' ``last*.ckpt`` there, or None where Lightning's
    own lookup is right (a version the user pinned, a logger of another kind). A versioned logger keeps its
    runs under ``save_dir/name``; with no logger, ModelCheckpoint writes to ``default_root_dir/checkpoints``.
    MLflow names each run's folder after its run id, under the experiment's id (ModelCheckpoint's rule:
    ``default_root_dir/<experiment id>/<run id>/checkpoints``), and only rank 0 knows that id: every
    experiment's run folders are searched, so that every rank finds the same file. W&B names each run's
    folder after its run id, under the project (``save_dir/<project>/<run id>/checkpoints``), unless the
    user named the run (``id``): that one folder is then Lightning's to look in."""
    versioned = _logger_with_versions(trainer)
    if versioned is not None:
        return Path(versioned.save_dir) / (versioned.name or ""), "*/checkpoints/last*.ckpt"
    logger = trainer.logger
    if isinstance(logger, WandbLogger) and logger.version is None:  # version: the id named, before the run
        return Path(logger.save_dir or trainer.default_root_dir) / logger.name, "*/checkpoints/last*.ckpt"
    if isinstance(logger, MLFlowLogger):
        return Path(logger.save_dir or trainer.default_root_dir), "*/*/checkpoints/last*.ckpt"
    if logger is None:  # --trainer.logger=false: every run's checkpoints in one folder
        return Path(trainer.default_root_dir), "checkpoints/last*.ckpt"
    return None


def _is_run(folder: Path, trainer: Trainer) -> bool:
    """Whether ``folder`` is a run of the trainer's logger: one named by an MLflow run id (32 hex digits) for
    MLflow, not a TensorBoard run (``version_N``) in the same root; a W&B run's for W&B; any other for a
    versioned logger, whose default folder (``logs/<recipe>``) W&B's default project shares."""
    if isinstance(trainer.logger, MLFlowLogger):
        return is_mlflow_run_id(folder.name)
    if isinstance(trainer.logger, WandbLogger):
        return is_wandb_run(folder)
    return trainer.logger is None or not is_wandb_run(folder)


def _runs_dir(trainer: Trainer) -> Path:
    searched = _runs_searched(trainer)
    if searched is not None:
        return searched[0]
    logger = trainer.logger
    if isinstance(logger, TensorBoardLogger | CSVLogger):
        return Path(logger.save_dir) / (logger.name or "")
    return Path(trainer.default_root_dir)


def _loggers_of_the_run(trainer: Trainer) -> list[TensorBoardLogger | CSVLogger]:
    """The versioned loggers after the first that write under the first's ``save_dir/name`` and would pick
    their version themselves."""
    first = trainer.logger
    if not isinstance(first, TensorBoardLogger | CSVLogger):
        return []
    return [
        logger
        for logger in trainer.loggers[1:]
        if isinstance(logger, TensorBoardLogger | CSVLogger)
        and logger_version_unset(logger)
        and Path(logger.root_dir) == Path(first.root_dir)
    ]


def share_run_folder(trainer: Trainer) -> None:
    """Versioned loggers under one ``save_dir/name`` (TensorBoard and CSV, say) write one run folder, the
    first logger's. Each picked its own next ``version_N``: TensorBoard made version_0 and CSV, finding it,
    took version_1, so a run's files were split over two folders and a resume continued only the first."""
    others = _loggers_of_the_run(trainer)
    if others:
        version = trainer.logger.version
        for logger in others:
            pin_logger_version(logger, version)


def _continue_run(trainer: Trainer, found: Path, logger_config) -> None:
    """A fit resumed from ``found`` goes on in that checkpoint's run: a versioned logger's ``version_N``
    (with the CSV rows it holds; every logger that shares the folder), an MLflow logger's run
    (mlflow_resume.py), a W&B logger's run (wandb_resume.py)."""
    run_dir = found.parent.parent
    logger = _logger_with_versions(trainer)
    if logger is not None:
        name = run_dir.name
        version = int(name.removeprefix("version_")) if name.startswith("version_") else name
        for each in (logger, *_loggers_of_the_run(trainer)):
            pin_logger_version(each, version)
            if isinstance(each, CSVLogger):
                _keep_csv_files(each)
    continue_mlflow_run(trainer, found, logger_config)
    continue_wandb_run(trainer, found, logger_config)


def _keep_csv_files(logger: CSVLogger) -> None:
    """Lightning's CSV writer deletes ``metrics.csv`` when it opens a run folder that exists ("Previous log
    files in this directory will be deleted"): the resumed run kept only its own epochs' rows. The file is
    moved aside while the writer opens the folder, and back, unwritten; the writer starts from its columns,
    so the new rows are appended (a new column rewrites the file with the old rows in it, as Lightning does
    within one process). The writer also wrote ``hparams.yaml`` afresh with the first settings it was given
    (the model's and data's): it now starts from the file's, and writes the file only when they change, so
    that a resume with nothing to train leaves both files as they were."""
    folder = Path(logger.log_dir)
    if rank_zero_only.rank != 0 or not folder.is_dir():
        return
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
    subcommand: str = "fit",
    checkpoint: dict | None = None,
    datamodule=None,
    logger_config=None,
) -> tuple[str | None, Path | None]:
    """The path the subcommand should get, and the run folder a fit goes on in (None: a new run, or not a
    fit): ``last`` resolved across the runs of this model and data, ``best`` to that run's best checkpoint;
    an explicit file checked now (``checkpoint``: that file, if already loaded). A fit resumed from ``last``,
    or from the path of a file ``last`` could find, goes on in that run (``logger_config``: the CLI's
    ``trainer.logger`` as given, which MLflow's run is rebuilt from).

    With no earlier checkpoint, ``fit --ckpt_path=last`` starts fresh (a first submission of a requeued
    job); ``validate``, ``test`` and ``predict`` refuse, since they would score random weights (without
    ``ckpt_path`` preflight refused them already, unless ``--model.weights`` or ``untrained`` says so)."""
    if ckpt_path in (None, UNTRAINED):  # with no weights at all, preflight refused validate, test, predict
        return None, None
    if ckpt_path == "last":
        found = find_last_checkpoint(trainer, model, datamodule)
        if found is None and subcommand != "fit" and not _fixed_dir_lasts(trainer):
            raise UserError(
                f"{subcommand} --ckpt_path=last: no last.ckpt from an earlier run under"
                f" {_runs_dir(trainer)}: pass --ckpt_path=PATH to a checkpoint, or train first with fit"
            )
        if found is None:
            lightnings = subcommand != "fit" or _fixed_dir_lasts(trainer)
            note = None if lightnings else _new_run_note(trainer, model, datamodule)
            if note is None:
                return ckpt_path, None  # Lightning's own lookup (a fixed dirpath, a pinned version)
            # A first submission of a requeued job, say: a new run. Lightning's own warning for it would
            # tell to set ModelCheckpoint(save_last=True), which every lit_ddp run does.
            rank_zero_info(f"lit_ddp: note: {note}")
            return None, None
        if subcommand != "fit":  # an evaluation gets a run of its own
            rank_zero_info(f"{subcommand}: {found}")
        ckpt_path, checkpoint, resumed = str(found), None, subcommand == "fit"
    elif ckpt_path == "best":
        last = _newest_last_for_best(trainer, model, datamodule)
        if last is None:
            raise UserError(
                f"{subcommand} --ckpt_path=best: no checkpoint from an earlier run under"
                f" {_runs_dir(trainer)}: pass --ckpt_path=PATH to a checkpoint, or train first with fit"
            )
        best, monitor = best_of_run(last)
        # fit starts a new run from those weights: the best run's own folder keeps its last.ckpt as it is.
        rank_zero_info(
            f"{'starting from' if subcommand == 'fit' else subcommand + ':'} {best} (best {monitor})"
        )
        ckpt_path, checkpoint, resumed = str(best), None, False
    elif ckpt_path in SPECIAL or "://" in ckpt_path:
        return ckpt_path, None
    else:
        # A run's last.ckpt given by its path (copied from `resuming from`, an sbatch script) is the file
        # `last` would resume, and goes on in that run the same way. Any other checkpoint (an epoch's, the
        # best, a file outside the runs `last` searches) is a branch from an earlier point: continuing its
        # run would log a second history over the steps the run took after it, so it starts a new run, as
        # Lightning does; so does another model's or data's last.ckpt, which `last` never resumes either.
        checkpoint = checkpoint or load_checkpoint_file(Path(ckpt_path), mmap=True)
        resumed = subcommand == "fit" and _is_runs_last(
            trainer, Path(ckpt_path), checkpoint, model, datamodule
        )
    path = Path(ckpt_path)
    check_compatible(model, checkpoint or load_checkpoint_file(path, mmap=True), path)
    if resumed:
        rank_zero_info(f"resuming from {path}")
        _continue_run(trainer, path, logger_config)
    return ckpt_path, path.parent.parent if resumed else None


def recorded_seed(run: Path) -> int | None:
    """The seed ``run``'s config.yaml records (``seed_everything``: the number a run of ``true`` drew), or
    None where it records none or cannot be read."""
    try:
        seed = yaml.safe_load((run / "config.yaml").read_text()).get("seed_everything")
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):  # AttributeError: not a mapping
        return None
    return seed if type(seed) is int else None
