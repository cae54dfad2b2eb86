"""The ``python -m lit_ddp`` / ``lit-ddp`` command line (LightningCLI).

    # laptop, no data needed: LeNet on the embedded Shapes dataset
    python -m lit_ddp fit
    # CPU DDP, 2 processes (gloo)
    python -m lit_ddp fit --config configs/presets/cpu_ddp.yaml
    # 8 GPUs on one machine
    python -m lit_ddp fit --config configs/lenet_cifar.yaml --trainer.devices=8 --trainer.strategy=ddp
    # torchrun (Lightning reads its environment; devices must match nproc_per_node)
    torchrun --nproc_per_node=8 -m lit_ddp fit --config configs/lenet_cifar.yaml --trainer.devices=8
    # SLURM: one task per GPU
    srun python -m lit_ddp fit --config configs/lenet_cifar.yaml --trainer.num_nodes=2 --trainer.devices=8

``--model`` and ``--data`` take any ImageClassifier / ImageDataModule subclass by short name.
"""

import sys
import warnings

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lit_ddp.data import ImageDataModule
from lit_ddp.errors import UserError
from lit_ddp.models import ImageClassifier

# In-memory uint8 datasets are fastest with num_workers=0 (no IPC): Lightning's hint to add workers
# is noise for them. Loaders that decode files (ImageNet) set their own num_workers.
warnings.filterwarnings("ignore", message=r".*does not have many workers.*")

DEFAULT_MODEL = "lit_ddp.models.LeNetCIFAR"
DEFAULT_DATA = "lit_ddp.data.ShapesDataModule"

TRAINER_DEFAULTS = {
    "default_root_dir": "logs",
    "max_epochs": 8,
}


class LitDDPCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"model": {"class_path": DEFAULT_MODEL}, "data": {"class_path": DEFAULT_DATA}})
        # The data decides the number of classes: a 3-class folder needs no --model.num_classes.
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/acc",
                "checkpoint.mode": "max",
                "checkpoint.save_last": True,
                "checkpoint.filename": "epoch{epoch:03d}-step{step}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )


def build_cli(args: list[str] | None = None, run: bool = True, **kwargs) -> LitDDPCLI:
    return LitDDPCLI(
        model_class=ImageClassifier,
        datamodule_class=ImageDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=0,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
        **kwargs,
    )


def main(args: list[str] | None = None) -> None:
    try:
        build_cli(args)
    except (UserError, MisconfigurationException) as err:
        print(f"lit_ddp: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
