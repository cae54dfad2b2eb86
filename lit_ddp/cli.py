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

import inspect
import os
import sys
from dataclasses import replace
from pathlib import Path

import fsspec
from jsonargparse import ArgumentError
from lightning import Trainer, seed_everything
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info

from lit_ddp.assembly import CALLBACKS, OPT_IN_CALLBACKS, class_path, trainer_arguments
from lit_ddp.callbacks.group import find_callback
from lit_ddp.callbacks.sinks import SHARED_SAVE_DIR, run_dir
from lit_ddp.compat import load_train_dataloader, set_collective_timeout
from lit_ddp.data import ImageDataModule
from lit_ddp.errors import UserError, constructor_error, constructor_failure, exception_chain
from lit_ddp.models import ImageClassifier, current_name
from lit_ddp.models.weights import checkpoint_replaces_weights
from lit_ddp.preflight import RunPlan, launcher_world, notes, problems
from lit_ddp.preflight.arguments import argument_problems, classes_named, without_classes_named
from lit_ddp.preflight.checkpoint import UNTRAINED, checkpoint_model_overrides, packages_of
from lit_ddp.preflight.checkpoint_file import allow_checkpoint_globals
from lit_ddp.preflight.folders import place_runs
from lit_ddp.preflight.settings import explain
from lit_ddp.runtime.failed_run import refusal
from lit_ddp.runtime.faults import DEFAULT_DIST_TIMEOUT_S, LostRankReport
from lit_ddp.runtime.launch import bind_rendezvous_to_loopback, check_launcher_world, first_to_say, mark_job
from lit_ddp.runtime.nvml import skip_futile_nvml_checks
from lit_ddp.runtime.preemption import stop_spawned_ranks_cleanly
from lit_ddp.runtime.quiet import SEED_LINE, QuietConsole, quiet_args_given, quiet_console
from lit_ddp.runtime.resilience import Resilience
from lit_ddp.runtime.resume import hold_shared_run, prepare_ckpt_path, recorded_seed
from lit_ddp.utils import draw_seed, imported, is_local_path, local_path
from lit_ddp.writes import write_file

# The default run: `python -m lit_ddp fit` with no arguments is configs/lenet_shapes.yaml (a test keeps
# the two, and LeNetCIFAR's defaults, in agreement). A project built on lit_ddp passes its own to main().
DEFAULT_MODEL = "lit_ddp.models.LeNetCIFAR"
DEFAULT_DATA = "lit_ddp.data.ShapesDataModule"
TRAINER_DEFAULTS = {"default_root_dir": "logs", "max_epochs": 12}
PROG = f"python -m {__package__}"
DESCRIPTION = (
    "DDP image classification: fit, validate, test and predict (each with --help)."
    " `doctor --config X.yaml` checks that a config trains the same model on any device count"
    " (doctor --help). `shard SRC DEST` writes a dataset as shards to stream from a folder or S3"
    " (shard --help)."
)


def description(prog: str) -> str:
    """What --help says: lit_ddp's own command also offers `new`; a project's does not advertise it."""
    if prog == PROG:
        return DESCRIPTION + " `new DEST` generates a new project on lit_ddp (new --help)."
    return DESCRIPTION


