"""Once per run: the resolved hyperparameters (with the metrics that judge the run), the resolved config
and the environment, written by rank 0 when training starts to every logger (TensorBoard's HParams and Text
tabs, MLflow's parameters and artifacts, files beside a CSV log).

A resumed fit writes them again, at the step it resumes from: its settings may differ (more epochs, other
devices), and TensorBoard keeps one value per step, so at step 0 they would replace the first part's. Its
HParams tab keeps the first hyperparameters a run folder holds: there the resume's texts say what changed."""

import os
import platform
from importlib.metadata import PackageNotFoundError, version

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_only

from lit_ddp.callbacks.sinks import run_dir, sinks
from lit_ddp.utils import (
    accumulation,
    accumulation_scheduler,
    flatten,
    global_batch_size,
    later_global_batches,
)


def tensorboard_hparams(prefix: str, tree) -> dict:
    """``tree`` flat (``prefix/a/b``), with TensorBoard's hparam types (int, float, str, bool); anything else
    as its string."""
    return {
        key: value if isinstance(value, (bool, int, float, str)) else str(value)
        for key, value in flatten(tree, prefix).items()
    }


def strategy_name(trainer: Trainer) -> str:
    """Lightning's short name: single_device, ddp (ddp_spawn included), fsdp, ..."""
    strategy = trainer.strategy
    return (
        getattr(strategy, "strategy_name", None) or type(strategy).__name__.removesuffix("Strategy").lower()
    )


def run_hparams(trainer: Trainer, pl_module: LightningModule) -> dict:
    """Model and data hyperparameters plus how the run is spread: devices, nodes, strategy, precision."""
    params = {"model": type(pl_module).__name__}
    params.update(tensorboard_hparams("model", dict(pl_module.hparams)))
    dm = trainer.datamodule
    if dm is not None:
        params["data"] = type(dm).__name__
        params.update(tensorboard_hparams("data", dict(dm.hparams)))
    params.update(
        {
            "trainer/accelerator": type(trainer.accelerator).__name__.removesuffix("Accelerator").lower(),
            "trainer/devices": trainer.num_devices,
            "trainer/num_nodes": trainer.num_nodes,
            "trainer/world_size": trainer.world_size,
            "trainer/strategy": strategy_name(trainer),
            "trainer/precision": str(trainer.precision),
            "trainer/accumulate_grad_batches": accumulation(trainer, 0),
            "trainer/max_epochs": trainer.max_epochs if trainer.max_epochs is not None else -1,
            "global_batch_size": global_batch_size(trainer, 0),
            "seed": int(os.environ.get("PL_GLOBAL_SEED", -1)),  # set by seed_everything
        }
    )
    scheduler = accumulation_scheduler(trainer)
    # The two above are the first epoch's, as a resume in a later epoch logs them too (MLflow keeps a run's
    # first values, and would note another as a change of this fit's); the scheduling gives the rest.
    if scheduler is not None:
        params["trainer/accumulation_scheduling"] = str(dict(sorted(scheduler.scheduling.items())))
    return params


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def environment_markdown(trainer: Trainer) -> str:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    rows = {
        "python": platform.python_version(),
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})",
        **{p: _version(p) for p in ("torchvision", "lightning", "torchmetrics", "tensorboard")},
        "world size": f"{trainer.world_size} = {trainer.num_nodes} node(s) × {trainer.num_devices} device(s)",
        "accelerator": type(trainer.accelerator).__name__,
        "strategy": f"{strategy_name(trainer)} ({type(trainer.strategy).__name__})",
        "precision": str(trainer.precision),
        "global batch": f"{global_batch_size(trainer)}{later_global_batches(trainer)}",
        "device": device,
        "host": f"{platform.node()} ({platform.system()})",
    }
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows.items())


class RunInfo(Callback):
    """Writes the ``hparams`` summary and the ``config`` and ``environment`` texts.

    Args:
        metrics: the scalars shown as hparam metrics (their last value: the final validation metrics);
            default ``val/loss`` and every ``val/`` metric of the module (``val/acc``, ``val/acc_top5``).
    """

    def __init__(self, metrics: list[str] | None = None) -> None:
        self.metrics = metrics

    def _metric_tags(self, pl_module: LightningModule) -> list[str]:
        if self.metrics is not None:
            return list(self.metrics)
        val_metrics = getattr(pl_module, "val_metrics", None)
        return ["val/loss", *(val_metrics.keys() if val_metrics is not None else ["val/acc"])]

    @rank_zero_only
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Not on_fit_start: a checkpoint's global_step is restored after it, before this.
        targets = sinks(trainer)
        if not targets:
            return
        params = run_hparams(trainer, pl_module)
        # The resolved config LightningCLI saved in the run directory (setup, before fit); else the hparams.
        config_path = os.path.join(run_dir(trainer) or "", "config.yaml")
        if os.path.isfile(config_path):
            with open(config_path) as f:
                config = f.read()
        else:
            config = "\n".join(f"{k}: {v}" for k, v in params.items())
        environment = environment_markdown(trainer)
        for sink in targets:
            sink.run_info(params, self._metric_tags(pl_module), config, environment, trainer.global_step)
