"""Preemption (SIGTERM, SIGUSR1 before a SLURM time limit, or Ctrl-C) → checkpoint, clean exit, resume later.

A signal reaches the ranks at different moments (or only one of them: the shell's SIGTERM goes to rank 0
of Lightning's launcher), so no rank may act on it alone. The handler here only records it. At the end of
every ``check_every_n_batches``-th training batch, all ranks start a non-blocking all-reduce (max) of their
records on a CPU process group, and read the result one batch later, when it has long arrived: no rank
waits for another, no GPU stream is synchronised, and every rank sees the same value at the same batch.
At an epoch's end they agree at once (blocking). If any rank was signalled, all of them set Lightning's
stop flag at that same point: Lightning's loops raise ``SIGTERMException`` there (exit code 0), and this
callback saves ``last.ckpt`` (``trainer.save_checkpoint``: rank 0 writes, all synchronise). So a run stops
at most ``check_every_n_batches + 1`` batches after the signal (with 1: at the end of the batch after the
one during which the signal arrived), or at the epoch's end; inside a gradient accumulation, at the
optimizer step that ends it (a checkpoint holds no gradients); when validation follows that batch, after
every rank has finished it (``on_validation_start`` says why). On SIGUSR1 under SLURM, rank 0 then runs
``scontrol requeue``; the requeued job's ``--ckpt_path=last`` continues from the saved step.

Why not every batch by default: even a non-blocking all-reduce costs CPU time, a visible share of a small
model's step on a CPU (docs/benchmarks.md). Every 10th batch keeps the stop within seconds for
any model whose batch takes a fraction of a second; set 1 for models with very slow batches.

Lightning's own handlers are replaced once training starts: its SIGTERM handler broadcasts from *inside*
the handler, and its SLURM SIGUSR1 handler saves ``hpc_ckpt_N.ckpt`` (a barrier) from inside the handler,
wherever each rank happens to be; a rank blocked in another collective never matches them, and the job
hangs. SIGTERM is recorded from the sanity check on, SIGUSR1 from fit's set-up on, and both are agreed on as
training starts, where a signal seen before stops every rank before the first step; a SIGTERM during set-up
still takes Lightning's path.

A stop in the middle of an epoch loses nothing: the checkpoint carries where the epoch stands (the data
module's batch count, lit_ddp/data/base.py) and the epoch's training metric states summed over the ranks
(lit_ddp/models/classifier.py), so the resumed run continues at the next batch of the same order, with
the same augmentation, and ends with the uninterrupted run's weights and metrics. The same holds for a fit
that ``--trainer.max_steps`` or ``--trainer.max_time`` ends inside an epoch: Lightning ends that epoch early
and counts it as processed, and the checkpoints written there are saved as inside it instead
(``on_save_checkpoint``), so that ``--ckpt_path=last`` with a larger budget trains the rest of it.
"""

import contextlib
import functools
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from lightning import Callback, LightningModule, Trainer
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_ddp.callbacks.group import find_callback
from lit_ddp.callbacks.last_checkpoint import LastCheckpoint
from lit_ddp.compat import (
    batch_counted,
    epoch_cut_short,
    epochs_started_completed,
    logging_step,
    request_stop,
    restore_handler_at_teardown,
    restore_stop_flag_broadcast,
    resume_inside_epoch,
    set_logging_step,
    skip_stop_flag_broadcast,
    wrap_spawn_launch,
)
from lit_ddp.data.samplers import ResumableShuffleSampler
from lit_ddp.errors import UserError
from lit_ddp.runtime.failed_run import refusal
from lit_ddp.runtime.position import run_position
from lit_ddp.runtime.quiet import quiet_exact_resume
from lit_ddp.utils import scheduled_accumulation
from lit_ddp.writes import WriteError, write_file

DEFAULT_CHECK_EVERY_N_BATCHES = 10  # why not 1: the module docstring
LOGGING_STEP_KEY = "lit_ddp_logging_step"


