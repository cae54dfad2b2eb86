"""``--ckpt_path=last`` and ``best``, resolved from the config before anything is built: the model is then
built from the file found, as from a path given by hand (LightningCLI reads a checkpoint's settings only
when ``ckpt_path`` names a file as the command line is parsed).

Lightning resolves ``--ckpt_path=last`` inside the *new* run's directory (``version_N+1/checkpoints``),
which is empty, so a plain ``fit --ckpt_path=last`` would silently start from scratch. Here ``last`` means
the newest ``last*.ckpt`` of an earlier run *of the same model and data* under the logger's directory, and
the resumed run keeps logging into that run's directory (one TensorBoard run, one checkpoint folder), as does
a fit given that ``last.ckpt``'s path (``goes_on_in_its_run``). With no earlier checkpoint it starts fresh,
so an sbatch script can pass ``--ckpt_path=last`` on every (re)submission; with only other experiments'
runs there it is an error naming the run and what differs, since resuming one would train (and overwrite)
another experiment.

``best`` is that same run's best checkpoint, as its ModelCheckpoint recorded it in ``last.ckpt``: Lightning
knows the best only in the process that trained (``trainer.validate(ckpt_path="best")`` after ``fit``), so
in a new process its ``best`` is always an error.

Each recipe logs into a folder of its own (``logs/<recipe>/version_N``, see ``folders.experiment_name``),
so runs of different recipes never share the folder ``last`` searches.
"""

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

from lit_ddp.errors import UserError
from lit_ddp.models import current_name
from lit_ddp.preflight.checkpoint_file import load_checkpoint_file
from lit_ddp.preflight.folders import logger_configs
from lit_ddp.preflight.mlflow import StoreAnswers, mlflow_stores
from lit_ddp.utils import from_here, imported, is_local_path

VERSIONED = (TensorBoardLogger, CSVLogger)
FILE_STORE = "file:"  # MLflow's local tracking URI, whose folder ModelCheckpoint writes under
# A folder of this machine, or a remote one (s3://bucket/runs) kept as the text given: a Path would write it
# as s3:/bucket/runs, and nothing is read from it here (its runs are not searched).
Folder = Path | str


def _folder(given) -> Folder:
    return Path(str(given)) if is_local_path(given) else str(given)


def _under(folder: Folder, *names: str) -> Folder:
    """``folder/names`` (an empty name adds nothing, as in a Path)."""
    if isinstance(folder, Path):
        return folder.joinpath(*names)
    return "/".join([folder.rstrip("/"), *filter(None, names)])


# Said where a remote root's runs would be: its last.ckpt is not looked for, so no line may say it has none.
NOT_SEARCHED = "lit_ddp looks for runs on this machine's disks only"


def is_mlflow_run_id(name: str) -> bool:
    """Whether a folder's name is an MLflow run id (32 hex digits), as ModelCheckpoint names its folder."""
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


def is_wandb_run(folder: Path) -> bool:
    """Whether ``folder`` (``<save_dir>/<project>/<run id>``) is a W&B run's: W&B keeps each run's files in
    ``<save_dir>/wandb/run-<time>-<run id>`` (``offline-run-...`` offline)."""
    wandb_dir = folder.parent.parent / "wandb"
    return wandb_dir.is_dir() and any(wandb_dir.glob(f"*run-*-{glob.escape(folder.name)}"))


