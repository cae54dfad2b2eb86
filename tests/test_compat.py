"""Every private Lightning/torch name in lit_ddp/compat.py still does what lit_ddp relies on.

One test per entry of ``PRIVATE_NAMES``, against the installed versions: a Lightning release that renames
or changes one fails here, naming it, instead of silently misbehaving in a user's run.
(The observer wrapper is driven in tests/test_faults.py, the stop-flag broadcast's switch-off during a
real fit in test_faults.py too.)
"""

import ast
import inspect
import re
import signal
from datetime import timedelta
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_ddp import compat
from lit_ddp.data import ShapesDataModule
from lit_ddp.models import LeNetCIFAR

ROOT = Path(__file__).resolve().parent.parent


def _trainer(tmp_path: Path, callbacks: list, **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        callbacks=callbacks,
        **{"limit_val_batches": 0, **kwargs},
    )


def _shapes() -> ShapesDataModule:
    return ShapesDataModule(train_size=128, val_size=16, batch_size=32)


def test_installed_lightning_is_a_checked_release_and_pyproject_pins_its_minor() -> None:
    minor = ".".join(L.__version__.split(".")[:2])
    checked = {".".join(v.split(".")[:2]) for v in compat.CHECKED_ON["lightning"]}
    assert minor in checked, f"lightning {L.__version__} is not among {compat.CHECKED_ON['lightning']}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    major, lo = (int(x) for x in minor.split("."))
    assert f'"lightning>={major}.{lo},<{major}.{lo + 1}"' in pyproject


def test_private_names_listed_are_the_ones_compat_uses() -> None:
    """Each private name compat.py reaches or imports has an entry (with the why) in PRIVATE_NAMES."""
    tree = ast.parse(Path(compat.__file__).read_text())
    own = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in ("lightning", "torch"):
            used |= {a.name for a in node.names if a.name.startswith("_")}
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            used.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            used |= set(re.findall(r"^(_[a-z]\w+)$", node.value))
    used -= own
    listed = " ".join(entry.name for entry in compat.PRIVATE_NAMES)
    assert used and all(name in listed for name in used), used - set(re.findall(r"_\w+", listed))
    assert all(entry.used_by and entry.why for entry in compat.PRIVATE_NAMES)


def test_lightning_broadcasts_the_stop_flag_before_batches_and_the_switch_turns_it_off(
    tmp_path: Path,
) -> None:
    """Lightning's loop calls the broadcast before each batch under DDP (the 2-process switch-off during a
    real fit is tests/test_faults.py's); the switch replaces it on the loop and the restore undoes that."""
    trainer = _trainer(tmp_path, [])
    loop = trainer.fit_loop.epoch_loop
    assert "self._broadcast_sigterm_tensor()" in inspect.getsource(type(loop).advance)
    compat.skip_stop_flag_broadcast(trainer)
    assert loop._broadcast_sigterm_tensor() is None and "_broadcast_sigterm_tensor" in vars(loop)
    compat.restore_stop_flag_broadcast(trainer)
    assert "_broadcast_sigterm_tensor" not in vars(loop)
    assert loop._broadcast_sigterm_tensor.__func__ is type(loop)._broadcast_sigterm_tensor


