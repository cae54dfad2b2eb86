"""What a data module's own loader hooks may change, checked where the DataLoader is made.

``ImageDataModule.loader(dataset, train, **dataloader_kwargs)`` is the one way its loaders are built: the
sampler (the training order by seed and epoch, sharded over the ranks, resumed mid-epoch; evaluation without
padded duplicates), the collate that passes batches through and the indices that key each sample's on-device
augmentation come with it, and the caller's DataLoader arguments (num_workers, pin_memory, prefetch_factor,
...) go on top. The arguments that would replace those parts are refused (``check_loader_options``), and so
is a DataLoader that a subclass's ``*_dataloader`` builds itself (``checked_loader_hook``): its batches
failed inside torch's collate or in the batch checks, and under DDP Lightning swapped in its own padded
sampler, in silence.
"""

import functools
from collections.abc import Callable, Mapping

from torch.utils.data import DataLoader

from lit_ddp.errors import UserError

LOADER_HOOKS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")

# Set on every DataLoader ``ImageDataModule.loader`` builds: whether it reads a training split.
BUILT_FOR_TRAINING = "lit_ddp_train"

# The DataLoader arguments ``loader`` sets itself, and why a caller's would break a promise.
SAMPLING = (
    "the training sampler orders the split by --data.seed and the epoch, shards it over the ranks and resumes"
    " it mid-epoch; for another order override train_sampler(dataset, num_replicas, rank)"
)
EVAL_SAMPLING = "evaluation reads every sample once, in order, sharded over the ranks without padding"
COLLATE = (
    "the data module's collate hands its batch hooks the dataset's batch (a Dataset of yours returns"
    " (image, label) samples, or a lit_ddp.data.batch.Batch from its __getitems__)"
)
OWN_OPTIONS = {
    "sampler": (SAMPLING, EVAL_SAMPLING),
    "batch_sampler": (SAMPLING, EVAL_SAMPLING),
    "shuffle": (SAMPLING, EVAL_SAMPLING),
    "collate_fn": (COLLATE, COLLATE),
    "drop_last": (
        "an epoch's last training batch is left out only where it would hold one image per device for"
        " BatchNorm (every device count then takes the same steps)",
        "evaluation reads every sample",
    ),
}


def check_loader_options(name: str, options: dict, train: bool, batch_size: int) -> None:
    """UserError for a DataLoader argument of ``options`` that ``loader`` sets itself; ``shuffle`` as the
    split is read anyway (True for training, False for evaluation) and ``batch_size`` equal to
    --data.batch_size are taken, as no change."""
    if "batch_size" in options and options["batch_size"] != batch_size:
        raise UserError(
            f"{name}.loader(batch_size={options['batch_size']}): the batch is --data.batch_size={batch_size}"
            " per device, which the global batch, the resume point and the evaluation limits count with:"
            f" leave batch_size out and pass --data.batch_size={options['batch_size']}"
        )
    for key, (when_training, when_evaluating) in OWN_OPTIONS.items():
        if key not in options or (key == "shuffle" and bool(options[key]) == train):
            continue
        why = when_training if train else when_evaluating
        value = options[key]
        shown = repr(value) if isinstance(value, bool | int | float | str | None) else "..."
        raise UserError(f"{name}.loader takes no {key}={shown}: {why}; leave {key} out")


def flattened(loaders: object) -> list:
    """The loaders of a hook's answer: one, or a list, tuple or dict of them (as Lightning takes them)."""
    if isinstance(loaders, Mapping):
        loaders = list(loaders.values())
    if isinstance(loaders, list | tuple):
        return [one for item in loaders for one in flattened(item)]
    return [loaders]


def check_built_by_loader(name: str, hook: str, loaders: object) -> None:
    """UserError for a DataLoader in ``loaders`` (what the data module ``name``'s ``hook`` returned) that
    ``loader`` did not build, or built for the other kind of split."""
    train = hook == "train_dataloader"
    fix = f"return self.loader({'dataset, train=True' if train else 'dataset'}, **DataLoader arguments)"
    for loader in flattened(loaders):
        built = getattr(loader, BUILT_FOR_TRAINING, None)
        if not isinstance(loader, DataLoader) or built is train:
            continue
        if built is None:
            raise UserError(
                f"{name}.{hook} returned a DataLoader of its own, which loses lit_ddp's sampler, collate and"
                f" sample indices (its batches fail, or are padded or reordered under DDP): {fix}"
                " (num_workers, pin_memory, prefetch_factor and the like go through)"
            )
        raise UserError(f"{name}.{hook} returned self.loader(..., train={built}) for the other split: {fix}")


def checked_loader_hook(hook: Callable, name: str) -> Callable:
    """``hook``, a subclass's ``name`` (``train_dataloader`` and the like), with its answer checked as it
    returns."""

    @functools.wraps(hook)
    def checked(self, *args, **kwargs):
        loaders = hook(self, *args, **kwargs)
        check_built_by_loader(type(self).__name__, name, loaders)
        return loaders

    return checked
