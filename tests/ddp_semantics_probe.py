"""A callback that records, on every rank, what a run did, for tests/test_ddp_semantics.py.

Added to a CLI run with ``--trainer.callbacks='{"class_path": "ddp_semantics_probe.Probe", ...}'`` (tests/ on
PYTHONPATH). At teardown each rank saves ``<out_dir>/<stage>_rank<r>.pt``: weights at set-up and after every
epoch's last optimizer step and after each of the first steps, the first step's gradients (after DDP's
all-reduce), epoch-level metrics, the indices its training sampler yielded, each epoch's first training batch
as the step saw it (augmented) with its samples' indices, the BatchNorm classes it trained with, and every
checkpoint write it made.
"""

from pathlib import Path

import torch
from lightning import Callback, LightningModule, Trainer
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from lit_ddp.data.batch_transforms import normalize

STEP_STATES = 8  # the weights after each of the first optimizer steps are kept


def snapshot(module: LightningModule) -> dict[str, Tensor]:
    """Parameters and buffers (running statistics included) of the plain network, copied to CPU."""
    return {k: v.detach().clone().cpu() for k, v in module.net.state_dict().items()}


def metrics(trainer: Trainer, prefix: str) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(prefix)}


def digest(dataset) -> tuple[int, int, int]:
    """A cheap fingerprint of an in-memory TensorImageDataset: size, pixel sum, label-weighted sum."""
    images, labels = dataset.images, dataset.labels
    weights = torch.arange(1, len(labels) + 1)
    return len(labels), int(images.long().sum()), int((labels * weights).sum())


class Probe(Callback):
    def __init__(self, out_dir: str, stop_after_epochs: int = 0) -> None:
        self.out_dir = Path(out_dir)
        self.stop_after_epochs = stop_after_epochs  # > 0: simulate a run killed after this many epochs
        self.record: dict = {
            "val": [],
            "test": [],
            "epoch_state": [],
            "samples": [],
            "aug": [],
            "aug_index": [],
            "plain": [],
            "step_state": [],
            "writes": [],
        }
        self._last_state: dict[str, Tensor] = {}

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.record.update(
            rank=trainer.global_rank, world_size=trainer.world_size, strategy=type(trainer.strategy).__name__
        )
        if stage == "fit":
            # Before the strategy wraps the model in DDP (which would broadcast rank 0's weights).
            self.record["init"] = snapshot(pl_module)
            dm = trainer.datamodule
            self.record["split"] = {"train": digest(dm.train_set), "val": digest(dm.val_set)}
        # Log the writes this rank makes through Lightning's checkpoint I/O.
        io = trainer.strategy.checkpoint_io
        save = io.save_checkpoint

        def logged_save(checkpoint, path, storage_options=None):
            self.record["writes"].append(str(path))
            return save(checkpoint, path, storage_options=storage_options)

        io.save_checkpoint = logged_save

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.record["bn_classes"] = sorted(
            {type(m).__name__ for m in pl_module.modules() if isinstance(m, _BatchNorm)}
        )

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sampler = trainer.train_dataloader.sampler  # Lightning has called set_epoch on it by now
        self.record["samples"].append((type(sampler).__name__, list(iter(sampler))))

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        # What training sees of the epoch's first batch (augmented and normalised on the device), beside the
        # same images normalised without augmentation.
        if batch_idx == 0:
            dm = trainer.datamodule
            first = self.record["samples"][-1][1][: dm.batch_size]
            plain = normalize(dm.train_set.images[first].to(pl_module.device), dm.mean, dm.std)
            self.record["aug"].append(batch[0].cpu())
            self.record["aug_index"].append(first)
            self.record["plain"].append(plain.cpu())

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer) -> None:
        # After backward, so after DDP's gradient all-reduce: what the optimizer applies.
        if "grads" not in self.record:
            self.record["grads"] = {
                k: p.grad.detach().clone().cpu() for k, p in pl_module.net.named_parameters()
            }

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        self._last_state = snapshot(pl_module)  # before validation's DDP buffer broadcast
        steps = self.record["step_state"]
        if len(steps) < min(
            trainer.global_step, STEP_STATES
        ):  # an optimizer step ended (not an accumulation)
            steps.append(self._last_state)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.record["epoch_state"].append(self._last_state)
        self.record["global_step"] = trainer.global_step  # optimizer steps so far
        if self.stop_after_epochs and trainer.current_epoch + 1 >= self.stop_after_epochs:
            trainer.should_stop = True

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self.record["val"].append(metrics(trainer, "val/"))
            self.record.setdefault("val_batches", []).append(list(trainer.num_val_batches))

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.record["test"].append(metrics(trainer, "test/"))
        self.record.setdefault("test_batches", []).append(list(trainer.num_test_batches))

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stage = getattr(stage, "value", stage)  # Lightning passes a TrainerFn (a str enum)
        torch.save(self.record, self.out_dir / f"{stage}_rank{trainer.global_rank}.pt")


def load(out_dir: Path, stage: str, world_size: int) -> list[dict]:
    """Every rank's record of one run."""
    return [torch.load(out_dir / f"{stage}_rank{r}.pt", weights_only=False) for r in range(world_size)]