def test_request_stop_ends_fit_at_the_next_batch_as_a_sigterm_does(tmp_path: Path) -> None:
    class StopAfterSecond(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx == 1:
                compat.request_stop(trainer)

        def on_exception(self, trainer, pl_module, exception) -> None:
            self.exception = exception

    stop = StopAfterSecond()
    trainer = _trainer(tmp_path, [stop], max_epochs=1)
    with pytest.raises(SIGTERMException):  # the CLI's main process turns it into exit code 0
        trainer.fit(LeNetCIFAR(), datamodule=_shapes())
    assert trainer.received_sigterm and isinstance(stop.exception, SIGTERMException)
    assert trainer.global_step == 2


def test_a_stop_request_taken_back_lets_fit_run_on(tmp_path: Path) -> None:
    class StopThenTakeBack(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx == 1:
                compat.request_stop(trainer)
                compat.request_stop(trainer, stop=False)

    trainer = _trainer(tmp_path, [StopThenTakeBack()], max_epochs=1, limit_train_batches=4)
    trainer.fit(LeNetCIFAR(), datamodule=_shapes())
    assert not trainer.received_sigterm and trainer.global_step == 4


def test_lightnings_teardown_after_a_failure_gives_a_signal_the_handler_named(tmp_path: Path) -> None:
    """Lightning records every signal's handler as fit's set-up ends and puts them back at its teardown, also
    after a failure (when no callback's teardown runs): a handler installed in setup would come back."""
    installed, given = (lambda signum, frame: None), (lambda signum, frame: None)

    class InSetUp(L.Callback):
        def setup(self, trainer, pl_module, stage) -> None:
            signal.signal(signal.SIGUSR1, installed)

        def on_train_start(self, trainer, pl_module) -> None:
            raise RuntimeError("failed")

        def on_exception(self, trainer, pl_module, exception) -> None:
            compat.restore_handler_at_teardown(trainer, signal.SIGUSR1, given)

    before = signal.getsignal(signal.SIGUSR1)
    try:
        with pytest.raises(RuntimeError, match="failed"):
            _trainer(tmp_path, [InSetUp()], max_epochs=1).fit(LeNetCIFAR(), datamodule=_shapes())
        assert signal.getsignal(signal.SIGUSR1) is given
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_collective_timeout_is_what_ddp_passes_to_init_process_group() -> None:
    strategy = DDPStrategy()
    compat.set_collective_timeout(strategy, 7)
    assert compat.collective_timeout(strategy) == timedelta(seconds=7)
    own = DDPStrategy(timeout=timedelta(seconds=99))
    compat.set_collective_timeout(own, 7)  # the user's own timeout stays
    assert compat.collective_timeout(own) == timedelta(seconds=99)
    source = inspect.getsource(DDPStrategy.setup_distributed)
    assert re.search(r"""["']?timeout["']?\s*[:=]\s*self\._timeout""", source)


def test_launched_children_are_the_subprocess_launchers_procs() -> None:
    ddp = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    assert compat.is_subprocess_launch(ddp.strategy)
    assert compat.launched_children(ddp.strategy) == []  # nothing launched before fit
    spawn = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    assert not compat.is_subprocess_launch(spawn.strategy)
    assert compat.launched_children(spawn.strategy) is None


def test_pinned_logger_version_decides_the_run_directory(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path)
    assert compat.logger_version_unset(logger)
    compat.pin_logger_version(logger, 3)
    assert logger.version == 3 and Path(logger.log_dir) == tmp_path / "lightning_logs" / "version_3"
    assert compat.logger_version_given(TensorBoardLogger(tmp_path, version="job7")) == "job7"


def test_tensorboards_writer_thread_hands_a_failed_write_to_the_callback_and_lives_on(tmp_path: Path) -> None:
    import errno
    import os

    from torch.utils.tensorboard import SummaryWriter

    class FullDisk:
        def write(self, data: bytes) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self) -> None:
            pass

    writer = SummaryWriter(tmp_path)
    errors: list[OSError] = []
    assert compat.hand_event_write_errors_to(writer, errors.append)
    async_writer = writer.file_writer.event_writer._async_writer
    async_writer._writer._writer = FullDisk()  # the RecordWriter's file: every byte now fails
    writer.add_scalar("x", 1.0, 0)
    writer.flush()  # raised the thread's OSError here, after the thread printed its traceback
    assert errors and all(e.errno == errno.ENOSPC for e in errors)
    assert async_writer._worker.exception is None and async_writer._worker.is_alive()
    writer.close()


def test_the_spawn_launch_wrap_reaches_the_ranks_function_and_keeps_the_launcher_picklable() -> None:
    """Lightning's spawn launcher runs ``launch(function, ...)`` and sets ``procs`` there; the wrap (on the
    instance, switched off with ``--resilience.preemption=false``) survives the pickling of the trainer into
    the ranks.
    The 2-process outcome is tests/test_faults.py's (SIGTERM under ddp_spawn)."""
    import pickle

    from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher

    assert "self.procs = process_context.processes" in inspect.getsource(_MultiProcessingLauncher.launch)
    spawn = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    assert compat.wrap_spawn_launch(spawn.strategy, len, _no_context)
    launcher = spawn.strategy.launcher
    assert isinstance(launcher.launch, compat.SpawnLaunch) and launcher.launch.procs() == []
    copy = pickle.loads(pickle.dumps(launcher))
    assert isinstance(copy.launch, compat.SpawnLaunch) and copy.launch.launcher is copy
    ddp = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    assert not compat.wrap_spawn_launch(ddp.strategy, len, _no_context)


def _no_context(procs):
    import contextlib

    return contextlib.nullcontext()


def test_every_private_name_says_how_to_switch_it_off() -> None:
    assert len(compat.PRIVATE_NAMES) <= 8
    assert all(entry.switch.startswith("--") for entry in compat.PRIVATE_NAMES)
    assert not any("_call_callback_hooks" in entry.name for entry in compat.PRIVATE_NAMES)


def test_a_removed_private_name_fails_with_the_fix(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, [])
    loop_class = type(trainer.fit_loop.epoch_loop)
    with pytest.MonkeyPatch.context() as mp:
        mp.delattr(loop_class, "_broadcast_sigterm_tensor")
        with pytest.raises(RuntimeError, match="install a lightning version lit_ddp was checked on"):
            compat.skip_stop_flag_broadcast(trainer)


def test_the_loop_progress_readers_follow_a_real_fit_and_a_cut_short_epoch(tmp_path: Path) -> None:
    """Where a fit stands, read from Lightning's loop counters (compat.py's last section), against what the
    public hooks say: the batch index, the epoch, and a max_steps stop inside the second epoch."""
    seen = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            assert compat.batch_in_progress(trainer) == batch_idx

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            last = batch_idx + 1 == trainer.num_training_batches
            assert compat.at_last_batch(trainer) == last
            assert compat.epochs_started_completed(trainer) == (
                trainer.current_epoch + 1,
                trainer.current_epoch,
            )

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            seen.append((compat.batches_done(trainer), compat.epoch_cut_short(trainer)))

    trainer = _trainer(tmp_path, [Record()], max_epochs=3, max_steps=6)  # 4 batches an epoch: stops at 2 of 4
    trainer.fit(LeNetCIFAR(), datamodule=_shapes())
    assert seen == [(4, False), (2, True)]
    assert compat.epochs_started_completed(trainer) == (2, 2)


def test_the_logging_step_counts_the_stepped_batches_and_a_batch_is_counted_after_its_validation(
    tmp_path: Path,
) -> None:
    """What the resume of a stop inside an epoch reads and sets (preemption.py): the loggers' step, and
    whether a checkpoint saved now comes after its batch's validation and logging step."""
    seen = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            seen.append(("start", compat.logging_step(trainer), compat.batch_counted(trainer)))
            if batch_idx == 3:
                compat.set_logging_step(trainer, 10)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            seen.append(("end", compat.logging_step(trainer), compat.batch_counted(trainer)))

        def on_validation_end(self, trainer, pl_module) -> None:
            seen.append(("validation", compat.logging_step(trainer), compat.batch_counted(trainer)))

    # 4 batches, a validation after the second and the fourth
    trainer = _trainer(tmp_path, [Record()], max_epochs=1, limit_val_batches=1.0, val_check_interval=2)
    trainer.fit(LeNetCIFAR(), datamodule=_shapes())
    assert seen == [
        *[("start", 0, True), ("end", 0, False)],
        *[("start", 1, True), ("end", 1, False), ("validation", 1, False)],
        *[("start", 2, True), ("end", 2, False)],
        *[("start", 3, True), ("end", 10, False), ("validation", 10, False)],
    ]
    assert compat.logging_step(trainer) == 11 and compat.batch_counted(trainer)


def test_the_train_loader_loads_for_a_run_without_a_length(tmp_path: Path) -> None:
    """A warmup counted in epochs needs the epoch's length in configure_optimizers, which a run without a
    length (max_epochs=-1) reaches before Lightning has loaded the training loader. (resume_inside_epoch:
    tests/test_resume_cut_short.py resumes real cut-short epochs.)"""
    from lit_ddp.models import OptimConfig

    lengths = []

    class Length(L.Callback):
        def on_fit_start(self, trainer, pl_module) -> None:  # after configure_optimizers
            lengths.append(trainer.num_training_batches)
            trainer.should_stop = True

    model = LeNetCIFAR(optim=OptimConfig(name="adamw", lr=3e-3, warmup_epochs=1.0, schedule="constant"))
    _trainer(tmp_path, [Length()], max_epochs=-1, max_steps=-1).fit(model, datamodule=_shapes())
    assert lengths == [4]


def test_lightning_passes_over_a_batch_hook_set_to_none_and_calls_it_once_given_back(tmp_path: Path) -> None:
    """skip_batch_hooks relies on Lightning's dispatch calling only the callable hooks of a callback."""
    calls = []

    class Counting(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            calls.append("start")

        def on_before_backward(self, trainer, pl_module, loss) -> None:
            calls.append("backward")

    counting = Counting()
    compat.skip_batch_hooks(counting, ["on_before_backward"])
    _trainer(tmp_path, [counting], max_steps=2).fit(LeNetCIFAR(), datamodule=_shapes())
    assert calls == ["start", "start"]
    calls.clear()
    compat.skip_batch_hooks(counting, [])
    assert "on_before_backward" not in vars(counting)
    _trainer(tmp_path, [counting], max_steps=2).fit(LeNetCIFAR(), datamodule=_shapes())
    assert calls == ["start", "backward", "start", "backward"]
