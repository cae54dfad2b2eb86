"""Every private Lightning and torch name lit_ddp uses, and Lightning's loop internals: the only module that
touches them.

Each private name is used here, behind a small function, because no public route does the job;
``PRIVATE_NAMES`` lists them with the module that needs each and why; the patches that use them live in
lit_ddp/runtime/. Where a fit stands (the batch of the epoch, the epochs started and completed, whether an
epoch was cut short) is read from Lightning's loop progress counters, which are not underscored but belong
to loop classes that are: the functions at the end read them, for the models, callbacks and runtime alike.
All were checked on the versions in ``CHECKED_ON`` (pyproject.toml pins lightning to that minor release).
tests/test_compat.py exercises every function against the installed versions and fails, naming the entry,
when an upgrade removes or changes one; tests/test_architecture.py fails when another module uses a private
Lightning or torch name or a loop's internals.
"""

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from lightning import Callback, Trainer
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import DDPStrategy, Strategy
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher, _SubprocessScriptLauncher

CHECKED_ON = {"lightning": ("2.6.6",), "torch": ("2.11", "2.14.1"), "tensorboard": ("2.21.0",)}


@dataclass(frozen=True)
class PrivateName:
    name: str
    used_by: str
    why: str
    switch: str  # the option that runs without it


PRIVATE_NAMES = (
    PrivateName(
        "lightning.pytorch.loops._TrainingEpochLoop._broadcast_sigterm_tensor and ._batches_that_stepped",
        "preemption.py",
        "a blocking broadcast of rank 0's stop flag before every batch; preemption agrees on the flag itself"
        " every N batches without blocking, and there is no switch to turn the broadcast off. The step the"
        " loggers log at, which Lightning's restart counts once more for a checkpoint saved after a"
        " validation inside an epoch, taking it for one saved during that validation: a stop's resume sets"
        " it back",
        "--resilience.preemption=false",
    ),
    PrivateName(
        "lightning.pytorch.Trainer._signal_connector.received_sigterm and ._original_handlers",
        "preemption.py",
        "Lightning's loops stop on this flag (public read-only as Trainer.received_sigterm); set it to stop"
        " every rank at the batch the ranks agreed on. The handlers it puts back at its teardown, on a"
        " failure after every callback's on_exception: the SIGUSR1 recorder of fit's set-up among them",
        "--resilience.preemption=false",
    ),
    PrivateName(
        "lightning.pytorch.strategies.DDPStrategy._timeout",
        "faults.py",
        "the collective timeout: public only as DDPStrategy(timeout=...), but strategy='auto' or a strategy"
        " name is resolved inside the Trainer, after which only this attribute sets it",
        "--trainer.strategy=DDPStrategy with init_args.timeout (the user's own timeout is kept)",
    ),
    PrivateName(
        "lightning.pytorch.strategies.launchers._SubprocessScriptLauncher",
        "faults.py, launch.py",
        "the launcher of `--trainer.strategy=ddp`: its .procs are the ranks this process started",
        "--resilience.fault_monitor=false (launch.py: ddp_spawn or torchrun, where it is not used)",
    ),
    PrivateName(
        "lightning.fabric.strategies.launchers.subprocess_script._ChildProcessObserver._terminate_all"
        " and ._child_processes",
        "faults.py",
        "the thread that SIGKILLs the job when a child rank dies; replaced to name the lost rank first and"
        " end rank 0 with exit 1, not a SIGKILL of its own",
        "--resilience.fault_monitor=false",
    ),
    PrivateName(
        "lightning.pytorch.loggers.TensorBoardLogger._version",
        "resume.py",
        "`--ckpt_path=last` continues the earlier run's directory: the version is set before it is read",
        "--trainer.logger with a logger of your own (then --ckpt_path=last picks the file only)",
    ),
    PrivateName(
        "tensorboard.summary.writer.event_file_writer.EventFileWriter._async_writer._writer",
        "write_errors.py",
        "the RecordWriter that TensorBoard's background thread writes events with: an OSError there (full"
        " disk) killed the thread with a printed traceback; wrapped to hand the error to the main thread",
        "--trainer.logger with a logger of your own",
    ),
    PrivateName(
        "lightning.pytorch.strategies.launchers._MultiProcessingLauncher (its .launch and .procs)",
        "preemption.py",
        "ddp_spawn's launcher: its ranks run the fit without Lightning's exception handling, so a stop"
        " agreed on every rank would end them without last.ckpt, and a SIGTERM to the main process"
        " would kill it alone; its launch is wrapped on the instance to stop the ranks cleanly and to"
        " hand the main process's stop signals to them",
        "--resilience.preemption=false",
    ),
)


# ---- preemption ------------------------------------------------------------------------------------


