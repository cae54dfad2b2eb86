"""One console line per epoch, printed by rank 0 only: epoch, losses, accuracies, images/s, the share of step
time spent waiting for data, time; once per fit, when that share is high, the likely fixes; and at the end
of a fit, where its run and checkpoints are."""

import os

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.trainer.states import RunningStage

from lit_ddp.callbacks.last_checkpoint import LastCheckpoint
from lit_ddp.callbacks.sinks import run_dir
from lit_ddp.compat import batches_done, epoch_cut_short
from lit_ddp.utils import is_local_path


def _fmt(metrics: dict, stage: str) -> str:
    loss = metrics.get(f"{stage}/loss_epoch", metrics.get(f"{stage}/loss"))
    parts = [f"{stage} loss {float(loss):.4f}"] if loss is not None else []
    accs = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith(f"{stage}/acc")}
    parts += [f"{name} {float(v):.4f}" for name, v in accs.items()]
    return " ".join(parts)


def _budget_to_raise(trainer: Trainer) -> str:
    """The budget that ended the fit, which a resume must raise to train on (the same budget would stop it
    at once): max_steps, or max_time, which Lightning's Timer counts over the resumed runs too."""
    if 0 <= trainer.max_steps <= trainer.global_step:
        return " and a larger --trainer.max_steps"
    timers = [c for c in trainer.callbacks if isinstance(c, Timer)]
    remaining = [t.time_remaining(RunningStage.TRAINING) for t in timers]
    if any(seconds is not None and seconds <= 0 for seconds in remaining):
        return " and a larger --trainer.max_time"
    return ""


def _fast_dev_resume(trainer: Trainer) -> str:
    """Why a fast_dev_run from a checkpoint trained nothing: Lightning stops it after fast_dev_run steps in
    all, whatever --trainer.max_steps says, and the checkpoint is past them."""
    steps = int(trainer.fast_dev_run)
    return (
        f"nothing to train: --trainer.fast_dev_run={steps} stops a fit at step {steps}, and"
        f" {trainer.ckpt_path} is at step {trainer.global_step}: leave --trainer.fast_dev_run out to resume"
        f" it, or --ckpt_path out to try {steps} batch(es) of a new run"
    )


def _shown(path: str, within: str | None = None) -> str:
    """A local path as short as it reads: relative to ``within`` (else the working folder) under it."""
    folder = os.path.abspath(within) if within is not None else os.getcwd()
    if not is_local_path(path) or not os.path.abspath(path).startswith(folder + os.sep):
        return path
    return os.path.relpath(os.path.abspath(path), folder)


def where_saved(trainer: Trainer) -> str:
    """The fit's closing line: its run folder, and the checkpoints to evaluate or resume from there."""
    folder = str(run_dir(trainer))
    checkpoints = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
    # The first that monitors a metric is the one --ckpt_path=best reads (Lightning's choice too); one that
    # monitors none keeps only its newest file: lit_ddp's last.ckpt, which --ckpt_path=last resumes, first.
    best = next((c for c in checkpoints if c.monitor and c.best_model_score is not None), None)
    ordered = sorted(checkpoints, key=lambda c: not isinstance(c, LastCheckpoint))
    newest = [c.last_model_path or ("" if c.monitor else c.best_model_path) for c in ordered]
    last = next(filter(None, newest), "")
    parts = []
    if best is not None and best.best_model_path:
        score = f"{best.monitor} {float(best.best_model_score):.4f}"
        parts.append(f"best by {score} {_shown(best.best_model_path, folder)}")
    if last:
        # --ckpt_path=last looks on this machine's disks only (preflight/runs.py).
        again = "--ckpt_path=last resumes it"
        if not is_local_path(last):
            again = "pass it as --ckpt_path to train on from it"
        parts.append(f"last {_shown(last, folder)} ({again})")
    return f"run saved in {_shown(folder)}" + (f": {', '.join(parts)}" if parts else "")


def _wait_hint(trainer: Trainer, wait: float) -> str | None:
    """The line naming the data module's remedies; None where it has none for this run (images in memory
    on a CPU: the wait is the batch's augmentation in the training process, which the epoch line shows)."""
    remedies = getattr(trainer.datamodule, "loader_remedies", lambda: [])()
    if not remedies:
        return None
    idle = " (the devices were idle meanwhile)" if trainer.strategy.root_device.type != "cpu" else ""
    return f"training waited for data {wait:.0%} of each step{idle}: {'; or '.join(remedies)}"


