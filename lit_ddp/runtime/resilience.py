"""Resilience: what keeps a run from losing work or hanging, as one callback.

``--resilience.X=false`` turns one part off, for a run that must do without it (a debugger that stops on
every signal, a model that is meant to produce NaN); ``--resilience=null`` all of them.
"""

import signal
from typing import Literal

from lightning import LightningModule, Trainer

from lit_ddp.callbacks.group import CallbackGroup
from lit_ddp.runtime.eval_limits import EvenEvalLimits
from lit_ddp.runtime.failed_run import RemoveFailedRunDir
from lit_ddp.runtime.faults import FaultMonitor, LostRankReport
from lit_ddp.runtime.nan_guard import NanGuard
from lit_ddp.runtime.preemption import DEFAULT_CHECK_EVERY_N_BATCHES, PreemptionCheckpoint
from lit_ddp.runtime.run_lock import RunLock
from lit_ddp.runtime.same_checkpoint import SameCheckpoint


class Resilience(CallbackGroup):
    """The parts, in the order they run:

    Args:
        preemption: SIGTERM, SIGUSR1 or Ctrl-C stop every rank at the same batch, with ``last.ckpt``;
            ``requeue_signal`` also requeues a SLURM job; the ranks agree on a stop every
            ``check_every_n_batches`` training batches.
        nan_guard: a non-finite loss or gradient stops training before the update, naming the step; under a
            GradScaler after ``max_skipped_steps`` skipped steps in a row; ``nan_read``: when the verdict is
            read ("auto": a step later on CUDA, without a device sync).
        fault_monitor: a lost rank is named in one line instead of a hang or a wall of tracebacks.

    Always on: a run stopped by bad input before its first step leaves no empty run folder; a fractional
    ``limit_val_batches``/``limit_test_batches``/``limit_predict_batches`` scores the same batches on every
    rank; every rank starts from the same checkpoint; the run folder's lock is released when the run fails.
    """

    def __init__(
        self,
        preemption: bool = True,
        requeue_signal: signal.Signals = signal.SIGUSR1,
        check_every_n_batches: int = DEFAULT_CHECK_EVERY_N_BATCHES,
        nan_guard: bool = True,
        max_skipped_steps: int = 20,
        nan_read: Literal["auto", "now", "next_step"] = "auto",
        fault_monitor: bool = True,
    ) -> None:
        parts = [
            (preemption, lambda: PreemptionCheckpoint(requeue_signal, check_every_n_batches)),
            (nan_guard, lambda: NanGuard(max_skipped_steps=max_skipped_steps, read=nan_read)),
            (fault_monitor, FaultMonitor),
            (True, RemoveFailedRunDir),
            (True, EvenEvalLimits),
            (True, SameCheckpoint),
        ]
        super().__init__(make() for on, make in parts if on)
        self.run_lock: RunLock | None = None  # taken before the run starts (cli.py): released last on failure

    def report_lost_ranks_to(self, report: LostRankReport) -> None:
        monitor = self.member(FaultMonitor)
        if monitor is not None:
            monitor.report = report

    def starts_from(self, given: str | None, resolved: str | None) -> None:
        """The ``--ckpt_path`` given and the file this rank resolved it to, for the ranks to compare."""
        self.member(SameCheckpoint).starts_from(given, resolved)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        if self.run_lock is not None:
            self.run_lock.release()
