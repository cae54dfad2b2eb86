"""What a checkpoint says is data: it names no code to import, and it is not scored as another model."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_RUN, cli_env
from test_mistakes import one_error_line
from test_preflight import FORMS

from lit_ddp.cli import build_cli
from lit_ddp.errors import UserError


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fit")
    build_cli(["fit", *TINY_RUN, "--trainer.limit_val_batches=1", f"--trainer.default_root_dir={root}"])
    return next(root.rglob("last.ckpt"))


def _edited(ckpt: Path, dest: Path, **hparams) -> Path:
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["hyper_parameters"].update(hparams)
    torch.save(checkpoint, dest)
    return dest


COMPOSED = "lit_ddp.models.ImageClassifier"


@pytest.mark.parametrize(
    ("hparams", "named", "key"),
    [
        ({"_class_path": "helpers.LeNetCIFAR"}, "helpers.LeNetCIFAR", "_class_path"),
        ({"_class_path": "this.Nope"}, "this.Nope", "_class_path"),
        # a dotted string given to the composed classifier's Callable `net` imports (and calls) it too
        ({"_class_path": COMPOSED, "net": "helpers.make_net"}, "helpers.make_net", "net"),
        # and so does a string jsonargparse reads as YAML or JSON, or as a YAML file's path
        ({"_class_path": COMPOSED, "net": "class_path: helpers.Net"}, "helpers.Net", "net.class_path"),
        ({"_class_path": COMPOSED, "net": '{"class_path": "helpers.Net"}'}, "helpers.Net", "net.class_path"),
        ({"_class_path": COMPOSED, "net": "net.yaml"}, "helpers.Net", "net.class_path"),
        # the other forms, through the same check (test below), once through the command line
        FORMS[-1],
    ],
)
def test_a_checkpoint_naming_code_imports_nothing(
    ckpt: Path, tmp_path: Path, monkeypatch, capsys, hparams: dict, named: str, key: str
) -> None:
    """`_class_path: helpers.LeNetCIFAR` with a helpers.py in the working directory ran helpers.py, then a
    traceback; `this.Nope` printed the Zen of Python and 5 tracebacks; `net: "class_path: helpers.Net"` (or
    its JSON, or a file holding it) imported helpers.py and built helpers.Net."""
    (tmp_path / "helpers.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    (tmp_path / "net.yaml").write_text("class_path: helpers.Net\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` puts the working directory first
    monkeypatch.delitem(sys.modules, "this", raising=False)
    # tests/helpers/ is a package the other test files import as `helpers`: forget it, so that only an
    # import of the user's helpers.py could put the name back
    monkeypatch.delitem(sys.modules, "helpers", raising=False)
    bad = _edited(ckpt, tmp_path / "model.ckpt", **hparams)
    line = one_error_line(
        capsys, ["predict", *TINY_RUN, f"--ckpt_path={bad}", f"--trainer.default_root_dir={tmp_path}"]
    )
    assert line.startswith(f"{bad} names {named} (hyper_parameters.{key}), which is not lit_ddp's")
    assert "it is not imported (a checkpoint must not run code); if you trust the file" in line
    # the option that names it on purpose: the model's class, or the composed model's network
    fix = {"_class_path": "--model", "net": f"--model={COMPOSED} --model.net"}
    fix["net.class_path"] = fix["net"]
    if key in fix:
        assert line.endswith(f"name the class yourself: {fix[key]}={named}")
    assert not (tmp_path / "ran").exists() and "helpers" not in sys.modules and "this" not in sys.modules
    assert not list(tmp_path.rglob("predictions.csv"))


def test_a_checkpoint_of_lit_ddps_classes_or_a_class_the_command_names_loads(
    ckpt: Path, tmp_path: Path
) -> None:
    cli = build_cli(["validate", *TINY_RUN, f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path}"])
    assert 0.0 <= float(cli.trainer.callback_metrics["val/acc"]) <= 1.0


def test_validating_another_models_checkpoint_with_the_default_model_named_is_refused(
    ckpt: Path, tmp_path: Path, capsys
) -> None:
    """`validate --ckpt_path=<a ResNet checkpoint> --model=LeNetCIFAR` scored the ResNet with no word: the
    model named was the default one, which the check took for no --model at all."""
    resnet = _edited(ckpt, tmp_path / "resnet.ckpt", _class_path="lit_ddp.models.ArchClassifier")
    root = f"--trainer.default_root_dir={tmp_path}"
    line = one_error_line(
        capsys, ["validate", *TINY_RUN, f"--ckpt_path={resnet}", "--model=LeNetCIFAR", root]
    )
    assert line == (
        f"--model=LeNetCIFAR, but {resnet} holds an ArchClassifier: leave --model out (the checkpoint decides"
        " the model) or pass a LeNetCIFAR checkpoint"
    )
    # Its own class named, by short name or in full, is the checkpoint's: it is scored.
    for named in ("LeNetCIFAR", "lit_ddp.models.LeNetCIFAR"):
        cli = build_cli(["validate", *TINY_RUN, f"--ckpt_path={ckpt}", f"--model={named}", root])
        assert "val/acc" in cli.trainer.callback_metrics


def test_model_settings_without_a_class_leave_the_class_to_the_checkpoint(
    ckpt: Path, tmp_path: Path, caplog
) -> None:
    """A recipe's `model:` with settings alone picks no class: a project whose default model is another
    class validates a LeNetCIFAR checkpoint, naming the setting the checkpoint replaces, instead of refusing
    `--model=ArchClassifier, but ... holds a LeNetCIFAR` for a --model nobody gave."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model:\n  init_args:\n    optim:\n      lr: 0.5\n")
    args = ["validate", f"--config={recipe}", *TINY_RUN, f"--ckpt_path={ckpt}"]
    with caplog.at_level("INFO"):
        cli = build_cli(
            [*args, f"--trainer.default_root_dir={tmp_path}"], model="lit_ddp.models.ArchClassifier"
        )
    assert type(cli.model).__name__ == "LeNetCIFAR" and "val/acc" in cli.trainer.callback_metrics
    note = f"lit_ddp: note: {ckpt} keeps the model settings it was trained with, over --model.optim.lr=0.5"
    assert any(message.startswith(note) for message in caplog.messages), caplog.messages


