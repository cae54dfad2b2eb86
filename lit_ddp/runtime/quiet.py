"""Every console message lit_ddp silences, in one list: a warning or log line of another library that a user
cannot act on, matched by its text because its text is all there is (no category or logger of its own).

Each entry names the module that emits it, a fragment of that module's source, an example of the message
as emitted and why it is silenced. tests/test_quiet.py checks, per entry, that the installed library still
holds the fragment and that the pattern matches the example: an upstream rewording fails there, by name,
instead of leaving a filter that silences nothing. Nothing is silenced on import: ``main()`` calls
``quiet_console()``; the ``QuietConsole`` callback (a default, assembly.CALLBACKS) calls it again in whatever
process runs the ranks' work, with ``quiet_evaluation()`` for validate/test/predict (ddp_spawn's ranks are
fresh interpreters that ``main()`` never ran in); PreemptionCheckpoint calls ``quiet_exact_resume()`` while
a resumed epoch starts; doctor and ``lit_ddp.testing`` build the CLI inside ``quiet_args_given()``.
Lightning's seed line is not silenced but held until the Trainer is built (``_SeedLine``).
"""

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from lightning.pytorch import Callback

from lit_ddp.compat import epoch_cut_short


@dataclass(frozen=True)
class Quiet:
    pattern: str  # a regular expression matched at the start of the message
    kind: Literal["warning", "info"]  # a Python warning, or a record of Lightning's rank-zero logger
    module: str  # the module whose source emits it
    literal: str  # a fragment of that message as the module's source writes it
    example: str  # the message as the installed version emits it
    why: str


# Process-wide, for every command (quiet_console).
CONSOLE = (
    Quiet(
        r".*does not have many workers",
        "warning",
        "lightning.pytorch.trainer.connectors.data_connector",
        "does not have many workers which may be a bottleneck",
        "The 'train_dataloader' does not have many workers which may be a bottleneck.",
        "in-memory uint8 datasets are fastest with num_workers=0 (no IPC), and loaders that decode files"
        " count the cores themselves (data/base.py)",
    ),
    Quiet(
        r"It is recommended to use `self.log\('(perf/|\w+/skipped_images)",
        "warning",
        "lightning.pytorch.trainer.connectors.logger_connector.result",
        "It is recommended to use `self.log(",
        "It is recommended to use `self.log('perf/img_per_s', ..., sync_dist=True)` when logging on epoch"
        " level in distributed setting to accumulate the metric across devices.",
        "the dashboard callbacks reduce their epoch values over the ranks themselves"
        " (callbacks/throughput.py): the advice to log them with sync_dist=True does not apply to these keys",
    ),
    Quiet(
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        "warning",
        "torch.utils._pytree",
        "`isinstance(treespec, LeafSpec)` is deprecated",
        "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) and"
        " treespec.is_leaf()` instead.",
        "Lightning 2.6 calls a torch API that torch 2.9+ deprecates, on every fit, validate and test",
    ),
    Quiet(
        r"💡 Tip: For seamless cloud logging",
        "info",
        "lightning.pytorch.trainer.connectors.logger_connector.logger_connector",
        "💡 Tip: For seamless cloud logging",
        "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]",
        "an advertisement for a hosted logger, on every run",
    ),
    Quiet(
        r"Precision \S+-mixed is not supported by the model summary",
        "warning",
        "lightning.pytorch.utilities.model_summary.model_summary",
        "is not supported by the model summary",
        "Precision bf16-mixed is not supported by the model summary.  Estimated model size in MB will not be"
        " accurate. Using 32 bits instead.",
        "mixed precision keeps the weights in float32, the size the summary then counts: the size is right,"
        " on every run of the bf16-mixed recipes",
    ),
    Quiet(
        r"Trainer already configured with model summary callbacks",
        "info",
        "lightning.pytorch.trainer.connectors.callback_connector",
        "Trainer already configured with model summary callbacks",
        "Trainer already configured with model summary callbacks: [<class 'ConsoleModelSummary'>]. Skipping"
        " setting a default `ModelSummary` callback.",
        "lit_ddp's model summary (callbacks/console.py) replaces Lightning's on purpose",
    ),
)

