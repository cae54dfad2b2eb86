"""Mistakes that were tracebacks (and left a half-made run folder): one line each, and nothing left behind."""

import importlib.util
import sys
import traceback
from pathlib import Path

import pytest
from conftest import TINY_RUN, run_cli
from lightning import Callback
from test_mistakes import one_error_line
from torch import nn

from lit_ddp.cli import main
from lit_ddp.data import ShapesDataModule
from lit_ddp.errors import constructor_failure, exception_chain

sys.path.insert(0, str(Path(__file__).parent))
from imagenet_tree import make_tree  # noqa: E402


@pytest.mark.parametrize("value", [".inf", ".nan", "-0.1", "1.5"])
def test_a_label_smoothing_outside_0_to_1_is_one_line(tmp_path: Path, capsys, value: str) -> None:
    """`--model.label_smoothing=.inf` was a traceback from torch at the first step."""
    root = f"--trainer.default_root_dir={tmp_path}"
    line = one_error_line(capsys, ["fit", *TINY_RUN, f"--model.label_smoothing={value}", root])
    assert line.startswith("--model.label_smoothing=") and line.endswith(
        "must be between 0 and 1 (0.1 is usual)"
    )
    assert not list(tmp_path.iterdir())  # no run folder, no lock, nothing


def _images_64px(root: Path) -> list[str]:
    """An ImageFolder tree whose crops are 64 px, for LeNet (built for 32): fit's and doctor's arguments."""
    make_tree(root, train_per_class=8, val_per_class=4)
    return [
        "--model=LeNetCIFAR",
        "--data=ImageNetDataModule",
        f"--data.data_dir={root}",
        "--data.image_size=64",
        "--data.val_resize=64",
        "--data.batch_size=4",
        "--data.num_workers=0",
    ]


TOO_LARGE = (
    "LeNet cannot take the data's 3×64×64 images (",
    "give the data the image size the network is built for (--data.image_size), or choose a network for this"
    " size",
)


def test_images_of_a_size_the_network_cannot_take_are_one_line(tmp_path: Path, capsys) -> None:
    """64-pixel images into LeNet (built for 32): `mat1 and mat2 shapes cannot be multiplied`, 60 lines."""
    root = tmp_path / "runs"
    argv = [
        "fit",
        *_images_64px(tmp_path / "data"),
        "--trainer.max_epochs=1",
        "--trainer.enable_progress_bar=false",
    ]
    line = one_error_line(capsys, [*argv, f"--trainer.default_root_dir={root}"])
    assert line.startswith(TOO_LARGE[0]) and line.endswith(TOO_LARGE[1])
    assert not list(root.rglob("*"))  # the failed start left no run folder behind, not even an empty one


