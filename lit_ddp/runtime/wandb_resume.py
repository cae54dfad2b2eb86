"""A fit resumed from a W&B run's checkpoint goes on in that W&B run.

WandbLogger starts a new W&B run unless it is given ``id``: a resumed fit gets the id of the run whose folder
holds the checkpoint, with ``resume="allow"``, so one training's curves stay in one W&B run however often
it is requeued, online and offline. Where a W&B run's folder is (``logs/<recipe>/<run id>/``):
``preflight.folders``.
"""

from pathlib import Path

from lightning import Trainer
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from lit_ddp.preflight.folders import plain_wandb_init_args
from lit_ddp.preflight.runs import is_wandb_run


def continue_wandb_run(trainer: Trainer, checkpoint: str | Path, logger_config) -> None:
    """Make the trainer's first logger, a plain WandbLogger built from ``logger_config`` (the CLI's
    ``trainer.logger``), log into the W&B run whose folder holds ``checkpoint``, unless the user named a
    run (``id``, ``version``) or the folder is not a W&B run's. The first logger's: its run names the
    checkpoint folder, as with several loggers ``--ckpt_path=last`` continues the first one's run."""
    first = trainer.loggers[0] if trainer.loggers else None
    configs = logger_config if isinstance(logger_config, list) else [logger_config]
    config = configs[0] if configs else None
    init_args = plain_wandb_init_args(config)
    if type(first) is not WandbLogger or init_args is None:
        return
    init_args = dict(init_args.as_dict() if hasattr(init_args, "as_dict") else init_args)  # a Namespace
    if init_args.get("id") or init_args.get("version"):
        return  # a run the user named: as given
    folder = Path(checkpoint).parent.parent
    if not is_wandb_run(folder):
        return
    # resume="allow": WandbLogger's own default, which a config's `resume: null` (wandb.init's) replaces
    init_args.update(id=folder.name, resume=init_args.get("resume") or "allow")
    trainer.loggers = [WandbLogger(**init_args), *trainer.loggers[1:]]
    rank_zero_info(f"continuing W&B run {folder.name} (project {first.name})")
