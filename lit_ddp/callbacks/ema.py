"""An exponential moving average (EMA) of the weights: validated, saved beside the raw weights, resumed.

    python -m lit_ddp fit --config configs/lenet_cifar.yaml --config configs/presets/ema.yaml

After every optimizer step, ``average = decay × average + (1 − decay) × weights`` (the first step copies
the weights), parameters and buffers alike (BatchNorm's running statistics). Validation runs on the
average; checkpoints keep it as ``state_dict``, so ``validate``/``test``/``predict --ckpt_path=X`` (and
the model class's ``load_from_checkpoint``: ``LeNetCIFAR.load_from_checkpoint``) use the averaged weights
with or without this callback; the raw weights go to ``current_model_state``, the average's update count to
``averaging_state`` (the layout of Lightning's ``WeightAveraging``). ``fit --ckpt_path`` restores both, and
the decay the run averaged with, as ``--model.optim`` settings resume: a decay given other than the default
holds over the checkpoint's, the default takes the checkpoint's, and a note names the one that changed.

Why not Lightning's ``EMAWeightAveraging`` (2.6) itself:

* under DDP its average is not the same on every rank: DDP keeps the parameters identical, but each rank
  updates BatchNorm's running statistics from its own batches, and that callback averages each rank's
  own. Fixing it needs its private ``_average_model``; callbacks here use public APIs only.
* its ``setup`` calls ``configure_model`` early and warns about sharding for every lit_ddp model (they
  override ``configure_model`` to compile the network).
* a checkpoint written mid-validation (a stop signal there) would store the raw and averaged weights
  swapped.
"""

import itertools

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from lit_ddp.errors import UserError

DEFAULT_DECAY = 0.999


def _tensors(module: nn.Module) -> dict[str, Tensor]:
    return dict(itertools.chain(module.named_parameters(), module.named_buffers()))


class EMA(Callback):
    """Keeps the EMA of the weights with ``decay`` per optimizer step (0.999: a horizon of ~1000 steps).

    Fork of ``lightning.pytorch.callbacks.EMAWeightAveraging``: it averages each rank's own BatchNorm
    statistics, so under DDP the ranks' averages differ; goes when it averages buffers alike on every rank
    through a public API.
    """

    def __init__(self, decay: float = DEFAULT_DECAY) -> None:
        if not 0.0 <= decay <= 1.0:
            raise UserError(f"EMA decay={decay} must be in [0, 1] (0.999 averages over ~1000 steps)")
        self.decay = decay
        self.given_decay = decay  # what each fit starts from: a resume may take its checkpoint's
        self.average: AveragedModel | None = None  # only while fitting
        self.last_update_step = 0  # trainer.global_step at the last update: one update per optimizer step
        self.swapped = False  # the module holds the average (during validation)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            # The same callback given to a second fit (library use): nothing of the last fit's carries over,
            # neither its checkpoint's decay nor its step count (the new fit's first steps would not update).
            self.decay, self.last_update_step, self.swapped = self.given_decay, 0, False
            # A copy of the LightningModule (same state_dict keys), on its device. Made before
            # configure_model compiles the network and before DDP wraps it: the copy is never run.
            # The parameters are still on the CPU here (the strategy moves them after the callbacks'
            # setup); pl_module.device already names the trainer's device, where the average belongs: on
            # the CPU it would cost a GPU run a copy of every weight to the host each step, and NCCL
            # refuses its CPU buffers in _sync_buffers.
            self.average = AveragedModel(
                pl_module,
                device=pl_module.device,
                multi_avg_fn=get_ema_multi_avg_fn(self.decay),
                use_buffers=True,
            )

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx
    ) -> None:
        # global_step counts optimizer steps: with accumulate_grad_batches=N, one update per N batches.
        if self.average is None or trainer.global_step <= self.last_update_step:
            return
        self.average.update_parameters(pl_module)
        self._sync_buffers(trainer)
        self.last_update_step = trainer.global_step

    @torch.no_grad()
    def _sync_buffers(self, trainer: Trainer) -> None:
        """The same average on every rank. Parameters are already equal (DDP all-reduces the gradients),
        but each rank's BatchNorm statistics come from its own batches: the average takes their mean
        over the ranks, the statistics of the global batch, as one process would see them. EMA is
        linear, so this equals the EMA of the ranks' mean. Every rank calls it at the same step."""
        buffers = [b for b in self.average.module.buffers() if b.is_floating_point()]
        if trainer.world_size == 1 or not buffers:
            return  # no collective for a model without BatchNorm
        flat = trainer.strategy.reduce(torch.cat([b.flatten() for b in buffers]), reduce_op="mean")
        for buffer, value in zip(buffers, flat.split([b.numel() for b in buffers]), strict=True):
            buffer.copy_(value.view_as(buffer))

    @torch.no_grad()
    def _swap(self, pl_module: LightningModule) -> None:
        average = _tensors(self.average.module)
        for name, current in _tensors(pl_module).items():
            kept = current.clone()
            current.copy_(average[name])
            average[name].copy_(kept)
        self.swapped = not self.swapped

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.average is not None and not self.swapped:
            self._swap(pl_module)  # val/* (and the best checkpoint's val/acc) are the average's

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Before the module's own epoch-end hook: its metrics were updated during the steps, with the average.
        if self.swapped:
            self._swap(pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # After fit the module holds the average, as it would after loading the checkpoint (Lightning does
        # the same), so a test or an export in the same process uses it.
        if self.average is not None and not self.swapped:
            self._swap(pl_module)
            self.average = None

    def state_dict(self) -> dict:
        return {"last_update_step": self.last_update_step, "decay": self.decay}

    def load_state_dict(self, state_dict: dict) -> None:
        self.last_update_step = state_dict["last_update_step"]
        saved = state_dict.get("decay", self.decay)  # a checkpoint that did not keep it: this run's
        if saved == self.decay:
            return
        if self.decay == DEFAULT_DECAY:  # not chosen (the preset gives the default): the saved run goes on
            said = f"the checkpoint's decay {saved} (this run's default: {self.decay})"
            self.decay = saved
        else:
            said = f"this run's decay {self.decay} (the checkpoint's: {saved})"
        if self.average is not None:
            self.average.multi_avg_fn = get_ema_multi_avg_fn(self.decay)
        rank_zero_info(f"lit_ddp: note: the EMA averages on with {said}")

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        if self.average is None:
            return
        current, average = checkpoint["state_dict"], self.average.module.state_dict()
        if self.swapped:  # saved mid-validation: the module holds the average
            current, average = average, current
        checkpoint["state_dict"] = average
        checkpoint["current_model_state"] = current
        checkpoint["averaging_state"] = {"n_averaged": self.average.n_averaged}

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        # validate/test/predict (no average): the module got state_dict, the average, which is what they use.
        # fit: Lightning loaded state_dict into the module; the raw weights are current_model_state. A
        # checkpoint without them (fine-tuning from a plain run) starts both from its weights.
        if self.average is None or "current_model_state" not in checkpoint:
            return
        self.average.module.load_state_dict(checkpoint["state_dict"])
        self.average.n_averaged.copy_(checkpoint["averaging_state"]["n_averaged"])
        pl_module.load_state_dict(checkpoint["current_model_state"])
