"""Where a run stands, as the progress bar and the epoch summary say it: epochs and batches count from 1.

Lightning's ``current_epoch`` counts from 0 and moves on as soon as an epoch ends, so a stop after the
first epoch read "at epoch 1" while the bar had shown "Epoch 1/2" finished. Steps are ``global_step``:
the optimizer steps taken, as on TensorBoard's x-axis.
"""

from lightning import Trainer
from lightning.pytorch.trainer.states import TrainerFn

from lit_ddp.compat import batches_done, epochs_started_completed


def run_position(trainer: Trainer) -> str:
    """``at epoch 2, step 7 (mid-epoch, after 3 of 4 batches)``, ``at the end of epoch 1, step 4``,
    ``at the start of epoch 1, step 0``, or ``during validate`` outside fit."""
    if trainer.state.fn != TrainerFn.FITTING:
        return f"during {trainer.state.fn.value if trainer.state.fn else 'setup'}"
    started, completed = epochs_started_completed(trainer)
    batch = batches_done(trainer)  # kept until the next epoch's first
    batches = trainer.num_training_batches
    step = trainer.global_step
    in_progress = started > completed
    if in_progress and 0 < batch < batches:
        return f"at epoch {started}, step {step} (mid-epoch, after {batch} of {batches} batches)"
    # Between epochs, or an epoch's batches all done (its validation or checkpoint may follow), or none yet.
    finished = completed if not in_progress else started - (0 if batch >= batches > 0 else 1)
    if finished == 0:
        return f"at the start of epoch 1, step {step}"
    return f"at the end of epoch {finished}, step {step}"