def steps_after(trainer: Trainer, batch_idx: int) -> bool:
    """Whether the optimizer steps after training batch ``batch_idx``: it ends a gradient accumulation
    (``--trainer.accumulate_grad_batches``), or the epoch, whose last batch steps whatever the count."""
    accumulate = trainer.accumulate_grad_batches
    return (batch_idx + 1) % accumulate == 0 or batch_idx + 1 >= trainer.num_training_batches


def last_checkpoint_path(trainer: Trainer) -> str:
    """Where the run's ``last.ckpt`` lives: the folder of lit_ddp's last_checkpoint, which
    ``--ckpt_path=last`` resumes, before any other ModelCheckpoint's (a user's may have a folder of its own);
    else ``default_root_dir``. A remote folder (s3://) stays a URL, which a Path would make local (s3:/)."""
    callbacks = sorted(trainer.checkpoint_callbacks, key=lambda c: not isinstance(c, LastCheckpoint))
    for callback in callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is not None:
            return os.path.join(callback.dirpath, f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}")
    return os.path.join(trainer.default_root_dir, "last.ckpt")


class PreemptionCheckpoint(Callback):
    """Saves ``last.ckpt`` when a run is stopped by SIGTERM or SIGUSR1; requeues a SLURM job on SIGUSR1."""

    def __init__(
        self,
        requeue_signal: signal.Signals = signal.SIGUSR1,
        check_every_n_batches: int = DEFAULT_CHECK_EVERY_N_BATCHES,
    ) -> None:
        if check_every_n_batches < 1:
            raise UserError(
                f"--resilience.check_every_n_batches={check_every_n_batches} must be 1 or more"
                " (training batches between the ranks' checks for a stop signal)"
            )
        self.requeue_signal = requeue_signal
        self.check_every_n_batches = check_every_n_batches
        # Ctrl-C (SIGINT) stops like SIGTERM; a second Ctrl-C aborts at once (KeyboardInterrupt, no
        # checkpoint). The larger code wins when ranks disagree.
        self._codes = {signal.SIGINT: 1, signal.SIGTERM: 2, requeue_signal: 3}
        self._previous_sigint = None
        self._previous_requeue = None  # the requeue signal's handler before fit's set-up
        self._received = 0  # set by the handler, on this rank
        self.stopped_by: str | None = None  # agreed by all ranks
        self._group: dist.ProcessGroup | None = None  # CPU (gloo) group for the agreement
        self._pending: tuple[dist.Work, torch.Tensor] | None = None  # the all-reduce started last batch
        self._held = 0  # an agreed stop inside a gradient accumulation, for its optimizer step
        self._held_should_stop = False  # a should_stop (max_time, a callback) inside one, likewise
        self._quiet: warnings.catch_warnings | None = None  # while a resumed epoch starts
        self._resumed_accumulation: int | None = None  # a GradientAccumulationScheduler's, resumed mid-epoch
        self._resumed_logging_step: int | None = None  # the loggers' step a stop inside an epoch saved
        self._evaluating = False  # validate, test or predict (not fit's validation)
        self._seen = self._common = 0  # evaluation batches run here / that every rank runs
        # The evaluation ("validate", ...) once its last check starts, set before that check reads the
        # records: a signal from then on cannot stop it, the handler records nothing, says it completes.
        self._past_last_check = ""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        if isinstance(sampler, ResumableShuffleSampler) and sampler.start > 0 and self._quiet is None:
            # Resumed mid-epoch, exactly: Lightning's warning that it is not, emitted as the epoch starts,
            # would be false. Only that one, and only until the epoch has started.
            self._quiet = quiet_exact_resume()
        if isinstance(sampler, ResumableShuffleSampler) and sampler.start > 0:
            # Lightning calls no on_train_epoch_start for an epoch resumed in its middle, where a
            # GradientAccumulationScheduler sets the epoch's accumulation: the rest would step every batch.
            self._resumed_accumulation = scheduled_accumulation(trainer, trainer.current_epoch)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.getsignal(signal.SIGINT)
        self._record_signals(trainer, self._codes)
        self._pending = None
        if trainer.received_sigterm:  # by Lightning's handler, before training: spread it our way
            self._received = max(self._received, self._codes[signal.SIGTERM])
        # With Lightning's handlers replaced, only this callback sets the stop flag, on all ranks at the
        # same batch, so Lightning's per-batch broadcast of it carries nothing: off until training ends.
        skip_stop_flag_broadcast(trainer)
        self._join_gloo_group(trainer)
        # A stop signal during the sanity check was only recorded: the ranks agree on it here, at the same
        # point, and stop before the first step (nothing of a gradient accumulation to lose).
        code = self._agree_blocking(trainer, pl_module)
        if code:
            self._stop_if(trainer, code)
            raise SIGTERMException

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Fit's set-up (a checkpoint restored, the model wrapped, loaders built) can take minutes, where
        # SIGUSR1's default action would kill the process: no checkpoint, no SLURM requeue. Recorded from here
        # on, and acted on as training starts. Lightning installs no SIGUSR1 handler over one it finds, and
        # gives this one back at its teardown: ``teardown`` restores the one found here.
        if stage == TrainerFn.FITTING and self.requeue_signal not in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(self.requeue_signal)
            if previous != self._on_signal and threading.current_thread() is threading.main_thread():
                self._previous_requeue = previous
            self._record_signals(trainer, [self.requeue_signal])

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._previous_requeue is not None and threading.current_thread() is threading.main_thread():
            signal.signal(self.requeue_signal, self._previous_requeue)
            restore_handler_at_teardown(trainer, self.requeue_signal, self._previous_requeue)
            self._previous_requeue = None

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning's SIGTERM handler broadcasts from inside itself, so a rank signalled alone would wait
        # there for ranks that wait for it in the check's collectives; outside SLURM nothing handles
        # SIGUSR1, whose default action kills the process. Both are only recorded, as in training. Ctrl-C
        # still aborts here: nothing has trained, and a user who sees a wrong setting presses it to get out.
        self._record_signals(
            trainer, [s for s in (signal.SIGTERM, self.requeue_signal) if s != signal.SIGINT]
        )

    def _record_signals(self, trainer: Trainer, signals) -> None:
        """``_on_signal`` for ``signals``, over Lightning's handlers (installed in Trainer._run, after
        on_fit_start; its signal connector restores the original ones at teardown)."""
        self._is_global_zero, self._rank = trainer.is_global_zero, trainer.global_rank
        if threading.current_thread() is threading.main_thread():
            for signum in signals:
                signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame) -> None:
        # Only record: a collective or a checkpoint here could meet another collective on another rank.
        if signum == signal.SIGINT:
            if self._received == self._codes[signal.SIGINT]:
                raise KeyboardInterrupt  # the second Ctrl-C: Lightning's abort path, at once
            if self._is_global_zero:
                print(
                    "\nlit_ddp: Ctrl-C: stopping at the next check, with last.ckpt; Ctrl-C again aborts now",
                    file=sys.stderr,
                    flush=True,
                )
        elif self._past_last_check:
            line = (
                f"lit_ddp: rank {self._rank} received {signal.Signals(signum).name} after the last batch"
                f" every rank runs: the {self._past_last_check} completes, not stopped\n"
            )
            sys.stderr.flush()
            os.write(sys.stderr.fileno(), line.encode())
            return
        elif self._received == 0:  # the rank that got it, once (one rank alone, or each that ddp_spawn's
            # main process handed it to)
            line = (
                f"lit_ddp: rank {self._rank} received {signal.Signals(signum).name}: every rank stops at the"
                f" next check{'' if self._evaluating else ', with last.ckpt'}\n"
            )
            sys.stderr.flush()
            os.write(sys.stderr.fileno(), line.encode())  # one write: ranks sharing stderr do not interleave
        self._received = max(self._received, self._codes.get(signal.Signals(signum), 1))

    @staticmethod
    def _collective(trainer: Trainer) -> bool:
        return trainer.world_size > 1 and dist.is_available() and dist.is_initialized()

    def _join_gloo_group(self, trainer: Trainer) -> None:
        # NCCL all-reduces need CUDA tensors, and reading one back would synchronise the GPU every step. A
        # gloo group works on CPU tensors. Every rank creates it at the same point (a hook every rank runs).
        if self._collective(trainer) and "gloo" not in dist.get_backend():
            self._group = dist.new_group(backend="gloo")

    def _signal_name(self, code: int) -> str:
        return {v: k for k, v in self._codes.items()}[code].name

    def _start_agreement(self) -> tuple[dist.Work, torch.Tensor]:
        flag = torch.tensor([self._received], dtype=torch.int32)
        return dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True), flag

    @staticmethod
    def _result(agreement: tuple[dist.Work, torch.Tensor] | None) -> int:
        if agreement is None:
            return 0
        work, flag = agreement
        work.wait()
        return int(flag.item())

    def _stop_if(self, trainer: Trainer, code: int) -> None:
        if code and self.stopped_by is None:
            self.stopped_by = self._signal_name(code)
            request_stop(trainer)  # Lightning's loops stop at their next check

    def _agree_blocking(self, trainer: Trainer, pl_module: LightningModule) -> int:
        """The ranks' agreed record now, at a point every rank reaches (any pending check is covered: records
        only grow)."""
        if not self._collective(trainer):
            return self._agree_now(trainer, pl_module)
        self._result(self._pending)
        self._pending = None
        return self._result(self._start_agreement())

    def _agree_now(self, trainer: Trainer, pl_module: LightningModule) -> int:
        """The ranks' agreed record, blocking (one process, or a strategy without torch.distributed)."""
        if trainer.world_size == 1:
            return self._received
        flag = torch.tensor(self._received, device=pl_module.device, dtype=torch.int32)
        return int(trainer.strategy.reduce(flag, reduce_op="max").item())

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        # Set at the first batch, not as training starts: the scheduler's on_train_start refuses a Trainer
        # whose accumulation is not 1.
        if self._resumed_accumulation is not None:
            trainer.accumulate_grad_batches, self._resumed_accumulation = self._resumed_accumulation, None
        if self._resumed_logging_step is not None:
            set_logging_step(trainer, self._resumed_logging_step)
            self._resumed_logging_step = None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        check = (batch_idx + 1) % self.check_every_n_batches == 0
        if trainer.world_size == 1:  # one process: its own record, free, every batch
            code = self._received
        elif self._collective(trainer):
            # Every rank passes here with the same batch_idx, so the all-reduces pair up across ranks.
            code = self._result(self._pending)  # started one batch ago: done by now, or nearly
            self._pending = self._start_agreement() if check else None
        else:  # a strategy without torch.distributed: blocking, every n-th
            code = self._agree_now(trainer, pl_module) if check else 0
        if not steps_after(trainer, batch_idx):
            # Inside a gradient accumulation, a stop would lose the gradients of the batches since the last
            # optimizer step (no checkpoint holds them) while the data module counts those batches as
            # trained: every rank waits for the step that ends it (the same batch on every rank).
            self._held = max(self._held, code)
            self._held_should_stop |= trainer.should_stop
            trainer.should_stop = False
            return
        trainer.should_stop |= self._held_should_stop
        self._stop_if(trainer, max(code, self._held))
        self._held, self._held_should_stop = 0, False

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # The epoch's last word is blocking, so a signal seen during the epoch never waits past its end.
        code = self._agree_blocking(trainer, pl_module)
        self._stop_if(trainer, max(code, self._held))
        self._held = 0

    # A stop agreed at a training batch that validation follows (an epoch's last, or a val_check_interval's)
    # waits until every rank has run all of its validation. Lightning's evaluation loop stops after the
    # batch during which it sees the flag unless that batch is the rank's last; evaluation shards are
    # uneven (data/samplers.py), so one rank would stop to save a checkpoint while another waits in the
    # metric sync. Finished, the validation's metrics are logged and checkpointed instead of lost.
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.stopped_by is not None and not trainer.sanity_checking:
            request_stop(trainer, stop=False)
        self.on_test_start(trainer, pl_module)

    # validate, test and predict: a stop signal ends the command on every rank, with nothing to keep
    # (failed_run.py says so, exit 1). Lightning's SIGTERM handler would broadcast from inside itself, which a
    # rank signalled alone waits in forever, and outside SLURM SIGUSR1 kills: both are only recorded, and the
    # ranks agree as in training, but only over the batches every rank runs (evaluation shards are uneven,
    # data/samplers.py). A signal after the last of those lets the command finish, its results whole.
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            return
        self._evaluating, self._seen, self._pending, self._past_last_check = True, 0, None, ""
        self.on_sanity_check_start(trainer, pl_module)  # the same signals recorded
        if trainer.received_sigterm:  # by Lightning's handler, during set-up: agreed on our way
            self._received = max(self._received, self._codes[signal.SIGTERM])
            request_stop(trainer, stop=False)
        counts = {
            TrainerFn.VALIDATING: trainer.num_val_batches,
            TrainerFn.TESTING: trainer.num_test_batches,
            TrainerFn.PREDICTING: trainer.num_predict_batches,
        }.get(trainer.state.fn, [])
        fewest = torch.tensor([float(sum(counts))], dtype=torch.float64)
        if self._collective(trainer):
            self._join_gloo_group(trainer)
            dist.all_reduce(fewest, op=dist.ReduceOp.MIN, group=self._group)
            if not math.isfinite(fewest.item()) or fewest.item() == 0:  # no batch is checked
                self._past_last_check = trainer.state.fn.value
        self._common = int(fewest.item()) if math.isfinite(fewest.item()) else 0

    on_predict_start = on_test_start

    def on_test_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args, **kwargs) -> None:
        if not self._evaluating:
            return
        self._seen += 1
        if not self._collective(trainer):
            if self._seen == self._common:  # the last batch: its check below is the last (_on_signal)
                self._past_last_check = trainer.state.fn.value
            code = self._received if trainer.world_size == 1 else 0
        elif self._seen <= self._common:  # every rank is at this batch: the all-reduces pair up
            code = self._result(self._pending)
            if self._seen == self._common and not code:  # the last batch every rank runs: agree now
                self._past_last_check = trainer.state.fn.value  # before the read: _on_signal
                code = self._result(self._start_agreement())
            again = not code and self._seen < self._common and self._seen % self.check_every_n_batches == 0
            self._pending = self._start_agreement() if again else None
        else:
            return
        if code:
            self.stopped_by = self._signal_name(code)
            stop = SIGTERMException()
            stop.signal_name = self.stopped_by  # for failed_run.py's line
            raise stop

    on_validation_batch_end = on_predict_batch_end = on_test_batch_end

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._evaluating:
            self._past_last_check, self._pending = trainer.state.fn.value, None
        # Fit's validation keeps training's check, started at the batch before it: read at the next batch.
        self._evaluating = False

    on_predict_end = on_test_end

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.stopped_by is not None and not trainer.sanity_checking and not self._evaluating:
            request_stop(trainer)
        self.on_test_end(trainer, pl_module)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._unquiet()

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        # max_steps or max_time ended the fit inside this epoch: Lightning ends the epoch anyway and saves it
        # as processed, so a resume would start the next epoch and never train the rest of this one.
        if trainer.state.fn == TrainerFn.FITTING and epoch_cut_short(trainer):
            resume_inside_epoch(checkpoint)
            # Saved after its batch was counted, where a validation followed that batch Lightning's restart
            # takes it for one saved during the validation and counts the batch again: every point of the
            # resumed run would be logged a step late. The resumed run logs on from the saved step.
            if batch_counted(trainer):
                checkpoint[LOGGING_STEP_KEY] = logging_step(trainer)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        self._resumed_logging_step = checkpoint.get(LOGGING_STEP_KEY)  # set as the first batch starts

    def _unquiet(self) -> None:
        if self._quiet is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None

    def _restore(self, trainer: Trainer) -> None:
        self._unquiet()
        self._evaluating = False
        self._pending = None  # every rank started it, so it completes without being waited for
        restore_stop_flag_broadcast(trainer)
        # Lightning restores the SIGTERM/SIGUSR1 handlers it installed; SIGINT is ours to give back.
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._restore(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        try:
            self._save_if_stopped(trainer, exception)
        finally:  # a failed fit calls no teardown: the handler of before its set-up goes back here
            self.teardown(trainer, pl_module, trainer.state.fn)

    def _save_if_stopped(self, trainer: Trainer, exception: BaseException) -> None:
        self._restore(trainer)
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        path = last_checkpoint_path(trainer)
        trainer.save_checkpoint(path, weights_only=False)
        stopped_by = self.stopped_by or "SIGTERM"
        if fit_complete(trainer):
            # The signal came as the fit ended (its last epoch, or a callback's stop): the checkpoint is the
            # finished run, which a resume (or a requeued SLURM job) would only train past.
            rank_zero_info(
                f"lit_ddp: {stopped_by} came after the run's last training step, step {trainer.global_step}:"
                f" the fit is complete, saved {path}"
            )
            return
        rank_zero_info(
            f"lit_ddp: stopped by {stopped_by} {run_position(trainer)}: saved {path};"
            " resume with --ckpt_path=last"
        )
        if stopped_by == self.requeue_signal.name and trainer.is_global_zero:
            _requeue_slurm_job()


def _run_rank(user_error_file: str, function: Callable, *args, **kwargs):
    """What a ddp_spawn rank runs: ``trainer.fit``'s work, where a stop agreed by the ranks (Lightning's
    SIGTERMException) reaches the callbacks' on_exception, as in the main process of any other strategy
    (PreemptionCheckpoint saves last.ckpt there), and then ends the rank normally: its results go back to
    the main process, which exits 0 (1 after a stopped validate, test or predict: rank 0 writes
    ``<user_error_file>.stopped``).

    A refusal (bad input the rank found: a fractional limit of no batch, an evaluation set smaller than the
    world, a NaN loss; failed_run.refusal) reaches the callbacks and then the loggers as Lightning's handling
    of a failure does it elsewhere: rank 0, which knows whether the run trained, keeps or removes the run's
    folder (the main process, which does not train, cannot tell), and a refused resume leaves no empty
    TensorBoard event file. Its line is also written to ``user_error_file``: torch hands the main process a
    rank's exception as traceback text only, which would reach the user as a wall of it, not one line."""
    try:
        return function(*args, **kwargs)
    except (SIGTERMException, KeyboardInterrupt) as stop:
        trainer: Trainer = function.__self__
        for callback in trainer.callbacks:  # as in any other strategy (Ctrl-C: an empty run folder goes)
            callback.on_exception(trainer, trainer.lightning_module, stop)
        if isinstance(stop, KeyboardInterrupt):  # before training started, or a second one: no checkpoint
            # The rank exits 1: torch's spawn wrapper would end it with status 0 and no result, which the main
            # process would wait for forever.
            sys.exit(1)
        for logger in trainer.loggers:  # Lightning's status for a stopped run (MLflow takes no other word)
            logger.finalize("failed")
        if trainer.state.fn != TrainerFn.FITTING and trainer.is_global_zero:
            # validate, test or predict: nothing kept, which the main process's exit status must say
            with contextlib.suppress(WriteError):
                write_file(f"{user_error_file}.stopped", "", "the rank's stop for the main process", None)
        return None
    except Exception as err:
        trainer = getattr(function, "__self__", None)  # the Trainer's, where Lightning launches the rank
        trainer = trainer if isinstance(trainer, Trainer) else None
        refused = refusal(trainer, err)
        if refused is None:
            raise
        for callback in trainer.callbacks if trainer is not None else []:
            callback.on_exception(trainer, trainer.lightning_module, refused)
        for logger in trainer.loggers if trainer is not None else []:
            with contextlib.suppress(OSError, UserError):  # the rank's own error is the one to report
                logger.finalize("failed")
        # A temporary folder that cannot be written loses the hand-over, never the rank's own error.
        with contextlib.suppress(WriteError):
            write_file(user_error_file, str(refused), "the rank's error for the main process", elsewhere=None)
        raise refused from None


@contextlib.contextmanager
def _ranks_running(user_error_file: str, procs: Callable[[], list]):
    """In ddp_spawn's main process while its ranks run: stop signals go to every rank
    (``_hand_stop_signals_to``), and a rank's UserError is raised here as itself (main() prints its line)."""
    try:
        with _hand_stop_signals_to(procs):
            yield
    except Exception:
        error = Path(user_error_file)
        if error.is_file():
            message = error.read_text()
            error.unlink()
            raise UserError(message) from None
        raise
    stopped = Path(f"{user_error_file}.stopped")
    if stopped.is_file():  # a signal stopped validate, test or predict: rank 0 printed the line, exit 1
        stopped.unlink()
        raise SystemExit(1)


@contextlib.contextmanager
def _hand_stop_signals_to(procs: Callable[[], list]):
    """In ddp_spawn's main process: SIGTERM and SIGUSR1 go to every rank (which agree where to stop)
    instead of killing this process alone, whose ranks torch would then interrupt at a random point.

    A Ctrl-C is the terminal's, sent to every process of the job, the ranks included: they stop on it
    themselves, so this process lets the first one pass (handed on, the ranks would count it twice and
    abort) and waits for them; at a second Ctrl-C, which aborts the ranks, it stops too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def hand_on(signum: int, frame) -> None:
        for proc in procs():
            if proc.is_alive():
                os.kill(proc.pid, signum)

    pressed = []

    def ctrl_c(signum: int, frame) -> None:
        pressed.append(signum)
        if len(pressed) > 1:
            raise KeyboardInterrupt  # the second: abort now (Lightning's path), as the ranks do

    handled = (signal.SIGTERM, signal.SIGUSR1)
    previous = {signum: signal.signal(signum, hand_on) for signum in handled}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, ctrl_c)
    try:
        yield
    except torch.multiprocessing.ProcessExitedException:
        if pressed:  # the ranks stopped on that Ctrl-C before training (exit 1): this process stops too
            raise KeyboardInterrupt from None
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop_spawned_ranks_cleanly(trainer: Trainer) -> bool:
    """Under ddp_spawn (called in the main process before the run): a stop signal to the main process or
    to one rank stops every rank at the same batch with last.ckpt, and the job exits 0."""
    if find_callback(trainer.callbacks, PreemptionCheckpoint) is None:
        return False
    # A path, not a queue: the trainer holding it is pickled into the ranks (and may be pickled again).
    user_error_file = os.path.join(
        tempfile.gettempdir(), f"lit_ddp_user_error_{os.getpid()}_{uuid.uuid4().hex}"
    )
    wrap = functools.partial(functools.partial, _run_rank, user_error_file)
    return wrap_spawn_launch(trainer.strategy, wrap, functools.partial(_ranks_running, user_error_file))


def fit_complete(trainer: Trainer) -> bool:
    """Whether the fit ends here anyway: it has reached its ``max_epochs`` (its last epoch ended) or its
    ``max_steps``, or a callback's ``should_stop`` (EarlyStopping, max_time) ends it, which Lightning's fit
    loop honours once ``min_epochs`` and ``min_steps`` are met (this callback stops through another flag)."""
    completed = epochs_started_completed(trainer)[1]
    max_epochs, max_steps = trainer.max_epochs, trainer.max_steps
    stopping = (
        trainer.should_stop
        and completed >= (trainer.min_epochs or 0)
        and trainer.global_step >= (trainer.min_steps or 0)
    )
    return (
        stopping
        or (max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps)
        or (max_epochs is not None and max_epochs >= 0 and completed >= max_epochs)
    )


def _requeue_slurm_job() -> None:
    if not SLURMEnvironment.detect():
        return
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ["SLURM_JOB_ID"]
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        rank_zero_warn(f"lit_ddp: could not requeue SLURM job {job}: {err}")
        return
    if result.returncode == 0:
        rank_zero_info(f"lit_ddp: requeued SLURM job {job}")
    else:
        rank_zero_warn(f"lit_ddp: `scontrol requeue {job}` failed: {result.stderr.strip()}")
