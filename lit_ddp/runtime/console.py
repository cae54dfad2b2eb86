"""The console: what a run prints, as one callback, plus the progress bar and model summary it asks for.

Lightning finds a progress bar and a model summary among ``trainer.callbacks`` by their type, so those two
stay entries of their own; ``--console.progress_bar=false`` / ``--console.model_summary=false`` (or
Lightning's ``--trainer.enable_progress_bar=false`` / ``enable_model_summary=false``) leave them out.
"""

from lightning import Callback

from lit_ddp.callbacks.console import ConsoleModelSummary, ProgressBar
from lit_ddp.callbacks.group import CallbackGroup
from lit_ddp.callbacks.skipped_images import SkippedImagesReport
from lit_ddp.callbacks.summary import EpochSummary
from lit_ddp.runtime.quiet import QuietConsole


class Console(CallbackGroup):
    """The parts, in the order they run:

    Args:
        quiet: upstream messages a user cannot act on are silenced in every rank's process
            (runtime/quiet.py lists each with its reason).
        skipped_images: unreadable image files, gathered over the ranks and reported once per epoch.
        epoch_summary: one line per epoch: losses, accuracies, images/s, the share of step time spent
            waiting for data, time; and once, when that share is above ``wait_hint_above``, what would
            feed the devices faster; at the end of a fit, where its run folder and checkpoints are.
        progress_bar: Lightning's bar, counting epochs from 1, redrawn at most ten times a second.
        model_summary: the modules that hold parameters, and the totals.
    """

    def __init__(
        self,
        quiet: bool = True,
        skipped_images: bool = True,
        epoch_summary: bool = True,
        wait_hint_above: float = 0.25,
        progress_bar: bool = True,
        model_summary: bool = True,
    ) -> None:
        parts = [
            (quiet, QuietConsole),
            (skipped_images, SkippedImagesReport),
            (epoch_summary, lambda: EpochSummary(wait_hint_above=wait_hint_above)),
        ]
        super().__init__(make() for on, make in parts if on)
        self.progress_bar = progress_bar
        self.model_summary = model_summary

    def lightning_parts(self) -> list[Callback]:
        """The progress bar and the model summary this console shows, for ``trainer.callbacks``."""
        parts = [(self.progress_bar, ProgressBar), (self.model_summary, ConsoleModelSummary)]
        return [make() for on, make in parts if on]
