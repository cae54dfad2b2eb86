"""A fit resumed from a checkpoint of an MLflow run goes on logging into that run.

Lightning's MLFlowLogger starts a new MLflow run unless it is given ``run_id``, and ModelCheckpoint names
the checkpoint folder after the run: each resume of a preempted job (``fit --ckpt_path=last``) split one
training's curves over one more MLflow run and its checkpoints over one more folder. The run's id is the
name of the folder that holds the checkpoint (``<root>/<experiment id>/<run id>/checkpoints/last.ckpt``).

MLflow keeps a run's parameters fixed: a resume with a changed setting (a longer ``--trainer.max_epochs``,
another ``--data.num_workers``) would stop on MLflow's INVALID_PARAMETER_VALUE at the first log. The
resumed run keeps each parameter's first value, logs the new ones, and says which changed: in one line
and in the run's ``lit_ddp.changed_params`` tag.
"""

from argparse import Namespace
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path

from lightning import Trainer
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from lit_ddp.preflight.runs import is_mlflow_run_id

CHANGED_TAG = "lit_ddp.changed_params"
PARAM_CHARS = 250  # MLFlowLogger.log_hyperparams keeps a value's first 250 characters
TAG_CHARS = 5000  # the longest tag value every MLflow store takes


def flat_params(params, prefix: str = "") -> dict:
    """``params`` flattened as MLFlowLogger flattens them before logging (``a/b`` keys; dataclasses,
    Namespaces and lists of dicts opened), so that a key compares with the run's logged parameter."""
    if isinstance(params, Namespace):
        params = vars(params)
    flat: dict = {}
    for key, value in (params or {}).items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if is_dataclass(value) and not isinstance(value, type):
            value = asdict(value)
        elif isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, Mapping):
            flat.update(flat_params(value, name))
        elif isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value):
            for i, item in enumerate(value):
                flat.update(flat_params(item, f"{name}/{i}"))
        else:
            flat[name] = value
    return flat


class ResumedMLFlowLogger(MLFlowLogger):
    """An MLFlowLogger that continues a run: a parameter the run already has with another value keeps that
    value (MLflow refuses the change); the change is said once and recorded in a tag.

    Fork of ``lightning.pytorch.loggers.MLFlowLogger``: on a resumed run it logs parameters the run holds with
    another value, which MLflow refuses; goes when it keeps a resumed run's logged values.
    """

    keeps_first_values = True  # the dashboard's run_info hands it the run's settings that changed, too

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._changed: dict = {}  # every call's (Lightning's hyperparameters, the dashboard's), for the tag

    @rank_zero_only
    def log_hyperparams(self, params) -> None:
        flat = flat_params(params)
        logged = self.experiment.get_run(self.run_id).data.params
        changed = {
            key: (logged[key], str(value)[:PARAM_CHARS])
            for key, value in flat.items()
            if key in logged and logged[key] != str(value)[:PARAM_CHARS]
        }
        if changed:
            rank_zero_info(
                f"lit_ddp: note: MLflow run {self.run_id} keeps the first value of each parameter; this fit"
                f" changed {', '.join(f'{key} ({old} -> {new})' for key, (old, new) in changed.items())}"
            )
            self._changed.update(changed)
            text = "; ".join(f"{key}: {old} -> {new}" for key, (old, new) in self._changed.items())
            self.experiment.set_tag(self.run_id, CHANGED_TAG, text[:TAG_CHARS])
        super().log_hyperparams({key: value for key, value in flat.items() if key not in changed})


def _init_args(config) -> dict | None:
    """The constructor arguments of a logger given as ``{class_path, init_args}``; None for ``true``."""
    if not isinstance(config, Mapping) and not hasattr(config, "get"):
        return None
    init_args = config.get("init_args") or {}
    return dict(init_args.as_dict() if hasattr(init_args, "as_dict") else init_args)


def _run_is_there(init_args: dict, run_id: str) -> bool:
    """Whether the tracking store still has the run (not deleted), asked by a throwaway logger so that the
    trainer's own is not set up before the launcher starts the other processes."""
    from mlflow.exceptions import MlflowException

    probe = MLFlowLogger(**init_args)
    try:
        return probe.experiment.get_run(run_id).info.lifecycle_stage != "deleted"
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return False


def continue_mlflow_run(trainer: Trainer, checkpoint: str | Path, logger_config) -> None:
    """Make the first logger of ``trainer`` (built from ``logger_config``, the CLI's ``trainer.logger``), a
    plain MLFlowLogger, log into the MLflow run whose folder holds ``checkpoint``, unless the user named a
    run (``run_id``), the checkpoint is not in a run's folder, or the store no longer has that run. The
    checkpoints' folder is the first logger's run: another MLflow logger of the list starts a new run."""
    run_id = Path(checkpoint).parent.parent.name
    if not is_mlflow_run_id(run_id) or not trainer.loggers:
        return
    logger = trainer.loggers[0]
    configs = logger_config if isinstance(logger_config, list) else [logger_config]
    init_args = _init_args(configs[0] if configs else None)
    if type(logger) is not MLFlowLogger or init_args is None or init_args.get("run_id"):
        return  # a subclass of the user's own, or a run the user named: as given
    init_args["run_id"] = run_id
    if rank_zero_only.rank == 0 and not _run_is_there(init_args, run_id):
        rank_zero_info(
            f"lit_ddp: note: MLflow run {run_id}, whose folder holds {checkpoint}, is not in the"
            " tracking store (or was deleted): this fit logs into a new MLflow run"
        )
        return
    trainer.loggers = [ResumedMLFlowLogger(**init_args), *trainer.loggers[1:]]
