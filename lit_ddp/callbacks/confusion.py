"""Validation confusion matrix over the whole validation set (all ranks), as a labelled figure, plus the
accuracy of each class.

Needs ``validation_step`` to return the logits (ImageClassifier does): the matrix is updated from them in
``on_validation_batch_end``, locally, and summed over ranks once, at validation end.
"""

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix

from lit_ddp.callbacks.render import confusion_figure
from lit_ddp.callbacks.sinks import sinks
from lit_ddp.errors import UserError


def class_names(trainer: Trainer, num_classes: int) -> list[str]:
    names = list(getattr(trainer.datamodule, "class_names", ()) or ())
    return [str(s) for s in names] if len(names) == num_classes else [str(i) for i in range(num_classes)]


def counts_markdown(matrix: Tensor, names: list[str]) -> str:
    """The (C, C) counts as a markdown table, rows = true class (exact numbers, next to the figure)."""
    lines = ["| true \\ predicted | " + " | ".join(names) + " | total |", "|---" * (len(names) + 2) + "|"]
    for name, row in zip(names, matrix.tolist(), strict=True):
        lines.append(f"| **{name}** | " + " | ".join(map(str, row)) + f" | {sum(row)} |")
    return "\n".join(lines)


class ConfusionMatrix(Callback):
    """Logs ``val/confusion_matrix`` (image, and its counts as a text table) and ``val_class_acc/<class>``
    (scalars; a class with no validation image has none) at each validation end.

    Beyond ``max_classes`` classes (ImageNet's 1000) a figure and per-class curves are unreadable: the
    per-class accuracies are logged as one histogram, ``val_class_acc``, instead.
    """

    def __init__(self, max_classes: int = 32) -> None:
        if max_classes < 0:
            raise UserError(
                f"--dashboard.max_classes={max_classes} must be 0 or more (the most classes drawn as a"
                " figure; 0: always the histogram)"
            )
        self.max_classes = max_classes
        self.metric: MulticlassConfusionMatrix | None = None
        self.batch_start_step: int | None = None

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        # A validation inside fit runs after a training batch, whose optimizer step global_step already
        # counts, while Lightning logs val/* at the count of steps before that batch: this is that count.
        self.batch_start_step = trainer.global_step

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        num_classes = getattr(pl_module, "num_classes", None) or trainer.datamodule.num_classes
        # validate_args=False: its label checks cost a device sync per batch on CUDA (the data is trusted).
        self.metric = MulticlassConfusionMatrix(num_classes, validate_args=False).to(pl_module.device)

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.metric.reset()

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs,
        batch,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if isinstance(outputs, Tensor) and not trainer.sanity_checking:
            self.metric.update(outputs.detach().argmax(dim=1), batch[1])  # (B, C) logits, (B,) labels

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:  # the same decision on every rank: compute() is a collective
            return
        matrix = self.metric.compute()  # (C, C) counts summed over ranks: a collective, on every rank
        per_class = matrix.diag().float() / matrix.sum(dim=1).clamp(min=1)  # accuracy (recall) per true class
        # A class without validation images has no accuracy: 0 would read as a class never recognised.
        seen = matrix.sum(dim=1) > 0  # the same on every rank: the matrix is summed over them
        names = class_names(trainer, matrix.shape[0])
        if len(names) <= self.max_classes:
            # Already whole-set values; sync_dist (an identity here) lets Lightning log them like val/*.
            scalars = {
                f"val_class_acc/{n.replace('/', '_')}": a
                for n, a, has_images in zip(names, per_class, seen.tolist(), strict=True)
                if has_images
            }
            pl_module.log_dict(scalars, on_step=False, on_epoch=True, sync_dist=True, batch_size=1)
        self._write(trainer, matrix.cpu(), per_class[seen].cpu(), names)

    @rank_zero_only
    def _write(self, trainer: Trainer, matrix: Tensor, per_class: Tensor, names: list[str]) -> None:
        targets = sinks(trainer)
        # The step of this validation's val/* scalars, so that the figure sits beside their points.
        fitting = trainer.state.fn == TrainerFn.FITTING and self.batch_start_step is not None
        step = self.batch_start_step if fitting else trainer.global_step
        if not targets:
            return
        if len(names) > self.max_classes:
            for sink in targets if len(per_class) else ():
                sink.values("val_class_acc", per_class, step)
            return
        figure, counts = confusion_figure(matrix, names), counts_markdown(matrix, names)
        for sink in targets:
            sink.image("val/confusion_matrix", figure, step)
            sink.text("val/confusion_matrix", counts, step)
