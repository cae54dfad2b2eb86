"""Batch-size arithmetic under DDP: ``batch_size`` is always per device."""

import lightning as L


def per_device_batch_size(trainer: L.Trainer) -> int:
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and hasattr(datamodule, "batch_size"):
        return int(datamodule.batch_size)
    loader = trainer.train_dataloader
    return int(getattr(loader, "batch_size", None) or 1)


def global_batch_size(trainer: L.Trainer) -> int:
    """Samples per optimizer step over all ranks: per-device batch × world size × accumulation."""
    return per_device_batch_size(trainer) * trainer.world_size * trainer.accumulate_grad_batches
