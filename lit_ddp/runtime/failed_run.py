"""A run stopped by bad input or Ctrl-C before it has produced anything, or a ``validate`` or ``test`` stopped
by SIGTERM before its metrics, leaves no run directory behind.

Lightning creates ``version_N`` (the TensorBoard writer, config.yaml) before the data module's ``setup``,
where unreadable data or an impossible ``val_size`` are found, and before the sanity check, where a user who
sees a wrong setting presses Ctrl-C. Left behind, that empty run takes a version number: the next run is
``version_1`` and the paths in README and in the user's notes stop being true.
"""

import shutil
import sys
import time
import traceback
from pathlib import Path

import torch.distributed as dist
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_ddp.errors import UserError
from lit_ddp.runtime.run_lock import missing_folders, remove_empty_folders
from lit_ddp.utils import is_local_path
from lit_ddp.writes import write_file


def _unlogged_monitor(trainer: Trainer, exception: BaseException) -> UserError | None:
    """EarlyStopping's refusal of a monitor the run does not log (a RuntimeError, told by where it was raised:
    in the callback, whose monitor is missing from the run's metrics), naming the metrics the run logs."""
    frames = [frame for frame, _ in traceback.walk_tb(exception.__traceback__)]
    stopper = frames[-1].f_locals.get("self") if frames else None
    logged = trainer.callback_metrics
    if not isinstance(exception, RuntimeError) or not isinstance(stopper, EarlyStopping) or not logged:
        return None
    if stopper.monitor in logged:
        return None
    return UserError(
        f"EarlyStopping(monitor={stopper.monitor!r}): the run logs no {stopper.monitor}; it logs"
        f" {', '.join(logged)}: pass one of them as its monitor (--trainer.callbacks.monitor, or monitor: in"
        " YAML)"
    )


def refusal(trainer: Trainer | None, exception: BaseException) -> UserError | None:
    """The bad input that stopped the run as one line, or None: a UserError, an EarlyStopping monitor the run
    does not log, or Lightning's refusal of a validation interval longer than the epoch (a ValueError with
    nothing else to tell it by, raised once the epoch's batches are known, for any model)."""
    if isinstance(exception, UserError):
        return exception
    if trainer is None:
        return None
    unlogged = _unlogged_monitor(trainer, exception)
    if unlogged is not None:
        return unlogged
    interval, batches = trainer.val_check_interval, trainer.num_training_batches
    if not isinstance(exception, ValueError) or not isinstance(interval, int):
        return None
    if trainer.check_val_every_n_epoch is None or interval <= batches:
        return None
    return UserError(
        f"--trainer.val_check_interval={interval} validates every {interval} training batches, and an"
        f" epoch has {batches} per device: pass {batches} or fewer, or"
        " --trainer.check_val_every_n_epoch=null to count the batches across epochs"
    )