# validate / test / predict only (quiet_evaluation).
EVALUATION = (
    Quiet(
        r"The dirpath has changed from",
        "warning",
        "lightning.pytorch.callbacks.model_checkpoint",
        "The dirpath has changed from",
        "The dirpath has changed from '/old/checkpoints' to '/new/checkpoints', therefore `best_model_score`,"
        " `kth_best_model_path`, `kth_value`, `last_model_path` and `best_k_models` won't be reloaded.",
        "evaluating a checkpoint in a new run directory is what these commands do: the best-k bookkeeping"
        " that is not restored is only used when training",
    ),
    Quiet(
        r"Be aware that when using `ckpt_path`, callbacks used",
        "warning",
        "lightning.pytorch.trainer.call",
        "Be aware that when using `ckpt_path`, callbacks used",
        "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided"
        " during `Trainer` instantiation.",
        "callback states matter to fit only (an EMA checkpoint's state_dict already holds the averaged"
        " weights): the advice to pass those callbacks again does not apply",
    ),
)

# While an exactly resumed epoch starts (quiet_exact_resume).
EXACT_RESUME = Quiet(
    r"You're resuming from a checkpoint that ended before the epoch ended and your",
    "warning",
    "lightning.pytorch.loops.training_epoch_loop",
    "You're resuming from a checkpoint that ended before the epoch ended and your",
    "You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not"
    " resumable. This can cause unreliable results if further training is done.",
    "lit_ddp's sampler resumes mid-epoch exactly (data/base.py, samplers.py); Lightning decides from the"
    " loader's state_dict(), which it cannot see, so the warning would be false",
)

# While a fit that its budget stopped inside an epoch ends (quiet_cut_short).
CUT_SHORT = Quiet(
    r"`ModelCheckpoint\(monitor='[^']*'\)` could not find the monitored key",
    "warning",
    "lightning.pytorch.callbacks.model_checkpoint",
    "could not find the monitored key in the returned",
    "`ModelCheckpoint(monitor='val/acc')` could not find the monitored key in the returned metrics: ['epoch',"
    " 'step']. HINT: Did you call `log('val/acc', value)` in the `LightningModule`?",
    "max_steps or max_time stopped the fit inside an epoch, before its validation: the best checkpoint has no"
    " metric to rank it by, the console's line says where the fit stopped, and last.ckpt resumes it",
)

# A fit that goes on in the run folder of the checkpoint it resumes (quiet_resumed_run): that folder only.
RESUMED_RUN = Quiet(
    r"Checkpoint directory .* exists and is not empty\.",
    "warning",
    "lightning.pytorch.callbacks.model_checkpoint",
    "exists and is not empty.",
    "Checkpoint directory logs/lenet_cifar/version_0/checkpoints exists and is not empty.",
    "a resumed fit goes on in its run's folder (runtime/resume.py), whose checkpoints are the ones it resumes"
    " and keeps writing: the folder holds them by design, on every resume and requeue",
)

# While lit_ddp's own code builds the CLI from arguments of its own (quiet_args_given).
ARGS_GIVEN = Quiet(
    r"LightningCLI's args parameter is intended to run from within Python",
    "warning",
    "lightning.pytorch.cli",
    "LightningCLI's args parameter is intended to run from within Python",
    "LightningCLI's args parameter is intended to run from within Python like if it were from the command"
    " line. To prevent mistakes it is not recommended to provide both args and command line arguments, got:"
    " sys.argv[1:]=['doctor', '--config', 'configs/lenet_shapes.yaml'], args=['--trainer.accelerator=cpu'].",
    "doctor and lit_ddp.testing.resolved_config pass the CLI arguments of their own while sys.argv holds"
    " their own command's (or pytest's): that is what the args parameter is for",
)

EVERY_FILTER = (
    *CONSOLE,
    *EVALUATION,
    EXACT_RESUME,
    CUT_SHORT,
    RESUMED_RUN,
    ARGS_GIVEN,
)

# Loggers of another library whose records below ERROR are silenced, by the logger's name, for every command
# (quiet_console): name -> why.
QUIET_LOGGERS = {
    "torch.multiprocessing.spawn": "ddp_spawn's main process logs each rank it terminates (or must kill)"
    " once another has failed: the cleanup after a failure that the failed rank's line or traceback reports",
}


def _ignore(quiet: Quiet) -> None:
    warnings.filterwarnings("ignore", message=quiet.pattern)


def _info_allowed(record: logging.LogRecord) -> bool:
    return not any(q.kind == "info" and re.match(q.pattern, str(record.msg)) for q in CONSOLE)


# Lightning's seed line and the first line of the Trainer it waits for (its device line, "GPU available").
SEED_LOGGER = "lightning.fabric.utilities.seed"
RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"