@pytest.mark.parametrize(
    ("arg", "option", "base"),
    [
        ("--model=os.system", "--model", "ImageClassifier"),
        ("--model.class_path=os.system", "--model", "ImageClassifier"),
        ("--data=os.system", "--data", "ImageDataModule"),
    ],
)
def test_a_class_path_naming_something_else_says_why_it_is_refused(
    tmp_path: Path, capsys, arg: str, option: str, base: str
) -> None:
    """`--model=os.system` was refused (nothing ran) with "expected null", which says nothing of why."""
    line = one_error_line(capsys, ["fit", arg, f"--trainer.default_root_dir={tmp_path}"])
    assert line.startswith(f"{option}=os.system: not an {base} subclass, so it is not used (nothing was run)")


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        (
            "--trainer.callbacks+=lit_ddp.callbacks.EMAA",
            "--trainer.callbacks=lit_ddp.callbacks.EMAA: no such class (lit_ddp.callbacks has no EMAA):"
            " did you mean lit_ddp.callbacks.EMA?",
        ),
        (
            "--checkpoint=lightning.pytorch.callbacks.ModelCheckpointt",
            "--checkpoint=lightning.pytorch.callbacks.ModelCheckpointt: no such class"
            " (lightning.pytorch.callbacks has no ModelCheckpointt): did you mean"
            " lightning.pytorch.callbacks.ModelCheckpoint?",
        ),
        (
            "--trainer.callbacks+=nosuchpkg.Probe",
            "--trainer.callbacks=nosuchpkg.Probe: no such class (no module nosuchpkg): check the import path"
            " (package.module.Class)",
        ),
        (
            "--model=lit_ddp.models.LeNetCifar",
            "--model=lit_ddp.models.LeNetCifar: no such class (lit_ddp.models has no LeNetCifar): did you"
            " mean lit_ddp.models.LeNetCIFAR?",
        ),
    ],
)
def test_a_class_path_that_does_not_import_is_named_with_the_closest_class(
    tmp_path: Path, capsys, arg: str, expected: str
) -> None:
    """A misspelt callback class was "--trainer.callbacks=lit_ddp.callbacks.EMAA: expected null", and a
    misspelt model class "not an ImageClassifier subclass": neither said that no such class exists."""
    assert one_error_line(capsys, ["fit", arg, f"--trainer.default_root_dir={tmp_path}"]) == expected


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        (
            "--checkpoint=lit_ddp.callbacks.EMA",
            "--checkpoint=lit_ddp.callbacks.EMA: expected a ModelCheckpoint (or a subclass) or null",
        ),
        (
            "--checkpoint=ModelCheckpointt",
            "--checkpoint=ModelCheckpointt: expected a ModelCheckpoint (or a subclass) or null"
            " (did you mean ModelCheckpoint?)",
        ),
        (
            "--trainer.logger=lit_ddp.callbacks.EMA",
            "--trainer.logger=lit_ddp.callbacks.EMA: expected a Logger (or a subclass) or a list of"
            " Logger or true or false or null",
        ),
        # The abstract Logger was the suggestion for a name near none: the loggers there are, instead.
        (
            "--trainer.logger=NoSuchThing",
            "--trainer.logger=NoSuchThing: expected a Logger (or a subclass) or a list of Logger or true or"
            " false or null (the classes are CSVLogger,",
        ),
        (
            "--trainer.callbacks=lit_ddp.models.LeNet",
            "--trainer.callbacks=lit_ddp.models.LeNet: expected a list of Callback or a Callback (or a"
            " subclass) or null",
        ),
    ],
)
def test_a_class_of_the_wrong_kind_names_the_kinds_accepted(
    tmp_path: Path, capsys, arg: str, expected: str
) -> None:
    """`--checkpoint=lit_ddp.callbacks.EMA` (a class that imports but is no ModelCheckpoint) said only
    "expected null", as if null were the one thing the option takes."""
    line = one_error_line(capsys, ["fit", arg, f"--trainer.default_root_dir={tmp_path}"])
    assert line.startswith(expected) if expected.endswith(",") else line == expected
    assert "did you mean Logger?" not in line and " Logger," not in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--model=ImageClassifier"],
            "--model=ImageClassifier needs net: add --model.net=VALUE",
        ),
        (
            ["--trainer.logger=CSVLogger"],
            "--trainer.logger=CSVLogger needs save_dir: add --trainer.logger.save_dir=VALUE",
        ),
        (
            ["--trainer.callbacks+=EarlyStopping"],
            "--trainer.callbacks=EarlyStopping needs monitor: add --trainer.callbacks.monitor=VALUE",
        ),
    ],
)
def test_a_class_without_an_argument_it_requires_names_the_argument(
    tmp_path: Path, capsys, args: list[str], expected: str
) -> None:
    """`--model=ImageClassifier` without `--model.net` said "--model=Namespace(class_path=..., <every
    argument>): not an ImageClassifier subclass", and `--trainer.logger=CSVLogger` without a save_dir the
    same dump ending in "expected ... or null": neither named the missing argument."""
    line = one_error_line(capsys, ["fit", *args, *TINY_RUN, f"--trainer.default_root_dir={tmp_path}"])
    assert line == expected
    assert not list(tmp_path.iterdir())


def test_a_class_in_a_config_file_without_an_argument_it_requires_names_the_file_and_line(
    tmp_path: Path, capsys
) -> None:
    config = tmp_path / "csv.yaml"
    config.write_text("trainer:\n  logger:\n    class_path: CSVLogger\n")
    line = one_error_line(capsys, ["fit", "--config", str(config), *TINY_RUN])
    assert line == f"{config}, line 2: trainer.logger: CSVLogger needs save_dir: set it under its init_args"