class SaveRunConfig(SaveConfigCallback):
    """config.yaml in the run's folder for every logger, written atomically (writes.py). Lightning's callback
    saves it in ``Trainer.log_dir``, which a logger without a local folder (MLflow on a database or a server)
    leaves None (the run stopped there on an AssertionError), and which for W&B is the ``save_dir`` of every
    run. Its run's folder is then the one its checkpoints go into.

    The file records the run, not the command that last went on with it: a fit that resumed its own run
    (``--ckpt_path=last``, or the path of the run's checkpoint) records no ``ckpt_path``, so that
    ``fit --config RUN/config.yaml`` trains the run again as a new one (with ``--ckpt_path=last`` it still
    resumes it); a fit started from another run's checkpoint records that file's path (``best`` resolved).

    Fork of ``lightning.pytorch.cli.SaveConfigCallback``: it writes into ``Trainer.log_dir``, not atomically,
    and records ``ckpt_path`` as given; goes when it writes beside the run's checkpoints for every logger,
    whole or not at all, and records what a re-run needs.
    """

    def setup(self, trainer: Trainer, pl_module, stage: str) -> None:
        # A resumed fit writes into the checkpoint's run folder, over the config that run trained with: only
        # once the data module has taken the checkpoint (callbacks are restored after it), since a resume it
        # refuses (another --data.seed, batch or data) must leave that run's config.yaml as it was.
        # A fit without a logger writes into the root folder that such runs share, which failed_run.py cannot
        # remove: only once its training loader is built (on_fit_start), so that what refuses the run there
        # (a BatchNorm batch of one per device, known once the strategy synchronised the layers) comes first.
        if stage == "fit" and (self.config.get("ckpt_path") is not None or trainer.logger is None):
            return
        self._save(trainer, pl_module, stage)

    def on_load_checkpoint(self, trainer: Trainer, pl_module, checkpoint: dict) -> None:
        self._save(trainer, pl_module, "fit")

    def on_fit_start(self, trainer: Trainer, pl_module) -> None:
        # --ckpt_path=last with no earlier run: a new run, with nothing restored. Before on_train_start,
        # where RunInfo reads the file.
        if trainer.logger is None and not self.already_saved:
            load_train_dataloader(trainer)  # as estimated_stepping_batches does: Lightning keeps it
        self._save(trainer, pl_module, "fit")

    def _save(self, trainer: Trainer, pl_module, stage: str) -> None:
        if self.already_saved:
            return
        log_dir = trainer.log_dir  # a broadcast, on every rank
        shared = isinstance(trainer.logger, SHARED_SAVE_DIR)
        folder = log_dir if log_dir is not None and not shared else run_dir(trainer)
        if stage == "fit" and self.config.get("ckpt_path") is not None:
            started = trainer.ckpt_path  # resolved: None where `last` found no run and this one is new
            own = started is None or _within(str(started), str(folder))
            self.config = self.config.clone()
            self.config.ckpt_path = None if own else str(started)
        name = self.config_filename
        fs, at = fsspec.core.url_to_fs(f"{folder}/{name}")
        if stage != "fit" and fs.isfile(at):  # an earlier run's folder (its version given): its config stays
            name = f"{trainer.state.fn.value}_{name}"
        if not is_local_path(folder):  # a remote folder (s3://): Lightning's writer
            self.config_filename = name
            return super().setup(trainer, pl_module, stage)
        path = Path(folder) / name
        if trainer.is_global_zero:  # written as lit_ddp writes files: whole or not at all (writes.py)
            text = self.parser.dump(self.config, skip_none=False)
            # A resume with the same settings leaves the file untouched: a folder synced by time stays synced.
            if not (path.is_file() and path.read_bytes() == text.encode()):
                write_file(path, text, "the run's config")
        self.already_saved = trainer.strategy.broadcast(True)


def _draw_seed(config) -> bool:
    """``--seed_everything=true``: a seed drawn here, which seeds the run and is what config.yaml records, so
    that a re-run of it seeds alike (a fit resuming a run of its own takes that run's: ``_before_run``).
    LightningCLI passes ``true`` on as ``seed_everything()``, which seeds 0 since Lightning 2.1
    (lightning#18846: processes that a launcher starts apart each drew their own) while its help still
    promises a random seed. A rank that Lightning's launcher started (LOCAL_RANK > 0) takes the seed of the
    process that started it, which ``seed_everything`` left in PL_GLOBAL_SEED; under torchrun or srun
    ``true`` stays, for preflight to refuse (#18846's reason). Returns whether it drew."""
    if config.get("seed_everything") is not True:
        return False
    inherited = os.environ.get("PL_GLOBAL_SEED", "")
    if os.environ.get("LOCAL_RANK", "0") != "0" and inherited.isdigit():
        config["seed_everything"] = int(inherited)
        return False
    launcher = launcher_world()
    if launcher is None or launcher.starts_devices or launcher.world == 1:
        config["seed_everything"] = draw_seed()
        return True
    return False


