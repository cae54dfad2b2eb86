"""Where a run writes, as the plan reads it from the config: its folder's name (the recipe's), its own paths
expanded as a shell expands them, and a W&B logger's folder beside the other loggers' runs. ``place_runs``
changes a subcommand's parsed config in place, before the plan reads its folders and before any logger
exists.

Lightning's WandbLogger writes into ``save_dir``, the current directory unless named: W&B's own files into
``save_dir/wandb/``, and ModelCheckpoint's into ``save_dir/<project>/<run id>/checkpoints``, so a fit left
checkpoints beside the user's code, and ``--ckpt_path=last`` had no runs to search. Left at its default,
``save_dir`` is the run's ``default_root_dir`` (``logs``) and the project the recipe's name, as the default
TensorBoard logger's ``logs/<recipe>/version_N``: a W&B run's folder is ``logs/<recipe>/<run id>/``.
"""

import os
from pathlib import Path

import yaml
from lightning.pytorch.loggers import WandbLogger

from lit_ddp.utils import imported, local_path

DEFAULT_EXPERIMENT = "lightning_logs"  # Lightning's own folder name: the run with no recipe file


def experiment_name(config_files) -> str:
    """The folder a run logs into under ``default_root_dir``: the recipe's name.

    The recipe is the first ``--config`` file that chooses the model or the data (presets such as
    ``presets/debug.yaml`` only adjust it): ``configs/lenet_cifar.yaml`` → ``lenet_cifar``. A run's own saved
    ``<name>/version_N/config.yaml``, given back with ``--config``, is that run's experiment, ``<name>``.
    With no recipe file: ``lightning_logs``, as Lightning names it."""
    for file in config_files or []:
        path = Path(str(file))
        try:
            content = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):  # parsed already by the CLI: this is not where it fails
            continue
        if not isinstance(content, dict) or not ({"model", "data"} & set(content)):
            continue
        if path.name == "config.yaml" and path.parent.name.startswith("version_"):
            return path.parent.parent.name
        return path.stem
    return DEFAULT_EXPERIMENT


def logger_configs(trainer) -> list[tuple[type | None, object]]:
    """(class, init_args) of each logger a config's ``trainer`` section names (one or a list); the class is
    None where the entry is not a ``class_path`` that imports (``true``, ``false``, an object)."""
    loggers = trainer.get("logger") if hasattr(trainer, "get") else None
    found = []
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        if not hasattr(logger, "get"):
            continue
        class_path = logger.get("class_path")
        cls = imported(class_path) if isinstance(class_path, str) else None
        found.append((cls if isinstance(cls, type) else None, logger.get("init_args") or {}))
    return found


# How a config names Lightning's class (``--trainer.logger=WandbLogger`` resolves to the first).
WANDB_CLASS_PATHS = ("lightning.pytorch.loggers.WandbLogger", "lightning.pytorch.loggers.wandb.WandbLogger")
DEFAULT_SAVE_DIR = "."  # WandbLogger's own default: the current directory


def plain_wandb_init_args(config):
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
    for cls, init_args in logger_configs(trainer):
        if cls is not WandbLogger:  # a subclass of the user's is left as built
            continue
        if init_args.get("save_dir") in (None, DEFAULT_SAVE_DIR):
            # WandbLogger ignores `dir` when save_dir is set, as it is by default: the folder the user named
            init_args["save_dir"] = init_args.get("dir") or trainer.get("default_root_dir") or os.getcwd()
        if not init_args.get("project") and not os.environ.get("WANDB_PROJECT"):
            init_args["project"] = experiment


def expand_paths(config) -> None:
    """``~`` and ``$VAR`` in the run's own paths (``--ckpt_path``, ``default_root_dir``, a logger's
    ``save_dir``), from a YAML config or a quoted argument, as a shell expands them: Lightning's TensorBoard
    writer expands ``~`` (fsspec) and its checkpoints do not, which split one run between ~/runs and
    ./~/runs, and a checkpoint path was "not found". The data modules and the weights file expand their own
    paths (``utils.local_path``)."""
    if isinstance(config.get("ckpt_path"), str):
        config["ckpt_path"] = local_path(config["ckpt_path"], "--ckpt_path")
    trainer = config.get("trainer") or {}
    if isinstance(trainer.get("default_root_dir"), str):
        trainer["default_root_dir"] = local_path(trainer["default_root_dir"], "--trainer.default_root_dir")
    for _, init_args in logger_configs(trainer):
        if isinstance(init_args.get("save_dir"), str):
            init_args["save_dir"] = local_path(init_args["save_dir"], "--trainer.logger.init_args.save_dir")


def place_runs(config) -> str:
    """A subcommand's parsed ``config`` with its paths expanded and its W&B loggers placed under the run's
    folder, the project named after the recipe; returns the recipe's name (``experiment_name``)."""
    experiment = experiment_name(config.get("config"))
    expand_paths(config)
    place_wandb_runs(config, experiment)
    return experiment
