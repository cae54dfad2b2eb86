"""The model and data classes a command line picks get their own defaults, not the default class's.

jsonargparse keeps a default's init_args that a newly picked class also takes (ShapesDataModule's CropFlip
in ImageNetDataModule): the CLI sets the default classes only where the command line picks none.
"""

import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from lit_ddp.cli import LitDDPCLI, build_cli
from lit_ddp.preflight.arguments import classes_named

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


@pytest.fixture
def parse(monkeypatch, tmp_path: Path):
    """args → the parsed config (flat, run=False), without building the model, data or trainer."""
    monkeypatch.setattr(LitDDPCLI, "instantiate_classes", lambda self: None)
    monkeypatch.chdir(tmp_path)
    return lambda args, **defaults: build_cli(args, run=False, **defaults).config.as_dict()


def _import(class_path: str) -> type:
    module, name = class_path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def signature_defaults(cls: type) -> dict:
    """The defaults of ``cls``'s constructor, and of its bases' as far as ``**kwargs`` forwards to them."""
    defaults: dict = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        for p in params:
            if p.default is not inspect.Parameter.empty:
                defaults.setdefault(p.name, p.default)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return defaults


def plain(value):
    """A default (an object, a dataclass, a tuple) and a parsed value (a class_path dict, a list), alike."""
    if isinstance(value, dict) and "class_path" in value:
        return (_import(value["class_path"]), plain(value.get("init_args", {})))
    if dataclasses.is_dataclass(value):
        return plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return (type(value), plain(vars(value)))
    return value


def assert_own_defaults(choice: dict, given: set[str]) -> None:
    """Every init_arg of the picked class that ``given`` leaves out is that class's own default."""
    defaults = signature_defaults(_import(choice["class_path"]))
    init_args = choice.get("init_args", {})
    assert set(init_args) <= set(defaults), choice["class_path"]
    for key, value in init_args.items():
        if key not in given:
            assert plain(value) == plain(defaults[key]), f"{choice['class_path']}: {key}"


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_recipe_gets_its_classes_own_defaults_for_what_it_leaves_out(parse, config: Path) -> None:
    recipe = yaml.safe_load(config.read_text())
    parsed = parse(["--config", str(config)])
    for key in ("model", "data"):
        assert parsed[key]["class_path"].rsplit(".", 1)[-1] == recipe[key]["class_path"].rsplit(".", 1)[-1]
        assert_own_defaults(parsed[key], given=set(recipe[key].get("init_args", {})))


def test_a_class_picked_on_the_command_line_gets_its_own_defaults(parse) -> None:
    parsed = parse(["--data=ImageNetDataModule", "--data.data_dir=x", "--model=ArchClassifier"])
    assert parsed["data"]["init_args"]["augmentation"]["class_path"].endswith("RandomResizedCropFlip")
    assert parsed["model"]["init_args"]["optim"]["name"] == "sgd"
    assert_own_defaults(parsed["data"], given={"data_dir"})
    assert_own_defaults(parsed["model"], given=set())
    by_class_path = parse(["--data.class_path=lit_ddp.data.ImageNetDataModule", "--data.data_dir=x"])
    assert by_class_path["data"] == parsed["data"]


def test_the_default_classes_take_init_args_and_a_projects_defaults_hold(parse, tmp_path: Path) -> None:
    parsed = parse(["--data.batch_size=3"])
    assert parsed["data"]["class_path"].endswith("ShapesDataModule") and parsed["model"]["class_path"]
    assert_own_defaults(parsed["data"], given={"batch_size"})
    assert parsed["data"]["init_args"]["batch_size"] == 3
    # a project's main(data={class_path, init_args}): its init_args are the defaults, until another class
    project = {"data": {"class_path": "lit_ddp.data.ShapesDataModule", "init_args": {"train_size": 100}}}
    parsed = parse(["--data.batch_size=3"], **project)
    assert parsed["data"]["init_args"]["train_size"] == 100 and parsed["data"]["init_args"]["batch_size"] == 3
    only_init_args = tmp_path / "data.yaml"  # a config without class_path: the default class, its init_args
    only_init_args.write_text("data:\n  init_args:\n    batch_size: 5\n")
    parsed = parse(["--config", str(only_init_args)], **project)
    assert parsed["data"]["init_args"]["train_size"] == 100 and parsed["data"]["init_args"]["batch_size"] == 5
    parsed = parse(["--data=ImageNetDataModule", "--data.data_dir=x"], **project)
    assert_own_defaults(parsed["data"], given={"data_dir"})


def test_what_picks_a_class(tmp_path: Path) -> None:
    picked = tmp_path / "picked.yaml"
    picked.write_text("fit:\n  model:\n    class_path: lit_ddp.models.ArchClassifier\n")
    assert classes_named(["fit", "--config", str(picked)]) == {"model"}
    assert classes_named(["--data", "CIFAR10DataModule", "--model.class_path=X"]) == {"data", "model"}
    assert classes_named(["--data={class_path: X}", "--model={init_args: {batch_norm: true}}"]) == {"data"}
    assert classes_named(["--data.batch_size=3", "--model.optim.lr=1"]) == set()
    assert classes_named({"data": {"class_path": "X"}, "model": {"init_args": {}}}) == {"data"}


NETS = """
from torch import nn


class Small(nn.Linear):
    def __init__(self, num_classes: int = 10, width: int = 1) -> None:
        super().__init__(3, num_classes)


class Wide(nn.Linear):
    def __init__(self, num_classes: int = 10, width: int = 8, p: float = 0.3) -> None:
        super().__init__(3, num_classes)
"""


@pytest.mark.parametrize(
    "pick",
    [
        "--model.net=my_nets.Wide",
        "--model.init_args.net=my_nets.Wide",
        "--model.net={class_path: my_nets.Wide}",
    ],
)
def test_a_network_picked_under_a_projects_default_model_gets_its_own_defaults(
    parse, tmp_path: Path, monkeypatch, pick: str
) -> None:
    """A project's `python -m PKG fit --model.net=Wide` built Wide(width=1), the default network's width,
    where `--config configs/default.yaml --model.net=Wide` built Wide(width=8), its own."""
    (tmp_path / "my_nets.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    net = {"class_path": "my_nets.Small"}
    project = {"model": {"class_path": "lit_ddp.models.ImageClassifier", "init_args": {"net": net}}}
    picked = parse([pick], **project)["model"]["init_args"]["net"]
    assert picked == {"class_path": "my_nets.Wide", "init_args": {"width": 8, "p": 0.3}}
    picked = parse([pick, "--model.net.width=2"], **project)["model"]["init_args"]["net"]
    assert picked["init_args"] == {"width": 2, "p": 0.3}
    kept = parse(["--model.net.width=2"], **project)["model"]["init_args"]["net"]  # the default network's
    assert kept == {"class_path": "my_nets.Small", "init_args": {"width": 2}}
