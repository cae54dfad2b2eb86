"""A data module's own ``train_dataloader`` and the like, built with ``ImageDataModule.loader``: other
DataLoader arguments, lit_ddp's samplers, collate and checks kept; a DataLoader of its own, or an argument
that would replace lit_ddp's parts, is one line naming the fix."""

from pathlib import Path

import pytest
import torch
from conftest import CPU, DDP2, ONE, TINY_SHAPES, WITH_PROBES, last_ckpt, read_scalars, run_cli
from torch.utils.data import DataLoader

from lit_ddp.cli import main
from lit_ddp.data import ShapesDataModule
from lit_ddp.data.datasets import collate_batch

RUN = [*CPU, *TINY_SHAPES, "--trainer.max_epochs=1", "--model.optim.name=sgd", "--model.optim.lr=0.05"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ShapesDataModule and TunedLoaders (own_loader.py), each on 1 and on 2 processes."""
    root = tmp_path_factory.mktemp("own_loader")
    for world, devices in (("1", ONE), ("2", DDP2)):
        for data in ("ShapesDataModule", "own_loader.TunedLoaders"):
            out = root / f"{data}{world}"
            args = ["fit", f"--data={data}", *RUN, *devices, f"--trainer.default_root_dir={out}"]
            done = run_cli(args, cwd=out, env=WITH_PROBES, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
    return root


@pytest.mark.ddp
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", ["1", "2"])
def test_loaders_built_with_self_loader_train_and_score_as_the_data_modules_own(
    runs: Path, world: str
) -> None:
    """Same weights after every step's order (the seeded sampler), same validation metrics (101 images on
    2 processes: padded shards would count one twice)."""
    own, base = (runs / f"{data}{world}" for data in ("own_loader.TunedLoaders", "ShapesDataModule"))
    got, want = (torch.load(last_ckpt(d, []), weights_only=True) for d in (own, base))
    assert got["global_step"] == want["global_step"] == 8 // int(world)
    for key, value in want["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][key], value, rtol=0, atol=0, msg=key)
    got, want = (read_scalars(last_ckpt(d, []).parent.parent) for d in (own, base))
    for key in ("val/acc", "val/loss"):
        assert got[key] == want[key], key


def test_an_overridden_loader_resumes_where_the_checkpoint_stopped() -> None:
    """The override's sampler starts where the base's does: 24 samples into epoch 2's order."""
    dms = [TunedEval(train_size=64, val_size=16, test_size=16, batch_size=8) for _ in range(2)]
    orders = []
    for dm, loader in zip(dms, (ShapesDataModule.train_dataloader, TunedEval.train_dataloader), strict=True):
        dm.setup("fit")
        dm.load_state_dict({"epoch": 1, "samples": 24, "samples_per_step": 8})
        orders.append(list(loader(dm).sampler))
    assert orders[0] == orders[1] and len(orders[0]) == 64 - 24


class TunedEval(ShapesDataModule):
    def train_dataloader(self):
        return self.loader(self.train_set, train=True, num_workers=0, pin_memory=False)

    def predict_dataloader(self):
        return self.loader(self.test_set, num_workers=0)


class PlainLoader(ShapesDataModule):
    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)


class LitDdpCollate(ShapesDataModule):
    def val_dataloader(self):
        return [DataLoader(self.val_set, batch_size=self.batch_size, collate_fn=collate_batch)]


class EvalLoaderForTraining(ShapesDataModule):
    def train_dataloader(self):
        return self.loader(self.train_set)


def options(**kwargs) -> type:
    """A data module whose training loader passes ``kwargs`` to ``self.loader``."""

    class Options(ShapesDataModule):
        def train_dataloader(self):
            return self.loader(self.train_set, train=True, **kwargs)

    return Options


LINES = {
    "PlainLoader": "PlainLoader.train_dataloader returned a DataLoader of its own, which loses lit_ddp's"
    " sampler, collate and sample indices (its batches fail, or are padded or reordered under DDP): return"
    " self.loader(dataset, train=True, **DataLoader arguments)",
    "LitDdpCollate": "LitDdpCollate.val_dataloader returned a DataLoader of its own, which loses lit_ddp's"
    " sampler, collate and sample indices (its batches fail, or are padded or reordered under DDP): return"
    " self.loader(dataset, **DataLoader arguments)",
    "EvalLoaderForTraining": "EvalLoaderForTraining.train_dataloader returned self.loader(..., train=False)"
    " for the other split: return self.loader(dataset, train=True, **DataLoader arguments)",
}


@pytest.mark.parametrize("data", sorted(LINES))
def test_a_loader_hook_that_does_not_build_with_self_loader_is_one_line(capsys, tmp_path: Path, data: str):
    """Before: torch's 'stack expects each tensor to be equal size' traceback at the first batch (the default
    collate), 'samples of 1 items ... load_split must return' (lit_ddp's collate, no sample indices), or a
    validation padded under DDP in silence."""
    args = [
        "fit",
        f"--data={__name__}.{data}",
        *RUN,
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("lit_ddp: error:")]
    assert exit_info.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert lines[0].startswith(f"lit_ddp: error: {LINES[data]}"), lines[0]


REFUSED = {
    "batch_size": (64, "Options.loader(batch_size=64): the batch is --data.batch_size=32 per device"),
    "sampler": ([0, 1], "Options.loader takes no sampler=...: the training sampler orders the split by"),
    "shuffle": (False, "Options.loader takes no shuffle=False: the training sampler orders the split by"),
    "collate_fn": (collate_batch, "Options.loader takes no collate_fn=...: the data module's collate hands"),
    "drop_last": (True, "Options.loader takes no drop_last=True: an epoch's last training batch is left out"),
}


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_a_dataloader_argument_that_replaces_lit_ddps_parts_is_refused(key: str) -> None:
    value, line = REFUSED[key]
    dm = options(**{key: value})(train_size=64, val_size=16, test_size=16, batch_size=32)
    dm.setup("fit")
    with pytest.raises(Exception) as err:
        dm.train_dataloader()
    assert type(err.value).__name__ == "UserError" and str(err.value).startswith(line), err.value
    assert "\n" not in str(err.value)


def test_the_arguments_that_keep_lit_ddps_parts_are_taken() -> None:
    dm = options(shuffle=True, batch_size=32, num_workers=0, prefetch_factor=2)(train_size=64, batch_size=32)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.batch_size == 32 and loader.collate_fn is collate_batch and loader.prefetch_factor is None


def test_predict_through_self_loader_keeps_each_samples_index(tmp_path: Path) -> None:
    import lightning as L

    from lit_ddp.models import ImageClassifier, LeNet

    dm = TunedEval(train_size=32, val_size=16, test_size=20, batch_size=8)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    rows = trainer.predict(ImageClassifier(net=LeNet), datamodule=dm)
    assert torch.cat([row["index"] for row in rows]).tolist() == list(range(20))