@dataclass(frozen=True)
class Runs:
    """Where this run's earlier runs are, as its config places them."""

    where: Folder  # the folder named when nothing is found there
    folder: Folder | None  # the folder `last` searches; None where Lightning's own lookup is right
    pattern: str  # the glob of each run's last*.ckpt in it
    logger: type | None  # the first logger's class, which decides which folders are its runs
    fixed: tuple[Path, ...]  # the checkpoint callbacks' own dirpaths, where Lightning's lookup goes
    model: str | None  # this run's model and data classes (short names)
    data: str | None
    # The version given to a versioned logger, or the run_id to MLflow's: its run is the one `last` reads.
    pinned: str | None = None

    def is_run(self, folder: Path) -> bool:
        """Whether ``folder`` is a run of the first logger: one named by an MLflow run id for MLflow, not a
        TensorBoard run (``version_N``) in the same root; a W&B run's for W&B; any other for a versioned
        logger, whose default folder (``logs/<recipe>``) W&B's default project shares."""
        if self.logger is not None and issubclass(self.logger, MLFlowLogger):
            return is_mlflow_run_id(folder.name)
        if self.logger is not None and issubclass(self.logger, WandbLogger):
            return is_wandb_run(folder)
        return not is_wandb_run(folder)

    def lasts(self) -> list[Path]:
        """Every run's ``last*.ckpt`` in the searched folder, of any model and data, newest first."""
        if not isinstance(self.folder, Path) or not self.pattern:  # none, or remote
            return []
        found = [p for p in self.folder.glob(self.pattern) if p.is_file() and self.is_run(p.parent.parent)]
        return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)

    def fixed_lasts(self) -> list[Path]:
        return [path for folder in self.fixed if folder.is_dir() for path in folder.glob("last*.ckpt")]

    def differences(self, checkpoint: dict) -> list[str]:
        """What a checkpoint's run was, where it is not this run: its model class and its data class."""
        saved_model = _class_name((checkpoint.get("hyper_parameters") or {}).get("_class_path"))
        saved_data = _class_name((checkpoint.get("datamodule_hyper_parameters") or {}).get("_class_path"))
        differs = []
        if saved_model and self.model and saved_model != self.model:
            differs.append(f"model {saved_model} (this run: {self.model})")
        if saved_data and self.data and saved_data != self.data:
            differs.append(f"data {saved_data} (this run: {self.data})")
        return differs


def _class_name(class_path) -> str | None:
    return str(current_name(class_path)).rsplit(".", 1)[-1] if class_path else None


def _checkpoint_dirs(config) -> list[str | None]:
    """The dirpath of each ModelCheckpoint the run will have, in Lightning's order: the user's, then lit_ddp's
    (``checkpoint``, ``last_checkpoint``); none where checkpointing is off."""
    trainer = config.get("trainer") or {}
    if trainer.get("enable_checkpointing") is False or trainer.get("barebones"):
        return []
    theirs = trainer.get("callbacks") or []
    chosen = [*(theirs if isinstance(theirs, list) else [theirs]), config.get("checkpoint")]
    chosen.append(config.get("last_checkpoint"))
    dirs = []
    for callback in chosen:
        cls = imported(str(callback.get("class_path"))) if hasattr(callback, "get") else None
        if isinstance(cls, type) and issubclass(cls, ModelCheckpoint):
            dirs.append((callback.get("init_args") or {}).get("dirpath"))
    return dirs


def _pinned_version(logger: tuple[type | None, dict]) -> str | None:
    """The folder name of the run a versioned logger is given (``version=0``: ``version_0``), or None where
    it picks its own: no version, or under SLURM the job id, which lit_ddp gives its default logger."""
    cls, init_args = logger
    version, job = init_args.get("version"), SLURMEnvironment.job_id()
    if cls is None or not issubclass(cls, VERSIONED) or version is None:
        return None
    if job is not None and str(version) == str(job):
        return None
    return version if isinstance(version, str) else f"version_{version}"  # Lightning's name for it


def _pinned(logger: tuple[type | None, dict]) -> str | None:
    """The run the first logger is given, which `last` and `best` read alone: a versioned logger's folder
    name (``_pinned_version``) or MLflow's run id."""
    cls, init_args = logger
    if cls is not None and issubclass(cls, MLFlowLogger) and init_args.get("run_id"):
        return str(init_args["run_id"])
    return _pinned_version(logger)


def _holds_run(folder: Path, sub_dir: str = "") -> bool:
    """Whether a run folder holds a run of lit_ddp's: its config.yaml (in TensorBoard's ``sub_dir``, its
    log_dir, where given) or a checkpoint (an empty folder, or another tool's event files alone, is none)."""
    configs = (folder / given / "config.yaml" for given in {"", sub_dir})
    return any(path.is_file() for path in configs) or any((folder / "checkpoints").glob("*.ckpt"))


