"""The console besides the one-line epoch summary: a progress bar and a model summary without what reads
as a bug to a user.

Lightning's bar counts epochs from 0 to max_epochs - 1 (``Epoch 0/0`` for a one-epoch run, whose summary
line says ``epoch 1/1``) and shows the logger's version as ``v_num: 0.000``; its model summary has a FLOPs
column of zeros (Lightning counts FLOPs only with an example input) and counts modules in train and eval
mode, torchmetrics' metric objects included. Users cannot act on any of that.

Lightning redraws its bar after every batch (``refresh_rate=1``): a dict of the logged metrics and a render,
which on a small model's step costs more than all of lit_ddp's other callbacks together
(docs/benchmarks.md, host overhead per step). Here a bar redraws at most ``REDRAW_S`` apart, and always at
an epoch's last batch: no reader sees the difference, and the step pays it ten times a second at most.
"""

import importlib.util
import time

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.model_summary import get_human_readable_count

from lit_ddp.callbacks.step_loss import STEP_LOSS


def epoch_description(trainer: Trainer) -> str:
    """``Epoch 3/12``: counted from 1, as the epoch summary line counts."""
    total = f"/{trainer.max_epochs}" if trainer.max_epochs not in (None, -1) else ""
    return f"Epoch {trainer.current_epoch + 1}{total}"


def _bar_metrics(trainer: Trainer, metrics: dict) -> dict:
    metrics.pop("v_num", None)  # the run directory's version_N, already in the path the run prints
    # The step loss, read here at a redraw; logged with prog_bar=True Lightning would read it every step.
    loss = trainer.callback_metrics.get(STEP_LOSS)
    if loss is not None:
        metrics[STEP_LOSS] = float(loss)
    return metrics


REDRAW_S = 0.1  # seconds between redraws of a progress bar within an epoch


class _Throttled:
    """A progress bar's per-batch redraws, at most one per ``REDRAW_S``, and the last batch's always."""

    _drawn_at = float("-inf")

    def _due(self, batch_idx: int, total: int | float) -> bool:
        now = time.monotonic()
        if now - self._drawn_at < REDRAW_S and batch_idx + 1 < total:
            return False
        self._drawn_at = now
        return True

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        # A disabled bar (every rank but 0) draws nothing and has no totals to read.
        if not self.is_disabled and self._due(batch_idx, self.total_train_batches):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int, dataloader_idx=0
    ) -> None:
        if not self.is_disabled and self._due(batch_idx, self.total_val_batches_current_dataloader):
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)


class RichBar(_Throttled, RichProgressBar):
    """Lightning's rich bar, counting epochs from 1, without ``v_num``, redrawn at most every ``REDRAW_S``.

    Fork of ``lightning.pytorch.callbacks.RichProgressBar``: it counts epochs from 0, shows ``v_num``,
    updates after every batch and wakes its redraw thread 100 times a second; goes when it counts from 1 and
    throttles its updates by time.
    """

    _described: tuple | None = None  # (task, epoch) whose description is ours

    def __init__(self, refresh_rate: int | None = None, **kwargs) -> None:
        # Lightning's bar redraws from a thread that wakes ``refresh_rate`` times a second (100 by default)
        # and takes the GIL each time; redraws are due at most every REDRAW_S, so more wake-ups draw nothing.
        if refresh_rate is None:
            refresh_rate = max(1, round(1 / REDRAW_S)) if REDRAW_S > 0 else 100
        super().__init__(refresh_rate=refresh_rate, **kwargs)

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        return _bar_metrics(trainer, super().get_metrics(trainer, pl_module))

    def _describe(self, trainer: Trainer) -> None:
        task = self.train_progress_bar_id
        described = (task, trainer.current_epoch)
        if self.progress is not None and task is not None and described != self._described:
            self.progress.update(task, description=epoch_description(trainer))
            self._described = described

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._describe(trainer)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        # A mid-epoch resume calls no on_train_epoch_start: Lightning's bar makes its task at a batch end,
        # described its own way ("Epoch 0/0" for the first of one epoch).
        self._describe(trainer)


class TQDMBar(_Throttled, TQDMProgressBar):
    """Lightning's tqdm bar (where rich is not installed), as ``RichBar`` changes it.

    Fork of ``lightning.pytorch.callbacks.TQDMProgressBar``: it counts epochs from 0, shows ``v_num`` and
    redraws every ``refresh_rate`` batches; goes when it counts from 1 and throttles its redraws by time.
    """

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        return _bar_metrics(trainer, super().get_metrics(trainer, pl_module))

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self.train_progress_bar.set_description(epoch_description(trainer))


# Lightning's own choice: rich where it is installed, tqdm (a dependency of Lightning) otherwise.
ProgressBar = RichBar if importlib.util.find_spec("rich") is not None else TQDMBar


class ConsoleModelSummary(LightningModelSummary):
    """The modules that hold parameters, their type and size, and the totals; printed once, by rank 0.

    Fork of ``lightning.pytorch.callbacks.ModelSummary``: its table has a FLOPs column of zeros without an
    example input and counts modules in train and eval mode, torchmetrics' metrics among them; goes when it
    leaves both out. Named apart from it, as ``--trainer.callbacks+=ModelSummary`` finds a class by its name.
    """

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int = 0,
        **summarize_kwargs,
    ) -> None:
        columns = dict(summary_data)
        names = [name for name in ("Name", "Type", "Params", "In sizes", "Out sizes") if name in columns]
        # Metric objects and parameter-free modules have 0 parameters: rows the user has nothing to read in.
        kept = [i for i, params in enumerate(columns["Params"]) if params.strip() != "0"]
        rows = [names, *([columns[name][i] for name in names] for i in kept)]
        widths = [max(len(str(row[c])) for row in rows) for c in range(len(names))]
        lines = [" | ".join(f"{str(cell):<{w}}" for cell, w in zip(row, widths, strict=True)) for row in rows]
        frozen = total_parameters - trainable_parameters
        count = lambda n: get_human_readable_count(n).strip()  # noqa: E731 - pads to a column width
        lines.append(
            f"{count(trainable_parameters)} trainable parameters, {count(frozen)} frozen, {model_size:.2f} MB"
        )
        print("\n".join(lines))
