"""Every console filter of lit_ddp/runtime/quiet.py silences a message the installed version emits.

One test per entry: the emitting module's source (string literals joined as Python joins them) still
holds the entry's fragment, and the entry's pattern matches its example. An upstream rewording fails here,
naming the entry, instead of leaving a filter that silences nothing (lightning 2.6.6, torch 2.14.1).
"""

import importlib
import inspect
import logging
import re
import warnings
from pathlib import Path

import pytest
from conftest import CPU, TINY_RUN, run_cli
from forked_cli import FRESH_RANKS

from lit_ddp.runtime import quiet

# Adjacent string literals across a line break ("a" \n "b", f"a" \n f" b"), joined as Python joins them.
_JOIN = re.compile(r"""(["'])\s*\n\s*(?:#[^\n]*\n\s*)*[fr]?(["'])""")


def _source(module: str) -> str:
    return _JOIN.sub("", inspect.getsource(importlib.import_module(module)))


@pytest.mark.parametrize("entry", quiet.EVERY_FILTER, ids=lambda q: q.pattern[:40])
def test_each_filtered_message_is_still_emitted_by_the_installed_version(entry: quiet.Quiet) -> None:
    assert entry.literal in _source(entry.module), f"{entry.module} no longer says {entry.literal!r}"
    assert entry.literal in entry.example and re.match(entry.pattern, entry.example)
    assert entry.why


def test_the_filters_silence_their_messages_and_nothing_else() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.quiet_console()
        quiet.quiet_evaluation()
        resuming = quiet.quiet_exact_resume()
        cut_short = quiet.quiet_cut_short()
        quiet.quiet_resumed_run("logs/lenet_cifar/version_0/checkpoints/last.ckpt")
        with quiet.quiet_args_given():
            for entry in quiet.EVERY_FILTER:
                if entry.kind == "warning":
                    warnings.warn(entry.example, UserWarning, stacklevel=1)
        cut_short.__exit__(None, None, None)
        resuming.__exit__(None, None, None)
        warnings.warn("a warning of the user's own", UserWarning, stacklevel=1)
        warnings.warn(quiet.ARGS_GIVEN.example, UserWarning, stacklevel=1)  # only inside its block
        other_folder = "Checkpoint directory ckpts exists and is not empty."  # not the resumed run's
        warnings.warn(other_folder, UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == [
        "a warning of the user's own",
        quiet.ARGS_GIVEN.example,
        other_folder,
    ]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    infos = [q for q in quiet.CONSOLE if q.kind == "info"]
    assert infos and all(
        not logger.filter(logging.LogRecord(logger.name, logging.INFO, "", 0, q.example, None, None))
        for q in infos
    )
    assert logger.filter(
        logging.LogRecord(logger.name, logging.INFO, "", 0, "GPU available: False", None, None)
    )


@pytest.mark.parametrize("name", quiet.QUIET_LOGGERS)
def test_each_quieted_logger_is_the_installed_modules_own_and_quiet_console_quiets_it(name: str) -> None:
    module = importlib.import_module(name)
    assert logging.getLogger(name) is getattr(module, "log", getattr(module, "logger", None)), name
    logger = logging.getLogger(name)
    level = logger.level
    try:
        quiet.quiet_console()
        assert not logger.isEnabledFor(logging.WARNING) and logger.isEnabledFor(logging.ERROR)
    finally:
        logger.setLevel(level)


def test_no_module_outside_quiet_silences_a_message_by_its_text() -> None:
    package = Path(quiet.__file__).resolve().parents[1]
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "quiet.py"
        and re.search(r"filterwarnings\([^)]*message=|addFilter\(", path.read_text())
    ]
    assert not offenders


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ranks_started_by_ddp_spawn_print_none_of_the_silenced_warnings(tmp_path: Path) -> None:
    """ddp_spawn's ranks are fresh interpreters that main() never ran in: before the QuietConsole callback
    this run printed torch's LeafSpec deprecation once per process and Lightning's sync_dist advice for each
    perf/ key from rank 0."""
    spawn = ["--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    # New interpreters, not the test runner's forks: what a fork's parent imported may have warned already.
    result = run_cli(["fit", *CPU, *TINY_RUN, *spawn], tmp_path, timeout=540, env={FRESH_RANKS: "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Trainer.fit` stopped" in result.stderr + result.stdout  # the ranks trained to the end
    warned = [q.pattern for q in quiet.CONSOLE if q.kind == "warning"]
    printed = [pattern for pattern in warned if re.search(pattern, result.stderr)]
    assert not printed, result.stderr[-3000:]


def test_the_seed_line_waits_for_the_trainer_and_a_mistake_before_it_is_the_only_line(capfd) -> None:
    """LightningCLI seeds before it builds the config's classes: a logger that cannot start printed
    "Seed set to 0", then its one-line error. The seed line is held until the Trainer's first line (its
    device line), then printed once, before it."""
    from lightning.fabric.utilities.seed import seed_everything
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    from lit_ddp.cli import main

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    loggers = [logging.getLogger(name) for name in ("lightning.fabric", "lightning.pytorch")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        quiet.quiet_console()
        seed_everything(7)
        assert seen == []
        rank_zero_info("GPU available: False, used: False")
        rank_zero_info("TPU available: False, using: 0 TPU cores")
        assert seen == [
            "Seed set to 7",
            "GPU available: False, used: False",
            "TPU available: False, using: 0 TPU cores",
        ]
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    capfd.readouterr()
    with pytest.raises(SystemExit):
        main(["fit", "--trainer.logger=MLFlowLogger", "--trainer.logger.init_args.tracking_uri=nosuch://x"])
    err = capfd.readouterr().err
    assert err.startswith("lit_ddp: error: ") and err.count("\n") == 1, err


def test_a_mixed_precision_fit_prints_its_model_size_without_lightnings_doubt(tmp_path: Path) -> None:
    """Every bf16-mixed run (the ResNet recipes) printed Lightning's warning that the model size is not
    accurate under mixed precision, while the float32 weights it then counts are the ones the run keeps."""
    args = ["fit", "--trainer.accelerator=cpu", *TINY_RUN, "--trainer.precision=bf16-mixed"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "not supported by the model summary" not in result.stderr, result.stderr[-3000:]
    assert re.search(r"trainable parameters, .* MB", result.stdout + result.stderr), result.stdout[-3000:]


def test_a_resumed_fit_does_not_warn_that_its_own_checkpoint_folder_is_not_empty(tmp_path: Path) -> None:
    """Every `fit --ckpt_path=last` (every requeue of a SLURM job) printed Lightning's warning, with its
    source line, that logs/.../version_0/checkpoints "exists and is not empty": the folder of the run it
    resumes, which holds the checkpoint it resumes from."""
    args = ["fit", *CPU, *TINY_RUN, "--trainer.default_root_dir=logs"]
    first = run_cli(args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_cli([*args, "--trainer.max_epochs=2", "--ckpt_path=last"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from logs/lightning_logs/version_0/checkpoints/last.ckpt" in resumed.stderr
    assert "exists and is not empty" not in resumed.stderr, resumed.stderr[-3000:]
