"""A W&B run keeps its folder under ``logs/`` beside the other loggers' runs, and a fit resumed from its
checkpoint goes on in that W&B run.

Lightning's WandbLogger writes into ``save_dir``, the current directory unless named: W&B's own files into
``save_dir/wandb/``, and ModelCheckpoint's into ``save_dir/<project>/<run id>/checkpoints``, so a fit left
checkpoints beside the user's code, and ``--ckpt_path=last`` had no runs to search. Left at its default,
``save_dir`` is the run's ``default_root_dir`` (``logs``) and the project the recipe's name, as the default
TensorBoard logger's ``logs/<recipe>/version_N``: a W&B run's folder is ``logs/<recipe>/<run id>/``.

WandbLogger starts a new W&B run unless it is given ``id``: a resumed fit gets the id of the run whose folder
holds the checkpoint, with ``resume="allow"``, so one training's curves stay in one W&B run however often
it is requeued, online and offline.
"""

import glob
import os
from pathlib import Path

from lightning import Trainer
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info

# How a config names Lightning's class (``--trainer.logger=WandbLogger`` resolves to the first).
WANDB_CLASS_PATHS = ("lightning.pytorch.loggers.WandbLogger", "lightning.pytorch.loggers.wandb.WandbLogger")
DEFAULT_SAVE_DIR = "."  # WandbLogger's own default: the current directory


def _plain_wandb_init_args(config):
    """The ``init_args`` of a logger config that is Lightning's own WandbLogger, else None (a subclass of the
    user's is left as built, as is a logger given as an object)."""
    if not hasattr(config, "get") or config.get("class_path") not in WANDB_CLASS_PATHS:
        return None
    return config.get("init_args")


def place_wandb_runs(config, experiment: str) -> None:
    """In a subcommand's parsed ``config``, each WandbLogger with no folder of the user's (``save_dir`` and
    ``dir`` at their defaults) writes under ``trainer.default_root_dir``, and one with no project (nor
    ``WANDB_PROJECT``) takes ``experiment``, the recipe's name, as its project."""
    trainer = config.get("trainer") or {}
    loggers = trainer.get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        init_args = _plain_wandb_init_args(logger)
        if init_args is None:
            continue
        if init_args.get("save_dir") in (None, DEFAULT_SAVE_DIR):
            # WandbLogger ignores `dir` when save_dir is set, as it is by default: the folder the user named
            init_args["save_dir"] = init_args.get("dir") or trainer.get("default_root_dir") or os.getcwd()
        if not init_args.get("project") and not os.environ.get("WANDB_PROJECT"):
            init_args["project"] = experiment


def is_wandb_run(folder: Path) -> bool:
    """Whether ``folder`` (``<save_dir>/<project>/<run id>``) is a W&B run's: W&B keeps each run's files in
    ``<save_dir>/wandb/run-<time>-<run id>`` (``offline-run-...`` offline)."""
    wandb_dir = folder.parent.parent / "wandb"
    return wandb_dir.is_dir() and any(wandb_dir.glob(f"*run-*-{glob.escape(folder.name)}"))


def _as_dict(init_args) -> dict:
    return dict(init_args.as_dict() if hasattr(init_args, "as_dict") else init_args)


def continue_wandb_run(trainer: Trainer, checkpoint: str | Path, logger_config) -> None:
    """Make the trainer's first logger, a plain WandbLogger built from ``logger_config`` (the CLI's
    ``trainer.logger``), log into the W&B run whose folder holds ``checkpoint``, unless the user named a
    run (``id``, ``version``) or the folder is not a W&B run's. The first logger's: its run names the
    checkpoint folder, as with several loggers ``--ckpt_path=last`` continues the first one's run."""
    first = trainer.loggers[0] if trainer.loggers else None
    configs = logger_config if isinstance(logger_config, list) else [logger_config]
    config = configs[0] if configs else None
    init_args = _plain_wandb_init_args(config)
    if type(first) is not WandbLogger or init_args is None:
        return
    init_args = _as_dict(init_args)
    if init_args.get("id") or init_args.get("version"):
        return  # a run the user named: as given
    folder = Path(checkpoint).parent.parent
    if not is_wandb_run(folder):
        return
    # resume="allow": WandbLogger's own default, which a config's `resume: null` (wandb.init's) replaces
    init_args.update(id=folder.name, resume=init_args.get("resume") or "allow")
    trainer.loggers = [WandbLogger(**init_args), *trainer.loggers[1:]]
    rank_zero_info(f"continuing W&B run {folder.name} (project {first.name})")
