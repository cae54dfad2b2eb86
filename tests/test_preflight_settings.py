"""lit_ddp/preflight/settings.py finds the setting at fault from structure, not from jsonargparse's message.

Each row makes the real CLI raise jsonargparse's ArgumentError, with its text replaced by a meaningless one
before preflight.settings sees it: the line can only come from the command line, the config files, the
parser's keys and the classes' signatures. The lines themselves are the ones tests/test_mistakes.py,
test_cli.py and test_scaffold.py assert through the whole CLI.
"""

import contextlib
import io
from pathlib import Path

import pytest
from conftest import REPO

import lit_ddp.cli as cli
from lit_ddp.models import ImageClassifier
from lit_ddp.preflight import settings

NOTHING_TO_READ = "an error"

# (command line, config files {name: YAML}, the line); {tmp}: the folder of the config files.
CLASSIFIER = "class_path: lit_ddp.models.ImageClassifier"
# Braces doubled: the rows are formatted with the tmp folder.
SHAPES = "--config={{data: {{class_path: lit_ddp.data.ShapesDataModule}}}}"
ROWS = [
    (["fiit"], {}, "unknown command 'fiit': did you mean fit?"),
    (
        ["fit", "--config", "{tmp}/absent.yaml"],
        {},
        "--config: no such file '{tmp}/absent.yaml': check the path",
    ),
    (["fit", "--config", "{tmp}"], {}, "--config: '{tmp}' is a folder, not a file: pass the YAML file in it"),
    (
        ["fit", "--config", "{tmp}/bad.yaml"],
        {"bad.yaml": "trainer:\n  max_epochs: [1,\n"},
        "{tmp}/bad.yaml, line 3, column 1: not valid YAML (while parsing a flow node",
    ),
    (["fit", "--optimizer=SGD"], {}, "there is no --optimizer: the models build their optimizer"),
    (
        ["fit", "--trainer.max_epoch=3"],
        {},
        "unknown option --trainer.max_epoch: did you mean --trainer.max_epochs?",
    ),
    (["fit", "--model.optim.lrr=3"], {}, "unknown option --model.optim.lrr: did you mean --model.optim.lr?"),
    (["fit", "--model.optm.lr=3"], {}, "unknown option --model.optm.lr: did you mean --model.optim.lr?"),
    # An option of another model class: the prefix the model's options share made any look close ("did
    # you mean --model.arch?").
    (
        ["fit", "--model=ArchClassifier", "--model.cuda_graph=true"],
        {},
        "unknown option --model.cuda_graph: ArchClassifier, the model class --model=ArchClassifier chooses,"
        " takes no cuda_graph (see python -m lit_ddp fit --model.help ArchClassifier)",
    ),
    (
        ["fit", "--config", "{tmp}/o.yaml"],
        {"o.yaml": "model:\n  class_path: lit_ddp.models.LeNetCIFAR\n  init_args:\n    optim: {lrr: 3}\n"},
        "{tmp}/o.yaml, line 4: unknown key model.optim.lrr: did you mean model.optim.lr?",
    ),
    (
        ["fit", "--data.augmentation.paddin=3"],
        {},
        "unknown option --data.augmentation.paddin: did you mean --data.augmentation.padding?",
    ),
    (
        ["fit", "--model=ImageClassifier", "--model.net=LeNet", "--model.net.num_classes=5"],
        {},
        "unknown option --model.net.num_classes: num_classes is the first argument of"
        " lit_ddp.models.lenet.LeNet",
    ),
    (["fit", "--model=LeNetCifar"], {}, "--model=LeNetCifar: no such model class: did you mean LeNetCIFAR?"),
    (["fit", "--model=os.system"], {}, "--model=os.system: not an ImageClassifier subclass"),
    (
        ["fit", "--trainer.callbacks+=lit_ddp.callbacks.EMAA"],
        {},
        "--trainer.callbacks=lit_ddp.callbacks.EMAA: no such class (lit_ddp.callbacks has no EMAA):"
        " did you mean lit_ddp.callbacks.EMA?",
    ),
    (
        ["fit", "--config", "{tmp}/ema.yaml"],
        {"ema.yaml": "trainer:\n  callbacks:\n    - class_path: lit_ddp.callbacks.EMAA\n"},
        "{tmp}/ema.yaml, line 2: trainer.callbacks: lit_ddp.callbacks.EMAA: no such class"
        " (lit_ddp.callbacks has no EMAA): did you mean lit_ddp.callbacks.EMA?",
    ),
    (
        ["fit", "--model=ImageClassifier", "--model.net=LeNett"],
        {},
        "--model.net=LeNett: expected a Module class or a function returning one (did you mean LeNet?)",
    ),
    (
        ["fit", "--checkpoint=lit_ddp.callbacks.EMA"],
        {},
        "--checkpoint=lit_ddp.callbacks.EMA: expected a ModelCheckpoint (or a subclass) or null",
    ),
    (
        ["fit", "--model.optim=adam"],
        {},
        "--model.optim=adam: model.optim is a group of settings, not one value",
    ),
    (["fit", "--model=ImageClassifier"], {}, "--model=ImageClassifier needs net: add --model.net=VALUE"),
    (
        ["fit", "--config", "{tmp}/csv.yaml"],
        {"csv.yaml": "trainer:\n  logger:\n    class_path: CSVLogger\n"},
        "{tmp}/csv.yaml, line 2: trainer.logger: CSVLogger needs save_dir: set it under its init_args",
    ),
    (["fit", "--trainer.max_epochs=abc"], {}, "--trainer.max_epochs=abc: expected an integer or null"),
    (["fit", "--dist_timeout=abc"], {}, "--dist_timeout=abc: expected a number"),
    (["validate", "--weights_only=maybe"], {}, "--weights_only=maybe: expected true or false or null"),
    (
        ["fit", "--model.optim.name=sgdd"],
        {},
        "--model.optim.name=sgdd: expected one of sgd, adam, adamw (did you mean sgd?)",
    ),
    # A nested class's argument as the command line spells it, without the init_args a file writes out.
    (
        ["fit", "--model=ImageClassifier", "--model.net=LeNet", "--model.net.batch_nrm=1"],
        {},
        "unknown option --model.net.batch_nrm: did you mean --model.net.batch_norm?",
    ),
    (
        ["fit", "--model=ImageClassifier", "--model.net=LeNet", "--model.net.batch_norm=maybe"],
        {},
        "--model.net.batch_norm=maybe: expected true or false",
    ),
    # A preset given as the group's value: jsonargparse's "Group 'trainer' does not accept option
    # 'trainer.max_epochs'".
    (
        ["fit", "--trainer", "{tmp}/debug.yaml"],
        {"debug.yaml": "trainer:\n  max_epochs: 1\n"},
        "--trainer={tmp}/debug.yaml holds trainer: at its top, as a --config file does: pass it as --config"
        " {tmp}/debug.yaml, or write the file's settings at its top, not under trainer:",
    ),
    # An option given no value (`--model.optim.lr $LR` with LR empty): "argument --model: expected one
    # argument", naming another option; a mistyped one was "unrecognized arguments".
    (
        ["fit", "--model.optim.lr", "--trainer.max_epochs=1"],
        {},
        "--model.optim.lr is given no value: pass --model.optim.lr=VALUE",
    ),
    (
        ["fit", "--trainer.max_epochz"],
        {},
        "unknown option --trainer.max_epochz: did you mean --trainer.max_epochs?",
    ),
    # A class's help asked for by a name that is no such class: the name is at fault, not the option.
    (
        ["fit", "--model.help", "LeNetCifar"],
        {},
        "--model.help=LeNetCifar: no such model class: did you mean LeNetCIFAR?",
    ),
    (
        ["fit", "--data.help=lit_ddp.data.ShapeDataModule"],
        {},
        "--data.help=lit_ddp.data.ShapeDataModule: no such class (lit_ddp.data has no ShapeDataModule): did"
        " you mean lit_ddp.data.ShapesDataModule?",
    ),
    # A recipe's data class replaced on the command line (docs/streaming.md: "any recipe with
    # --data=StreamingDataModule"): jsonargparse drops the recipe's keys the new class does not take, so the
    # line names the mistake, not the recipe's data_dir (it was "c.yaml, line 3: unknown key data.data_dir").
    (
        ["fit", "--config", "{tmp}/c.yaml", "--data=StreamingDataModule", "--data.url=s", "--model.foo=1"],
        {"c.yaml": "data:\n  class_path: lit_ddp.data.CIFAR10DataModule\n  init_args: {data_dir: data/}\n"},
        "unknown option --model.foo:",
    ),
    # A setting of the data or the model before the file that chooses their class: jsonargparse reads it
    # against the base class (a class chosen later is no default), which does not take it ("Parser key
    # "data":", naming nothing).
    (
        ["fit", "--data.strict=true", "--config", "{tmp}/f.yaml"],
        {"f.yaml": "data:\n  class_path: lit_ddp.data.ImageNetDataModule\n  init_args: {data_dir: d}\n"},
        "--data.strict=true comes before --config {tmp}/f.yaml, which chooses the data class"
        " (ImageNetDataModule), and is read as a setting of ImageDataModule, which does not take it: put"
        " --data.strict=true after --config {tmp}/f.yaml",
    ),
    (
        ["fit", "--config", "{tmp}/p.yaml", "--config", "{tmp}/f.yaml"],
        {
            "p.yaml": "data:\n  init_args:\n    strict: true\n",
            "f.yaml": "data:\n  class_path: lit_ddp.data.ImageNetDataModule\n  init_args: {data_dir: d}\n",
        },
        "{tmp}/p.yaml, line 3: data.strict: true comes before --config {tmp}/f.yaml, which chooses the data"
        " class (ImageNetDataModule), and is read as a setting of ImageDataModule, which does not take it:"
        " give --config {tmp}/p.yaml after --config {tmp}/f.yaml",
    ),
    # A config given inline is read as a file is: it said "unknown option --data.train_size: see ... --help",
    # and "Parser key \"model\":" for a value of its own.
    (
        ["fit", "--data.train_size=64", SHAPES],
        {},
        f"--data.train_size=64 comes before {SHAPES}, which chooses the data class (ShapesDataModule), and"
        " is read as a setting of ImageDataModule, which does not take it: put --data.train_size=64 after"
        f" {SHAPES}",
    ),
    (
        ["fit", "--config={{model: {{init_args: {{batch_norm: 3}}}}}}"],
        {},
        "--config={{model: {{init_args: {{batch_norm: 3}}}}}}: model.batch_norm: 3: expected true or false",
    ),
    # A misspelt class_path or init_args: it named no fix, or another argument ("did you mean
    # model.batch_norm?" for init_arg.batch_norm).
    (
        ["fit", "--config", "{tmp}/t.yaml"],
        {"t.yaml": "model:\n  class_pat: lit_ddp.models.LeNetCIFAR\n"},
        "{tmp}/t.yaml, line 2: unknown key model.class_pat: did you mean model.class_path?",
    ),
    (
        ["fit", "--config", "{tmp}/t.yaml"],
        {"t.yaml": "model:\n  class_path: lit_ddp.models.LeNetCIFAR\n  init_arg:\n    batch_norm: true\n"},
        "{tmp}/t.yaml, line 4: unknown key model.init_arg.batch_norm: did you mean"
        " model.init_args.batch_norm?",
    ),
    # A misspelt init_args before an argument the class does not take either: the key spelt right was offered
    # ("did you mean --model.batch_norm?"), which ImageClassifier refuses; its network takes batch_norm.
    (
        ["fit", "--model=ImageClassifier", "--model.net=LeNet", "--model.init_arg.batch_norm=1"],
        {},
        "unknown option --model.init_arg.batch_norm: ImageClassifier, the model class --model=ImageClassifier"
        " chooses, takes no batch_norm: did you mean --model.net.batch_norm?",
    ),
    (
        ["fit", "--config", "{tmp}/t.yaml"],
        {
            "t.yaml": f"model:\n  {CLASSIFIER}\n  init_args: {{net: LeNet}}\n"
            "  init_arg:\n    batch_norm: true\n"
        },
        "{tmp}/t.yaml, line 5: unknown key model.init_arg.batch_norm: ImageClassifier, the model class"
        " {tmp}/t.yaml chooses, takes no batch_norm: did you mean model.init_args.net.init_args.batch_norm?",
    ),
    (
        ["fit", "--model=ImageClassifier", "--model.init_arg.zzz=1"],
        {},
        "unknown option --model.init_arg.zzz: ImageClassifier, the model class --model=ImageClassifier"
        " chooses, takes no zzz (see python -m lit_ddp fit --model.help ImageClassifier)",
    ),
    # An argument the class a file chose does not take: it said "did you mean --data.val_resize?" (a word
    # ending in _size), and without the model's network's argument of that name.
    (
        ["fit", "--config", "{tmp}/f.yaml", "--data.train_size=32"],
        {"f.yaml": "data:\n  class_path: lit_ddp.data.ImageNetDataModule\n  init_args: {data_dir: d}\n"},
        "unknown option --data.train_size: ImageNetDataModule, the data class {tmp}/f.yaml chooses, takes no"
        " train_size (see python -m lit_ddp fit --data.help ImageNetDataModule)",
    ),
    (
        ["fit", "--config", "{tmp}/f.yaml", "--data.val_resiz=256"],
        {"f.yaml": "data:\n  class_path: lit_ddp.data.ImageNetDataModule\n  init_args: {data_dir: d}\n"},
        "unknown option --data.val_resiz: did you mean --data.val_resize?",
    ),
    (
        ["fit", "--model.batch_norm=true", "--config", "{tmp}/n.yaml"],
        {"n.yaml": "model:\n  class_path: lit_ddp.models.ImageClassifier\n  init_args: {net: LeNet}\n"},
        "unknown option --model.batch_norm: ImageClassifier, the model class {tmp}/n.yaml chooses, takes no"
        " batch_norm: did you mean --model.net.batch_norm?",
    ),
    # An argument of another class than the default one: it offered the default's close name ("did you mean
    # --data.val_size?", the size of the validation split), and for a network's help the --help of it all.
    (
        ["fit", "--data.val_resize=3"],
        {},
        "unknown option --data.val_resize: ShapesDataModule, the default data class, takes no val_resize;"
        " ImageNetDataModule, StreamingDataModule take it: choose one first (--data=ImageNetDataModule before"
        " it)",
    ),
    (
        ["fit", "--model.net.help", "LeNet"],
        {},
        "unknown option --model.net.help: LeNetCIFAR, the default model class, takes no net; ImageClassifier"
        " takes it: choose it first (--model=ImageClassifier before it)",
    ),
    (
        ["fit", "--config", "{tmp}/v.yaml"],
        {"v.yaml": "data:\n  val_resize: 3\n"},
        "{tmp}/v.yaml, line 2: unknown key data.val_resize: ShapesDataModule, the default data class, takes"
        " no val_resize; ImageNetDataModule, StreamingDataModule take it: choose one first (class_path:"
        " lit_ddp.data.imagenet.ImageNetDataModule in data:)",
    ),
    # An enum's members by name: it was "expected a Signals (or a subclass) (the classes are Signals)".
    (
        ["fit", "--resilience.requeue_signal=SIGUSR3"],
        {},
        "--resilience.requeue_signal=SIGUSR3: expected one of SIGHUP, SIGINT,",
    ),
]