def test_a_checkpoint_that_does_not_fit_points_to_its_runs_config(ckpt: Path, tmp_path: Path, capsys) -> None:
    """The advice was "pass the same --model and --model.* options", which cannot fix a 5-class head (the
    data decides num_classes); the run's config.yaml can."""
    checkpoint = torch.load(ckpt, weights_only=True)
    for key, value in list(checkpoint["state_dict"].items()):
        if value.shape[:1] == (10,):
            checkpoint["state_dict"][key] = value[:5]
    mismatched = ckpt.parent / "five_classes.ckpt"
    torch.save(checkpoint, mismatched)
    try:
        root = f"--trainer.default_root_dir={tmp_path}"
        line = one_error_line(capsys, ["validate", *TINY_RUN, f"--ckpt_path={mismatched}", root])
    finally:
        mismatched.unlink()
    assert line.startswith(f"checkpoint {mismatched} does not fit LeNetCIFAR: 2 tensors of another shape")
    config = ckpt.parent.parent / "config.yaml"
    assert line.endswith(
        f": run with --config {config}, the settings it was trained with (your own options after it)"
    )


# A fresh interpreter that never imports lit_ddp's CLI or runtime, as a notebook or a user's own script:
# the module built in Python, trained, saved, loaded back with torch's default weights-only load, resumed.
PYTHON_API_RUN = """
import sys
from pathlib import Path
from lightning import Trainer
from lit_ddp.data import ShapesDataModule
from lit_ddp.models import LeNetCIFAR, OptimConfig

root = Path(sys.argv[1])
def trainer(epochs):
    return Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=root)
data = ShapesDataModule(train_size=64, val_size=16, test_size=16, batch_size=32)
first = trainer(1)
first.fit(LeNetCIFAR(optim=OptimConfig(lr=2e-3, schedule="constant")), data)
first.save_checkpoint(root / "python.ckpt")

model = LeNetCIFAR.load_from_checkpoint(root / "python.ckpt")
assert model.optim == OptimConfig(lr=2e-3, schedule="constant"), model.optim
resumed, ckpt = trainer(2), root / "python.ckpt"
resumed.fit(model, ShapesDataModule.load_from_checkpoint(ckpt), ckpt_path=ckpt)
assert resumed.global_step == 4, resumed.global_step
assert not [m for m in sys.modules if m.startswith(("lit_ddp.cli", "lit_ddp.runtime"))]
"""


