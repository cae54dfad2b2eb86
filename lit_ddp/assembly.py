"""What a run's Trainer is given: the default callbacks, the ones a config keeps, the flags for what it
turns off, the plugins and the default logger.

``trainer_arguments`` reads the config's ``trainer`` section (its classes built) and lit_ddp's callbacks as
the config left them, and returns the Trainer arguments that differ from the section: a function of its
inputs alone, so tests/test_assembly.py checks each rule as a row of a table. The CLI hands them to
LightningCLI's Trainer. Nothing here imports jsonargparse, so a benchmark builds the same callbacks without
the CLI.
"""

import os
from collections.abc import Mapping
from contextlib import nullcontext

from lightning import Callback
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import LearningRateMonitor as AnyLearningRateMonitor
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.callbacks import ModelSummary as AnyModelSummary
from lightning.pytorch.callbacks import ProgressBar as AnyProgressBar
from lightning.pytorch.profilers import PassThroughProfiler

from lit_ddp.callbacks import Dashboard, LastCheckpoint, PredictionWriter
from lit_ddp.callbacks.group import CallbackGroup, skip_unused_batch_hooks
from lit_ddp.runtime.checkpoint_io import with_atomic_checkpoint_io
from lit_ddp.runtime.console import Console
from lit_ddp.runtime.gc_freeze import FreezeGC
from lit_ddp.runtime.resilience import Resilience
from lit_ddp.runtime.sync_batchnorm import with_sync_batchnorm
from lit_ddp.runtime.write_errors import WriteSafeTensorBoardLogger

# The default callbacks, in the order Lightning calls them (it moves checkpoint callbacks last): each is named
# for what a user sees or is protected from (docs/architecture.md gives the reason for each; a test compares).
# The key is the config key: `--KEY.ARG=VALUE` sets an argument, `--KEY=null` (`KEY: null` in YAML) leaves
# the callback out. The values are each callback's defaults for lit_ddp.
CALLBACKS: dict[str, tuple[type[Callback], dict]] = {
    # what the run prints: quieted upstream noise, unreadable files, the epoch line (+ the bar and summary)
    "console": (Console, {}),
    # a stop signal saves last.ckpt; a NaN stops before the update; a lost rank is named; nothing left half
    "resilience": (Resilience, {}),
    # TensorBoard (or the logger picked): step loss, learning rate, throughput, images, confusion, run info
    "dashboard": (Dashboard, {}),
    # predict: predictions.csv in the run directory, one row per image, the same on any device count
    "predictions": (PredictionWriter, {}),
    # the best epoch by val/acc, and last.ckpt: always the newest state, which --ckpt_path=last resumes
    "checkpoint": (
        ModelCheckpoint,
        {
            "monitor": "val/acc",
            "mode": "max",
            "filename": "epoch{epoch:03d}-step{step}",
            "auto_insert_metric_name": False,
        },
    ),
    "last_checkpoint": (LastCheckpoint, {}),
}

# Off unless named (`--KEY=CLASS_PATH`, or `KEY: {class_path: ...}` in YAML): each changes how a run goes,
# not what a user sees or keeps. docs/architecture.md lists both tables with the reason for each entry.
OPT_IN_CALLBACKS: dict[str, type[Callback]] = {
    # one collection at train start, then gc.freeze(): no full collection stalls the ranks mid-epoch
    "gc_freeze": FreezeGC,
}

# A Trainer flag that turns a feature off turns lit_ddp's callback for it off too.
OFF_SWITCHES = {"enable_checkpointing": ModelCheckpoint}
# Lightning's raw-speed mode refuses the features it turns off: a recipe's logging cadence or lit_ddp's
# callbacks for them would make it a refusal, so they are turned off with it (its opt-ins, such as a
# profiler, stay the user's to drop).
BAREBONES_OFF = {
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "log_every_n_steps": 0,
    "num_sanity_val_steps": 0,
}
# The Trainer flag for each part Lightning keeps one of, found among its callbacks by type.
LIGHTNING_PARTS = {"enable_progress_bar": AnyProgressBar, "enable_model_summary": AnyModelSummary}
# Parts of lit_ddp's groups that a callback of the user's of the same kind replaces: both would write the same
# points (the dashboard's learning rate, a LearningRateMonitor's).
USERS_PARTS = (AnyLearningRateMonitor,)


class NoProfiler(PassThroughProfiler):
    """Lightning's default profiler (none), without its cost: Lightning enters ``profiler.profile(...)``
    around each hook, callback call and step, about thirty times a training step; this one hands back one
    reusable empty context.

    Fork of ``lightning.pytorch.profilers.PassThroughProfiler``: its ``profile`` is a generator-based context
    manager that records nothing, made anew at each call; goes when it returns a reusable empty context.
    """

    _nothing = nullcontext()

    def profile(self, action_name: str) -> nullcontext:
        return self._nothing


def class_path(cls: type) -> str:
    """The shortest public import path of a default callback, as users would write it in YAML."""
    module = "lightning.pytorch.callbacks" if cls is ModelCheckpoint else cls.__module__
    return f"{module}.{cls.__name__}"