@pytest.mark.parametrize(
    ("argv", "files", "line"), ROWS, ids=[" ".join(row[0][1:] or row[0]) for row in ROWS]
)
def test_the_line_comes_from_structure_not_the_message(
    argv: list[str], files: dict, line: str, tmp_path: Path, monkeypatch
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    explain = settings.explain
    monkeypatch.setattr(cli, "explain", lambda message, *args: explain(NOTHING_TO_READ, *args))
    with pytest.raises(cli.UserError) as err:
        cli.build_cli([arg.format(tmp=tmp_path) for arg in argv], run=True)
    assert str(err.value).startswith(line.format(tmp=tmp_path)), err.value


def test_a_mistake_no_check_finds_is_jsonargparses_first_line() -> None:
    """Nothing given is at fault here: the line is the message's first one, and where to read more."""
    line = settings.explain("Problem one\n  details\n", ["fit"], [], {}, "python -m lit_ddp")
    assert line == "Problem one (see python -m lit_ddp fit --help)"


def test_the_module_reads_no_message_text() -> None:
    assert "import re\n" not in Path(settings.__file__).read_text()


def test_no_check_finds_fault_with_the_recipes_and_presets(monkeypatch) -> None:
    """Every setting of the shipped configs fits its key, class and type: a check that flagged one would name
    a setting that is not at fault in place of jsonargparse's line."""
    from jsonargparse import ArgumentError
    from lightning.pytorch.cli import LightningCLI

    def refuse(self, parser, args) -> None:
        raise ArgumentError(None, "refused")

    monkeypatch.setattr(LightningCLI, "parse_arguments", refuse)
    configs = sorted((REPO / "configs").glob("*.yaml"))
    presets = sorted((REPO / "configs" / "presets").glob("*.yaml"))
    runs = [[str(c)] for c in configs] + [[str(configs[0]), str(p)] for p in presets]
    for files in runs:
        with pytest.raises(cli.UserError) as err:
            cli.build_cli(["fit", *(arg for f in files for arg in ("--config", f))], run=True)
        assert str(err.value).startswith("refused (see "), (files, err.value)


RECIPES = [None, *sorted(p.name for p in (REPO / "configs").glob("*.yaml"))]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r or "default")
@pytest.mark.parametrize("command", ["fit", "validate", "test", "predict"])
def test_no_check_finds_fault_with_any_config_print_config_writes(
    monkeypatch, tmp_path: Path, command: str, recipe: str | None
) -> None:
    """What `COMMAND [--config RECIPE] --print_config` writes holds every default setting of that command:
    the file a user edits. A check that flagged one put every mistake of the file on that setting (a
    Signals value, requeue_signal: SIGUSR1, read as a class name), or ended in a traceback."""
    from jsonargparse import ArgumentError
    from lightning.pytorch.cli import LightningCLI

    args = [command, *(["--config", str(REPO / "configs" / recipe)] if recipe else [])]
    args += [] if command == "fit" else ["--ckpt_path=untrained"]
    printed = tmp_path / "printed.yaml"
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit) as done:
        cli.main([*args, "--print_config"])
    assert done.value.code in (0, None)
    printed.write_text(out.getvalue())

    def refuse(self, parser, args) -> None:
        raise ArgumentError(None, "refused")

    monkeypatch.setattr(LightningCLI, "parse_arguments", refuse)
    with pytest.raises(cli.UserError) as err:
        cli.build_cli([command, "--config", str(printed)], run=True)
    assert str(err.value).startswith("refused (see "), err.value