class _SeedLine:
    """Lightning's "Seed set to N" held back until the Trainer is built. LightningCLI seeds before it builds
    the config's classes, so a mistake found there (a logger that cannot start) read as the seed line and
    then the one-line error; a run whose Trainer is built prints the seed line once, before the Trainer's
    own lines. A filter on each of the two loggers (``hold`` and ``release``).

    A fit that drew its seed and may resume a run of its own (``--ckpt_path``) holds the line until the
    checkpoint is found (``defer``, then ``settle``): a resume seeds again with the run's recorded seed, and
    its line is the one that is true."""

    def __init__(self) -> None:
        self.held: logging.LogRecord | None = None
        self.releasing = self.deferred = False

    def hold(self, record: logging.LogRecord) -> bool:
        if self.releasing:
            return True
        self.held = record
        return False

    def release(self, record: logging.LogRecord | None = None) -> bool:
        if self.held is not None and not self.deferred:
            held, self.held = self.held, None
            self.releasing = True
            try:
                logging.getLogger(held.name).handle(held)
            finally:
                self.releasing = False
        return True

    def defer(self, until_settled: bool) -> None:
        """Whether this command's held line waits for ``settle`` (set by each command: a refused one never
        settles)."""
        self.deferred = until_settled

    def settle(self, reseeding: bool) -> None:
        """Drop the held line where the run seeds again (its own line replaces it), else print it."""
        self.deferred = False
        if reseeding:
            self.held = None
        self.release()


SEED_LINE = _SeedLine()


def quiet_console() -> None:
    """The process-wide filters (CONSOLE, QUIET_LOGGERS, and the seed line held back: ``_SeedLine``): set by
    ``main()``, never by importing a module."""
    for quiet in CONSOLE:
        if quiet.kind == "warning":
            _ignore(quiet)
    # addFilter adds a filter once, however often this runs (main(), then QuietConsole in the same process).
    for log_filter in (_info_allowed, SEED_LINE.release):
        logging.getLogger(RANK_ZERO_LOGGER).addFilter(log_filter)
    logging.getLogger(SEED_LOGGER).addFilter(SEED_LINE.hold)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def quiet_evaluation() -> None:
    """The filters of validate, test and predict (EVALUATION)."""
    for quiet in EVALUATION:
        _ignore(quiet)


def quiet_exact_resume() -> warnings.catch_warnings:
    """Silence EXACT_RESUME until the returned context is exited."""
    context = warnings.catch_warnings()
    context.__enter__()
    _ignore(EXACT_RESUME)
    return context


def quiet_cut_short() -> warnings.catch_warnings:
    """Silence CUT_SHORT until the returned context is exited."""
    context = warnings.catch_warnings()
    context.__enter__()
    _ignore(CUT_SHORT)
    return context


def quiet_resumed_run(checkpoint: str) -> None:
    """Silence RESUMED_RUN for the folder of ``checkpoint``, the file a fit resumes, as ModelCheckpoint may
    name it (as given, absolute, links resolved): a non-empty folder of any other path still warns."""
    folder = os.path.dirname(checkpoint)
    names = dict.fromkeys((folder, os.path.abspath(folder), os.path.realpath(folder)))
    either = "|".join(re.escape(name) for name in names)
    warnings.filterwarnings("ignore", message=rf"Checkpoint directory ({either}) exists and is not empty\.")


@contextlib.contextmanager
def quiet_args_given() -> Iterator[None]:
    """Silence ARGS_GIVEN inside the block (and nothing else, nor after it)."""
    with warnings.catch_warnings():
        _ignore(ARGS_GIVEN)
        yield


class QuietConsole(Callback):
    """The console filters in every process that runs a rank's work: ``main()`` sets them in the process it
    runs in, but ddp_spawn's ranks are fresh interpreters started by Lightning's launcher, and each would
    print what ``main()`` silences. In ``setup``: before any loader is built or checkpoint restored, where
    the filtered messages come from; validate, test and predict add their own filters, and a fit the
    checkpoint folder of the ``resumed`` file (set by the CLI once it has found it: Lightning sets
    ``trainer.ckpt_path`` only after ``setup``)."""

    resumed: str | None = None
    _cut_short: warnings.catch_warnings | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        quiet_console()
        if stage != "fit":
            quiet_evaluation()
        elif self.resumed and os.path.dirname(self.resumed):
            quiet_resumed_run(self.resumed)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # Before the checkpoint callbacks' own (Lightning calls them last), until the fit ends.
        if self._cut_short is None and epoch_cut_short(trainer):
            self._cut_short = quiet_cut_short()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._cut_short is not None:
            self._cut_short.__exit__(None, None, None)
            self._cut_short = None
