"""The Lightning system shared by every image classifier: steps, metrics, optimizers.

Subclasses (LeNetCIFAR, ResNetImageNet) only build the network, a plain ``nn.Module`` returning logits,
and hand it to ``ImageClassifier.__init__``, which owns its memory format and compilation.
Every metric is a torchmetrics object updated locally on each rank and reduced once, at epoch end,
over all ranks, so reported values are those of the whole dataset, not of rank 0's shard.
"""

import torch
import torch.nn.functional as F
from lightning import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from lit_ddp.distributed.batch import global_batch_size
from lit_ddp.models.optim import OptimConfig, build_optimizer

STAGES = ("train", "val", "test")


def build_metrics(num_classes: int, top_k: tuple[int, ...]) -> MetricCollection:
    """``acc`` (top-1) plus ``acc_top{k}`` for each extra k; k is capped at num_classes (never crashes).

    ``validate_args=False``: the step computes the cross-entropy first, which already rejects a label
    outside [0, num_classes), and the logits' shape is the network's. torchmetrics' own check would
    repeat that on every update, with host syncs on a GPU.
    """
    kwargs = dict(average="micro", validate_args=False)
    metrics = {"acc": MulticlassAccuracy(num_classes, top_k=1, **kwargs)}
    for k in top_k:
        if k > 1:
            metrics[f"acc_top{k}"] = MulticlassAccuracy(num_classes, top_k=min(k, num_classes), **kwargs)
    return MetricCollection(metrics)


class LossMean(MeanMetric):
    """The sample-weighted mean of batch losses, reduced over ranks like ``MeanMetric``.

    A NaN batch loss makes the mean NaN: ``MeanMetric``'s default drops NaN values with a warning, which
    would report the finite mean of the other batches, and checks every update (a host sync on a GPU).
    Its ``nan_strategy="disable"`` skips the check but also replaces the weights by ones (torchmetrics
    1.9; Lightning-AI/torchmetrics#3434), which would weight a short last batch like a full one.
    """

    def update(self, value: Tensor | float, weight: Tensor | float = 1.0) -> None:
        value = torch.as_tensor(value, dtype=self.dtype, device=self.device)
        if not isinstance(weight, Tensor):
            # The step passes the sample count as a Python number: used as a scalar it needs no tensor,
            # whose copy to a GPU torch would synchronise with the device on every step.
            self.mean_value += value.sum() * weight
            self.weight += weight * value.numel()
            return
        weight = weight.to(dtype=self.dtype, device=self.device).broadcast_to(value.shape)
        self.mean_value += (value * weight).sum()
        self.weight += weight.sum()


class ImageClassifier(LightningModule):
    """Cross-entropy classifier over ``net``; batches are ``(images, labels)`` already normalised.

    ``channels_last`` stores the weights NHWC and hands the network NHWC inputs: what tensor cores want
    under bf16/fp16, and on CPU what oneDNN's convolutions and max-pooling run fastest on (LeNet trains
    ~20 % faster per step). ``compile`` runs ``torch.compile`` on the network, in place, so checkpoints
    keep their parameter names.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        optim: OptimConfig,
        label_smoothing: float = 0.0,
        top_k: tuple[int, ...] = (1,),
        channels_last: bool = False,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.net = net.to(memory_format=self.memory_format)
        self.compile_net = compile
        self.num_classes = num_classes
        self.optim = optim
        self.label_smoothing = label_smoothing
        for stage in STAGES:
            # Attributes, not a ModuleDict keyed by stage: "train" would clash with nn.Module.train.
            setattr(self, f"{stage}_metrics", build_metrics(num_classes, top_k).clone(prefix=f"{stage}/"))
            setattr(self, f"{stage}_loss", LossMean())

    def forward(self, x: Tensor) -> Tensor:
        # A no-op when the batch is already in the network's memory format (the ImageNet loader's are).
        return self.net(x.contiguous(memory_format=self.memory_format))

    def configure_model(self) -> None:
        # On each rank after launch (a compiled module does not pickle for ddp_spawn), before DDP wraps it.
        if self.compile_net and getattr(self.net, "_compiled_call_impl", None) is None:
            self.net.compile()

    def _log_now(self, stage: str, batch_idx: int) -> bool:
        """Whether this batch calls ``self.log``. Metric objects accumulate every update themselves, so
        Lightning needs the call only once per epoch (to know the metric, compute and reset it at epoch
        end) and on the training steps whose values it writes (every ``log_every_n_steps``). Skipping the
        other calls saves ~1 ms of Lightning bookkeeping per step, ~10 % of a LeNet step on a CPU."""
        trainer = self._trainer
        if batch_idx == 0 or trainer is None:
            return True
        return stage == "train" and (self.global_step + 1) % trainer.log_every_n_steps == 0

    def _shared_step(
        self, batch: tuple[Tensor, Tensor], stage: str, batch_idx: int = 0
    ) -> tuple[Tensor, Tensor]:
        """The loss and the (B, num_classes) logits of one batch; updates the stage's metrics."""
        x, y = batch
        logits = self(x)
        # Label smoothing is a training regulariser; evaluation reports the plain cross-entropy.
        smoothing = self.label_smoothing if stage == "train" else 0.0
        loss = F.cross_entropy(logits, y, label_smoothing=smoothing)
        metrics: MetricCollection = getattr(self, f"{stage}_metrics")
        loss_metric: LossMean = getattr(self, f"{stage}_loss")
        metrics.update(logits.detach(), y)
        # Weighting by sample count makes the epoch loss the per-sample mean over the whole dataset,
        # also when the last batch or one rank's shard is smaller.
        n = y.shape[0]
        if not self._log_now(stage, batch_idx):
            loss_metric.update(loss.detach(), weight=n)
            return loss, logits
        if stage == "train":
            # forward() = update + this batch's value, which Lightning writes as train/loss_step.
            loss_metric(loss.detach(), weight=n)
            self.log("train/loss", loss_metric, on_step=True, on_epoch=True, prog_bar=True)
        else:
            loss_metric.update(loss.detach(), weight=n)
            self.log(f"{stage}/loss", loss_metric, on_step=False, on_epoch=True, prog_bar=True)
        # Logged as objects: Lightning calls compute() (one all-reduce over ranks) at epoch end.
        self.log_dict(metrics, on_step=False, on_epoch=True, prog_bar=stage != "train")
        return loss, logits

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._shared_step(batch, "train", batch_idx)[0]

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        # The logits go to callbacks' on_validation_batch_end (callbacks/confusion.py); Lightning keeps none.
        return self._shared_step(batch, "val", batch_idx)[1].detach()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "test", batch_idx)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        x, y = batch
        probs = self(x).softmax(dim=-1)
        confidence, pred = probs.max(dim=-1)
        return {"pred": pred, "confidence": confidence, "target": y}

    def configure_optimizers(self):
        trainer = self.trainer
        total_steps = int(trainer.estimated_stepping_batches)
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 1
        global_batch = global_batch_size(trainer)
        optimizer, scheduler = build_optimizer(
            self.net, self.optim, global_batch, total_steps, steps_per_epoch=total_steps / epochs
        )
        if self.optim.scale_lr:
            rank_zero_info(
                f"lr scaled by global batch: {self.optim.lr} × {global_batch}/{self.optim.base_batch_size}"
                f" = {optimizer.param_groups[0]['initial_lr']:.4g}"
            )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