def _within(path: str, folder: str) -> bool:
    """Whether the file ``path`` lies under ``folder`` (local paths as they resolve, remote ones as named)."""
    if is_local_path(path) and is_local_path(folder):
        return Path(path).resolve().is_relative_to(Path(folder).resolve())
    return path.startswith(folder.rstrip("/") + "/")


def _as_default(choice: str | type | dict) -> dict:
    """A default for --model or --data: a class, its import path, or a whole {class_path, init_args}."""
    if isinstance(choice, dict):
        return choice
    return {"class_path": choice if isinstance(choice, str) else f"{choice.__module__}.{choice.__qualname__}"}


class LitDDPCLI(LightningCLI):
    """lit_ddp's LightningCLI: the declared callbacks, the hardening layer and one-line errors.

    ``model`` and ``data`` are what runs when the command line names no --model / --data: a class, its
    import path, or ``{"class_path": ..., "init_args": {...}}``; ``prog`` is the command's name in messages;
    ``lost_rank`` is where the FaultMonitor of the run writes what it found out about a lost rank (main()
    reads it when the run fails).
    """

    def __init__(
        self,
        *args,
        model: str | type | dict = DEFAULT_MODEL,
        data: str | type | dict = DEFAULT_DATA,
        prog: str = PROG,
        lost_rank: LostRankReport | None = None,
        **kwargs,
    ) -> None:
        self.default_model, self.default_data, self.prog = _as_default(model), _as_default(data), prog
        self.lost_rank = lost_rank if lost_rank is not None else LostRankReport()
        self.rendezvous = None  # rank 0's store on 127.0.0.1, held for the run (runtime/launch.py)
        self.plan: RunPlan | None = None  # what the preflight read from the command line (parse_arguments)
        super().__init__(*args, **kwargs)

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        main_kwargs = {"prog": self.prog, "description": description(self.prog), **main_kwargs}
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        if not add_subcommands:  # doctor's parser, given fit's configs: a printed one holds ckpt_path too
            self.parser.add_method_arguments(self.trainer_class, "fit", skip=set(self.subcommands()["fit"]))

    def init_parser(self, **kwargs) -> LightningArgumentParser:
        # A typo must not change what runs (jsonargparse would expand --trainer.max_epoch), and errors
        # come back to parse_arguments as exceptions, to be reported in one line instead of the usage.
        parser = super().init_parser(**{"allow_abbrev": False, "exit_on_error": False, **kwargs})
        self._parsers = [*getattr(self, "_parsers", []), parser]
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # The default model and data are set in parse_arguments, for the keys the command line leaves out.
        self._choice_parsers = [*getattr(self, "_choice_parsers", []), parser]
        # The data decides the number of classes: a 3-class folder needs no --model.num_classes.
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        for key, (callback_class, init_args) in CALLBACKS.items():
            parser.add_subclass_arguments(callback_class, key, required=False, fail_untyped=False)
            parser.set_defaults({key: {"class_path": class_path(callback_class), "init_args": init_args}})
        for key, callback_class in OPT_IN_CALLBACKS.items():
            parser.add_subclass_arguments(callback_class, key, required=False, fail_untyped=False)
            parser.set_defaults({key: None})
        parser.add_argument(
            "--dist_timeout",
            type=float,
            default=DEFAULT_DIST_TIMEOUT_S,
            help="Seconds a collective may wait for the other ranks before the job fails (torch: 1800).",
        )

    def _subcommand_config(self, config) -> dict:
        return config[self.subcommand] if self.subcommand else config

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        # Before jsonargparse reads them: it would keep a duplicate key's last value without a word.
        argv = [] if isinstance(args, dict) else [str(a) for a in (sys.argv[1:] if args is None else args)]
        found = argument_problems(argv)  # an alias bomb, a key given twice, a setting a later file replaces
        if found:
            raise UserError("\n".join(found))
        given = args if isinstance(args, dict) else argv
        picked = classes_named(given)
        defaults = {"model": self.default_model, "data": self.default_data}
        defaults = {key: without_classes_named(default, key, given) for key, default in defaults.items()}
        for choice_parser in self._choice_parsers:
            choice_parser.set_defaults({k: v for k, v in defaults.items() if k not in picked})
        try:
            if (validated := _without_print_config(argv)) is not None:
                # jsonargparse prints the config before it validates it: a network argument without a
                # default would be printed as null, and the printed file refused by fit. Validated first,
                # a config fit refuses is refused here with fit's line (a project's resolved_config too).
                with quiet_args_given():
                    super().parse_arguments(parser, validated)
            super().parse_arguments(parser, args)
        except ArgumentError as err:
            # The class each top-level key takes, for the settings under it to be checked against.
            bases = {"trainer": self.trainer_class, "model": self.model_class, "data": self.datamodule_class}
            bases |= {key: cls for key, (cls, _) in CALLBACKS.items()} | OPT_IN_CALLBACKS
            bases |= {"seed_everything": bool | int, "dist_timeout": float}  # LightningCLI's, and ours
            raise UserError(explain(str(err), argv, self._parsers, bases, self.prog)) from None
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        self._seed_drawn = _draw_seed(config)
        # A resume of its own run seeds again, with the run's seed (_before_run): one seed line, that one.
        SEED_LINE.defer(self._seed_drawn and subcommand == "fit" and config.get("ckpt_path") is not None)
        # The run's folders as the plan reads them: ~ and $VAR expanded, W&B's beside the other runs.
        experiment = place_runs(config) if subcommand else None
        # Every problem of the plan, a line each (main prints them), before anything is built: LightningCLI
        # reads the checkpoint's hyperparameters next, and jsonargparse would import what they name (only
        # what this command or lit_ddp trusts).
        packages = frozenset(packages_of(self.default_model, self.default_data))
        if not subcommand and config.get("ckpt_path") is not None:  # doctor's: it trains from the start
            config = config.clone()
            config["ckpt_path"] = None
        fit = subcommand or "fit"  # doctor's, with none, trains in check runs that log nowhere
        plan = RunPlan.of(
            config, subcommand=fit, packages=packages, experiment=experiment, logs=bool(subcommand), argv=argv
        )
        found = problems(plan)
        if found:
            raise UserError("\n".join(found))
        if subcommand:
            # `last` and `best` as the file they name, before the model is built from its settings as from a
            # path given by hand; each node resolves them alone (Resilience compares the ranks' at setup).
            config["ckpt_path"] = plan.ckpt_path
        for note in notes(plan) if subcommand else ():  # doctor's checks judge the run themselves
            rank_zero_info(note)
        # The --ckpt_path file, read once, for prepare_ckpt_path's shape check; the plan kept for the run
        # does not hold it (_before_run lets it go).
        self._checkpoint, self.plan = plan.checkpoint, replace(plan, checkpoint=None)
        ckpt_path = plan.ckpt_path
        self._run_options = {}
        if self._checkpoint is not None:
            chosen = self.config[subcommand]["model"]
            # LightningCLI reads the checkpoint's settings over the model settings given here next: say so,
            # naming each one, and keep the command's where they hold (put back in instantiate_classes).
            data = self.config[subcommand]["data"]  # required: without a default, it must be named here too
            picks = {"model": _as_picked(chosen), **({"data": _as_picked(data)} if data else {})}
            defaults = parser.parse_object({subcommand: picks})[subcommand]["model"]
            overridden, self._run_options = checkpoint_model_overrides(
                chosen.as_dict(),
                defaults.as_dict(),
                None if "model" in picked else self.default_model["class_path"],  # --model chosen: checked
                ckpt_path,
                self._checkpoint,
            )
            if overridden:
                rank_zero_info(f"lit_ddp: note: {overridden}")
            if subcommand != "fit" and data:
                _take_saved_classes(data, self._checkpoint)
            hparams = self._checkpoint.get("hyper_parameters") or {}
            if hparams and "_class_path" not in hparams:
                self._read_as_the_chosen_model(parser, subcommand, hparams, ckpt_path)

    def instantiate_classes(self) -> None:
        model = (self.config[self.subcommand] if self.subcommand else self.config).get("model")
        if model is not None:  # a 0.2 checkpoint's hyperparameters name the model by its 0.2 name
            model["class_path"] = current_name(model.get("class_path"))
            for key, value in getattr(self, "_run_options", {}).items():
                if key in (model.get("init_args") or {}):  # the checkpoint's class may not take it
                    model[f"init_args.{key}"] = value
        try:
            with checkpoint_replaces_weights(self.plan.checkpoint_replaces_weights):
                return super().instantiate_classes()
        except ValueError as err:  # jsonargparse's, around what a named class's constructor raised
            failed = None if _user_error(err) else constructor_failure(err) or constructor_error(err)
            if failed is None:
                raise
        # Outside the handler, not chained to jsonargparse's union and its Namespace: a library class's one
        # line, or the exception of a class of the user's own, with its traceback, last.
        raise UserError(failed) if isinstance(failed, str) else failed

    def _read_as_the_chosen_model(self, parser, subcommand: str, hparams: dict, ckpt_path: str) -> None:
        """A checkpoint saved from Python (``Trainer.fit``, not this CLI) names no class with its settings:
        LightningCLI reads them next as the model's, and jsonargparse takes the parser's default class for a
        dict without one, so the chosen model becomes that default. Settings it does not take: one line."""
        chosen = self.config[subcommand]["model"]
        for choice_parser in self._choice_parsers:
            choice_parser.set_defaults({"model": chosen.as_dict()})
        try:
            parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except ArgumentError:
            names = ", ".join(sorted(hparams))
            raise UserError(
                f"checkpoint {ckpt_path} was saved from Python, and its settings ({names}) do not fit"
                f" {chosen['class_path']}: pass --model=<the class it was saved from>"
            ) from None

    def instantiate_trainer(self, **kwargs) -> Trainer:
        config = self._subcommand_config(self.config_init)
        chosen = {key: config.get(key) for key in (*CALLBACKS, *OPT_IN_CALLBACKS)}
        trainer_config = {**config.get("trainer", {}), **kwargs}  # as LightningCLI merges them
        kwargs |= trainer_arguments(trainer_config, chosen, self.subcommand, self.plan.experiment)
        for callback in kwargs["callbacks"]:
            if isinstance(callback, Resilience):
                callback.report_lost_ranks_to(self.lost_rank)
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except ValueError as err:  # Lightning's checks of Trainer options: a sentence naming the option
            raise UserError(str(err)) from None
        # DDP collectives get --dist_timeout unless the strategy was built with a timeout of its own.
        set_collective_timeout(trainer.strategy, config.get("dist_timeout", DEFAULT_DIST_TIMEOUT_S))
        # Lightning runs 16-mixed as bf16-mixed on a CPU (and warns): config.yaml, written later from this
        # config, records the precision that ran, so that a re-run with --config is the same run.
        saved = self._subcommand_config(self.config).get("trainer")
        if saved is not None and saved.get("precision") is not None:
            saved["precision"] = trainer.precision
        # Lightning appends its Timer (--trainer.max_time) after every other callback; it decides a stop
        # in on_train_batch_end, which StepLoss must see to write that step's loss: Timer goes first.
        trainer.callbacks.sort(key=lambda callback: not isinstance(callback, Timer))
        return trainer

    def fit(self, **kwargs) -> None:
        """``trainer.fit`` (LightningCLI runs a subcommand's method of the CLI where it has one), with
        Lightning's refusals of a validation interval longer than the epoch and of an EarlyStopping monitor
        the run does not log as one line (failed_run.py)."""
        try:
            self.trainer.fit(**kwargs)
        except (ValueError, RuntimeError) as err:
            refused = refusal(self.trainer, err)
            if refused is None:
                raise
            raise refused from None

    def _before_run(self) -> None:
        # Before any process is spawned (lit_ddp/runtime/launch.py, resume.py): the launcher's world
        # matches --trainer.devices, the checkpoint fits the model and its run goes on, the data has what
        # the subcommand reads.
        if isinstance(self.datamodule, ImageDataModule):
            self.datamodule.check_stage(self.subcommand)
        check_launcher_world(self.trainer)
        stop_spawned_ranks_cleanly(self.trainer)  # ddp_spawn: stop signals as under ddp (preemption.py)
        config = self.config_init[self.subcommand]
        checkpoint, self._checkpoint = getattr(self, "_checkpoint", None), None  # not held all run long
        logger_config = self.config[self.subcommand]["trainer"].get("logger")  # as given: MLflow's run_id
        goes_on = self.plan.resumes_run
        resumed = prepare_ckpt_path(
            config.get("ckpt_path"), self.trainer, self.model, checkpoint, logger_config, goes_on
        )
        if config.get("ckpt_path") == UNTRAINED:  # the model as built, on purpose: nothing to load
            config["ckpt_path"] = None
        # The loggers a resume replaced (an MLflow or W&B run's) must not live on in the config, which
        # ddp_spawn pickles for the ranks: pickling a WandbLogger starts its run.
        if config.get("trainer") and config["trainer"].get("logger") not in (None, True, False):
            config["trainer"]["logger"] = self.trainer.loggers
        resilience = find_callback(self.trainer.callbacks, Resilience)
        if resilience is not None:  # each node resolves it alone: the ranks compare at setup
            resilience.starts_from(self.plan.ckpt_asked, config["ckpt_path"])
        quieting = find_callback(self.trainer.callbacks, QuietConsole)
        if quieting is not None and resumed is not None:  # going on in that run: its checkpoints are its own
            quieting.resumed = os.fspath(config["ckpt_path"])
        # `true` resuming a run of its own: the seed that run drew, for this process and the ranks it starts
        # (PL_GLOBAL_SEED) and for its config.yaml, which goes on recording it.
        seed = recorded_seed(resumed) if resumed is not None and self._seed_drawn else None
        SEED_LINE.settle(reseeding=seed is not None)
        if seed is not None:
            self.config[self.subcommand]["seed_everything"] = seed_everything(seed, workers=True)
        if self.rendezvous is None:
            timeout_s = config.get("dist_timeout", DEFAULT_DIST_TIMEOUT_S)
            self.rendezvous = bind_rendezvous_to_loopback(self.trainer, timeout_s)
        # Every logger writes one run, and a second run on its directory refuses (resume.py, run_lock.py).
        self._run_lock = hold_shared_run(self.trainer)

    def _after_run(self) -> None:
        if getattr(self, "_run_lock", None) is not None:
            self._run_lock.release()

    before_fit = before_validate = before_test = before_predict = _before_run
    after_fit = after_validate = after_test = after_predict = _after_run