class RemoveFailedRunDir(Callback):
    """On a refusal (above) or a Ctrl-C (a KeyboardInterrupt: before training starts, or a second Ctrl-C),
    rank 0 deletes the run directory if this run created every file in it and no checkpoint is among them:
    never a resumed run's directory, never a file from before this run. In a folder that holds an earlier
    run's files (a resumed run's, or a version given by hand: ``--trainer.logger.init_args.version=0``) the
    files this run made go, and the settings files it wrote over (config.yaml, a CSV logger's hparams.yaml)
    are put back. A run without a logger writes its config into the root folder that such runs share: a
    config this run added goes, with the folders it made for it, left empty, and an earlier run's config it
    wrote over is put back as it was."""

    def __init__(self) -> None:
        self.started = time.time()  # before Lightning creates anything: the CLI builds callbacks first
        self.new_configs: list[Path] = []
        self.earlier_configs: dict[Path, bytes] = {}
        self.made: list[Path] = []  # deepest first
        self.earlier: set[Path] = set()  # the run folder's files and folders from before this run

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Before SaveConfigCallback's own setup (LightningCLI adds it after every other callback), after the
        # logger opened its files (Lightning's first step of set-up).
        if trainer.logger is not None:
            folder = trainer.logger.log_dir
            if folder is not None and is_local_path(folder) and Path(folder).is_dir():
                found = list(Path(folder).rglob("*"))
                self.earlier = {path for path in found if path.stat().st_mtime < self.started}
                self.earlier_configs = {
                    path: path.read_bytes() for path in self.earlier if path.suffix == ".yaml"
                }
            return
        root = Path(trainer.default_root_dir).absolute()
        self.made = missing_folders(root)
        configs = [root / c.config_filename for c in trainer.callbacks if isinstance(c, SaveConfigCallback)]
        self.new_configs = [path for path in configs if not path.exists()]
        self.earlier_configs = {path: path.read_bytes() for path in configs if path.is_file()}

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        interrupted = isinstance(exception, KeyboardInterrupt)
        # Lightning's SIGTERM handler ends validate or test after the batch it came in, before any metric,
        # with an exception that exits 0: a script or a scheduler would take the part that ran for a result.
        evaluating = trainer.state.fn in (TrainerFn.VALIDATING, TrainerFn.TESTING, TrainerFn.PREDICTING)
        terminated = isinstance(exception, SIGTERMException) and evaluating
        refused = refusal(trainer, exception) is not None
        if not (refused or interrupted or terminated) or not trainer.is_global_zero:
            return
        if trainer.world_size > 1 and not (dist.is_available() and dist.is_initialized()):
            return  # ddp_spawn's main process, which does not train: rank 0 knows whether the run did
        if terminated:
            exception.code = 1
        removed = None
        if trainer.global_step > 0:  # it trained (a full disk at its first checkpoint): its logs stay
            pass
        elif trainer.logger is None:
            removed = self._undo_configs()
        elif trainer.logger.log_dir is not None:  # else a logger with no local run folder (MLflow on a db)
            removed = self._remove_run_dir(Path(trainer.logger.log_dir))
        # Lightning says only that it shuts down, or that it received SIGTERM: what became of the run.
        if (interrupted and removed is not None) or terminated:
            by = "Ctrl-C" if interrupted else getattr(exception, "signal_name", "SIGTERM")
            when = "before the first training step" if trainer.state.fn == TrainerFn.FITTING else None
            line = f"lit_ddp: stopped by {by} {when or f'during {trainer.state.fn.value}'}: nothing to keep"
            print(line + (f", {removed} removed" if removed is not None else ""), file=sys.stderr, flush=True)

    def _remove_run_dir(self, run_dir: Path) -> Path | None:
        files = [p for p in run_dir.rglob("*") if p.is_file()] if run_dir.is_dir() else []
        if any(p.suffix == ".ckpt" for p in files) or any(p.stat().st_mtime < self.started for p in files):
            self._undo_in(run_dir)
            return None
        shutil.rmtree(run_dir, ignore_errors=True)
        return run_dir

    def _undo_in(self, run_dir: Path) -> None:
        """An earlier run's folder: what this run made in it goes (a file found at set-up is this run's if
        written since it started: the logger's event file), and the settings files it wrote over come back."""
        for path, text in self.earlier_configs.items():
            if not (path.is_file() and path.read_bytes() == text):
                write_file(path, text, "the earlier run's settings")
        for path in sorted(run_dir.rglob("*"), key=lambda p: len(p.parts), reverse=True):  # files first
            if path not in self.earlier and path.stat().st_mtime >= self.started:
                if path.is_file():
                    path.unlink()
                elif not any(path.iterdir()):
                    path.rmdir()

    def _undo_configs(self) -> Path | None:
        written = [path for path in self.new_configs if path.is_file()]
        for path in written:
            path.unlink(missing_ok=True)
        remove_empty_folders(self.made)
        for path, earlier in self.earlier_configs.items():
            if path.is_file() and path.read_bytes() != earlier:
                write_file(path, earlier, "the earlier run's config")
        return written[0] if written else None
