"""One console line per epoch, printed by rank 0 only: epoch, losses, accuracies, images/s, time."""

from lightning import Callback, LightningModule, Trainer


def _fmt(metrics: dict, stage: str) -> str:
    loss = metrics.get(f"{stage}/loss_epoch", metrics.get(f"{stage}/loss"))
    parts = [f"{stage} loss {float(loss):.4f}"] if loss is not None else []
    accs = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith(f"{stage}/acc")}
    parts += [f"{name} {float(v):.4f}" for name, v in accs.items()]
    return " ".join(parts)


class EpochSummary(Callback):
    """At each training epoch end (after validation), prints

    ``epoch 3/12 | train loss 0.41 acc 0.86 | val loss 0.37 acc 0.88 | 5120 img/s (2560/device) | 9.8 s``
    """

    def __init__(self) -> None:
        self._validated = False  # whether this epoch ran validation (else val/* are last epoch's)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._validated = False

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Read on every rank: the first read of an epoch runs the pending metric all-reduces, which all
        # ranks must join. Printing is rank 0's alone (LightningModule.print, above the progress bar).
        metrics = dict(trainer.callback_metrics)
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        parts = [f"epoch {trainer.current_epoch + 1}{epochs}", _fmt(metrics, "train")]
        if self._validated:
            parts.append(_fmt(metrics, "val"))
        if "perf/images_per_s" in metrics:
            rate, per_device = metrics["perf/images_per_s"], metrics.get("perf/images_per_s_per_device")
            per_device = f" ({float(per_device):.0f}/device)" if per_device is not None else ""
            parts.append(f"{float(rate):.0f} img/s{per_device}")
        if "perf/epoch_time_s" in metrics:
            parts.append(f"{float(metrics['perf/epoch_time_s']):.1f} s")
        pl_module.print(" | ".join(p for p in parts if p))
