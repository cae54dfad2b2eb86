"""Preemption (SIGTERM, or SIGUSR1 before a SLURM time limit) → checkpoint, clean exit, resume later.

Lightning already turns SIGTERM into a clean stop: the signal handler forwards it to the ranks it
launched, and at the start of the next training batch rank 0's flag is broadcast, so every rank stops at
the same batch (``SIGTERMException``, exit code 0). What it does not do is save anything. This callback
saves ``last.ckpt`` at that point, on every rank together (``trainer.save_checkpoint`` writes on rank 0
and synchronises), and treats SIGUSR1 the same way. Under SLURM it then asks for the job to be requeued
(``scontrol requeue``), and the requeued job's ``--ckpt_path=last`` continues from the saved step.

This replaces Lightning's own SLURM SIGUSR1 handler, which saves ``hpc_ckpt_N.ckpt`` from inside the
signal handler, wherever each rank happens to be, with a barrier that can meet a different collective on
another rank.

What a stop in the middle of an epoch loses (the checkpoint records the step, not the data loader's
position): the resumed epoch restarts its data from the epoch's first batch (the same shuffled order,
since the sampler is seeded by epoch) and ends after the epoch's remaining number of batches. The first
``k`` batches are trained on twice and the last ``k`` not at all, and that epoch's train/* metrics cover
only the batches after the resume. The step count, the learning-rate schedule and all later epochs are as
in an uninterrupted run. A stop at an epoch boundary loses nothing: the resumed run is the uninterrupted
run."""

import os
import signal
import subprocess
import threading
from pathlib import Path

from lightning import Callback, LightningModule, Trainer
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException


def last_checkpoint_path(trainer: Trainer) -> Path:
    """Where the run's ``last.ckpt`` lives (the ModelCheckpoint's folder), else ``default_root_dir``."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is not None:
            return Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
    return Path(trainer.default_root_dir) / "last.ckpt"


class PreemptionCheckpoint(Callback):
    """Saves ``last.ckpt`` when a run is stopped by SIGTERM or SIGUSR1; requeues a SLURM job on SIGUSR1."""

    def __init__(self, requeue_signal: signal.Signals = signal.SIGUSR1) -> None:
        self.requeue_signal = requeue_signal
        self.received: str = "SIGTERM"

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning has installed its SIGTERM handler by now (after on_fit_start): route SIGUSR1 to it.
        if threading.current_thread() is not threading.main_thread():
            return
        on_sigterm = signal.getsignal(signal.SIGTERM)
        if not callable(on_sigterm):
            return

        def on_requeue_signal(signum, frame) -> None:
            self.received = signal.Signals(signum).name
            on_sigterm(signum, frame)

        signal.signal(self.requeue_signal, on_requeue_signal)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        path = last_checkpoint_path(trainer)
        trainer.save_checkpoint(path, weights_only=False)
        batch = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        where = f"epoch {trainer.current_epoch}, step {trainer.global_step}"
        if 0 < batch < trainer.num_training_batches:
            where += f" (mid-epoch, after {batch} of {trainer.num_training_batches} batches)"
        rank_zero_info(
            f"lit_ddp: stopped by {self.received} at {where}: saved {path}; resume with --ckpt_path=last"
        )
        if self.received == self.requeue_signal.name and trainer.is_global_zero:
            _requeue_slurm_job()


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