# A class_path into a module of the user's that exists but fails to import: it said "check the import path
# (package.module.Class)" for a package the module imports that is not installed, and for any other exception
# the explanation itself ended in that exception's traceback.
BROKEN_MODULES = [
    ("import not_installed_pkg_x\n", "it imports not_installed_pkg_x, which is not installed", 1),
    ("x = 1\nundefined_name_x\n", "NameError: name 'undefined_name_x' is not defined", 2),
    ("class Net(\n", "SyntaxError: ", 1),
]


@pytest.mark.parametrize(("source", "line", "lineno"), BROKEN_MODULES, ids=["missing", "raises", "syntax"])
def test_a_class_in_a_module_that_fails_to_import_names_why_and_where(
    source: str, line: str, lineno: int, tmp_path: Path, monkeypatch
) -> None:
    (tmp_path / "brokenmod_x.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    explain = settings.explain
    monkeypatch.setattr(cli, "explain", lambda message, *args: explain(NOTHING_TO_READ, *args))
    with pytest.raises(cli.UserError) as err:
        cli.build_cli(["fit", "--model=ImageClassifier", "--model.net=brokenmod_x.Net"], run=True)
    where = f"({tmp_path / 'brokenmod_x.py'}, line {lineno})"
    assert str(err.value).startswith(f"--model.net=brokenmod_x.Net: brokenmod_x cannot be imported: {line}")
    assert where in str(err.value), err.value


class AnImportedSubclass(ImageClassifier):
    """What a project (or another test module) imports: a subclass that takes ImageClassifier's net."""


class _PrivateClassifier(ImageClassifier):
    """A private helper class, never one to choose."""


def test_an_argument_of_another_class_names_the_first_class_that_takes_it_not_its_subclasses() -> None:
    """The subclasses imported beside lit_ddp's own (a project's, a test's) take net from ImageClassifier:
    the line names ImageClassifier alone to choose, as on a bare install."""
    with pytest.raises(cli.UserError) as err:
        cli.build_cli(["fit", "--model.net.help", "LeNet"], run=True)
    assert str(err.value).endswith(
        "takes no net; ImageClassifier takes it: choose it first (--model=ImageClassifier before it)"
    ), err.value
