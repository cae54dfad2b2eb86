"""``last.ckpt``: the newest state of a fit, which ``--ckpt_path=last`` resumes, after every training epoch.

A ModelCheckpoint saves where validation ends once validation does not come with every epoch
(``--trainer.check_val_every_n_epoch=2``, or ``None`` with a step ``val_check_interval``): the epochs
after the last validation never reached ``last.ckpt``, so a 3-epoch fit validated every 2nd epoch left
the weights of epoch 2 there, and ``test --ckpt_path=last`` scored them without a word. This one saves at
the end of every training epoch (after that epoch's validation, when it has one), and after a validation
inside an epoch too (``val_check_interval`` < 1), as a ModelCheckpoint does.
"""

import os

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from lit_ddp.compat import at_last_batch


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt`` at the end of every training epoch and after every validation inside one.

    Fork of ``lightning.pytorch.callbacks.ModelCheckpoint(save_last=True)``: it writes ``last.ckpt`` where
    it saves a checkpoint, so with validation every N epochs the epochs after the last one never reach it;
    goes when ``save_last`` saves at every training epoch's end.
    """

    def __init__(self, filename: str = "last", enable_version_counter: bool = False, **kwargs) -> None:
        # One file, rewritten (never last-v1.ckpt), at every epoch's end whatever the validation schedule.
        kwargs["save_on_train_epoch_end"] = True
        # A schedule of the user's own (--last_checkpoint.every_n_train_steps=1000, ...) decides alone.
        scheduled = ("every_n_train_steps", "train_time_interval", "every_n_epochs")
        self._at_validations = not any(kwargs.get(key) for key in scheduled)
        # Without a step or time schedule, ModelCheckpoint's check after each training batch never saves.
        on_batches = any(kwargs.get(key) for key in ("every_n_train_steps", "train_time_interval"))
        self.idle_batch_hooks = () if on_batches else ("on_train_batch_end",)
        super().__init__(filename=filename, enable_version_counter=enable_version_counter, **kwargs)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if trainer.sanity_checking or at_last_batch(trainer) or trainer.state.fn != TrainerFn.FITTING:
            return  # the epoch's end saves it, after every epoch-end hook has run
        if not self._at_validations:
            return
        path = os.path.join(self.dirpath, f"{self.filename}{self.FILE_EXTENSION}")
        trainer.save_checkpoint(path, self.save_weights_only)
        self.last_model_path = path
