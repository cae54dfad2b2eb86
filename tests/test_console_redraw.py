"""The progress bar's per-batch cost: redrawn at most every REDRAW_S, and always at a loop's last batch."""

import lightning as L
import pytest
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.demos.boring_classes import BoringModel

from lit_ddp.callbacks import console


def _fit(tmp_path, callbacks: list, **limits) -> L.Trainer:
    """One epoch of Lightning's BoringModel with these callbacks, nothing else on."""
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **limits,
    )
    trainer.fit(BoringModel())
    return trainer


@pytest.mark.parametrize(
    "bar_class, lightning_bar", [(console.RichBar, RichProgressBar), (console.TQDMBar, TQDMProgressBar)]
)
def test_the_bar_redraws_at_most_every_redraw_s_and_always_at_the_last_batch(
    tmp_path, monkeypatch, bar_class, lightning_bar
) -> None:
    drawn = {"train": [], "val": []}
    train_end, val_end = lightning_bar.on_train_batch_end, lightning_bar.on_validation_batch_end

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        drawn["train"].append(batch_idx)
        train_end(self, trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        drawn["val"].append(batch_idx)
        val_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    monkeypatch.setattr(lightning_bar, "on_train_batch_end", on_train_batch_end)
    monkeypatch.setattr(lightning_bar, "on_validation_batch_end", on_validation_batch_end)
    monkeypatch.setattr(console, "REDRAW_S", 1e9)  # no batch is due by time: only the first and the last
    _fit(tmp_path, [bar_class()], limit_train_batches=25, limit_val_batches=7)
    assert drawn == {"train": [0, 24], "val": [6]}
    monkeypatch.setattr(console, "REDRAW_S", 0.0)  # due every time: Lightning's own behaviour
    bar = bar_class()
    assert all(bar._due(i, 25) for i in range(25))


@pytest.mark.parametrize("bar_class", [console.RichBar, console.TQDMBar])
def test_the_step_loss_is_read_to_the_host_at_redraws_only_and_shown_in_the_bar(
    tmp_path, monkeypatch, bar_class
) -> None:
    """Logged with prog_bar=True, Lightning would turn the step loss into a float after every batch: a
    blocking device-to-host copy per step on a GPU. Here the bar reads it when it redraws."""
    from lightning.pytorch.trainer.connectors.logger_connector import result

    from lit_ddp.callbacks import StepLoss

    conversions = []
    convert = result.convert_tensors_to_scalars
    monkeypatch.setattr(result, "convert_tensors_to_scalars", lambda x: conversions.append(x) or convert(x))
    monkeypatch.setattr(console, "REDRAW_S", 1e9)
    shown = []

    class Bar(bar_class):
        def get_metrics(self, trainer, pl_module):
            metrics = super().get_metrics(trainer, pl_module)
            shown.append(metrics)
            return metrics

    limits = dict(limit_train_batches=20, limit_val_batches=2, log_every_n_steps=4)
    trainer = _fit(tmp_path, [StepLoss(), Bar()], **limits)
    assert not conversions
    assert shown and isinstance(shown[-1]["train/loss_step"], float)
    assert shown[-1]["train/loss_step"] == pytest.approx(float(trainer.callback_metrics["train/loss_step"]))


def test_the_rich_bars_thread_wakes_as_often_as_a_redraw_can_be_due(tmp_path, monkeypatch) -> None:
    """Lightning's rich bar redraws from a thread that wakes ``refresh_rate`` times a second (100 by
    default), taking the GIL from the training loop each time: here as often as REDRAW_S allows a redraw."""
    seen = []

    class Look(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(trainer.progress_bar_callback.progress.live.refresh_per_second)

    monkeypatch.setattr(console, "REDRAW_S", 0.25)
    _fit(tmp_path, [console.RichBar(), Look()], limit_train_batches=2, limit_val_batches=1)
    assert seen == [4, 4]
    assert console.RichBar(refresh_rate=30).refresh_rate == 30  # a rate of the user's stays
