"""The Trainer's arguments as a table (lit_ddp/assembly.py): a config's ``trainer`` section, the default
callbacks it keeps and the subcommand → the callbacks the Trainer gets, in order, and the flags set for it.
tests/test_cli.py checks the same rules through the whole CLI, on a built Trainer."""

from pathlib import Path

import pytest
from lightning import Callback
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.layer_sync import LayerSync
from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler

from lit_ddp.assembly import BAREBONES_OFF, CALLBACKS, OPT_IN_CALLBACKS, trainer_arguments
from lit_ddp.callbacks import ConsoleModelSummary, Dashboard, LastCheckpoint, PredictionWriter, ProgressBar
from lit_ddp.callbacks.confusion import ConfusionMatrix
from lit_ddp.callbacks.images import TrainBatchImages
from lit_ddp.callbacks.run_info import RunInfo
from lit_ddp.callbacks.step_loss import StepLoss
from lit_ddp.callbacks.throughput import Throughput
from lit_ddp.runtime.checkpoint_io import AtomicCheckpointIO
from lit_ddp.runtime.console import Console
from lit_ddp.runtime.gc_freeze import FreezeGC
from lit_ddp.runtime.resilience import Resilience
from lit_ddp.runtime.write_errors import WriteSafeTensorBoardLogger

FIT = [Console, Resilience, Dashboard, ModelCheckpoint, LastCheckpoint, ProgressBar, ConsoleModelSummary]
NO_CHECKPOINTS = [Console, Resilience, Dashboard, ProgressBar, ConsoleModelSummary]
USERS_BAR = TQDMProgressBar  # a bar of the user's own, in trainer.callbacks

# (case, trainer section, config keys set to null or replaced, subcommand) → (callback types, flags set)
ROWS = [
    ("a default fit", {}, {}, "fit", FIT, {}),
    ("predict adds its writer", {}, {}, "predict", [*FIT[:3], PredictionWriter, *FIT[3:]], {}),
    # Lightning refuses a checkpoint callback with checkpointing off.
    (
        "enable_checkpointing=false",
        {"enable_checkpointing": False},
        {},
        "fit",
        NO_CHECKPOINTS,
        {"enable_checkpointing": False},
    ),
    # No validation: no val/acc for the best checkpoint; last.ckpt stays.
    ("no validation", {"limit_val_batches": 0}, {}, "fit", [*FIT[:3], *FIT[4:]], {}),
    # Not Lightning's default checkpoint in their place.
    (
        "both checkpoint keys null",
        {},
        {"checkpoint": None, "last_checkpoint": None},
        "fit",
        NO_CHECKPOINTS,
        {"enable_checkpointing": False},
    ),
    # Not Lightning's default bar and summary in their place.
    (
        "no console",
        {},
        {"console": None},
        "fit",
        [Resilience, Dashboard, ModelCheckpoint, LastCheckpoint],
        {"enable_progress_bar": False, "enable_model_summary": False},
    ),
    (
        "console.progress_bar=false",
        {},
        {"console": Console(progress_bar=False)},
        "fit",
        [*FIT[:5], ConsoleModelSummary],
        {"enable_progress_bar": False},
    ),
    # The flag is the user's and Lightning honours it: the bar is left out, the flag left alone.
    (
        "enable_progress_bar=false",
        {"enable_progress_bar": False},
        {},
        "fit",
        [*FIT[:5], ConsoleModelSummary],
        {},
    ),
    # An opt-in named in the config runs after the defaults, before the console's bar and summary.
    ("gc_freeze named", {}, {"gc_freeze": FreezeGC()}, "fit", [*FIT[:5], FreezeGC, *FIT[5:]], {}),
    # Lightning takes one bar: the user's.
    (
        "a bar of the user's",
        {"callbacks": [USERS_BAR()]},
        {},
        "fit",
        [USERS_BAR, *FIT[:5], ConsoleModelSummary],
        {},
    ),
    # Lightning's raw-speed mode refuses what it turns off.
    (
        "barebones",
        {"barebones": True},
        {},
        "fit",
        [Console, Resilience, Dashboard],
        {**BAREBONES_OFF, "enable_checkpointing": False},
    ),
]


def _defaults() -> dict:
    return {key: cls(**init_args) for key, (cls, init_args) in CALLBACKS.items()}