def _take_saved_classes(data, checkpoint: dict) -> None:
    """A data module that takes ``class_names`` and has no ``data_dir/train/`` to read them from (the held-out
    splits copied alone, to evaluate on) gets the checkpoint's own (``ImageDataModule.state_dict``): the
    model's classes in the order of its labels. Not where they are given, nor over a train/ (whose classes
    the data module checks against the checkpoint's as it loads)."""
    init_args = data.get("init_args") or {}
    if "class_names" not in init_args or init_args["class_names"] is not None:
        return
    data_dir = init_args.get("data_dir")
    if data_dir is not None and (Path(local_path(data_dir, "--data.data_dir")) / "train").is_dir():
        return
    state = checkpoint.get(imported(data["class_path"]).__qualname__)  # where Lightning saves it
    if isinstance(state, dict) and state.get("class_names"):
        init_args["class_names"] = list(state["class_names"])


def _as_picked(choice) -> dict:
    """A class chosen in the config (``model`` or ``data``) with only the arguments it cannot do without
    (no default: the network of a composed ImageClassifier), as given: what parses to its defaults."""
    init_args = choice.get("init_args") or {}
    cls = imported(choice["class_path"])  # the parser imported it to build the config
    needed = {}
    for param in inspect.signature(cls).parameters.values() if callable(cls) else []:
        keyword = param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
        if keyword and param.default is param.empty and param.name in init_args:
            value = init_args[param.name]
            needed[param.name] = value.as_dict() if hasattr(value, "as_dict") else value  # a Namespace
    return {"class_path": choice["class_path"], "init_args": needed}


