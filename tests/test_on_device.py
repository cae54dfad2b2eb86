"""``--data.on_device``: splits held on the training device, batches gathered there. The same training,
evaluation and predictions as the host loader's, and one clear line for data it cannot hold."""

import lightning as L
import pytest
import torch

from lit_ddp.data import RandomResizedCropFlip, ShapesDataModule
from lit_ddp.data.datasets import IndexBatch
from lit_ddp.errors import UserError
from lit_ddp.models import LeNetCIFAR

SIZES = dict(train_size=96, val_size=40, test_size=24, batch_size=16)


class HeldSplits(L.Callback):
    """The splits the data module holds on the device, as each stage ends."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = {}

    def _note(self, stage: str, trainer: L.Trainer) -> None:
        self.seen[stage] = set(trainer.datamodule._held)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._note("fit", trainer)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._note("test", trainer)

    def on_predict_epoch_end(self, trainer, pl_module) -> None:
        self._note("predict", trainer)


def fit_test_predict(tmp_path, on_device: bool, **data) -> dict:
    """Two epochs with validation, then test and predict, in this process on the CPU."""
    torch.manual_seed(0)
    held = HeldSplits()
    dm = ShapesDataModule(**SIZES, on_device=on_device, **data)
    model = LeNetCIFAR()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path, callbacks=[held],
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    fitted = {k: v.clone() for k, v in model.state_dict().items()}
    progress = dm.state_dict()
    val = {k: float(v) for k, v in trainer.callback_metrics.items()}
    test = trainer.test(model, datamodule=dm, verbose=False)
    predictions = trainer.predict(model, datamodule=dm)
    return dict(
        weights=fitted,
        progress=progress,
        val=val,
        test=test,
        predictions=predictions,
        held=held.seen,
        after=dm._held,
    )


def test_splits_held_on_the_device_train_evaluate_and_predict_as_the_host_loader_does(tmp_path) -> None:
    host = fit_test_predict(tmp_path / "host", on_device=False, mixup_alpha=0.2)
    held = fit_test_predict(tmp_path / "held", on_device=True, mixup_alpha=0.2)
    # The same samples, draws (crop, flip, MixUp) and order reach the model: bit-identical weights.
    for name, value in host["weights"].items():
        assert torch.equal(value, held["weights"][name]), name
    assert host["progress"] == held["progress"]  # the samples counted for an exact resume
    assert host["val"] == held["val"] and host["test"] == held["test"]
    assert len(host["predictions"]) == len(held["predictions"])
    for a, b in zip(host["predictions"], held["predictions"], strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert host["held"] == {"fit": set(), "test": set(), "predict": set()}
    assert held["held"] == {"fit": {"train", "val"}, "test": {"test"}, "predict": {"predict"}}
    assert not held["after"]  # teardown let the device's copies go


def test_an_on_device_loader_hands_out_indices_and_pins_no_images() -> None:
    dm = ShapesDataModule(**SIZES, on_device=True)
    dm.setup("fit")
    loader = dm.train_dataloader()
    batch = next(iter(loader))
    assert isinstance(batch, IndexBatch) and batch.index.shape == (16,) and batch.index.dtype == torch.long
    assert loader.num_workers == 0  # the workers would only pass indices through a queue
    # The indices are the sampler's: the same samples the host loader's first batch holds.
    host = ShapesDataModule(**SIZES)
    host.setup("fit")
    images, labels, index = next(iter(host.train_dataloader()))
    assert torch.equal(batch.index, index)


def test_on_device_with_a_worker_augmentation_is_one_clear_line() -> None:
    with pytest.raises(UserError, match=r"on_device=true .* RandomResizedCropFlip.*on_device=false"):
        ShapesDataModule(**SIZES, on_device=True, augmentation=RandomResizedCropFlip())


def test_on_device_with_a_split_read_from_files_is_one_clear_line() -> None:
    class FilesOnly(ShapesDataModule):
        def load_split(self, split: str) -> torch.utils.data.Dataset:
            return torch.utils.data.Subset(super().load_split(split), range(8))

    with pytest.raises(UserError, match=r"FilesOnly's train split is a Subset, not images held in memory"):
        FilesOnly(**SIZES, on_device=True).setup("fit")
