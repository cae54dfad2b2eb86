"""The progress bar's per-batch cost: redrawn at most every REDRAW_S, and always at a loop's last batch."""

import lightning as L
import pytest
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.demos.boring_classes import BoringModel

from lit_ddp.callbacks import console


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
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=25,
        limit_val_batches=7,
        num_sanity_val_steps=0,
        callbacks=[bar_class()],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(BoringModel())
    assert drawn == {"train": [0, 24], "val": [6]}
    monkeypatch.setattr(console, "REDRAW_S", 0.0)  # due every time: Lightning's own behaviour
    bar = bar_class()
    assert all(bar._due(i, 25) for i in range(25))