class EpochSummary(Callback):
    """After each training epoch (and its validation), prints

    ``epoch 3/12 | train loss 0.41 acc 0.86 | val loss 0.37 acc 0.88 | <img/s> (<per device>) | data wait
    <share> | <time>``

    The line is printed at the next hook after the epoch's end: the LightningModule logs its epoch metrics
    in its own ``on_train_epoch_end``, which Lightning calls after this callback's.

    The data wait is ``perf/data_wait`` (the dashboard's throughput part), the mean over the ranks of the
    share of each training step spent before the step could start. Above ``wait_hint_above`` one line, once
    per fit, names what would feed the devices faster: the data module's ``loader_remedies()``.
    """

    def __init__(self, wait_hint_above: float = 0.25) -> None:
        self.wait_hint_above = wait_hint_above
        self._hinted = False
        self._validated = False  # whether this epoch ran validation (else val/* are last epoch's)
        self._pending: int | None = None  # the finished epoch whose line is still to print
        self._cut_short: str | None = None  # how far an epoch max_steps or max_time ended went
        self._trained = False  # whether this fit ran its training loop at all

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._trained = True

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.fast_dev_run:  # Lightning's fast_dev_run saves nothing: no run folder, no checkpoint
            if not self._trained and trainer.ckpt_path:
                pl_module.print(_fast_dev_resume(trainer))
            return
        if self._trained:
            pl_module.print(where_saved(trainer))
            return
        # A fit resumed from a finished run trains nothing (Lightning skips its training loop and says
        # which budget is reached): name the budget to raise, as for a run cut short.
        if not trainer.ckpt_path:
            return
        budget = _budget_to_raise(trainer)
        if not budget and trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch:
            budget = " and a larger --trainer.max_epochs"
        if budget:
            pl_module.print(
                f"nothing to train: {trainer.ckpt_path} ends a finished run (resume it with"
                f" --ckpt_path=last{budget} to train on)"
            )

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._print_pending(trainer, pl_module)
        self._validated = False

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._pending = trainer.current_epoch
        self._cut_short = None
        if epoch_cut_short(trainer):  # the model logs no train/* for it: the epoch is not over
            done = batches_done(trainer)
            self._cut_short = (
                f"stopped after {done} of {trainer.num_training_batches} batches"
                f" (resume with --ckpt_path=last{_budget_to_raise(trainer)} to train the rest)"
            )

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._print_pending(trainer, pl_module)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._print_pending(trainer, pl_module)

    def _print_pending(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._pending is None:
            return
        epoch, self._pending = self._pending, None
        metrics = dict(trainer.callback_metrics)
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        if self._cut_short is not None:  # and no perf/* of its own: those are the last full epoch's
            parts = [f"epoch {epoch + 1}{epochs} {self._cut_short}"]
            metrics = {k: v for k, v in metrics.items() if not k.startswith("perf/")}
        else:
            parts = [f"epoch {epoch + 1}{epochs}", _fmt(metrics, "train")]
        if self._validated:
            parts.append(_fmt(metrics, "val"))
        if "perf/images_per_s" in metrics:
            rate, per_device = metrics["perf/images_per_s"], metrics.get("perf/images_per_s_per_device")
            per_device = f" ({float(per_device):.0f}/device)" if per_device is not None else ""
            parts.append(f"{float(rate):.0f} img/s{per_device}")
        wait = metrics.get("perf/data_wait")
        if wait is not None:
            parts.append(f"data wait {float(wait):.0%}")
        if "perf/epoch_time_s" in metrics:
            parts.append(f"{float(metrics['perf/epoch_time_s']):.1f} s")
        pl_module.print(" | ".join(p for p in parts if p))  # rank 0 only, above the progress bar
        if wait is not None and float(wait) > self.wait_hint_above and not self._hinted:
            self._hinted = True
            hint = _wait_hint(trainer, float(wait))
            if hint is not None:
                pl_module.print(hint)