@pytest.mark.timeout(120)
def test_python_saves_loads_and_resumes_a_checkpoint_without_lit_ddps_cli(tmp_path: Path) -> None:
    # The hyperparameters went in as lit_ddp's OptimConfig, which a weights-only load refuses unless the
    # process allow-listed it (lit_ddp's CLI does; a notebook does not).
    run = subprocess.run(
        [sys.executable, "-c", PYTHON_API_RUN, str(tmp_path)],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "python.ckpt") == []


def test_a_cli_checkpoint_holds_only_data_that_torch_loads_without_an_allow_list(ckpt: Path) -> None:
    assert torch.serialization.get_unsafe_globals_in_checkpoint(ckpt) == []


def test_a_path_given_to_a_data_module_is_kept_as_its_string(tmp_path: Path) -> None:
    from lit_ddp.data import ImageDataModule

    class Folder(ImageDataModule):  # a user's data module, given a Path from Python
        def __init__(self, data_dir: Path, **kwargs) -> None:
            super().__init__(**kwargs)

    assert Folder(tmp_path).hparams["data_dir"] == str(tmp_path)


def test_data_given_to_a_data_module_is_not_saved_as_a_setting(tmp_path: Path) -> None:
    """A user's data module given its images as tensors (the benchmark's in-memory CIFAR): saved as settings,
    the logger wrote all 50,000 images into hparams.yaml as YAML before the first batch (over 140 s on an
    H200) and each checkpoint held the dataset. The settings beside them are kept."""
    import numpy as np
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch.utils.data import TensorDataset

    from lit_ddp.data import ImageDataModule

    class InMemory(ImageDataModule):
        def __init__(self, images: torch.Tensor, labels: np.ndarray, extra: TensorDataset, **kwargs) -> None:
            super().__init__(**kwargs)

    images = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
    dm = InMemory(images, np.zeros(4), TensorDataset(images), batch_size=3)
    assert dm.hparams["batch_size"] == 3 and not {"images", "labels", "extra"} & set(dm.hparams)
    assert not {"images", "labels", "extra"} & set(dm.hparams_initial)
    logger = TensorBoardLogger(tmp_path)  # as Trainer.fit logs a data module's settings
    logger.log_hyperparams(dm.hparams_initial)
    logger.save()
    saved = (Path(logger.log_dir) / "hparams.yaml").read_text()
    assert "batch_size: 3" in saved and "images" not in saved


def _saved_from_python(model, path: Path) -> Path:
    from lightning import Trainer

    trainer = Trainer(logger=False, accelerator="cpu")
    trainer.strategy.connect(model)
    trainer.save_checkpoint(path)
    return path


def test_a_network_class_given_from_python_is_saved_by_name_and_found_again_only_if_imported(
    tmp_path: Path,
) -> None:
    from lit_ddp.models import ImageClassifier, LeNet

    composed = _saved_from_python(ImageClassifier(net=LeNet, num_classes=4), tmp_path / "composed.ckpt")
    assert torch.serialization.get_unsafe_globals_in_checkpoint(composed) == []
    again = ImageClassifier.load_from_checkpoint(composed)
    assert isinstance(again.net, LeNet) and again.net(torch.zeros(1, 3, 32, 32)).shape == (1, 4)

    elsewhere = _edited(composed, tmp_path / "elsewhere.ckpt", net="notebook_code.Net")
    with pytest.raises(
        UserError, match="^the checkpoint's network is notebook_code.Net, which is not imported"
    ):
        ImageClassifier.load_from_checkpoint(elsewhere)
    assert "notebook_code" not in sys.modules