def build_cli(args: list[str] | None = None, run: bool = True, **kwargs) -> LitDDPCLI:
    allow_checkpoint_globals()  # --ckpt_path of an older checkpoint, which LightningCLI loads itself
    return LitDDPCLI(
        model_class=ImageClassifier,
        datamodule_class=ImageDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=0,
        # The models build their optimizer and schedule from --model.optim.* (no-decay groups, warmup,
        # scaled lr): a generic --optimizer would silently replace all of that.
        auto_configure_optimizers=False,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_callback=SaveRunConfig,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
        **kwargs,
    )


def _user_error(exc: BaseException | None) -> BaseException | None:
    """The UserError (or Lightning misconfiguration) behind ``exc``: jsonargparse wraps errors raised while
    it instantiates the data module in its own ValueError, keeping ours in the exception chain."""
    ours = (e for e in exception_chain(exc) if isinstance(e, UserError | MisconfigurationException))
    return next(ours, None)


def _without_print_config(argv: list[str]) -> list[str] | None:
    """``argv`` without its ``--print_config[=flags]``; None when it asks for no printed config."""
    kept = [a for a in argv if a != "--print_config" and not a.startswith("--print_config=")]
    return kept if len(kept) < len(argv) else None


def main(
    args: list[str] | None = None,
    *,
    model: str | type | dict = DEFAULT_MODEL,
    data: str | type | dict = DEFAULT_DATA,
    prog: str = PROG,
) -> None:
    """The command line. A project on lit_ddp calls it from its ``__main__.py`` with its own defaults:
    ``main(model={"class_path": "lit_ddp.models.ImageClassifier", "init_args": {"net": ...}}, data=MyData,
    prog="python -m my_project")``; its classes, once imported, are found by short name too."""
    quiet_console()
    mark_job()  # before Lightning's launcher copies this environment into the ranks it starts
    lost_rank = LostRankReport()  # the run context a FaultMonitor writes and this function reads
    skip_futile_nvml_checks()  # process-wide, once, before any optimizer step (lit_ddp/runtime/nvml.py)
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["new"]:  # not a Lightning subcommand: lit_ddp's project generator
        from lit_ddp.scaffold.new import main as new_project

        return new_project(argv[1:])
    try:
        if argv[:1] == ["shard"]:  # not a Lightning subcommand: data → shards (lit_ddp/data/convert.py)
            from lit_ddp.data.convert import main as shard

            return shard(argv[1:], prog=f"{prog} shard")
        if argv[:1] == ["doctor"]:  # not a Lightning subcommand: the trust kit (lit_ddp/testing)
            from lit_ddp.testing.doctor import main as doctor

            parse = lambda a: build_cli(a, run=False, model=model, data=data, prog=prog)  # noqa: E731
            sys.exit(doctor(argv[1:], parse, prog=f"{prog} doctor"))
        build_cli(args, model=model, data=data, prog=prog, lost_rank=lost_rank)
    except Exception as err:
        user_error = _user_error(err)
        if user_error is None and lost_rank.message:
            lost_rank.print_once()
            sys.exit(1)
        if user_error is None:
            raise
        for line in str(user_error).splitlines():  # a line each: preflight reports every problem it found
            if first_to_say(line):
                print(f"lit_ddp: error: {line}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
