"""Config files through the command line: what a file may expand to, and an order of arguments that would
silently drop a setting. Each case's line is a row of tests/test_preflight.py's ARGUMENTS table; here the
CLI refuses it (exit 2, one line, nothing written) and runs the order that does what was asked."""

from pathlib import Path

import pytest
from conftest import REPO, TINY_RUN, run_cli
from test_mistakes import one_error_line

from lit_ddp.cli import build_cli

RECIPE = str(REPO / "configs" / "lenet_shapes.yaml")
DEBUG = str(REPO / "configs" / "presets" / "debug.yaml")
EMA = str(REPO / "configs" / "presets" / "ema.yaml")


def test_a_yaml_alias_bomb_is_refused_in_one_line(tmp_path: Path) -> None:
    """Nine levels of ten aliases under an unknown key: 10^9 nodes, and jsonargparse hung with no output."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    result = run_cli(["fit", "--config", "bomb.yaml"], cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "lit_ddp: error: bomb.yaml expands to more than 100,000 YAML nodes (anchors and aliases repeated"
        " inside each other): it is not read; write the settings out plainly"
    ]
    assert not (tmp_path / "logs").exists()


def test_an_option_before_a_config_that_replaces_it_is_refused(tmp_path: Path, capsys) -> None:
    """`fit --trainer.max_epochs=1 --config configs/lenet_shapes.yaml` ran the recipe's 12 epochs."""
    line = one_error_line(capsys, ["fit", "--trainer.max_epochs=1", "--config", RECIPE])
    assert line == (
        f"--config {RECIPE} sets trainer.max_epochs after --trainer.max_epochs=1 did, and the later one wins:"
        f" put --trainer.max_epochs=1 after --config {RECIPE} (later arguments override earlier ones)"
    )
    # After the config, the option wins, as asked.
    root = f"--trainer.default_root_dir={tmp_path}"
    cli = build_cli(["--config", RECIPE, *TINY_RUN, root], run=False)
    assert cli.trainer.max_epochs == 1 and cli.config["data"]["init_args"]["train_size"] == 64


def test_a_callback_added_before_a_config_that_replaces_the_list_is_refused(tmp_path: Path, capsys) -> None:
    """`fit --trainer.callbacks+=EarlyStopping --trainer.callbacks.monitor=val/loss --config
    presets/ema.yaml` ran without EarlyStopping: the preset's list replaced the one the option appended to."""
    added = "--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping"
    args = ["fit", added, "--trainer.callbacks.monitor=val/loss", "--config", EMA]
    assert one_error_line(capsys, args) == (
        f"--config {EMA} sets trainer.callbacks after {added} did, and the later one wins: put {added} after"
        f" --config {EMA} (later arguments override earlier ones)"
    )
    # After the config, the callback is appended to the preset's, as asked.
    args = [
        "--config",
        EMA,
        added,
        "--trainer.callbacks.monitor=val/loss",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    names = [type(c).__name__ for c in build_cli(args, run=False).trainer.callbacks]
    assert "EMA" in names and "EarlyStopping" in names


def test_a_preset_after_a_recipe_adjusts_it(tmp_path: Path) -> None:
    """The order the refusal of `--config presets/debug.yaml --config configs/lenet_cifar.yaml` gives."""
    root = f"--trainer.default_root_dir={tmp_path}"
    cli = build_cli(["--config", RECIPE, "--config", DEBUG, "--data.train_size=64", root], run=False)
    assert cli.trainer.max_epochs == 1 and cli.trainer.limit_train_batches == 10


def test_a_preset_of_model_or_data_settings_adjusts_the_recipe_before_it(tmp_path: Path) -> None:
    """A file of the user's own that only adjusts the model's or the data's settings (`data: {init_args:
    {batch_size: 64}}`) after a recipe was taken for a recipe and refused, and the fix the line gave (the
    recipe after it) was refused too: no order of the two ran."""
    bs = tmp_path / "bs.yaml"
    bs.write_text(
        "data:\n  init_args:\n    batch_size: 16\nmodel:\n  init_args:\n    optim:\n      lr: 0.01\n"
    )
    root = f"--trainer.default_root_dir={tmp_path}"
    cli = build_cli(["--config", RECIPE, "--config", str(bs), "--data.train_size=64", root], run=False)
    assert cli.datamodule.batch_size == 16 and cli.model.hparams.optim["lr"] == 0.01


@pytest.mark.parametrize("command", ["fit", "doctor"])
def test_a_num_classes_the_data_would_replace_is_refused(tmp_path: Path, capsys, command: str) -> None:
    """`--model.num_classes=5` was accepted and ignored: the data's 10 classes won, in fit and in doctor."""
    root = f"--trainer.default_root_dir={tmp_path}"
    line = one_error_line(capsys, [command, *TINY_RUN, "--model.num_classes=5", root])
    assert line.startswith("--model.num_classes=5 would not be used: the data decides the number of classes")
    assert not (tmp_path / "lightning_logs").exists()
