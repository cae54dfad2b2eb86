"""Config files: what a file may expand to, and an order of arguments that would silently drop a setting."""

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
    # Spelled with a space, or through init_args, it is the same setting.
    line = one_error_line(capsys, ["fit", "--model.init_args.batch_norm", "true", "--config", RECIPE])
    assert line.startswith(f"--config {RECIPE} sets model.batch_norm after --model.init_args.batch_norm true")
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
    # An argument of an entry of that list is replaced with it.
    line = one_error_line(capsys, ["fit", "--trainer.callbacks.decay=0.5", "--config", EMA])
    assert line.startswith(f"--config {EMA} sets trainer.callbacks after --trainer.callbacks.decay=0.5 did")
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


def test_a_recipe_after_a_preset_is_refused_and_a_preset_after_a_recipe_adjusts_it(
    tmp_path: Path, capsys
) -> None:
    """`--config presets/debug.yaml --config configs/lenet_cifar.yaml` ran the full 30-epoch recipe."""
    line = one_error_line(capsys, ["fit", "--config", DEBUG, "--config", RECIPE])
    assert line.startswith(f"--config {RECIPE} sets trainer.max_epochs after {DEBUG} did, and the later one")
    assert f"give --config {DEBUG} after --config {RECIPE}" in line
    root = f"--trainer.default_root_dir={tmp_path}"
    cli = build_cli(["--config", RECIPE, "--config", DEBUG, "--data.train_size=64", root], run=False)
    assert cli.trainer.max_epochs == 1 and cli.trainer.limit_train_batches == 10


def test_a_preset_of_model_or_data_settings_adjusts_the_recipe_before_it(tmp_path: Path, capsys) -> None:
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
    # Before the recipe it would be replaced: refused, with the order that works.
    line = one_error_line(capsys, ["fit", "--config", str(bs), "--config", RECIPE])
    assert line.startswith(f"--config {RECIPE} sets data.batch_size after {bs} did")
    assert f"give --config {bs} after --config {RECIPE}" in line


def test_two_recipes_are_refused_without_advice_to_swap_them(capsys) -> None:
    """Two recipes (each chooses the model and the data) were refused in either order, each time advising
    the other order."""
    other = str(REPO / "configs" / "lenet_cifar.yaml")
    for first, second in ((RECIPE, other), (other, RECIPE)):
        line = one_error_line(capsys, ["fit", "--config", first, "--config", second])
        assert line.startswith(f"--config {second} sets "), line
        assert "give --config" not in line and f"{first} and {second} are both recipes" in line, line


@pytest.mark.parametrize("command", ["fit", "doctor"])
def test_a_num_classes_the_data_would_replace_is_refused(tmp_path: Path, capsys, command: str) -> None:
    """`--model.num_classes=5` was accepted and ignored: the data's 10 classes won, in fit and in doctor."""
    root = f"--trainer.default_root_dir={tmp_path}"
    line = one_error_line(capsys, [command, *TINY_RUN, "--model.num_classes=5", root])
    assert line.startswith("--model.num_classes=5 would not be used: the data decides the number of classes")
    (tmp_path / "c.yaml").write_text("model:\n  init_args:\n    num_classes: 5\n")
    line = one_error_line(capsys, [command, "--config", str(tmp_path / "c.yaml"), *TINY_RUN, root])
    assert line.startswith(f"{tmp_path / 'c.yaml'}: model.num_classes would not be used")
    assert not (tmp_path / "lightning_logs").exists()
