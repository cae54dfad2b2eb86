"""Python's garbage collector, frozen for the objects that exist when training starts.

A full (generation 2) collection walks every object the process holds: hundreds of thousands after set-up
(torch, Lightning, the data module). One lands in the first training steps of every run,
and under DDP each rank's collection stalls the others at the next all-reduce (at different moments on
different ranks, so the stalls add up). ``gc.freeze()`` after one collection at the start of training moves
those objects to a permanent generation that later collections skip; what a training step allocates is
young and stays cheap to collect. Unfrozen when training ends.
"""

import gc

from lightning import Callback, LightningModule, Trainer


class FreezeGC(Callback):
    """Collects once at train start, then freezes the surviving objects out of later collections."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        gc.collect()  # every rank here, before the first collective: what is garbage now is not frozen
        gc.freeze()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        gc.unfreeze()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        gc.unfreeze()