def _wanted(key: str, callback: Callback, trainer: Mapping, subcommand: str) -> bool:
    """Whether a callback of lit_ddp's the config kept belongs in this run."""
    off = [
        kind for flag, kind in OFF_SWITCHES.items() if trainer.get(flag) is False or trainer.get("barebones")
    ]
    if isinstance(callback, tuple(off)):
        return False  # Lightning would refuse a checkpoint callback with enable_checkpointing=false
    if key == "checkpoint" and trainer.get("limit_val_batches") == 0:
        return False  # no validation: no val/acc for the best checkpoint
    return subcommand == "predict" or not isinstance(callback, PredictionWriter)  # predict's alone


def _console_parts(ours: list[Callback], theirs: list[Callback], trainer: Mapping) -> list[Callback]:
    """The progress bar and model summary the console shows, unless a Trainer flag turns them off or the
    user's callbacks bring their own (Lightning takes one of each)."""
    console = next((c for c in ours if isinstance(c, Console)), None)
    if console is None:
        return []
    off = {
        kind: trainer.get(flag) is False or trainer.get("barebones") for flag, kind in LIGHTNING_PARTS.items()
    }
    return [
        part
        for part in console.lightning_parts()
        if not any(
            isinstance(part, k) and (o or any(isinstance(c, k) for c in theirs)) for k, o in off.items()
        )
    ]


def _drop_users_parts(ours: list[Callback], theirs: list[Callback]) -> None:
    """Leaves out of lit_ddp's groups each part (``USERS_PARTS``) the user's callbacks bring their own of."""
    for kind in USERS_PARTS:
        if any(isinstance(c, kind) for c in theirs):
            for group in ours:
                if isinstance(group, CallbackGroup):
                    group.drop(kind)


def trainer_arguments(
    trainer: Mapping, chosen: Mapping[str, Callback | None], subcommand: str, experiment: str
) -> dict:
    """The Trainer arguments a run gets over its config's ``trainer`` section (``trainer``: the section, its
    classes built, with any arguments the caller adds): ``callbacks`` (the user's, then those of ``chosen``
    still wanted, less the parts the user's replace, then the console's bar and summary), ``plugins``, the
    flags that say what is off, and the default ``logger`` (under ``experiment``, the recipe's folder).
    ``chosen``: lit_ddp's callbacks by config key, None where the config turned one off."""
    barebones = bool(trainer.get("barebones"))
    arguments: dict = dict(BAREBONES_OFF) if barebones else {}
    plugins = trainer.get("plugins")
    # sync_batchnorm=true alone gets torch's nn.SyncBatchNorm, which refuses CPU: our plugin picks torch's on
    # CUDA and an all-reduce BatchNorm elsewhere, unless the user passed a LayerSync plugin.
    if trainer.get("sync_batchnorm"):
        plugins = with_sync_batchnorm(plugins)
    arguments["plugins"] = with_atomic_checkpoint_io(plugins)  # atomic writes, safe loads
    if trainer.get("profiler") is None and not barebones:  # barebones refuses any profiler
        arguments["profiler"] = NoProfiler()
    theirs = trainer.get("callbacks") or []
    theirs = theirs if isinstance(theirs, list) else [theirs]
    ours = [c for key, c in chosen.items() if c is not None and _wanted(key, c, trainer, subcommand)]
    ours += _console_parts(ours, theirs, trainer)
    _drop_users_parts(ours, theirs)
    for callback in ours:
        skip_unused_batch_hooks(callback)  # Lightning would call each empty one at every batch
    callbacks = arguments["callbacks"] = [*theirs, *ours]
    if not any(isinstance(c, ModelCheckpoint) for c in callbacks):
        # `--checkpoint=null --last_checkpoint=null` means no checkpoints, not Lightning's default one.
        arguments["enable_checkpointing"] = False
    for flag, kind in LIGHTNING_PARTS.items():
        # Likewise `--console.progress_bar=false` means no bar, and `--console.model_summary=false` no
        # summary: Lightning would add its own default in their place (a bar counting epochs from 0, with
        # v_num; a table with a FLOPs column of zeros). A bar or summary of the user's, or the flag set to
        # true, stays.
        if trainer.get(flag) is None and not any(isinstance(c, kind) for c in callbacks):
            arguments[flag] = False
    if trainer.get("logger") in (None, True) and not barebones:
        # Lightning's default logger, without its placeholder hparams summary (hp_metric = -1), which
        # TensorBoard would show instead of RunInfo's, with the real validation metrics. One folder per
        # recipe (logs/lenet_cifar/version_N), so `--ckpt_path=last` never finds another experiment's run.
        # A full disk while writing events is one line too (runtime/write_errors.py).
        arguments["logger"] = WriteSafeTensorBoardLogger(
            save_dir=trainer.get("default_root_dir") or os.getcwd(),
            name=experiment,
            version=SLURMEnvironment.job_id(),
            default_hp_metric=False,
        )
    return arguments