@pytest.mark.parametrize(
    ("trainer", "changed", "subcommand", "types", "flags"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_each_rule_gives_its_callbacks_and_flags(
    trainer: dict, changed: dict, subcommand: str, types: list[type], flags: dict
) -> None:
    arguments = trainer_arguments(trainer, _defaults() | changed, subcommand, "recipe")
    assert [type(c) for c in arguments["callbacks"]] == types
    built = ("callbacks", "plugins", "logger", "profiler")
    assert {key: value for key, value in arguments.items() if key not in built} == flags


def test_a_learning_rate_monitor_of_the_users_takes_the_dashboards_place() -> None:
    """Both wrote every learning-rate point (a second TensorBoard point at each step)."""
    arguments = trainer_arguments({"callbacks": [LearningRateMonitor()]}, _defaults(), "fit", "recipe")
    (dashboard,) = [c for c in arguments["callbacks"] if isinstance(c, Dashboard)]
    assert [type(m) for m in dashboard.members] == [
        StepLoss,
        Throughput,
        TrainBatchImages,
        ConfusionMatrix,
        RunInfo,
    ]
    (alone,) = [
        c
        for c in trainer_arguments({}, _defaults(), "fit", "recipe")["callbacks"]
        if isinstance(c, Dashboard)
    ]
    assert any(isinstance(m, LearningRateMonitor) for m in alone.members)


def test_the_default_logger_is_tensorboard_in_the_recipes_folder_unless_one_is_given(tmp_path: Path) -> None:
    arguments = trainer_arguments({"default_root_dir": str(tmp_path)}, _defaults(), "fit", "lenet_cifar")
    logger = arguments["logger"]
    assert isinstance(logger, WriteSafeTensorBoardLogger)
    assert Path(logger.root_dir) == tmp_path / "lenet_cifar"
    for given in (False, CSVLogger(tmp_path)):
        assert "logger" not in trainer_arguments({"logger": given}, _defaults(), "fit", "lenet_cifar")
    assert "logger" not in trainer_arguments({"barebones": True}, _defaults(), "fit", "lenet_cifar")


def test_checkpoints_are_written_atomically_and_sync_batchnorm_runs_on_any_backend() -> None:
    plugins = trainer_arguments({}, {}, "fit", "recipe")["plugins"]
    assert [type(p) for p in plugins] == [AtomicCheckpointIO]
    plugins = trainer_arguments({"sync_batchnorm": True}, {}, "fit", "recipe")["plugins"]
    assert sorted(type(p).__name__ for p in plugins) == ["AtomicCheckpointIO", "SyncBatchNormPlugin"]
    assert any(isinstance(p, LayerSync) for p in plugins)
    own_io = AtomicCheckpointIO()
    assert trainer_arguments({"plugins": [own_io]}, {}, "fit", "recipe")["plugins"] == [own_io]


def test_the_default_profiler_records_nothing_at_no_cost_and_a_profiler_asked_for_stays() -> None:
    profiler = trainer_arguments({}, {}, "fit", "recipe")["profiler"]
    assert isinstance(profiler, PassThroughProfiler)  # Lightning's "no profiler", its summary empty
    # One empty context for every call: Lightning enters one around each hook and step.
    assert profiler.profile("[Callback]a.on_train_batch_end") is profiler.profile("run_training_batch")
    with profiler.profile("run_training_batch"):
        pass
    assert profiler.summary() == ""
    for given in ("simple", SimpleProfiler()):
        assert "profiler" not in trainer_arguments({"profiler": given}, {}, "fit", "recipe")
    assert "profiler" not in trainer_arguments({"barebones": True}, {}, "fit", "recipe")


def test_the_table_holds_every_default_and_opt_in_callback() -> None:
    seen = {t for row in ROWS for t in row[4]}
    assert {cls for cls, _ in CALLBACKS.values()} | set(OPT_IN_CALLBACKS.values()) <= seen


def test_lightning_calls_only_the_batch_hooks_a_default_callback_uses() -> None:
    """Each empty per-batch hook of lit_ddp's callbacks is None on the instance (Lightning passes over it);
    a hook a group's member defines, or the class overrides, stays callable."""
    from lit_ddp.callbacks.group import CallbackGroup, skip_unused_batch_hooks
    from lit_ddp.compat import BATCH_HOOKS

    for callback in trainer_arguments({}, _defaults(), "fit", "recipe")["callbacks"]:
        for name in BATCH_HOOKS:
            if isinstance(callback, CallbackGroup):
                used = bool(callback._hooks[name])
            else:
                used = getattr(type(callback), name) is not getattr(Callback, name)
                used = used and name not in getattr(callback, "idle_batch_hooks", ())
            assert callable(getattr(callback, name)) == used, (type(callback).__name__, name)
    dashboard = Dashboard()
    assert dashboard.on_before_backward is None and callable(dashboard.on_train_batch_end)
    assert getattr(ModelCheckpoint(), "on_before_backward", None) is not None  # only what fit is handed
    last = LastCheckpoint()
    assert skip_unused_batch_hooks(last).on_train_batch_end is None  # no step or time schedule: never saves
    assert callable(skip_unused_batch_hooks(LastCheckpoint(every_n_train_steps=100)).on_train_batch_end)