def _given_run(trainer, cls: type | None, init_args) -> tuple[list[Path], str] | None:
    """The folders the run the first logger is given may be in, and the logger's key that names it: a
    versioned logger's ``version`` (``save_dir/name/version_N``), MLflow's ``run_id``
    (``<store>/<experiment id>/<run id>``, ModelCheckpoint's folder for it) and W&B's ``id`` or ``version``
    (``save_dir/<project>/<id>``); None where it is given none."""
    root = str(trainer.get("default_root_dir") or os.getcwd())
    if cls is not None and issubclass(cls, MLFlowLogger) and (run_id := init_args.get("run_id")):
        ((uri, _, _),) = mlflow_stores([(cls, init_args)])
        store = Path(uri[len(FILE_STORE) :] if uri.startswith(FILE_STORE) else root)
        return list(store.glob(f"*/{glob.escape(str(run_id))}")), "run_id"
    if cls is not None and issubclass(cls, WandbLogger) and (init_args.get("version") or init_args.get("id")):
        key = "version" if init_args.get("version") else "id"  # WandbLogger takes its run's id as either
        project = init_args.get("project") or os.environ.get("WANDB_PROJECT") or "lightning_logs"
        return [Path(str(init_args.get("save_dir") or root)) / project / str(init_args[key])], key
    if (version := _pinned_version((cls, init_args))) is None:
        return None
    run = _under(_folder(init_args.get("save_dir")), init_args.get("name") or "", version)
    return [run] if isinstance(run, Path) else [], "version"  # a remote store: not probed here


def pinned_run(config) -> tuple[Path, str] | None:
    """The folder of the run the first logger is given, and the key that names it (``_given_run``), where it
    holds an earlier run (``_holds_run``) that a new fit would write over; None elsewhere."""
    trainer = config.get("trainer") or {}
    loggers = logger_configs(trainer)
    given = _given_run(trainer, *loggers[0]) if loggers else None
    if given is None:
        return None
    folders, key = given
    sub_dir = str(loggers[0][1].get("sub_dir") or "")
    return next(((folder, key) for folder in folders if _holds_run(folder, sub_dir)), None)


def resumable_beside(pinned: Path, ckpt_path: str | None) -> Path | None:
    """The run beside the ``pinned`` one (under the same folder) whose ``last*.ckpt`` ``ckpt_path`` is, which
    giving the logger that run's folder name resumes in its own run; None for any other file."""
    path = Path(ckpt_path or "")
    run = path.parent.parent
    if not (path.name.startswith("last") and path.suffix == ".ckpt" and path.parent.name == "checkpoints"):
        return None
    beside = run.parent.resolve() == pinned.parent.resolve() and run.resolve() != pinned.resolve()
    return run if beside and path.is_file() else None


def _searched(
    config, experiment: str, root: Folder, ask: StoreAnswers
) -> tuple[Folder, str, type | None] | None:
    """The folder ``last`` searches, the glob of the runs' ``last*.ckpt`` there and the first logger's class,
    or None where Lightning's own lookup is right (a logger of another kind). A versioned logger keeps its
    runs under ``save_dir/name`` (a version given to it names the one run searched); with no logger,
    ModelCheckpoint writes to ``default_root_dir/checkpoints``. MLflow names each run's folder after its run
    id, under the experiment's id (ModelCheckpoint's rule:
    ``default_root_dir/<experiment id>/<run id>/checkpoints``): every rank asks the store (``ask``) for the
    id of the experiment named (no glob where there is none yet). W&B
    names each run's folder after its run id, under the project (``save_dir/<project>/<run id>/checkpoints``),
    unless the user named the run (``id``): that one folder is then Lightning's to look in."""
    trainer = config.get("trainer") or {}
    given = trainer.get("logger")
    if given is False or trainer.get("barebones"):
        return root, "checkpoints/last*.ckpt", None
    if given in (None, True):  # lit_ddp's default TensorBoard logger (assembly.trainer_arguments)
        return _under(root, experiment), "*/checkpoints/last*.ckpt", TensorBoardLogger
    loggers = logger_configs(trainer)
    cls, init_args = loggers[0] if loggers else (None, {})
    if cls is None:
        return None
    if issubclass(cls, VERSIONED):
        runs = _under(_folder(init_args.get("save_dir")), init_args.get("name") or "")
        pinned = _pinned_version((cls, init_args))
        if pinned is not None:
            return _under(runs, pinned), "checkpoints/last*.ckpt", cls
        return runs, "*/checkpoints/last*.ckpt", cls
    if issubclass(cls, WandbLogger):
        if init_args.get("id") or init_args.get("version"):
            return None
        project = init_args.get("project") or os.environ.get("WANDB_PROJECT") or "lightning_logs"
        return _under(_folder(init_args.get("save_dir") or root), project), "*/checkpoints/last*.ckpt", cls
    if issubclass(cls, MLFlowLogger):
        ((uri, name, run_id),) = mlflow_stores([(cls, init_args)])
        store = uri[len(FILE_STORE) :] if uri.startswith(FILE_STORE) else None
        if run_id is not None:  # that run alone, in its own experiment (none: the store row says why)
            holder = ask(uri, name, run_id).experiment_id
            run = _under(_folder(store or root), holder or "", run_id)
            return run, "checkpoints/last*.ckpt" if holder else "", cls
        # The named experiment's runs alone: another experiment's, beside them, is never resumed.
        found = ask(uri, name).experiment_id
        return _folder(store or root), f"{glob.escape(found)}/*/checkpoints/last*.ckpt" if found else "", cls
    return None


