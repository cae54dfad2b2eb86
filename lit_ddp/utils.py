"""Batch-size arithmetic under DDP (``batch_size`` is always per device); hyperparameter trees made flat or
plain; paths expanded as a shell would."""

import dataclasses
import functools
import math
import os
import pickle
import random
import re
import sys
import types
from pathlib import Path, PurePath

import lightning as L
import torch
import yaml

from lit_ddp.errors import UserError

_VARIABLE = re.compile(r"\$(\w+|\{\w+\})")
# numpy's seeds, which Lightning's seed_everything checks.
MAX_SEED = 2**32 - 1


def draw_seed() -> int:
    """A seed for ``seed_everything: true``, drawn as fit draws it and the trust kit judges it."""
    return random.SystemRandom().randint(0, MAX_SEED)  # not the global RNG: a forked process shares its state


def flatten(tree, prefix: str = "", sep: str = "/") -> dict:
    """Nested dicts and dataclasses → ``{"a/b/c": leaf}``, leaves as they are. Keys that start with an
    underscore are left out: Lightning's private entries (``_instantiator``, ``_class_path``)."""
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        tree = dataclasses.asdict(tree)
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        if not str(key).startswith("_"):
            flat.update(flatten(value, f"{prefix}{sep}{key}" if prefix else str(key), sep))
    return flat


def plain_data(value: object) -> object:
    """``value`` as data a weights-only ``torch.load`` reads without allow-listing a class: a dataclass (an
    ``OptimConfig``) as a dict of its fields, a class or function (a network given as ``net``) as its dotted
    name (:func:`imported` finds it again), a ``functools.partial`` of one with keyword arguments (a network
    given with its own arguments) as ``{"class_path": name, "init_args": {...}}``, jsonargparse's form, a path
    as its string, containers element by element."""
    if isinstance(value, functools.partial) and not value.args:
        return {"class_path": plain_data(value.func), "init_args": plain_data(value.keywords)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain_data(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, type | types.FunctionType):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, dict):
        return {key: plain_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return (list if isinstance(value, list) else tuple)(plain_data(item) for item in value)
    return value


def imported(name: str) -> object | None:
    """The object a dotted name (``package.module.Class``) names in a module already imported, or None: a name
    read from a file imports no code."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            found = module
            for attribute in parts[cut:]:
                found = getattr(found, attribute, None)
            return found
    return None


class LoadsSavedSubclass:
    """``load_from_checkpoint`` as the class a LightningCLI run saved (``_class_path`` in the checkpoint's
    hyperparameters), where that subclass is imported: ``ImageClassifier.load_from_checkpoint`` of a
    ``--model=LeNetCIFAR`` run's file gives a LeNetCIFAR. Lightning builds the class named there only for a
    class that takes ``**kwargs``, which lit_ddp's typed base classes do not."""

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, *args, **kwargs):
        named = _saved_subclass(checkpoint_path, cls, cls.CHECKPOINT_HYPER_PARAMS_KEY)
        if named is not None:
            return named.load_from_checkpoint(checkpoint_path, *args, **kwargs)
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)


def _saved_subclass(checkpoint_path, cls: type, key: str) -> type | None:
    """The imported subclass of ``cls`` other than itself that the checkpoint's ``key`` names, else None (also
    for what is not a local file this can read: Lightning's own load then says what is wrong with it)."""
    if not isinstance(checkpoint_path, str | os.PathLike) or not os.path.isfile(checkpoint_path):
        return None
    try:
        saved = torch.load(checkpoint_path, map_location="cpu", weights_only=True, mmap=True).get(key)
    except (pickle.UnpicklingError, RuntimeError, OSError, AttributeError):
        return None
    name = saved.get("_class_path") if isinstance(saved, dict) else None
    named = imported(name) if isinstance(name, str) else None
    return named if isinstance(named, type) and issubclass(named, cls) and named is not cls else None


def per_device_batch_size(trainer: L.Trainer) -> int:
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and hasattr(datamodule, "batch_size"):
        return int(datamodule.batch_size)
    loader = trainer.train_dataloader
    return int(getattr(loader, "batch_size", None) or 1)


def accumulation_scheduler(trainer: L.Trainer) -> L.pytorch.callbacks.GradientAccumulationScheduler | None:
    for callback in getattr(trainer, "callbacks", None) or ():
        if isinstance(callback, L.pytorch.callbacks.GradientAccumulationScheduler):
            return callback
    return None


def scheduled_accumulation(trainer: L.Trainer, epoch: int | None = None) -> int | None:
    """The batches a GradientAccumulationScheduler in the Trainer's callbacks accumulates in ``epoch`` (the
    largest of its scheduling when None), or None without one. It sets ``trainer.accumulate_grad_batches``
    at each epoch's start only: in a data module's setup, or a checkpoint's load, that still says 1."""
    scheduler = accumulation_scheduler(trainer)
    if scheduler is None:
        return None
    if epoch is None:
        return max(scheduler.scheduling.values(), default=1)
    return scheduler.get_accumulate_grad_batches(epoch)


