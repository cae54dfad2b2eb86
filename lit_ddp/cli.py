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
    # SLURM templates with checkpoint + requeue on preemption (README: Running on a cluster)
    sbatch scripts/sbatch_single_node.sh

``--model`` and ``--data`` take any ImageClassifier / ImageDataModule subclass by short name.
"""

import sys
import warnings

from lightning import Trainer
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lit_ddp.callbacks import DEFAULT_CALLBACKS, ModelCheckpoint
from lit_ddp.callbacks.preemption import DEFAULT_CHECK_EVERY_N_BATCHES
from lit_ddp.data import ImageDataModule
from lit_ddp.distributed.checkpoint_io import with_atomic_checkpoint_io
from lit_ddp.distributed.faults import (
    DEFAULT_DIST_TIMEOUT_S,
    fault_tolerance_callbacks,
    lost_rank_message,
    report_lost_rank,
    set_dist_timeout,
)
from lit_ddp.distributed.launch import (
    bind_rendezvous_to_loopback,
    check_devices_exist,
    check_launcher_world,
)
from lit_ddp.distributed.resume import check_ckpt_file, prepare_ckpt_path
from lit_ddp.distributed.sync_batchnorm import with_sync_batchnorm
from lit_ddp.errors import UserError
from lit_ddp.models import ImageClassifier

# In-memory uint8 datasets are fastest with num_workers=0 (no IPC): Lightning's hint to add workers
# is noise for them. Loaders that decode files (ImageNet) set their own num_workers.
warnings.filterwarnings("ignore", message=r".*does not have many workers.*")

DEFAULT_MODEL = "lit_ddp.models.LeNetCIFAR"
DEFAULT_DATA = "lit_ddp.data.ShapesDataModule"

TRAINER_DEFAULTS = {
    "default_root_dir": "logs",
    "max_epochs": 12,
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
        # The TensorBoard dashboard and FreezeGC (lit_ddp/callbacks/__init__.py): on by default,
        # `--KEY=null` turns one off.
        for key, callback_class in DEFAULT_CALLBACKS.items():
            parser.add_subclass_arguments(callback_class, key, required=False, fail_untyped=False)
            class_path = f"{callback_class.__module__}.{callback_class.__name__}"
            parser.set_defaults({key: {"class_path": class_path}})
        parser.add_argument(
            "--dist_timeout",
            type=float,
            default=DEFAULT_DIST_TIMEOUT_S,
            help="Seconds a collective may wait for the other ranks before the job fails (torch: 1800).",
        )
        parser.add_argument(
            "--preemption_check_every_n_batches",
            type=int,
            default=DEFAULT_CHECK_EVERY_N_BATCHES,
            help="Training batches between the ranks' checks for SIGTERM/SIGUSR1: a signal stops the run"
            " (with last.ckpt) at most N + 1 batches later, or at the epoch's end.",
        )

    def instantiate_trainer(self, **kwargs) -> Trainer:
        # sync_batchnorm=true alone gets torch's nn.SyncBatchNorm, which refuses CPU: add our plugin
        # (torch's on CUDA, an all-reduce BatchNorm elsewhere) unless the user passed a LayerSync plugin.
        trainer_config = self._get(self.config_init, "trainer", default={})
        check_devices_exist(trainer_config.get("accelerator"), trainer_config.get("devices"))
        if trainer_config.get("sync_batchnorm"):
            kwargs["plugins"] = with_sync_batchnorm(kwargs.get("plugins", trainer_config.get("plugins")))
        # Fault tolerance (lit_ddp/distributed/faults.py): atomic checkpoint writes and safe loads, a
        # checkpoint on SIGTERM/SIGUSR1, a stop on NaN, a finite collective timeout, a lost rank named.
        kwargs["plugins"] = with_atomic_checkpoint_io(kwargs.get("plugins", trainer_config.get("plugins")))
        callbacks = kwargs.get("callbacks", trainer_config.get("callbacks")) or []
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        every = self._get(self.config_init, "preemption_check_every_n_batches", DEFAULT_CHECK_EVERY_N_BATCHES)
        kwargs["callbacks"] = [*callbacks, *fault_tolerance_callbacks(every)]
        defaults = [self._get(self.config_init, key) for key in DEFAULT_CALLBACKS]
        kwargs["callbacks"] += [callback for callback in defaults if callback is not None]
        trainer = super().instantiate_trainer(**kwargs)
        set_dist_timeout(trainer, self._get(self.config_init, "dist_timeout", default=DEFAULT_DIST_TIMEOUT_S))
        return trainer

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the checkpoint's hyperparameters here, first: a corrupt file is one error.
        subcommand = self.config.get("subcommand")
        check_ckpt_file(self.config[subcommand].get("ckpt_path") if subcommand else None)
        super()._parse_ckpt_path()

    def _before_run(self) -> None:
        # Before any process is spawned (lit_ddp/distributed/launch.py, resume.py): the launcher's world
        # matches --trainer.devices, `last` is found across runs, a bad checkpoint is one error.
        check_launcher_world(self.trainer)
        config = self.config_init[self.subcommand]
        config["ckpt_path"] = prepare_ckpt_path(config.get("ckpt_path"), self.trainer, self.model)
        bind_rendezvous_to_loopback(self.trainer, self._get(self.config_init, "dist_timeout"))

    before_fit = before_validate = before_test = before_predict = _before_run


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


def _user_error(exc: BaseException | None) -> BaseException | None:
    """The UserError (or Lightning misconfiguration) behind ``exc``: jsonargparse wraps errors raised while
    it instantiates the data module in its own ValueError, keeping ours in the exception chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (UserError, MisconfigurationException)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def main(args: list[str] | None = None) -> None:
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["new"]:  # scaffold-only: `new` is not a Lightning subcommand
        from lit_ddp.scaffold.new import main as new_project  # scaffold-only

        return new_project(argv[1:])  # scaffold-only
    try:
        build_cli(args)
    except Exception as err:
        user_error = _user_error(err)
        if user_error is None and lost_rank_message():
            report_lost_rank()
            sys.exit(1)
        if user_error is None:
            raise
        print(f"lit_ddp: error: {user_error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
