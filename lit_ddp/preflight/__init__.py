"""Preflight: what a command line asks of the Trainer, the machine and the checkpoint it names, checked
before any class is built, any process started or anything imported from the checkpoint.

``RunPlan.of(config)`` reads the parsed config (LightningCLI's, its classes not yet built), what this machine
has, what a launcher (torchrun, srun, mpirun) set in the environment and the ``--ckpt_path`` file, loaded
as data, into a typed plan; ``problems(plan)`` runs each row of ``ROWS`` over it, one line per problem,
naming the option and the fix. The CLI reports every line and stops (exit 2) as soon as it has parsed the
command line. tests/test_preflight.py holds the table of command lines and plans, and the lines (or plan
fields) they give.
"""

import errno
import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import fsspec
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.accelerators import MPSAccelerator, XLAAccelerator
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import GradClipAlgorithmType

from lit_ddp.errors import UserError
from lit_ddp.models.classifier import BATCH_OF_ONE
from lit_ddp.preflight.checkpoint import (
    LIBRARY,
    UNTRAINED,
    average_without_averaging,
    missing_run_state,
    named_by,
    resumes_averages,
    untrusted_name,
)
from lit_ddp.preflight.checkpoint_file import load_ckpt_file
from lit_ddp.preflight.folders import DEFAULT_EXPERIMENT, experiment_name, logger_configs
from lit_ddp.preflight.mlflow import StoreAnswers, mlflow_stores
from lit_ddp.preflight.runs import (
    goes_on_in_its_run,
    is_wandb_run,
    pinned_run,
    resolve_named,
    resumable_beside,
    runs_of,
)
from lit_ddp.preflight.settings import given
from lit_ddp.utils import MAX_SEED, imported, is_local_path, local_path
from lit_ddp.writes import WriteError

OPTION_PREDICTIONS = "--predictions.filename"

# Precisions that keep the weights in another dtype than float32 (Lightning casts the batch as the loader
# gives it, uint8 here, before the data module normalises it on the device into float32).
WEIGHT_DTYPES = {"16-true": "float16", "bf16-true": "bfloat16", "64-true": "float64", "64": "float64"}
# What Lightning takes for --trainer.devices: a count, auto, -1 (every GPU), a list of indices or a text of
# them ("0,1").
DEVICES = re.compile(r"\s*(auto|-1|\[?\s*\d+(\s*,\s*\d+)*\s*,?\s*\]?)\s*")
# The accelerators besides CUDA that Lightning's `auto` chooses where they are present.
_OTHER_ACCELERATORS = (("tpu", XLAAccelerator), ("mps", MPSAccelerator))
DEVICES_FIX = "pass a count (--trainer.devices=2), -1 or auto for all of them, or a list of indices ([0,1])"