def accumulation(trainer: L.Trainer, epoch: int | None = None) -> int:
    """The batches an optimizer step accumulates in ``epoch`` (the Trainer's current one when None): a
    GradientAccumulationScheduler's for that epoch, whose Trainer still says 1 before the epoch starts (at
    set-up, in on_train_start, in configure_optimizers), else the Trainer's."""
    scheduler = accumulation_scheduler(trainer)
    if scheduler is None:
        return trainer.accumulate_grad_batches
    return scheduler.get_accumulate_grad_batches(trainer.current_epoch if epoch is None else epoch)


def global_batch_size(trainer: L.Trainer, epoch: int | None = None) -> int:
    """Samples per optimizer step over all ranks in ``epoch`` (the current one when None): per-device batch
    × world size × accumulation."""
    return per_device_batch_size(trainer) * trainer.world_size * accumulation(trainer, epoch)


def optimizer_steps(trainer: L.Trainer, epochs: int) -> int:
    """Optimizer steps of the first ``epochs`` epochs: each epoch's batches over its accumulation (a
    GradientAccumulationScheduler's changes by epoch), an epoch's last step taking the batches left."""
    return sum(math.ceil(trainer.num_training_batches / accumulation(trainer, e)) for e in range(epochs))


def later_global_batches(trainer: L.Trainer) -> str:
    """``"; 512 (4 accumulated) from epoch 3"`` for each epoch after the current one whose
    GradientAccumulationScheduler changes the global batch (epochs counted from 1, as the console does); ""
    without one. A resumed run's current epoch is where it goes on: the changes before it are its past."""
    scheduler, later = accumulation_scheduler(trainer), []
    for epoch in scheduler.epochs if scheduler is not None else ():
        accumulated = scheduler.get_accumulate_grad_batches(epoch)
        if epoch > trainer.current_epoch and accumulated != scheduler.get_accumulate_grad_batches(epoch - 1):
            later.append(
                f"; {global_batch_size(trainer, epoch)} ({accumulated} accumulated) from epoch {epoch + 1}"
            )
    return "".join(later)


def local_path(value: str | os.PathLike, option: str) -> str:
    """A path as a shell would have passed it: ``~`` the home folder, ``$VAR`` and ``${VAR}`` the
    environment's. A YAML config's (or a quoted argument's) arrive unexpanded, and a cluster's config names
    its folders by ``$SCRATCH`` or ``$SLURM_TMPDIR``. A variable the environment lacks is a UserError that
    names ``option``, not a search of a folder literally called ``$SCRATCH``."""
    expanded = os.path.expandvars(os.path.expanduser(str(value)))
    unset = _VARIABLE.search(expanded)
    if unset:
        name = unset.group(1).strip("{}")
        raise UserError(
            f"{option}={value}: ${name} is not set in this environment: export {name}=<folder>, or write"
            " the path out"
        )
    return expanded


def is_local_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` is one of this machine's, not a URL (``s3://bucket/runs``, read and written through
    fsspec), which is kept as text: a Path would fold it into ``s3:/bucket/runs``."""
    return "://" not in str(path)


def from_here(path: str | os.PathLike) -> str:
    """``path`` as a line names it, for a line saying it is missing: a relative path that does not exist
    with the absolute path it was read as. It is read from the current folder, which may not be the one a
    config's paths were written for (the project's, not the folder a job starts in)."""
    given = Path(path)
    if given.is_absolute() or given.exists() or not is_local_path(path):
        return str(path)
    return f"{path} (read from the current folder, as {Path.cwd() / given})"


# Options of the command itself, not settings of the run (the config files, help, printing the config).
NOT_SETTINGS = ("--config", "-c", "--help", "-h", "--print_config")


def command_line(argv: list[str]) -> list[tuple[int, str | None, str | None]]:
    """``(position, option, value)`` of each word of ``argv`` that is not an option's value: the one place
    the command line is read. ``--key=value`` and ``--key value`` give ``("--key", "value")``, an option
    followed by another or by nothing ``("--key", None)``, a word that is no option (the subcommand)
    ``(None, word)``."""
    words, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            words.append((i, None, arg))
            i += 1
            continue
        option, eq, value = arg.partition("=")
        if not eq:  # the next word is its value unless it is an option itself (a negative number is not)
            following = argv[i + 1] if i + 1 < len(argv) else "-"
            value = None if following.startswith("-") and not following[1:2].isdigit() else following
        words.append((i, option, value))
        i += 1 if eq or value is None else 2
    return words


def config_files(argv: list[str]) -> list[tuple[int, Path]]:
    """``(position in argv, path)`` of each ``--config`` / ``-c`` file given, in order (the CLI's checks and
    its one-line errors all ask here)."""
    words = command_line(argv)
    files = [(i, Path(value)) for i, option, value in words if option in ("-c", "--config") and value]
    return [(i, path) for i, path in files if path.is_file()]


def yaml_key_line(path: Path, keys: tuple[str, ...]) -> int | None:
    """The line (from 1) of the mapping key reached through ``keys`` in the YAML file ``path``."""
    node = yaml.compose(path.read_text(), Loader=yaml.SafeLoader)
    line = None
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return None
        found = next(((k, v) for k, v in node.value if getattr(k, "value", None) == key), None)
        if found is None:
            return None
        line, node = found[0].start_mark.line + 1, found[1]
    return line


def yaml_flow(value: object) -> str:
    """``value`` as YAML writes it on one line (``true``, ``null``, ``[1, 2]``)."""
    return yaml.safe_dump(value, default_flow_style=True).partition("\n...")[0].strip()  # no end marker