def test_the_cli_takes_a_checkpoint_saved_from_python_as_the_model_it_names(tmp_path: Path, capsys) -> None:
    """A checkpoint saved by Trainer.fit in a script names no class with its settings; with --model given,
    jsonargparse read them as the base class ImageClassifier's: a traceback ("'batch_norm' is not
    accepted") for `validate --model=LeNetCIFAR --ckpt_path=...`."""
    from lit_ddp.models import ImageClassifier, LeNet, LeNetCIFAR, OptimConfig

    lenet = _saved_from_python(LeNetCIFAR(optim=OptimConfig(lr=2e-3)), tmp_path / "lenet.ckpt")
    composed = _saved_from_python(ImageClassifier(net=LeNet, label_smoothing=0.1), tmp_path / "composed.ckpt")
    root = f"--trainer.default_root_dir={tmp_path}"
    for model in ([], ["--model=LeNetCIFAR"]):
        cli = build_cli(["validate", *TINY_RUN, f"--ckpt_path={lenet}", *model, root])
        assert type(cli.model) is LeNetCIFAR and cli.model.optim.lr == 2e-3
    picks = ["--model=ImageClassifier", "--model.net=LeNet"]
    cli = build_cli(["validate", *TINY_RUN, f"--ckpt_path={composed}", *picks, root])
    assert isinstance(cli.model.net, LeNet) and cli.model.label_smoothing == 0.1

    line = one_error_line(capsys, ["validate", *TINY_RUN, f"--ckpt_path={composed}", root])
    assert line.startswith(f"checkpoint {composed} was saved from Python, and its settings (")
    assert line.endswith("do not fit lit_ddp.models.LeNetCIFAR: pass --model=<the class it was saved from>")


def test_the_base_class_loads_a_cli_checkpoint_of_a_subclass_as_that_subclass(tmp_path: Path) -> None:
    """`ImageClassifier.load_from_checkpoint` on a `--model=LeNetCIFAR` run's checkpoint stopped on
    jsonargparse's "the following arguments are required: module.net": Lightning drops the class the
    checkpoint names for a class without **kwargs before it builds one, and built the base class."""
    from lit_ddp.data import ImageDataModule, ShapesDataModule
    from lit_ddp.models import ImageClassifier, LeNetCIFAR

    build_cli(["fit", *TINY_RUN, f"--trainer.default_root_dir={tmp_path}"])
    ckpt = next(tmp_path.rglob("last.ckpt"))
    model = ImageClassifier.load_from_checkpoint(ckpt)
    assert type(model) is LeNetCIFAR
    saved = torch.load(ckpt, weights_only=True)["state_dict"]
    assert all(torch.equal(model.state_dict()[key], value) for key, value in saved.items())
    assert type(ImageDataModule.load_from_checkpoint(ckpt)) is ShapesDataModule
    assert type(LeNetCIFAR.load_from_checkpoint(ckpt)) is LeNetCIFAR  # the class itself, as before


def test_a_composed_models_checkpoint_is_validated_with_its_model_named(tmp_path: Path) -> None:
    """`validate --model=ImageClassifier --model.net=LeNet --ckpt_path=...` stopped on a traceback ("the
    following arguments are required: net"): the model's defaults, for the note on replaced settings, were
    parsed from --model alone, which a class with a required argument cannot be."""
    from lit_ddp.models import LeNet

    composed = ["--model=ImageClassifier", "--model.net=LeNet"]
    build_cli(["fit", *TINY_RUN, *composed, f"--trainer.default_root_dir={tmp_path / 'fit'}"])
    ckpt = next((tmp_path / "fit").rglob("last.ckpt"))
    cli = build_cli(
        ["validate", *TINY_RUN, *composed, f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path}"]
    )
    assert isinstance(cli.model.net, LeNet) and "val/acc" in cli.trainer.callback_metrics