def test_doctor_with_a_workdir_it_cannot_create_is_one_line(tmp_path: Path, capsys) -> None:
    """`doctor --workdir PATH` on a path it could not create was a traceback from inside the check runs."""
    (tmp_path / "a_file").write_text("")
    workdir = tmp_path / "a_file" / "runs"
    line = one_error_line(capsys, ["doctor", "--workdir", str(workdir), *TINY_RUN])
    assert line == f"cannot create the workdir {workdir} (Not a directory): pass another one"


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_doctor_on_images_of_a_size_the_network_cannot_take_prints_one_line(tmp_path: Path) -> None:
    """The same 64-pixel images through `doctor`: the line comes from inside a check rank (relayed, not
    wrapped in the launcher's LaunchError), and stderr held Lightning's GPU/TPU/seed lines before it, from a
    Trainer the doctor builds only to read its settings."""
    args = ["doctor", "--checks=grads", *_images_64px(tmp_path / "data")]
    proc = run_cli(args, cwd=tmp_path / "cwd", timeout=560)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()  # exactly one line, no traceback, nothing before it
    assert line.startswith("lit_ddp: error: " + TOO_LARGE[0]) and line.endswith(TOO_LARGE[1])
    assert proc.stdout.splitlines()[0].startswith(
        "python -m lit_ddp doctor: LeNetCIFAR on ImageNetDataModule"
    )
    assert len(proc.stdout.splitlines()) == 1  # the header only: no table, no verdict


def test_the_bar_counts_epochs_from_1_after_a_mid_epoch_resume(tmp_path: Path, monkeypatch) -> None:
    """After a mid-epoch resume Lightning's rich bar made its task at a batch end, reading "Epoch 0/0"."""
    from conftest import REPO
    from lightning import Callback

    from lit_ddp.callbacks.console import RichBar
    from lit_ddp.cli import build_cli, main

    monkeypatch.syspath_prepend(str(REPO / "tests"))  # fault_probe, for --trainer.callbacks
    args = [
        *TINY_RUN,
        "--data.train_size=128",
        "--trainer.max_epochs=2",
        "--resilience.check_every_n_batches=1",
    ]
    args = [a for a in args if a != "--trainer.enable_progress_bar=false"]
    root = f"--trainer.default_root_dir={tmp_path}"
    probe = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigterm"]
    with pytest.raises(SystemExit):
        main(["fit", *args, *probe, "--trainer.callbacks.at_step=5", root])  # epoch 2, after 2 of 4 batches
    seen: list[str] = []

    class Read(Callback):
        def on_validation_start(self, trainer, pl_module) -> None:
            bar = trainer.progress_bar_callback
            task = next(t for t in bar.progress.tasks if t.id == bar.train_progress_bar_id)
            seen.append(str(task.description))

    cli = build_cli([*args, root], run=False)
    assert isinstance(cli.trainer.progress_bar_callback, RichBar)
    cli.trainer.callbacks.append(Read())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=str(next(tmp_path.rglob("last.ckpt"))))
    assert cli.trainer.global_step == 8 and [s.strip() for s in seen] == ["Epoch 2/2"]


class BrokenCallback(Callback):
    """A user's own class whose constructor has a bug: its traceback is what its author needs."""

    def __init__(self) -> None:
        raise TypeError("a bug in the user's own code")


@pytest.mark.parametrize(
    "logger, says",
    [
        ("WandbLogger", "WandbLogger could not be created: ModuleNotFoundError: Requirement 'wandb"),
        (
            "MLFlowLogger",  # a file store, without the opt-in MLflow 3 asks for
            "MLFlowLogger could not be created: MlflowException: ",
        ),
    ],
)
def test_a_logger_that_cannot_be_created_is_one_line_with_its_own_reason(
    tmp_path: Path, capsys, monkeypatch, logger: str, says: str
) -> None:
    """A logger whose package is missing, or whose tracking store refuses, was 88 lines of jsonargparse's
    union errors and tracebacks."""
    if logger == "WandbLogger" and importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    if logger == "MLFlowLogger":
        pytest.importorskip("mlflow")
        monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    args = [f"--trainer.logger={logger}", f"--trainer.default_root_dir={tmp_path}"]
    if logger == "MLFlowLogger":
        args.append(f"--trainer.logger.init_args.tracking_uri=file:{tmp_path / 'mlruns'}")
    line = one_error_line(capsys, ["fit", *TINY_RUN, *args])
    assert line.startswith(says), line
    assert not list(tmp_path.iterdir())


class BrokenNet(nn.Module):
    """A user's network whose constructor has a bug; ImageClassifier, lit_ddp's, builds it."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        raise TypeError("a bug in the user's own network")


class BrokenData(ShapesDataModule):
    """A user's data module whose constructor raises, beneath a function of its own."""

    def __init__(
        self, train_size: int = 64, val_size: int = 16, test_size: int = 16, batch_size: int = 32
    ) -> None:
        super().__init__(train_size=train_size, val_size=val_size, test_size=test_size, batch_size=batch_size)
        _check_shapes()


def _check_shapes() -> None:
    raise RuntimeError("a bug in the user's own data module")