def runs_of(config, experiment: str, ask: StoreAnswers | None = None) -> Runs:
    """Where the earlier runs of a subcommand's parsed ``config`` are (``experiment``: the recipe's name;
    ``ask``: the preflight's MLflow answers, which the store row reads too)."""
    trainer = config.get("trainer") or {}
    root = _folder(trainer.get("default_root_dir") or os.getcwd())
    dirs = _checkpoint_dirs(config)
    # One callback writing into the run's folder (lit_ddp's last_checkpoint, unless given a folder) makes
    # the runs the place to search, whatever folder another checkpoint callback has of its own.
    searched = _searched(config, experiment, root, ask or StoreAnswers()) if None in dirs else None
    if searched is not None:
        where, pattern, logger = searched
    else:  # a versioned logger's folder, else the run's root, to name in a message
        loggers = logger_configs(trainer)
        cls, init_args = loggers[0] if loggers else (None, {})
        versioned = cls is not None and issubclass(cls, VERSIONED)
        where = _under(_folder(init_args.get("save_dir")), init_args.get("name") or "") if versioned else root
        pattern, logger = "", cls
    return Runs(
        where=where,
        folder=where if searched is not None else None,
        pattern=pattern,
        logger=logger,
        fixed=tuple(Path(d) for d in dirs if d is not None),
        model=_class_name((config.get("model") or {}).get("class_path")),
        data=_class_name((config.get("data") or {}).get("class_path")),
        pinned=_pinned(next(iter(logger_configs(trainer)), (None, {}))) if searched else None,
    )


def find_last(runs: Runs, asked: str = "last") -> Path | None:
    """The newest ``last*.ckpt`` of the runs of this model and data, or None when there is none at all;
    UserError when there are only other experiments' runs (``asked``: the value the error names)."""
    newest_other = None
    for path in runs.lasts():  # newest first; only the hyperparameters are read (memory-mapped)
        differs = runs.differences(load_checkpoint_file(path, mmap=True))
        if not differs:
            return path
        newest_other = newest_other or (path, differs)
    if newest_other is None:
        return None
    path, differs = newest_other
    raise UserError(
        f"--ckpt_path={asked}: the runs under {runs.folder} are other experiments', the newest"
        f" {path.parent.parent.name} with {' and '.join(differs)}: resuming it would train another model or"
        " data: pass --ckpt_path=PATH to a checkpoint of this one, or leave --ckpt_path out for a new run"
    )


def goes_on_in_its_run(runs: Runs, path: Path, checkpoint: dict) -> bool:
    """Whether ``path`` is a file ``--ckpt_path=last`` could resume: a run's ``last*.ckpt`` in the folder it
    searches, of this model and data, so that a fit from it goes on in that run. The same file under another
    name (a relative path, a link to the folder) is the same run; a link named last.ckpt to an epoch's file
    is still the run's last. Any other checkpoint (an epoch's, the best, a file outside the runs `last`
    searches) is a branch from an earlier point: continuing its run would log a second history over the
    steps the run took after it, so it starts a new run, as Lightning does."""
    where = (path.parent.resolve(), path.name)
    if not any((last.parent.resolve(), last.name) == where for last in runs.lasts()):
        return False
    return not runs.differences(checkpoint)


