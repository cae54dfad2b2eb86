"""The dashboard: what a run shows in TensorBoard (or the logger a user picks), as one callback.

``--dashboard.X=false`` leaves one part out; ``--dashboard=null`` all of them (the module's own ``val/*``
and ``train/*`` metrics stay: the LightningModule logs those).
"""

from lit_ddp.callbacks.confusion import ConfusionMatrix
from lit_ddp.callbacks.group import CallbackGroup
from lit_ddp.callbacks.images import TrainBatchImages
from lit_ddp.callbacks.lr_monitor import DashboardLearningRate
from lit_ddp.callbacks.run_info import RunInfo
from lit_ddp.callbacks.step_loss import StepLoss
from lit_ddp.callbacks.throughput import Throughput


class Dashboard(CallbackGroup):
    """The parts, in the order they run:

    Args:
        step_loss: ``train/loss_step`` every ``log_every_n_steps``, and in the progress bar.
        lr_monitor: the learning rate of each param group (``lr-<Optimizer>/pg<N>``).
        throughput: ``perf/*``: images/s, epoch time, the share of step time spent waiting for data, peak
            GPU memory (the console's epoch line reads them).
        batch_images: ``train/batch``, the first augmented training batch of the run, up to
            ``max_images`` tiles of ``tile`` pixels.
        confusion_matrix: ``val/confusion_matrix`` and per-class accuracies, as a figure up to
            ``max_classes`` classes, as a histogram beyond.
        run_info: the HParams summary with the validation metrics ``hparam_metrics`` (default: ``val/loss``
            and the module's ``val/*``), the resolved config and the environment.
    """

    def __init__(
        self,
        step_loss: bool = True,
        lr_monitor: bool = True,
        throughput: bool = True,
        batch_images: bool = True,
        max_images: int = 32,
        tile: int = 64,
        confusion_matrix: bool = True,
        max_classes: int = 32,
        run_info: bool = True,
        hparam_metrics: list[str] | None = None,
    ) -> None:
        parts = [
            (step_loss, StepLoss),
            (lr_monitor, DashboardLearningRate),
            (throughput, Throughput),
            (batch_images, lambda: TrainBatchImages(max_images=max_images, tile=tile)),
            (confusion_matrix, lambda: ConfusionMatrix(max_classes=max_classes)),
            (run_info, lambda: RunInfo(metrics=hparam_metrics)),
        ]
        super().__init__(make() for on, make in parts if on)
