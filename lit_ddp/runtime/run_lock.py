"""One run at a time in a run directory: a lock file beside it, naming the process that holds it.

Two ``fit --ckpt_path=last`` on one root both resumed ``version_0`` and wrote into it: one run's final state
was lost and the folder held two event files. The run directory is held by ``.version_0.lock`` beside it
(beside, not inside: a run that fails to start leaves no folder behind), created atomically and holding the
holder's pid and host. A second run refuses in one line. A lock whose process is gone (killed, the node
rebooted) does not block: on the same host a dead pid is taken over; on another host it cannot be checked,
and the line names the file to delete.
"""

import atexit
import json
import os
import random
import socket
import time
from pathlib import Path

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger

from lit_ddp.callbacks.sinks import SHARED_SAVE_DIR, run_dir
from lit_ddp.errors import UserError
from lit_ddp.utils import is_local_path
from lit_ddp.writes import create_file, gone

NEW_ROOT = "give this run another --trainer.default_root_dir"


def lock_path(run_dir: Path) -> Path:
    return run_dir.parent / f".{run_dir.name}.lock"


def _holder(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # being written this instant, or removed: judged on the next try


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and the folders above it that do not exist yet, deepest first: what a run will make, for
    ``remove_empty_folders`` to take back if the run is refused."""
    folder = folder.absolute()
    return [p for p in (folder, *folder.parents) if not p.exists()]


def remove_empty_folders(folders: list[Path]) -> None:
    """Removes ``folders`` (deepest first) while they are empty: one that holds anything stays, and those
    above it."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


class RunLock(Callback):
    """Holds ``run_dir`` for this process until ``release()``, the run fails, or the process exits. A
    callback so that a run that fails gives it back (and the folders it made for it, if left empty); the
    copies that ranks receive hold nothing (the pid is the launcher's)."""

    def __init__(self, run_dir: Path | str, fix: str = NEW_ROOT) -> None:
        self.run_dir = Path(run_dir)
        self.fix = fix  # the refusal's other way out, besides waiting for the holder
        self.path = lock_path(self.run_dir)
        self.held = False
        self.made: list[Path] = []  # the folders this run creates above its run directory, deepest first

    def acquire(self) -> "RunLock":
        self.made = missing_folders(self.path.parent)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for attempt in range(3):
            try:  # the lock is the file's creation (O_EXCL), not a rename; a full disk is one line
                create_file(self.path, json.dumps(me), "the run lock")
            except FileExistsError:
                holder = _holder(self.path)
                if holder is None:  # created by another run this instant, its pid not yet written
                    time.sleep(0.1 * (attempt + 1))
                    continue
                same_host = holder.get("host") == me["host"]
                pid = int(holder.get("pid", -1))
                if same_host and (pid == me["pid"] or gone(pid)):
                    self.path.unlink(missing_ok=True)  # our own leftover, or a dead process's: stale
                    continue
                where = f"pid {pid}" + ("" if same_host else f" on {holder.get('host')}")
                stale = "" if same_host else f" (if no run is going on there, delete {self.path})"
                raise UserError(
                    f"{self.run_dir} is in use by another run ({where}){stale}: wait for it to finish, or"
                    f" {self.fix}"
                ) from None
            self.held = True
            atexit.register(self.release)
            return self
        raise UserError(f"{self.run_dir}: could not take its lock {self.path}: try again")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        holder = _holder(self.path)
        if holder is not None and holder.get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)
            remove_empty_folders(self.made)  # a failed start leaves none of them: logs/, logs/<recipe>/
        atexit.unregister(self.release)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.release()  # after RemoveFailedRunDir (callbacks run in order, this one last)


def launcher_rank_zero() -> bool:
    """Whether this process starts the run (rank 0 of a launcher's world, or the process Lightning spawns
    its ranks from): the ranks that a launcher or Lightning starts alongside it hold no lock of their own."""
    for name in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK"):
        if os.environ.get(name, "0") not in ("", "0"):
            return False
    return True


def start_wandb_run(logger: WandbLogger) -> None:
    """Starts (or joins) the logger's W&B run. W&B refusing the set-up (no API key and no terminal to ask
    for one, as in a batch job; a key it does not accept) is one line with its reason and the ways on."""
    from wandb.errors import Error as WandbError  # installed: the WandbLogger was created

    try:
        _ = logger.experiment
    except WandbError as err:
        reason = " ".join(str(err).split()).rstrip(".") or "(no message)"
        raise UserError(
            f"WandbLogger could not start its W&B run ({type(err).__name__}: {reason}): log in"
            " (`wandb login`, or WANDB_API_KEY), or log offline with --trainer.logger.init_args.offline=true"
            " (or WANDB_MODE=offline; `wandb sync` uploads the run later)"
        ) from None


def hold_run_dir(trainer: Trainer) -> RunLock | None:
    """The lock on the trainer's run directory, taken by the process that starts the run: a versioned
    logger's ``log_dir``, or the folder of an MLflow or W&B run (``<save_dir>/<experiment>/<run id>``, where
    its config.yaml and checkpoints/ go), whose resumes go on in one tracker run. None where there is no
    such local directory or this is not that process."""
    logger = trainer.logger
    if not launcher_rank_zero():
        return None
    if isinstance(logger, TensorBoardLogger | CSVLogger):
        lock = RunLock(logger.log_dir)
    elif isinstance(logger, SHARED_SAVE_DIR):
        if isinstance(logger, WandbLogger) and logger.version is None:
            start_wandb_run(logger)  # a new W&B run has its id once started; a resumed one is named by it
        # MLflow names a new run from `random`, which the run's seed has just fixed: every run had one name.
        # It draws from a fresh state here, and the seeded one is put back for the run.
        seeded = random.getstate()
        random.seed()
        try:
            folder = run_dir(trainer)  # MLflow's run id: the run it logs into, started (or found) here
        finally:
            random.setstate(seeded)
        if not is_local_path(folder):
            return None
        tracker = "W&B" if isinstance(logger, WandbLogger) else "MLflow"
        lock = RunLock(folder, f"start a new {tracker} run: both would log into run {logger.version}")
    else:
        return None
    lock.acquire()
    if isinstance(logger, WandbLogger):
        # Started here, in the process that spawns the ranks: ddp_spawn pickles the CLI's config with the
        # trainer, and a logger there that a resume replaced (wandb_resume.py) would start a W&B run without
        # an id, which this one would then join (a WandbLogger joins the W&B run in progress). After the
        # lock: a refused run starts none.
        start_wandb_run(logger)
    # Resilience (resilience.py, which imports this module) releases it after its other parts on a failure.
    holder = next((c for c in trainer.callbacks if hasattr(c, "run_lock")), None)
    if holder is not None:
        holder.run_lock = lock
    else:
        trainer.callbacks.append(lock)
    return lock