# The network's: it was "ImageClassifier could not be created: TypeError: ...", without where it failed. Each
# traceback ended in jsonargparse's "Does not validate against any of the Union subtypes ... Given value:
# Namespace(...)", the user's own error in the middle.
@pytest.mark.parametrize(
    ("args", "raised"),
    [
        ([f"--trainer.callbacks+={__name__}.BrokenCallback"], TypeError),
        (["--model=ImageClassifier", f"--model.net={__name__}.BrokenNet"], TypeError),
        ([f"--config={{data: {{class_path: {__name__}.BrokenData}}}}"], RuntimeError),
    ],
    ids=["callback", "network", "data"],
)
def test_a_class_of_the_users_own_that_fails_to_build_keeps_its_traceback(
    capsys, args: list[str], raised: type
) -> None:
    with pytest.raises(raised) as err:
        main(["fit", *args, *TINY_RUN])  # the data class before its settings
    assert constructor_failure(err.value) is None
    assert "a bug in the user's own" in str(exception_chain(err.value)[-1])
    # The traceback as Python prints it ends with the user's exception, raised in the user's code.
    printed = "".join(traceback.format_exception(err.value))
    assert printed.splitlines()[-1].startswith(f"{raised.__name__}: a bug in the user's own"), printed
    assert err.traceback[-1].path == Path(__file__) and "Union subtypes" not in printed, printed


EARLY_STOPPING = ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.mode=max"]


def test_an_early_stopping_monitor_the_run_does_not_log_is_one_line_naming_those_it_does(
    tmp_path: Path, capsys
) -> None:
    """`--trainer.callbacks.monitor=val/accuracy` (a typo of val/acc) was Lightning's RuntimeError, a
    traceback, at the first epoch's end; a ModelCheckpoint's was one line already."""
    typo = [*EARLY_STOPPING, "--trainer.callbacks.monitor=val/accuracy"]
    line = one_error_line(capsys, ["fit", *TINY_RUN, *typo, f"--trainer.default_root_dir={tmp_path}"])
    assert line.startswith("EarlyStopping(monitor='val/accuracy'): the run logs no val/accuracy"), line
    assert "val/acc, " in line and line.endswith("(--trainer.callbacks.monitor, or monitor: in YAML)"), line


def test_another_error_of_a_run_with_early_stopping_is_not_taken_for_its_monitor(tmp_path: Path) -> None:
    """Before the first validation no metric is logged, so no monitor is found: an error raised there is the
    run's own, with its traceback."""
    sys.path.insert(0, str(Path(__file__).parent / "helpers"))  # fault_probe, for --trainer.callbacks
    probe = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=raise"]
    watch = [*EARLY_STOPPING, "--trainer.callbacks.monitor=val/acc"]
    with pytest.raises(RuntimeError, match="fault_probe: injected error"):
        main(
            [
                "fit",
                *TINY_RUN,
                *watch,
                *probe,
                "--trainer.callbacks.at_step=0",
                f"--trainer.default_root_dir={tmp_path}",
            ]
        )


UNUSED_NET = """
from torch import nn


class UnusedNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.head = nn.Linear(3, num_classes)
        self.aux = nn.Linear(3, num_classes)  # in no forward

    def forward(self, x):
        return self.head(x.mean(dim=(2, 3)))
"""


@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_find_unused_parameters_true"])
def test_a_parameter_the_loss_does_not_reach_is_one_line_under_ddp(tmp_path: Path, strategy: str) -> None:
    """A network with a layer its forward never calls trained on 1 device, and on 2 each rank printed DDP's
    reducer traceback at the second step. One line names the parameters; the strategy that looks for unused
    parameters trains it."""
    (tmp_path / "unused_net.py").write_text(UNUSED_NET)
    args = [
        "fit",
        *TINY_RUN,
        "--data.batch_size=16",
        "--model=ImageClassifier",
        "--model.net=unused_net.UnusedNet",
    ]
    args += ["--trainer.accelerator=cpu", "--trainer.devices=2", f"--trainer.strategy={strategy}"]
    result = run_cli(args, tmp_path / "run", env={"PYTHONPATH": str(tmp_path)})
    if strategy != "ddp":
        assert result.returncode == 0, result.stderr[-3000:]
        return
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("lit_ddp: error: ")]
    assert errors == [
        "lit_ddp: error: net.aux.weight, net.aux.bias took no part in the loss, and DDP waits for every"
        " parameter's gradient: use them in forward, freeze them (requires_grad=False) or remove them, or"
        " pass --trainer.strategy=ddp_find_unused_parameters_true (slower: DDP searches the graph each step)"
    ], result.stderr[-3000:]
