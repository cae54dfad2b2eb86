"""What a data module's splits must hold for the stage the Trainer runs, checked in its ``setup`` (so in a
Trainer of your own too): a training step (a batch, times the batches accumulated into it) no larger than
a device's training shard, and a sample in the split that ``validate`` or ``test`` scores.

A step larger than the shard: the loader would draw the whole shard as one smaller batch (or fewer batches
than a step accumulates), while the global batch printed, logged and used by ``scale_lr`` would be the one
asked for: a learning rate scaled for a batch no step ever takes. An empty split: ``validate`` and ``test``
would log no metric and exit 0.
"""

import math

from lit_ddp.errors import UserError


def _smaller_step(batch_size: int, shard: int, accumulation: int, scheduled: bool = False) -> str:
    """The settings that make one device's step (``batch_size × accumulation``) fit ``shard``; ``scheduled``:
    a GradientAccumulationScheduler's scheduling gives the accumulation (the Trainer's option is then 1)."""
    if accumulation == 1:
        return f"--data.batch_size={shard} or less"
    fixes = [f"--data.batch_size={shard // accumulation} or less"] if shard >= accumulation else []
    if shard >= batch_size:
        most = shard // batch_size
        fixes.append(
            f"a scheduling of {most} or less"
            if scheduled
            else f"--trainer.accumulate_grad_batches={most} or less"
        )
    alone = "and no GradientAccumulationScheduler" if scheduled else "--trainer.accumulate_grad_batches=1"
    return ", or ".join(fixes) or f"--data.batch_size={shard} {alone}"


def check_training_batch_fits(
    batch_size: int, train_set, world_size: int, accumulation: int = 1, scheduled: bool = False
) -> None:
    """UserError when one device's optimizer step (``batch_size`` × ``accumulation`` batches) is more than the
    training images that device gets (its padded shard). ``scheduled``: the accumulation is the largest of a
    GradientAccumulationScheduler's."""
    if train_set is None:
        return
    if len(train_set) == 0:  # no batch size fits: name the split, not a batch size of 0
        raise UserError(
            "the training split holds no sample: the data module's load_split('train') returned an empty"
            " split; check the data it reads (its data_dir, its files, its size options)"
        )
    shard = math.ceil(len(train_set) / world_size)
    # A step accumulates its batches from the shard: one that needs more images ends with each epoch.
    step = batch_size * accumulation
    if step > shard:
        on = f" on each of {world_size} devices" if world_size > 1 else ""
        asked = f"--data.batch_size={batch_size}"
        if accumulation > 1:
            given = "GradientAccumulationScheduler's " if scheduled else "--trainer.accumulate_grad_batches="
            asked += f" × {given}{accumulation} = {step}"
        raise UserError(
            f"{asked} is more than the {shard} training images{on}: every step would take {shard}, not"
            f" {step} (the global batch and a scaled lr would be wrong): pass"
            f" {_smaller_step(batch_size, shard, accumulation, scheduled)}"
        )


def check_split_evaluated(stage: str, dataset) -> None:
    """UserError when ``validate`` or ``test`` would read an empty split: it logged no metric and exited 0."""
    if dataset is not None and len(dataset) == 0:
        stage = getattr(stage, "value", stage)  # Lightning passes a TrainerFn (a str enum)
        split = "val" if stage == "validate" else "test"
        raise UserError(
            f"the {split} split holds no sample: {stage} would report no metric; check the data the data"
            f" module reads for it (its load_split('{split}'), data_dir, files, size options)"
        )
