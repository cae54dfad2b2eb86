"""Every recipe in configs/ still names classes and arguments that exist, and the default run is
configs/default.yaml."""

from pathlib import Path

import pytest
from lit_ddp.testing import resolved_config

from {{ cookiecutter.package_name }}.__main__ import main

PROJECT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.relative_to(PROJECT) for p in (PROJECT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=str)
def test_recipe_parses(recipe: Path) -> None:
    config = resolved_config(main, "--config", str(PROJECT / recipe))  # fit's own error if it does not
    assert config["model"]["class_path"] and config["data"]["class_path"]


def test_the_default_run_is_configs_default_yaml(default_config: dict) -> None:
    default = resolved_config(main)
    for key in ("model", "data", "seed_everything"):
        assert default[key] == default_config[key], key