def test_a_network_given_with_its_arguments_from_python_is_saved_as_data_and_rebuilt(tmp_path: Path) -> None:
    """``net=functools.partial(Net, width=...)`` is how Python passes a network's own arguments; the
    checkpoint pickled the partial, which a weights-only load refuses ("Unsupported global:
    functools.partial")."""
    from functools import partial

    from lit_ddp.models import ImageClassifier, LeNet

    system = ImageClassifier(net=partial(LeNet, batch_norm=True), num_classes=4)
    composed = _saved_from_python(system, tmp_path / "partial.ckpt")
    assert torch.serialization.get_unsafe_globals_in_checkpoint(composed) == []
    hparams = torch.load(composed, weights_only=True)["hyper_parameters"]
    assert hparams["net"] == {"class_path": "lit_ddp.models.lenet.LeNet", "init_args": {"batch_norm": True}}
    again = ImageClassifier.load_from_checkpoint(composed)
    for key, value in system.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
    assert isinstance(again.net, LeNet) and again.net(torch.zeros(2, 3, 32, 32)).shape == (2, 4)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in again.net.modules())

    posing = _edited(composed, tmp_path / "posing.ckpt", net={"class_path": "os.system", "init_args": {}})
    with pytest.raises(UserError, match="^the checkpoint.s network os.system is not an nn.Module class:"):
        ImageClassifier.load_from_checkpoint(posing)


@pytest.mark.parametrize("net", ["os.system", "builtins.exec", "subprocess.run"])
def test_a_checkpoint_naming_another_callable_as_its_network_runs_nothing(tmp_path: Path, net: str) -> None:
    """A crafted checkpoint named os.system as its network and a shell command as num_classes: a
    weights-only load_from_checkpoint ran the command."""
    from lit_ddp.models import ImageClassifier, LeNet

    saved = _saved_from_python(ImageClassifier(net=LeNet, num_classes=4), tmp_path / "net.ckpt")
    witness = tmp_path / "ran"
    command = f"open({str(witness)!r}, 'w')" if net == "builtins.exec" else f"touch {witness}"
    crafted = _edited(saved, tmp_path / "crafted.ckpt", net=net, num_classes=command)
    with pytest.raises(UserError):
        ImageClassifier.load_from_checkpoint(crafted, weights_only=True)
    crafted = _edited(saved, tmp_path / "crafted_int.ckpt", net=net)  # a valid num_classes: still refused
    with pytest.raises(UserError, match="is not an nn.Module class or a network function"):
        ImageClassifier.load_from_checkpoint(crafted, weights_only=True)
    assert not witness.exists()


@pytest.mark.parametrize(
    ("subcommand", "kept", "missing", "what"),
    [
        # loops removed: fit started again at epoch 1, with no word
        ("fit", "all but loops", "loop state (epoch, batch)", "a run's state to resume"),
        # torch.save({"state_dict": ...}): Lightning's KeyError traceback, in fit and validate
        (
            "fit",
            "state_dict",
            "Lightning version, no loop state (epoch, batch), no optimizer state",
            "a run's state to resume",
        ),
        ("validate", "state_dict", "Lightning version", "a Lightning checkpoint"),
    ],
)
def test_a_checkpoint_of_weights_only_is_one_line_saying_what_it_lacks(
    ckpt: Path, tmp_path: Path, capsys, subcommand: str, kept: str, missing: str, what: str
) -> None:
    full = torch.load(ckpt, weights_only=True)
    saved = {"state_dict": full["state_dict"]}
    if kept == "all but loops":
        saved = {k: v for k, v in full.items() if k != "loops"}
    weights = tmp_path / "weights.ckpt"
    torch.save(saved, weights)
    root = f"--trainer.default_root_dir={tmp_path}"
    line = one_error_line(capsys, [subcommand, *TINY_RUN, f"--ckpt_path={weights}", root])
    assert line.startswith(f"checkpoint {weights} holds weights only, not {what} (no {missing}): ")
    assert not (tmp_path / "lightning_logs").exists()