def skip_stop_flag_broadcast(trainer: Trainer) -> None:
    """Switch off Lightning's broadcast of rank 0's stop flag before every training batch."""
    epoch_loop = trainer.fit_loop.epoch_loop
    if not hasattr(epoch_loop, "_broadcast_sigterm_tensor"):
        raise RuntimeError(_changed("_TrainingEpochLoop._broadcast_sigterm_tensor"))
    epoch_loop._broadcast_sigterm_tensor = lambda: None


def restore_stop_flag_broadcast(trainer: Trainer) -> None:
    vars(trainer.fit_loop.epoch_loop).pop("_broadcast_sigterm_tensor", None)  # back to Lightning's method


def request_stop(trainer: Trainer, stop: bool = True) -> None:
    """Make Lightning's loops stop at their next check, raising SIGTERMException (exit code 0); with
    ``stop=False``, take the request back (until it is made again)."""
    trainer._signal_connector.received_sigterm = stop


def restore_handler_at_teardown(trainer: Trainer, signum: int, handler) -> None:
    """Make Lightning's teardown give ``signum`` to ``handler``: it puts back the handlers it found as fit's
    set-up ended (one a callback installed for the set-up among them), also after a failure, where no
    callback's teardown runs after it."""
    originals = trainer._signal_connector._original_handlers
    if signum in originals:
        originals[signum] = handler


# ---- collectives and launchers ---------------------------------------------------------------------


def set_collective_timeout(strategy: Strategy, seconds: float) -> None:
    """Give a DDP strategy's collectives a ``seconds`` timeout, unless it was built with its own."""
    if isinstance(strategy, DDPStrategy) and strategy._timeout == default_pg_timeout:
        strategy._timeout = timedelta(seconds=seconds)


def collective_timeout(strategy: Strategy) -> timedelta | None:
    return getattr(strategy, "_timeout", None)


def launched_children(strategy: Strategy) -> list | None:
    """The ``subprocess.Popen`` of the ranks this process started (``--trainer.strategy=ddp``), or None
    when the strategy does not start ranks as scripts (spawn, torchrun, SLURM, one device)."""
    launcher = getattr(strategy, "launcher", None)
    return launcher.procs if isinstance(launcher, _SubprocessScriptLauncher) else None


def is_subprocess_launch(strategy: Strategy) -> bool:
    return isinstance(getattr(strategy, "launcher", None), _SubprocessScriptLauncher)


class SpawnLaunch:
    """ddp_spawn's launch, wrapped on the launcher instance (picklable: the trainer, launcher included, is
    pickled into every rank)."""

    def __init__(self, launcher, wrap_function, on_launched) -> None:
        self.launcher, self.wrap_function, self.on_launched = launcher, wrap_function, on_launched

    def procs(self) -> list:
        return list(getattr(self.launcher, "procs", []))

    def __call__(self, function, *args, **kwargs):
        with self.on_launched(self.procs):
            return type(self.launcher).launch(self.launcher, self.wrap_function(function), *args, **kwargs)


def wrap_spawn_launch(strategy: Strategy, wrap_function, on_launched) -> bool:
    """Under ddp_spawn: the function each rank runs becomes ``wrap_function(function)`` (picklable), and
    ``on_launched(procs)``, a context manager, is entered in the main process while its ranks run
    (``procs()``: their multiprocessing.Process objects, once started); True if the strategy spawns them."""
    launcher = getattr(strategy, "launcher", None)
    if not isinstance(launcher, _MultiProcessingLauncher):
        return False
    if not isinstance(vars(launcher).get("launch"), SpawnLaunch):
        launcher.launch = SpawnLaunch(launcher, wrap_function, on_launched)
    return True


def replace_child_observer_kill(children: list, end_job) -> bool:
    """Make Lightning's child-process observer call ``end_job()`` where, a child having died, it would
    SIGKILL every child and then this process; True if the observer was found."""
    for thread in threading.enumerate():
        if isinstance(thread, _ChildProcessObserver) and thread._child_processes is children:
            thread._terminate_all = end_job
            return True
    return False


# ---- callbacks: Lightning's dispatch of a batch's hooks -------------------------------------------------

# The hooks Lightning calls on every entry of ``trainer.callbacks`` at every batch.
BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


def skip_batch_hooks(callback: Callback, skipped: Iterable[str]) -> None:
    """Make Lightning's dispatch pass over ``callback``'s per-batch hooks named in ``skipped`` (hooks that do
    nothing), and call its other per-batch hooks again if they were skipped before.

    Lightning calls a callback's hook only where the attribute is callable (its loop's dispatch of every
    hook to every callback, inside a profiler context labelled with the callback's ``state_key``): a None
    on the instance is passed over, where ``Callback``'s empty method would be called at every batch. The
    class's own methods stay, for ``super()`` and for code that calls the hook on the class."""
    skipped = set(skipped)
    for name in BATCH_HOOKS:
        if name in skipped:
            setattr(callback, name, None)
        elif name in vars(callback) and vars(callback)[name] is None:
            del vars(callback)[name]