# What each launcher sets in every process it starts: (name, world size, processes on this node, the
# launcher's own flags for those two). Read in this order; srun only inside a job step (SLURM_STEP_ID), since
# a batch script's own shell sees the allocation's SLURM_NTASKS too.
LAUNCHERS = (
    ("torchrun", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "--nnodes and --nproc_per_node"),
    ("mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "-np and -npernode"),  # Open MPI
    ("mpirun", "PMI_SIZE", "MPI_LOCALNRANKS", "-np and -ppn"),  # MPICH, Intel MPI
    ("srun", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "--nodes and --ntasks-per-node"),
)


@dataclass(frozen=True)
class Launcher:
    """The launcher that started this process: its name, how many processes it started and how many of them
    on this node (None where it does not say), and its flags for those two."""

    name: str
    world: int
    per_node: int | None
    flags: str
    starts_devices: bool = False  # srun with one task or in an interactive shell: Lightning starts the ranks


def launcher_world(environ=None) -> Launcher | None:
    """The launcher whose variables ``environ`` (default: this process's) holds, or None."""
    environ = os.environ if environ is None else environ
    for name, world, local, flags in LAUNCHERS:
        if world not in environ or (name == "srun" and "SLURM_STEP_ID" not in environ):
            continue
        if world == "WORLD_SIZE" and "TORCHELASTIC_RUN_ID" not in environ:
            name = "the launcher"  # another that sets torch's variables (or Lightning's own ranks > 0)
        try:
            # SLURM_NTASKS_PER_NODE may read "4(x2)": the count is what comes first.
            per_node = int(re.match(r"\d+", environ[local]).group()) if local in environ else None
            size = int(environ[world])
        except (ValueError, AttributeError):
            continue
        # Lightning's rule for a shell inside an allocation (SLURMEnvironment.job_name).
        shell = name == "srun" and environ.get("SLURM_JOB_NAME") in ("bash", "interactive")
        return Launcher(name, size, per_node, flags, starts_devices=name == "srun" and (size == 1 or shell))
    return None


def batch_shell_tasks(environ) -> int:
    """The allocation's task count that a batch script's own shell sees (SLURM_NTASKS with no job step), which
    Lightning's SLURM rule (SLURMEnvironment.detect: a job name other than bash or interactive) takes for
    srun's; 0 elsewhere."""
    if "SLURM_STEP_ID" in environ or environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return 0
    tasks = environ.get("SLURM_NTASKS", "0")
    return int(tasks) if tasks.isdigit() else 0


def launcher_mismatch(launcher: Launcher | None, devices: int, num_nodes: int) -> str | None:
    """The line for a launcher that started another number of processes than ``devices × num_nodes``, which
    Lightning would join into one training (it compares them only when its strategy takes the launcher's
    environment, else each process trains alone); None where they agree or Lightning starts the ranks."""
    if launcher is None or launcher.starts_devices:
        return None
    wanted = devices * num_nodes
    if launcher.world == wanted:
        return None
    asked = f"--trainer.devices={devices} × --trainer.num_nodes={num_nodes} = {wanted}"
    per_node = launcher.per_node
    nodes = launcher.world // per_node if per_node else None
    fix = f"--trainer.devices={per_node}" if per_node else "--trainer.devices"
    fix += f" --trainer.num_nodes={nodes}" if nodes and nodes != num_nodes else ""
    if launcher.name == "the launcher":
        return (
            f"the launcher started {launcher.world} processes (WORLD_SIZE) but {asked}: make them equal"
            f" ({fix})"
        )
    return (
        f"{launcher.name} started {launcher.world} processes but {asked}: make them equal ({fix}, or"
        f" {launcher.name}'s {launcher.flags})"
    )


def _get(config, key: str, default=None):
    value = config.get(key) if hasattr(config, "get") else None
    return default if value is None else value


def _strategy_name(strategy) -> str:
    """A strategy's name, or the class path of one given as ``{class_path: ..., init_args: ...}``."""
    return strategy if isinstance(strategy, str) else str(_get(strategy, "class_path", ""))


def _batch_norm(model) -> bool | None:
    """Whether the configured model holds a BatchNorm layer, where its class tells from its arguments
    (``ImageClassifier.batch_norm_in``); None where only building it would."""
    told = getattr(imported(str(_get(model, "class_path", ""))), "batch_norm_in", None)
    if not callable(told):
        return None
    init_args = _get(model, "init_args", {})
    return told(init_args.as_dict() if hasattr(init_args, "as_dict") else init_args)


def _logger_dirs(loggers: list[tuple[type | None, object]]) -> tuple[str, ...]:
    """The local folders the configured loggers write into (MLflow's store is probed on its own, and a
    logger without a save_dir writes under the run's)."""
    return tuple(
        save_dir
        for cls, init_args in loggers
        if cls is not None
        and not issubclass(cls, MLFlowLogger)
        and isinstance(save_dir := init_args.get("save_dir"), str)
    )


@dataclass(frozen=True)
class RunPlan:
    """What the run is asked to be, from the config before anything is built, and the machine it is on."""

    accelerator: str = "auto"
    devices: object = "auto"  # as given: a count, auto, a list or a text of indices
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    accumulate_grad_batches: int = 1
    max_epochs: int | None = None
    max_steps: int = -1
    min_epochs: int | None = None
    min_steps: int | None = None
    limit_train_batches: int | float | None = None
    limit_val_batches: int | float | None = None
    limit_test_batches: int | float | None = None
    limit_predict_batches: int | float | None = None
    max_time: object = None  # as given: "DD:HH:MM:SS", {"hours": 4}, or None
    check_val_every_n_epoch: int | None = 1
    val_check_interval: object = None  # batches (int), a fraction of the epoch (float), or a time
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str | None = None
    log_every_n_steps: int | None = None
    dist_timeout: float | None = None  # seconds; None: the CLI's default
    seed_everything: bool | int | None = None
    per_device_batch: int | None = None
    sync_batchnorm: bool | None = None  # as given; None: left at Lightning's default (off)
    batch_norm: bool | None = None  # the model as configured holds BatchNorm (None: its class cannot tell)
    root_dir: str = "."
    experiment: str = DEFAULT_EXPERIMENT  # the recipe's: the run logs into root_dir/experiment/version_N
    logger_dirs: tuple[str, ...] = ()
    # (tracking URI, experiment, run id given) of each MLflow logger
    mlflow_stores: tuple[tuple[str, str, str | None], ...] = ()
    # Their answers, each store asked once in this preflight (the runs `last` searches, the store row).
    mlflow_answers: StoreAnswers = field(default_factory=StoreAnswers, compare=False, repr=False)
    cuda_devices: int = 0  # this machine's
    # This machine's other accelerator, "mps" (Apple silicon) or "tpu", which Lightning's `auto` picks and
    # where devices=-1 means all of them, as on CUDA; None where it has neither.
    other_accelerator: str | None = None
    launcher: Launcher | None = None  # what started this process, from the environment
    manual_start: bool = False  # MASTER_ADDR or NODE_RANK set by hand: Lightning's "general cluster" start
    batch_shell_tasks: int = 0  # SLURM_NTASKS as a batch script's shell sees it (batch_shell_tasks)
    subcommand: str = "fit"
    ckpt_asked: str | None = None  # --ckpt_path as given
    ckpt_path: str | None = None  # what the subcommand gets: `last` and `best` resolved (preflight/runs.py)
    ckpt_note: str | None = None  # the line that says what they resolved to, or None
    resumes_run: bool = False  # a fit from a run's last.ckpt: it goes on in that run
    # A new fit's logger names this folder, which holds an earlier run, by this key (version, run_id, id).
    pinned_run: tuple[str, str] | None = None
    # The run beside it whose last.ckpt that fit was given: it would train it there, not in its own run.
    pinned_instead: str | None = None
    predictions_file: str | None = None  # predict's predictions.csv, where the predictions callback is on
    # The --ckpt_path file, loaded as data (None for last, best, a URL or none): what it names and holds.
    checkpoint: dict | None = field(default=None, compare=False, repr=False)
    checkpoint_problem: str | None = None  # why the --ckpt_path file cannot be read, where it cannot
    takes_weights: bool = False  # the model has --model.weights, which starts a run from a file's weights
    loads_weights: bool = False  # and it is given
    averages: bool = False  # trainer.callbacks average the weights (an EMA): a resume needs them
    named: frozenset[str] = frozenset()  # the class paths and dotted names the command line and configs give
    packages: frozenset[str] = frozenset({LIBRARY})  # lit_ddp's and the project's: their classes are trusted

    @classmethod
    def of(
        cls,
        config,
        cuda_devices: int | None = None,
        other_accelerator: str | None = None,
        environ=None,
        subcommand: str = "fit",
        checkpoint: dict | None = None,
        packages: frozenset[str] = frozenset({LIBRARY}),
        experiment: str | None = None,
        logs: bool = True,
        argv: list[str] | None = None,
    ) -> "RunPlan":
        """The plan of one subcommand's parsed config (``trainer``, ``model``, ``data``, ``ckpt_path``);
        ``cuda_devices``: this machine's count, ``other_accelerator`` its MPS or TPU and ``environ`` its
        environment, unless given; ``checkpoint``: the ``ckpt_path`` file, loaded here (weights-only,
        memory-mapped) unless given; ``packages``: the project's (``preflight.checkpoint.packages_of``);
        ``experiment``: the recipe's name, where the caller has read it (``folders.place_runs``); ``logs``:
        whether the run writes into its logger's folder (doctor's check runs do not); ``argv``: the command
        line, which tells a setting given from its default."""
        environ = os.environ if environ is None else environ
        experiment = experiment or experiment_name(_get(config, "config"))
        asked = ckpt_path = _get(config, "ckpt_path")
        checkpoint_problem = ckpt_note = None
        answers = StoreAnswers()
        runs = runs_of(config, experiment, answers) if asked is not None else None
        try:
            # `last` and `best` become the file they name (preflight/runs.py), read as a path given by hand
            ckpt_path, ckpt_note = resolve_named(runs, asked, subcommand) if runs else (asked, None)
            if checkpoint is None:
                checkpoint = load_ckpt_file(ckpt_path)
        except UserError as err:  # no run to resume; a missing, foreign, truncated or untrusted file
            checkpoint_problem = str(err)
        # A fit from a run's last.ckpt goes on in that run.
        resumes = subcommand == "fit" and bool(checkpoint) and runs is not None
        resumes_run = resumes and goes_on_in_its_run(runs, Path(ckpt_path), checkpoint)
        # A new run: from nothing, or from a file that does not go on in its run (`last` resumes the run
        # given, or starts it where it has no last.ckpt; `hpc` is Lightning's requeue of this job's own).
        new_run = asked not in ("last", "hpc") and not resumes_run and checkpoint_problem is None
        pinned = pinned_run(config) if logs and subcommand == "fit" and new_run else None
        trainer = _get(config, "trainer", {})
        loggers = logger_configs(trainer)
        data_args = _get(_get(config, "data", {}), "init_args", {})
        model_args = _get(_get(config, "model", {}), "init_args", {})
        sync = bool(_get(trainer, "sync_batchnorm", False))  # true is no default: it was given
        sync_given = sync or given(argv or [], subcommand, ("trainer", "sync_batchnorm"))
        if cuda_devices is None:
            cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
            other_accelerator = next((name for name, cls in _OTHER_ACCELERATORS if cls.is_available()), None)
        return cls(
            accelerator=str(_get(trainer, "accelerator", "auto")),
            devices=_get(trainer, "devices", "auto"),
            num_nodes=int(_get(trainer, "num_nodes", 1)),
            strategy=_strategy_name(_get(trainer, "strategy", "auto")),
            precision=str(_get(trainer, "precision", "32-true")),
            accumulate_grad_batches=int(_get(trainer, "accumulate_grad_batches", 1)),
            max_epochs=_get(trainer, "max_epochs"),
            max_steps=int(_get(trainer, "max_steps", -1)),
            min_epochs=_get(trainer, "min_epochs"),
            min_steps=_get(trainer, "min_steps"),
            limit_train_batches=_get(trainer, "limit_train_batches"),
            limit_val_batches=_get(trainer, "limit_val_batches"),
            limit_test_batches=_get(trainer, "limit_test_batches"),
            limit_predict_batches=_get(trainer, "limit_predict_batches"),
            max_time=_get(trainer, "max_time"),
            check_val_every_n_epoch=_get(trainer, "check_val_every_n_epoch", 1),
            val_check_interval=_get(trainer, "val_check_interval"),
            gradient_clip_val=_get(trainer, "gradient_clip_val"),
            gradient_clip_algorithm=_get(trainer, "gradient_clip_algorithm"),
            log_every_n_steps=_get(trainer, "log_every_n_steps"),
            dist_timeout=_get(config, "dist_timeout"),
            seed_everything=_get(config, "seed_everything"),
            per_device_batch=_get(data_args, "batch_size"),
            sync_batchnorm=sync if sync_given else None,
            batch_norm=_batch_norm(_get(config, "model")) if subcommand == "fit" else None,
            root_dir=str(_get(trainer, "default_root_dir", os.getcwd())),
            experiment=experiment,
            logger_dirs=_logger_dirs(loggers),
            mlflow_stores=mlflow_stores(loggers),
            mlflow_answers=answers,
            cuda_devices=cuda_devices,
            other_accelerator=other_accelerator,
            launcher=launcher_world(environ),
            manual_start=bool({"MASTER_ADDR", "NODE_RANK"} & set(environ)),
            batch_shell_tasks=batch_shell_tasks(environ),
            subcommand=subcommand,
            ckpt_asked=asked,
            ckpt_path=ckpt_path,
            ckpt_note=ckpt_note,
            resumes_run=resumes_run,
            pinned_run=(str(pinned[0]), pinned[1]) if pinned else None,
            pinned_instead=str(beside)
            if pinned and (beside := resumable_beside(pinned[0], ckpt_path))
            else None,
            predictions_file=_get(_get(_get(config, "predictions", {}), "init_args", {}), "filename")
            if subcommand == "predict"
            else None,
            checkpoint=checkpoint,
            checkpoint_problem=checkpoint_problem,
            takes_weights="weights"
            in (model_args.as_dict() if hasattr(model_args, "as_dict") else model_args),
            loads_weights=bool(_get(model_args, "weights")),
            averages=resumes_averages(_get(trainer, "callbacks", [])),
            named=frozenset(named_by(config)) if checkpoint else frozenset(),
            packages=frozenset(packages),
        )

    @property
    def checkpoint_replaces_weights(self) -> bool:
        """validate, test or predict of a checkpoint: its state_dict replaces every weight the model is built
        with (runtime/resume.py checks that it holds them all), so ``--model.weights`` need not be read."""
        return self.subcommand != "fit" and self.ckpt_path not in (None, UNTRAINED)

    @property
    def device_count(self) -> int | None:
        """Devices per node, where the plan names a count (None for auto, -1 or a list Lightning reads)."""
        try:
            count = int(self.devices)
        except (TypeError, ValueError):
            return len(self.devices) if isinstance(self.devices, list | tuple) else None
        return count if count > 0 else None

    @property
    def every_gpu(self) -> int | None:
        """The devices per node that auto or -1 means where Lightning runs on CUDA: every CUDA GPU of this
        machine; None where it picks another accelerator (MPS, TPU) or the CPU, or the plan names a count."""
        on_cuda = self.accelerator == "cuda" or (
            self.accelerator in ("gpu", "auto") and not self.other_accelerator
        )
        if str(self.devices).strip() not in ("auto", "-1") or not on_cuda or self.cuda_devices < 1:
            return None
        return self.cuda_devices

    @property
    def world_size(self) -> int | None:
        """The run's processes where the plan tells them: the launcher's, or devices × nodes, auto and -1
        counted as Lightning counts them on CUDA (``every_gpu``); None where Lightning counts them as it
        starts (the doctor judges a CPU stand-in for a GPU run)."""
        if self.launcher is not None and not self.launcher.starts_devices:
            return self.launcher.world
        devices = self.device_count or self.every_gpu
        return None if devices is None else devices * self.num_nodes

    @property
    def global_batch(self) -> int | None:
        """Samples per optimizer step over every process, where the plan fixes it."""
        if self.per_device_batch is None or self.device_count is None:
            return None
        return self.per_device_batch * self.device_count * self.num_nodes * self.accumulate_grad_batches


def _no_devices(plan: RunPlan) -> str | None:
    # Lightning's own words: `Trainer(devices='0') value is not a valid input`, or a TypeError traceback
    # from deep inside the Trainer for other text, a count below -1, and -1 on the CPU (where Lightning 2.6
    # takes a count of processes above 0).
    text = str(plan.devices).strip()
    if text in ("0", "[]", ""):
        return f"--trainer.devices={plan.devices} asks for no device: {DEVICES_FIX}"
    if isinstance(plan.devices, str | int) and not DEVICES.fullmatch(text):
        return f"--trainer.devices={plan.devices} is not a number of devices: {DEVICES_FIX}"
    only_cpu = not (plan.cuda_devices or plan.other_accelerator)
    if text == "-1" and (plan.accelerator == "cpu" or (plan.accelerator == "auto" and only_cpu)):
        cpu = (
            "this machine has none"
            if plan.accelerator == "auto"
            else "--trainer.accelerator=cpu runs on the CPU"
        )
        return (
            f"--trainer.devices={plan.devices} means every GPU, and {cpu}: pass a number of CPU processes"
            " (--trainer.devices=2 --trainer.strategy=ddp), or --trainer.devices=auto (one process)"
        )
    return None


def _missing_gpus(plan: RunPlan) -> str | None:
    if plan.accelerator not in ("gpu", "cuda") or _no_devices(plan):
        return None
    wanted = plan.device_count or 1  # a list of indices or auto: Lightning checks those
    if plan.cuda_devices == 0:
        return (
            f"--trainer.accelerator={plan.accelerator}, but this machine has no CUDA GPU: pass"
            " --trainer.accelerator=cpu (with --trainer.devices=N for N processes) or run on a GPU node"
        )
    if wanted > plan.cuda_devices:
        return (
            f"--trainer.accelerator={plan.accelerator} --trainer.devices={plan.devices}, but this machine has"
            f" {plan.cuda_devices} CUDA GPUs: pass --trainer.devices={plan.cuda_devices}, or"
            " --trainer.accelerator=cpu"
        )
    return None


def _fsdp_without_gpus(plan: RunPlan) -> str | None:
    # Lightning's check is a ValueError whose advice, accelerator='cuda', cannot work on this machine.
    if "fsdp" in plan.strategy.lower() and plan.cuda_devices == 0:
        return (
            f"--trainer.strategy={plan.strategy} shards the model across CUDA GPUs, and this machine has"
            " none: use --trainer.strategy=ddp (gloo on CPU) or run on a GPU node"
        )
    return None


def _accumulation(plan: RunPlan) -> str | None:
    # Lightning takes 0 into a ZeroDivisionError while counting the schedule's steps, and a negative count
    # as 1 (a step after every batch).
    if plan.accumulate_grad_batches < 1:
        return (
            f"--trainer.accumulate_grad_batches={plan.accumulate_grad_batches} must be 1 or more (the batches"
            " whose gradients add up before each optimizer step; 1 steps after every batch)"
        )
    return None


# Each subcommand's settings whose 0 leaves it nothing to run (Lightning then runs no batch, exits 0 and
# leaves an empty run folder), and what the line says it leaves.
SOME_BATCHES = ": pass a number of batches, or a fraction of them, above 0"
NOTHING_AT_ZERO = {
    "fit": (
        ("limit_train_batches", "max_epochs", "max_steps", "max_time"),
        "fit nothing to train, and it would validate nothing either: pass a value above 0, or score a model"
        " with validate --ckpt_path=PATH",
    ),
    "validate": (("limit_val_batches",), "validate no batch to score" + SOME_BATCHES),
    "test": (("limit_test_batches",), "test no batch to score" + SOME_BATCHES),
    "predict": (("limit_predict_batches",), "predict no batch to predict" + SOME_BATCHES),
}


def _nothing_to_run(plan: RunPlan) -> str | None:
    keys, left = NOTHING_AT_ZERO.get(plan.subcommand, ((), ""))
    for key in keys:
        value = getattr(plan, key)
        if (_seconds(value) if key == "max_time" and value is not None else value) == 0:
            return f"--trainer.{key}={value} leaves {left}"
    return None


def _seconds(duration) -> float | None:
    """A ``max_time`` in seconds, as Lightning's Timer reads it; None where it cannot (its own error)."""
    try:
        return Timer(duration).time_remaining()
    except (TypeError, ValueError, AttributeError, MisconfigurationException):
        return None


def _max_time(plan: RunPlan) -> str | None:
    # Lightning's Timer: a text it cannot read was its own line naming `Timer(duration=...)`, not the
    # option; a negative duration stopped the fit before its first batch ("Time limit reached").
    if plan.subcommand != "fit" or plan.max_time is None:
        return None
    seconds = _seconds(plan.max_time)
    if seconds is not None and seconds >= 0:
        return None
    return (
        f"--trainer.max_time={plan.max_time} is not a duration of 0 or more: pass DD:HH:MM:SS (00:04:00:00"
        " for four hours) or a mapping of timedelta's fields ({hours: 4})"
    )


def _validation_cadence(plan: RunPlan) -> str | None:
    # Lightning divides by both: 0 was a ZeroDivisionError traceback at the first batch. A negative epoch
    # count validated on whichever epochs its sign's arithmetic picked.
    if plan.subcommand != "fit":
        return None
    every = plan.check_val_every_n_epoch
    if every is not None and every < 1:
        return (
            f"--trainer.check_val_every_n_epoch={every} must be 1 or more (validate after every Nth training"
            " epoch), or null (validate every --trainer.val_check_interval batches alone)"
        )
    if type(plan.val_check_interval) is int and plan.val_check_interval == 0:
        return (
            "--trainer.val_check_interval=0 must be 1 or more (validate every N training batches), or a"
            " fraction of the epoch such as 0.25"
        )
    if type(plan.val_check_interval) is float and plan.val_check_interval <= 0:  # Lightning: every batch
        return (
            f"--trainer.val_check_interval={plan.val_check_interval} is no fraction of an epoch (Lightning"
            " would validate after every batch): pass one above 0, such as 0.25, or a number of batches"
        )
    return None


def _minimum_above_maximum(plan: RunPlan) -> str | None:
    # Lightning stops at the maximum (-1: none) and dropped a larger minimum with no word.
    if plan.subcommand != "fit":
        return None
    for unit in ("epochs", "steps"):
        least, most = getattr(plan, f"min_{unit}"), getattr(plan, f"max_{unit}")
        if least is not None and most is not None and 0 <= most < least:
            return (
                f"--trainer.min_{unit}={least} is more than --trainer.max_{unit}={most}, where Lightning"
                f" stops: pass a min_{unit} of {most} or less, or a max_{unit} of {least} or more"
            )
    return None


# Settings whose negative values Lightning takes without a word, and what it then does.
NEGATIVE = {
    "gradient_clip_val": "clips nothing (0 turns clipping off; above it, the largest gradient norm kept)",
    "log_every_n_steps": "logs after every step (0 turns step logging off)",
}


def _negative_settings(plan: RunPlan) -> str | None:
    for key, taken_as in NEGATIVE.items():
        value = getattr(plan, key)
        if value is not None and value < 0:
            return f"--trainer.{key}={value} is negative: Lightning then {taken_as}; pass 0 or more"
    return None


def _clip_algorithm(plan: RunPlan) -> str | None:
    algorithm = plan.gradient_clip_algorithm
    if algorithm is None:
        return None
    # Lightning's own line (it takes any case) did not name the option.
    allowed = [kind.value for kind in GradClipAlgorithmType]
    if str(algorithm).lower() not in allowed:
        return (
            f"--trainer.gradient_clip_algorithm={algorithm} is not a clipping algorithm: pass one of"
            f" {', '.join(allowed)}, or leave it out to clip by norm"
        )
    # Lightning clips only where a value is given, and took the algorithm alone without a word.
    if plan.gradient_clip_val is not None:
        return None
    return (
        f"--trainer.gradient_clip_algorithm={algorithm} clips nothing without --trainer.gradient_clip_val:"
        " pass the largest value kept (--trainer.gradient_clip_val=0.5), or leave the algorithm out"
    )


def _dist_timeout(plan: RunPlan) -> str | None:
    # torch's rendezvous then timed out at once: a C++ traceback of 58 lines under ddp (exit 1).
    seconds = plan.dist_timeout
    if seconds is None or 0 < seconds < math.inf:
        return None
    return (
        f"--dist_timeout={seconds} must be a number of seconds above 0 (how long the start-up and each"
        " collective wait for every rank)"
    )


def _seed_range(plan: RunPlan) -> str | None:
    # Outside numpy's seeds: Lightning's ValueError traceback, once the run started.
    seed, launcher = plan.seed_everything, plan.launcher
    # true is drawn by the CLI (cli._draw_seed), except in processes a launcher started apart.
    if seed is True and launcher is not None and launcher.world > 1 and not launcher.starts_devices:
        return (
            f"--seed_everything=true would draw a seed in each of the {launcher.world} processes"
            f" {launcher.name} started, and they would differ: pass one seed for all of them"
            " (--seed_everything=N)"
        )
    if seed is None or isinstance(seed, bool) or 0 <= seed <= MAX_SEED:
        return None
    return f"--seed_everything={seed} is outside 0..{MAX_SEED}, the seeds numpy takes: pass one in that range"


def _weights_precision(plan: RunPlan) -> str | None:
    # Weights in float16/bfloat16/float64 and the batch in float32 fail at the first layer.
    dtype = WEIGHT_DTYPES.get(plan.precision)
    if dtype is None:
        return None
    half = "16-mixed or bf16-mixed (half-precision compute)"
    instead = "32-true (the default)" if dtype == "float64" else half
    return (
        f"--trainer.precision={plan.precision} keeps the weights in {dtype}, and lit_ddp's batches are"
        f" normalised to float32 on the device: use {instead}"
    )


def _write_probe(folder: str) -> OSError | None:
    """Why a local folder cannot be written, probed at the nearest existing folder on its way (creating
    nothing: a run that fails next leaves no folder behind); None where it can."""
    existing = Path(folder).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        return err
    return None


def _missing_store_package(url: str) -> str | None:
    """The package fsspec needs for a remote folder's store (s3fs for s3://) where it is not installed;
    None where it is, or where the scheme is none fsspec knows (Lightning's to refuse)."""
    try:
        fsspec.get_filesystem_class(fsspec.utils.get_protocol(url))
    except ImportError as err:  # fsspec raises its own, from the import that failed
        failed = err.__cause__ if isinstance(err.__cause__, ImportError) else err
        return failed.name
    except ValueError:
        return None
    return None


def unwritable(folder: str, option: str) -> str | None:
    """The line for a folder a run cannot write into; None where it can, or for a remote folder (s3://)
    whose store's package is installed: the store checks its own permissions."""
    if not is_local_path(folder) and (package := _missing_store_package(folder)):
        # Else an ImportError traceback from the logger's creation.
        return f"{option}={folder} needs the {package} package, which is not installed: pip install {package}"
    err = _write_probe(folder) if is_local_path(folder) else None
    if err is None:
        return None
    return f"{option}={folder} cannot be written ({err.strerror or err}): pass a directory you can write to"


def _predictions_file(plan: RunPlan) -> str | None:
    # predict scored every image, then failed at the last step. A relative file goes into the run folder,
    # which the run_dir row probes.
    path = Path(local_path(plan.predictions_file, OPTION_PREDICTIONS)) if plan.predictions_file else None
    err = _write_probe(str(path.parent)) if path is not None and path.is_absolute() else None
    return None if err is None else str(WriteError("predictions", path, err, OPTION_PREDICTIONS))


def _run_dir(plan: RunPlan) -> str | None:
    # Else an OSError traceback from the first checkpoint or event file, possibly hours into the run.
    return unwritable(plan.root_dir, "--trainer.default_root_dir")


def _logger_dir(plan: RunPlan) -> str | None:
    found = (unwritable(d, "--trainer.logger.init_args.save_dir") for d in plan.logger_dirs)
    return next((line for line in found if line), None)


def _mlflow_store(plan: RunPlan) -> str | None:
    # MLFlowLogger reports a scheme MLflow has no store for as a traceback from its creation, and a server
    # that does not answer after minutes of retries at the run's first log, and a run_id the store has not as
    # a traceback too.
    found = (plan.mlflow_answers(*store).problem for store in plan.mlflow_stores)
    return next((line for line in found if line), None)


def _nodes_without_launcher(plan: RunPlan) -> str | None:
    # Lightning's own launcher starts the processes of one node only: the other nodes' must be started there,
    # with the rendezvous address and the node's rank. Without those, rank 0 waited 600 s for nodes that
    # never come, then blamed a stuck rank.
    if plan.num_nodes > 1 and plan.launcher is None and not plan.manual_start:
        return (
            f"--trainer.num_nodes={plan.num_nodes}, but nothing started this job on {plan.num_nodes} nodes:"
            f" launch it on every node with torchrun (--nnodes={plan.num_nodes}) or srun, or set MASTER_ADDR,"
            " MASTER_PORT and NODE_RANK on each node; on one machine leave --trainer.num_nodes out"
        )
    return None


def _launcher_world(plan: RunPlan) -> str | None:
    launcher = plan.launcher
    if launcher is None and plan.batch_shell_tasks > 1:
        # Lightning took this process for task 0 and waited for the others until --dist_timeout.
        tasks = plan.batch_shell_tasks
        return (
            f"this process runs in the SLURM job's batch shell (SLURM_NTASKS={tasks}, no srun step), so"
            " Lightning would take it for task 0 and wait for the others, which never start: put srun in"
            " front of python (srun python -m lit_ddp fit ...), as scripts/sbatch_single_node.sh does"
        )
    if launcher and launcher.name == "srun" and launcher.per_node is None and not launcher.starts_devices:
        # Lightning's SLURMEnvironment raises a RuntimeError in every task, as the Trainer is built.
        tasks = launcher.world
        return (
            f"srun started {tasks} tasks with no --ntasks-per-node (SLURM_NTASKS_PER_NODE is unset), which"
            f" Lightning needs: ask for --nodes and --ntasks-per-node in place of --ntasks={tasks} (#SBATCH"
            f" --nodes=1 --ntasks-per-node={tasks} for {tasks} tasks on one node)"
        )
    # Where the plan names the device count; auto and -1 are Lightning's to count: runtime/launch.py checks
    # those against the built Trainer, with this same line.
    if plan.device_count is None:
        return None
    return launcher_mismatch(plan.launcher, plan.device_count, plan.num_nodes)


def _checkpoint_file(plan: RunPlan) -> str | None:
    return plan.checkpoint_problem


def _pinned_run(plan: RunPlan) -> str | None:
    # A new run would write its config.yaml, last.ckpt and best over the earlier run's (and into an MLflow or
    # W&B run a second history over the same steps), from a --ckpt_path that does not go on in that run
    # (another run's last.ckpt, an earlier checkpoint, a file from elsewhere) as from none. `last` reads a
    # versioned logger's or MLflow's given run alone; W&B's is named by the file's path.
    if plan.pinned_run is None:
        return None
    folder, key = plan.pinned_run
    option = f"--trainer.logger.init_args.{key}"
    if plan.pinned_instead is not None:
        other = Path(plan.pinned_instead).name
        return (
            f"--ckpt_path={plan.ckpt_asked} is the run {plan.pinned_instead}'s, and {option} names {folder},"
            f" which holds another run: the fit would train {other}'s weights over {Path(folder).name}'s"
            f" config.yaml and checkpoints; resume {other} in its own run with {option}={other}, or none"
            f" ({option}=null), or give the logger a new {key}"
        )
    if plan.ckpt_asked is not None:
        return (
            f"--ckpt_path={plan.ckpt_asked} starts a new run, and {option} names {folder}, which holds an"
            f" earlier run: the fit would write over its config.yaml and checkpoints; give the logger a new"
            f" {key}, or none ({option}=null: a new run from that checkpoint)"
        )
    last = Path(folder, "checkpoints", "last.ckpt")
    resume = f"--ckpt_path={last}" if is_wandb_run(Path(folder)) else "--ckpt_path=last"
    return (
        f"{option} names {folder}, which holds an earlier run: a new fit would write over its config.yaml and"
        f" checkpoints; resume that run with {resume}, or give the logger another {key}, or none"
        f" ({option}=null: a new run)"
    )


def _checkpoint_names(plan: RunPlan) -> str | None:
    # jsonargparse would import what the checkpoint's hyperparameters name, when LightningCLI reads them.
    return untrusted_name(plan.checkpoint, plan.ckpt_path, set(plan.named), set(plan.packages))


def _checkpoint_state(plan: RunPlan) -> str | None:
    return missing_run_state(plan.checkpoint, plan.ckpt_path, plan.subcommand, plan.takes_weights)


def _checkpoint_average(plan: RunPlan) -> str | None:
    return average_without_averaging(
        plan.checkpoint, plan.ckpt_path, plan.subcommand, plan.averages, plan.takes_weights
    )


def _batch_of_one(plan: RunPlan) -> str | None:
    # BatchNorm raised its ValueError ("Expected more than 1 value per channel") at the first step. Layers
    # synchronised over several processes normalise their one-image batches together.
    if plan.subcommand != "fit" or plan.per_device_batch != 1 or not plan.batch_norm:
        return None
    world = plan.world_size
    return None if plan.sync_batchnorm and (world is None or world > 1) else BATCH_OF_ONE


def _batch_norm_per_device(plan: RunPlan) -> str | None:
    # Each device's BatchNorm normalises its own images: another model than one process with the global batch
    # trains (docs/ddp.md). A recipe that sets sync_batchnorm: false chose it; the default is not a choice.
    world, batch = plan.world_size, plan.per_device_batch
    if plan.subcommand != "fit" or not plan.batch_norm or plan.sync_batchnorm is not None:
        return None
    if world is None or world < 2 or batch is None:
        return None
    return (
        f"lit_ddp: note: BatchNorm normalises each device's {batch} images alone, not the {world * batch} of"
        f" all {world} devices together as one process would: --trainer.sync_batchnorm=true normalises them"
        " together"
    )


def _random_weights(plan: RunPlan) -> str | None:
    # validate and test scored the model's random initial weights, and predict labelled images with them,
    # with no word.
    if plan.subcommand == "fit" or plan.ckpt_path is not None or plan.loads_weights:
        return None
    what, verb = ("label the images with", "predict with") if plan.subcommand == "predict" else ("score",) * 2
    return (
        f"{plan.subcommand} with no --ckpt_path would {what} the model's random initial weights: pass"
        f" --ckpt_path=PATH to a checkpoint (or last, the newest of this recipe's runs), or"
        f" --ckpt_path={UNTRAINED} to {verb} them on purpose"
    )


def _no_hpc_checkpoint(plan: RunPlan) -> str | None:
    # Lightning's SLURM checkpoint, which it looks for in default_root_dir (and raises a ValueError, after
    # start-up, when there is none; a remote folder is its to look in); lit_ddp's stop writes last.ckpt.
    if plan.ckpt_path != "hpc" or not is_local_path(plan.root_dir):
        return None
    if any(Path(plan.root_dir).glob("hpc_ckpt_*.ckpt")):
        return None
    return (
        f"--ckpt_path=hpc: no hpc_ckpt_N.ckpt in {plan.root_dir} (lit_ddp saves a stopped run as last.ckpt):"
        " pass --ckpt_path=last, or --ckpt_path=PATH to a checkpoint"
    )


# Each row: a plan → None, or the one line naming the option and the fix. In the order they are reported.
ROWS: dict[str, Callable[[RunPlan], str | None]] = {
    "devices": _no_devices,
    "nodes": _nodes_without_launcher,
    "launcher": _launcher_world,
    "gpus": _missing_gpus,
    "strategy": _fsdp_without_gpus,
    "accumulation": _accumulation,
    "nothing_to_run": _nothing_to_run,
    "max_time": _max_time,
    "validation_cadence": _validation_cadence,
    "minimum_above_maximum": _minimum_above_maximum,
    "negative_settings": _negative_settings,
    "clip_algorithm": _clip_algorithm,
    "dist_timeout": _dist_timeout,
    "seed": _seed_range,
    "precision": _weights_precision,
    "run_dir": _run_dir,
    "predictions_file": _predictions_file,
    "logger_dir": _logger_dir,
    "mlflow_store": _mlflow_store,
    "checkpoint_file": _checkpoint_file,
    "pinned_run": _pinned_run,
    "checkpoint_names": _checkpoint_names,
    "checkpoint_state": _checkpoint_state,
    "checkpoint_average": _checkpoint_average,
    "random_weights": _random_weights,
    "batch_of_one": _batch_of_one,
    "hpc_checkpoint": _no_hpc_checkpoint,
}


def problems(plan: RunPlan) -> list[str]:
    """Every row's line for ``plan``, in ``ROWS``'s order: empty when the plan can run."""
    return [line for row in ROWS.values() if (line := row(plan)) is not None]


def notes(plan: RunPlan) -> list[str]:
    """The lines a plan that can run is told before it runs: what ``last`` or ``best`` resolved to, and a
    choice left to the default that trains another model than the user may think."""
    return [line for line in (plan.ckpt_note, _batch_norm_per_device(plan)) if line is not None]