def _new_run_note(runs: Runs) -> str:
    """The line for ``fit --ckpt_path=last`` that found no run of its own to resume. A recipe's folder is
    named after its --config file, so a run of this model and data under another name (a config printed to
    my.yaml from a run without one) is named: the user may mean it."""
    if not isinstance(runs.folder, Path):
        return (
            f"--ckpt_path=last: the runs under {runs.folder} are not searched ({NOT_SEARCHED}), so this fit"
            " starts a new one: pass a run's last.ckpt there as --ckpt_path to train on from it"
        )
    line = f"--ckpt_path=last: no run under {runs.folder} to resume, so this fit starts a new one"
    # Other recipes' folders beside this one: a versioned logger's (MLflow's and W&B's are not by recipe).
    versioned = runs.logger is not None and issubclass(runs.logger, VERSIONED) and runs.pinned is None
    siblings = runs.folder.parent.glob(f"*/{runs.pattern}") if versioned else ()
    elsewhere = [
        p
        for p in siblings
        if p.is_file() and p.parent.parent.parent != runs.folder and runs.is_run(p.parent.parent)
    ]
    for path in sorted(elsewhere, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            differs = runs.differences(load_checkpoint_file(path, mmap=True))
        except UserError:  # not a checkpoint lit_ddp reads: not the run meant
            continue
        if not differs:
            return f"{line}; {path} is a run of this model and data: pass --ckpt_path={path} to resume it"
    return line


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


def _no_checkpoint(runs: Runs, subcommand: str, asked: str) -> str:
    """The line for ``last`` or ``best`` that found no run's checkpoint. A version (MLflow: a run_id) given to
    the logger names the one run searched: the line says so, and names the runs beside it that have one."""
    train = "pass --ckpt_path=PATH to a checkpoint, or train first with fit"
    if not isinstance(runs.where, Path):
        what = "last.ckpt" if asked == "last" else "checkpoint"
        return (
            f"{subcommand} --ckpt_path={asked}: no {what} from an earlier run under {runs.where} is looked"
            f" for ({NOT_SEARCHED}): pass --ckpt_path=PATH to a checkpoint there"
        )
    if runs.pinned is None:
        what = "last.ckpt" if asked == "last" else "checkpoint"
        where = from_here(runs.where)
        return f"{subcommand} --ckpt_path={asked}: no {what} from an earlier run under {where}: {train}"
    parent = runs.where.parent
    found = (p.parent.parent for p in parent.glob(f"*/{runs.pattern}") if p.is_file())
    others = ", ".join(sorted({run.name for run in found if runs.is_run(run)}))
    key = "run_id" if runs.logger is not None and issubclass(runs.logger, MLFlowLogger) else "version"
    line = f"{subcommand} --ckpt_path={asked}: the logger's {key} names the run {runs.where}, which has no"
    if not others:
        return f"{line} last.ckpt, nor has any run under {parent}: {train}"
    return (
        f"{line} last.ckpt (runs under {parent} with one: {others}): give the logger the {key} of one of"
        " them, or none (the newest run's), or pass --ckpt_path=PATH to a checkpoint"
    )


def resolve_named(runs: Runs, asked: str | None, subcommand: str) -> tuple[str | None, str | None]:
    """The ``--ckpt_path`` the subcommand gets for ``last`` or ``best`` (any other value as given) and the
    line to print about it, or None. With no earlier checkpoint, ``fit --ckpt_path=last`` starts fresh (a
    first submission of a requeued job: None); ``validate``, ``test`` and ``predict`` refuse, since they
    would score random weights. Where no run has a last.ckpt and a checkpoint callback has a fixed dirpath,
    ``last`` stays Lightning's to find."""
    if asked not in ("last", "best"):
        return asked, None
    evaluates = subcommand != "fit"
    if asked == "last":
        found = find_last(runs)
        if found is not None:
            return str(found), f"{subcommand}: {found}" if evaluates else None
        if evaluates and not runs.fixed_lasts():
            raise UserError(_no_checkpoint(runs, subcommand, asked))
        if evaluates or runs.fixed_lasts() or runs.folder is None:
            return asked, None  # Lightning's own lookup (a fixed dirpath)
        # Lightning's own warning for it would tell to set ModelCheckpoint(save_last=True), which every
        # lit_ddp run does.
        return None, f"lit_ddp: note: {_new_run_note(runs)}"
    fixed = runs.fixed_lasts()
    last = find_last(runs, asked) or max(fixed, key=lambda p: p.stat().st_mtime, default=None)
    if last is None:
        raise UserError(_no_checkpoint(runs, subcommand, asked))
    best, monitor = best_of_run(last)
    # fit starts a new run from those weights: the best run's own folder keeps its last.ckpt as it is.
    return str(best), f"{subcommand + ':' if evaluates else 'starting from'} {best} (best {monitor})"