# ---- loggers and files -----------------------------------------------------------------------------


def logger_version_unset(logger: Logger) -> bool:
    """Whether the logger will choose its run's version itself (none was given)."""
    return getattr(logger, "_version", None) is None


def logger_version_given(logger: Logger):
    return getattr(logger, "_version", None)


def pin_logger_version(logger: Logger, version: int | str) -> None:
    """Make ``logger`` write into the run ``version`` (before anything has read its log_dir)."""
    logger._version = version


def hand_event_write_errors_to(summary_writer, on_error) -> bool:
    """Make the background thread of torch's ``SummaryWriter`` call ``on_error(err)`` on an OSError while
    writing or flushing events (and drop those events) instead of dying; True if the writer was found."""
    event_writer = getattr(getattr(summary_writer, "file_writer", None), "event_writer", None)
    record_writer = getattr(getattr(event_writer, "_async_writer", None), "_writer", None)
    if record_writer is None or not all(hasattr(record_writer, m) for m in ("write", "flush")):
        return False

    def guard(method):
        def guarded(*args):
            try:
                method(*args)
            except OSError as err:
                on_error(err)

        return guarded

    record_writer.write, record_writer.flush = guard(record_writer.write), guard(record_writer.flush)
    return True


def _changed(name: str) -> str:
    return (
        f"lit_ddp relies on Lightning's private {name}, which this Lightning release no longer has:"
        f" install a lightning version lit_ddp was checked on ({', '.join(CHECKED_ON['lightning'])})"
    )


# ---- where a fit stands: Lightning's loop progress ----------------------------------------------------


def batches_done(trainer: Trainer) -> int:
    """Training batches completed in the current epoch (kept after the epoch ends, until the next starts)."""
    return trainer.fit_loop.epoch_loop.batch_progress.current.completed


def batch_in_progress(trainer: Trainer) -> int:
    """The index in its epoch of the training batch being run (from ``on_train_batch_start`` on)."""
    return trainer.fit_loop.epoch_loop.batch_progress.current.ready - 1


def at_last_batch(trainer: Trainer) -> bool:
    """Whether the batch just run was its epoch's last (the loader is exhausted, whatever its length)."""
    return trainer.fit_loop.epoch_loop.batch_progress.is_last_batch


def batch_counted(trainer: Trainer) -> bool:
    """Whether the training batch just run is counted whole: its ``on_train_batch_end``, the validation that
    follows it and its logging step are behind it (a checkpoint saved now is saved after all three)."""
    total = trainer.fit_loop.epoch_loop.batch_progress.total
    return total.completed == total.processed and not trainer.validating


def logging_step(trainer: Trainer) -> int:
    """The step loggers put training's points at: the batches that stepped the optimizer, over resumes."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def set_logging_step(trainer: Trainer, step: int) -> None:
    trainer.fit_loop.epoch_loop._batches_that_stepped = step


def epochs_started_completed(trainer: Trainer) -> tuple[int, int]:
    """(epochs started, epochs completed) of this fit, resumed ones included: an epoch in progress has
    started and not completed."""
    progress = trainer.fit_loop.epoch_progress.current
    return progress.started, progress.completed


def epoch_cut_short(trainer: Trainer) -> bool:
    """Whether the training epoch ending now stopped before its last batch: ``max_steps``, ``max_time`` or a
    callback's ``should_stop`` ended the fit inside it. Lightning still ends that epoch (its epoch-end hooks
    run, its checkpoints are written), but the epoch is not over: a resumed run goes on inside it."""
    done = batches_done(trainer)
    return not at_last_batch(trainer) and 0 < done < trainer.num_training_batches


def load_train_dataloader(trainer: Trainer) -> None:
    """Build the training loader now (``num_training_batches`` set), as ``estimated_stepping_batches`` does
    for a run with a length: for ``configure_optimizers`` in a run without one (``max_epochs=-1``)."""
    trainer.fit_loop.setup_data()


def resume_inside_epoch(checkpoint: dict) -> None:
    """Make ``checkpoint``, saved at the end of an epoch that a stop cut short, resume inside that epoch. Its
    fit loop's state (``Loop.state_dict``: the epoch progress counters) counts an epoch processed before the
    epoch-end hooks that save checkpoints, and completed after them: with the epoch not yet processed,
    Lightning restores it as a stop inside the epoch, at the next batch."""
    progress = checkpoint["loops"]["fit_loop"]["epoch_progress"]
    for counts in (progress["total"], progress["current"]):
        counts["processed"] = min(counts["processed"], counts["completed"])
