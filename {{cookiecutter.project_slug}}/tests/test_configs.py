"""Every recipe in configs/ still names classes and arguments that exist, and the default run is
configs/default.yaml."""

import contextlib
import io
from pathlib import Path

import pytest
import yaml
from lit_ddp.cli import build_cli

from {{ cookiecutter.package_name }}.__main__ import MODEL
from {{ cookiecutter.package_name }}.data import MyDataModule

PROJECT = Path(__file__).resolve().parents[1]

RECIPES = sorted(p.relative_to(PROJECT) for p in (PROJECT / "configs").glob("*.yaml"))


def resolved(*args: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        build_cli(["fit", *args, "--print_config"], model=MODEL, data=MyDataModule, prog="test")
    assert exit_.value.code in (0, None)
    return yaml.safe_load(out.getvalue())


@pytest.mark.parametrize("recipe", RECIPES, ids=str)
def test_recipe_parses(recipe: Path) -> None:
    config = resolved("--config", str(PROJECT / recipe))
    assert config["model"]["class_path"] and config["data"]["class_path"]


def test_the_default_run_is_configs_default_yaml() -> None:
    default, spelled_out = resolved(), resolved("--config", str(PROJECT / "configs" / "default.yaml"))
    for key in ("model", "data", "seed_everything"):
        assert default[key] == spelled_out[key], key
