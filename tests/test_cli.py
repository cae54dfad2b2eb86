"""The command line end to end: in process, and as real 2-process DDP runs on CPU."""

import os
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, TINY_SHAPES, assert_single_run, read_scalars, run_cli

from lit_ddp.cli import build_cli, main
from lit_ddp.data import ShapesDataModule
from lit_ddp.errors import UserError
from lit_ddp.models import LeNetCIFAR
from lit_ddp.preflight import checkpoint_file
from lit_ddp.runtime import resume

QUICK = [
    *TINY_SHAPES,
    "--trainer.max_epochs=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.log_every_n_steps=1",
]


def test_fit_in_process_logs_metrics_and_writes_one_run(tmp_path: Path) -> None:
    cli = build_cli(["fit", *QUICK, f"--trainer.default_root_dir={tmp_path}"])
    assert isinstance(cli.model, LeNetCIFAR) and isinstance(cli.datamodule, ShapesDataModule)
    metrics = cli.trainer.callback_metrics
    for key in ("train/loss_step", "train/loss_epoch", "train/acc", "val/loss", "val/acc"):
        assert key in metrics and torch.isfinite(metrics[key])
    assert 0.0 <= metrics["val/acc"] <= 1.0
    run = assert_single_run(tmp_path)
    scalars = read_scalars(run)
    assert {"train/loss_step", "train/loss_epoch", "train/acc", "val/loss", "val/acc"} <= set(scalars)


def test_validate_and_test_from_checkpoint_in_process(tmp_path: Path) -> None:
    build_cli(["fit", *QUICK, f"--trainer.default_root_dir={tmp_path}"])
    ckpt = next(tmp_path.rglob("last.ckpt"))
    args = [*QUICK, f"--trainer.default_root_dir={tmp_path / 'eval'}", f"--ckpt_path={ckpt}"]
    val = build_cli(["validate", *args]).trainer.callback_metrics
    test = build_cli(["test", *args]).trainer.callback_metrics
    assert 0.0 <= val["val/acc"] <= 1.0 and "val/loss" in val
    assert 0.0 <= test["test/acc"] <= 1.0 and "test/loss" in test


def test_num_classes_is_linked_from_the_data(tmp_path: Path) -> None:
    cli = build_cli(["fit", *QUICK, "--trainer.fast_dev_run=true", f"--trainer.default_root_dir={tmp_path}"])
    assert cli.model.hparams.num_classes == cli.datamodule.num_classes == 10


def test_predict_returns_one_prediction_per_test_image(tmp_path: Path) -> None:
    cli = build_cli(["predict", *QUICK, "--ckpt_path=untrained", f"--trainer.default_root_dir={tmp_path}"])
    # LightningCLI does not return predictions; run predict on the built objects to check their shape.
    out = cli.trainer.predict(cli.model, datamodule=cli.datamodule)
    preds = torch.cat([b["pred"] for b in out])
    assert preds.shape == (64,) and preds.max() < 10


def test_print_config_shows_the_embedded_default(tmp_path: Path) -> None:
    result = run_cli(["fit", "--print_config"], cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "lit_ddp.models.LeNetCIFAR" in result.stdout and "lit_ddp.data.ShapesDataModule" in result.stdout


DEPTH_NET = """from torch import nn


class DepthNet(nn.Module):
    def __init__(self, num_classes: int, depth: int) -> None:
        super().__init__()
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, num_classes))
"""


@pytest.mark.parametrize("depth", ["left out", "null, as --print_config printed it"])
def test_a_network_argument_without_a_default_is_named_by_print_config_and_by_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, depth: str
) -> None:
    """A network whose argument has no default, named in a recipe without it: --print_config printed the
    recipe with `depth: null` and exited 0 (so a project's resolved_config, its test that every recipe
    parses, passed a recipe fit refuses), and fit on that printed file said `Parser key "model": (see ...)`.
    """
    from lit_ddp.testing import resolved_config

    (tmp_path / "depth_net.py").write_text(DEPTH_NET)
    null = "\n      init_args:\n        depth: null" if depth.startswith("null") else ""
    (tmp_path / "recipe.yaml").write_text(
        "model:\n  class_path: lit_ddp.models.ImageClassifier\n  init_args:\n    net:\n"
        f"      class_path: depth_net.DepthNet{null}\n"
    )
    line = "recipe.yaml, line 4: model.net: DepthNet needs depth: set it under its init_args"
    for args in (["fit", "--config", "recipe.yaml", "--print_config"], ["fit", "--config", "recipe.yaml"]):
        result = run_cli(args, cwd=tmp_path, timeout=120)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert result.stderr.strip().splitlines()[-1] == f"lit_ddp: error: {line}", (args, result.stderr)
        assert "depth" not in result.stdout, args  # nothing printed to run
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError) as err:
        resolved_config(main, "--config", "recipe.yaml")
    assert str(err.value) == line


def test_a_mistyped_option_is_one_line_naming_the_closest_option(tmp_path: Path) -> None:
    result = run_cli(["fit", "--model.optim.lrr=3"], cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "lit_ddp: error: unknown option --model.optim.lrr: did you mean --model.optim.lr?"
    )
    assert "usage" not in result.stderr and "__main__" not in result.stderr
    assert not (tmp_path / "logs").exists()


TYPO_YAML = "trainer:\n  max_epochz: 1\n"
BROKEN_YAML = "trainer:\n  max_epochs: [1\n"
MODEL_TYPO_YAML = "model:\n  class_path: LeNetCIFAR\n  init_args:\n    lrr: 3\n"
OPTIM_TYPO_YAML = "model:\n  init_args:\n    optim:\n      lrr: 0.01\n"


@pytest.mark.parametrize(
    ("args", "files", "line"),
    [
        (
            ["--trainer.max_epochz=1"],
            {},
            "unknown option --trainer.max_epochz: did you mean --trainer.max_epochs?",
        ),
        # An abbreviation is refused, not expanded: a typo must not change what runs.
        (
            ["--trainer.max_epoch=1"],
            {},
            "unknown option --trainer.max_epoch: did you mean --trainer.max_epochs?",
        ),
        (["--trainer.max_epochs=abc"], {}, "--trainer.max_epochs=abc: expected an integer or null"),
        (["--model=LeNetCifar"], {}, "--model=LeNetCifar: no such model class: did you mean LeNetCIFAR?"),
        (
            ["--model.optim.name=sgdd"],
            {},
            "--model.optim.name=sgdd: expected one of sgd, adam, adamw (did you mean sgd?)",
        ),
        (["--model.optim.lr=x"], {}, "--model.optim.lr=x: expected a number"),
        (
            ["--model.compile=fast"],
            {},
            "--model.compile=fast: expected one of default, reduce-overhead, max-autotune,"
            " max-autotune-no-cudagraphs or true or false",
        ),
        (
            ["--optimizer=SGD"],
            {},
            "there is no --optimizer: the models build their optimizer from --model.optim.*",
        ),
        (["--config", "nofile.yaml"], {}, "--config: no such file"),
        (["--config", "/"], {}, "--config: '/' is a folder, not a file: pass the YAML file in it"),
        (
            ["--config", "typo.yaml"],
            {"typo.yaml": TYPO_YAML},
            "typo.yaml, line 2: unknown key trainer.max_epochz: did you mean trainer.max_epochs?",
        ),
        (["--config", "m.yaml"], {"m.yaml": MODEL_TYPO_YAML}, "m.yaml, line 4: unknown key model.lrr"),
        # A typo inside a group of settings names the group and its closest key, as on the command line.
        (
            ["--config", "o.yaml"],
            {"o.yaml": OPTIM_TYPO_YAML},
            "o.yaml, line 4: unknown key model.optim.lrr: did you mean model.optim.lr?",
        ),
        (
            ["--config", "typo.yaml", "--print_config"],
            {"typo.yaml": TYPO_YAML},
            "typo.yaml, line 2: unknown key trainer.max_epochz: did you mean trainer.max_epochs?",
        ),
        (
            ["--config", "top.yaml", "--print_config"],
            {"top.yaml": "trainerr:\n  max_epochs: 1\n"},
            "top.yaml, line 2: unknown key trainerr.max_epochs: did you mean trainer.max_epochs?",
        ),
        (
            ["--data.augmentation.paddin=3"],
            {},
            # As the command line spells it (it was --data.init_args.augmentation.init_args.paddin).
            "unknown option --data.augmentation.paddin: did you mean --data.augmentation.padding?",
        ),
        (
            ["--config", "bad.yaml"],
            {"bad.yaml": BROKEN_YAML},
            "bad.yaml, line 2, column 15: not valid YAML (while parsing a flow sequence",
        ),
        # The class asked about is at fault, not the option (it said: did you mean --model.top_k?).
        (
            ["--model.help", "LeNetCifar"],
            {},
            "--model.help=LeNetCifar: no such model class: did you mean LeNetCIFAR?",
        ),
        (["--model.net.help", "LeNet"], {}, "unknown option --model.net.help"),
        (["--model.optim.lr", "--trainer.max_epochs=1"], {}, "--model.optim.lr is given no value"),
        # A preset given to the group it sets: it said "Group 'trainer' does not accept option ...".
        (
            ["--trainer", "d.yaml"],
            {"d.yaml": "trainer:\n  max_epochs: 1\n"},
            "--trainer=d.yaml holds trainer: at its top, as a --config file does: pass it as --config d.yaml",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_option_or_file_and_the_fix(
    tmp_path: Path, monkeypatch, capsys, args: list[str], files: dict[str, str], line: str
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(SystemExit) as stop:
        main(["fit", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"lit_ddp: error: {line}"), err[0]
    assert not (tmp_path / "logs").exists()


def test_a_config_before_the_command_is_refused_unless_its_settings_are_under_the_commands_name(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """`python -m lit_ddp --config presets/debug.yaml fit` (the root's usage shows [-c CONFIG] before the
    command) trained the full 12 epochs: the root parser reads a config for `fit:` and dropped the preset's
    settings; a recipe there failed on jsonargparse's `Option 'model.init_args...' is not accepted`."""
    monkeypatch.chdir(tmp_path)
    debug, recipe = REPO / "configs" / "presets" / "debug.yaml", REPO / "configs" / "lenet_shapes.yaml"
    for path in (debug, recipe):
        with pytest.raises(SystemExit) as stop:
            main(["--config", str(path), "fit", "--print_config"])
        err = capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == 2 and len(err) == 1, err
        assert err[0].startswith(f"lit_ddp: error: --config {path} before fit holds "), err[0]
        assert err[0].endswith(f"give it after the command (fit --config {path})"), err[0]
    assert not (tmp_path / "logs").exists()
    # A config for the root parser, the command's settings under its name, is read as before.
    (tmp_path / "root.yaml").write_text("fit:\n  trainer:\n    max_epochs: 1\n")
    with pytest.raises(SystemExit) as stop:
        main(["--config", "root.yaml", "fit", "--print_config"])
    assert stop.value.code == 0 and "  max_epochs: 1\n" in capsys.readouterr().out
    # After the command, the same file is refused: the command's parser has no `fit` key.
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", "root.yaml", "--print_config"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("lit_ddp: error: --config root.yaml after fit holds fit at its top"), err[0]


def test_a_mistyped_command_names_the_closest_and_help_names_the_program(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["fiit"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith(
        "lit_ddp: error: unknown command 'fiit': did you mean fit?"
        " (the commands are fit, validate, test, predict"
    )
    with pytest.raises(SystemExit) as stop:  # the commands with parsers of their own are named too
        main(["shardd"])
    assert capsys.readouterr().err.startswith(
        "lit_ddp: error: unknown command 'shardd': did you mean shard? (the commands are fit, validate, test,"
        " predict, new, shard, doctor)"
    )
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and out.startswith("usage: python -m lit_ddp ")
    assert "fit,validate,test,predict" in out
    assert "`new DEST` generates a new project" in " ".join(out.split())
    assert "`shard SRC DEST` writes a dataset as shards" in " ".join(out.split())  # it was not named


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_two_process_cpu_ddp_logs_metrics_and_writes_once(tmp_path: Path, strategy: str) -> None:
    args = [
        "fit",
        *QUICK,
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        f"--trainer.strategy={strategy}",
    ]
    result = run_cli(args, cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    run = assert_single_run(tmp_path / "logs")
    scalars = read_scalars(run)
    assert {"train/loss_epoch", "train/acc", "val/loss", "val/acc"} <= set(scalars)
    assert 0.0 <= scalars["val/acc"][-1] <= 1.0
    # The effective global batch is printed once (rank 0), not once per rank.
    assert (result.stdout + result.stderr).count("global batch = 32 per device × 2 devices") == 1


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_process_run_with_the_progress_bar_and_no_epoch_summary_finishes(tmp_path: Path) -> None:
    """The progress bar reads the epoch's metrics on rank 0 alone; no value it reads may still need a
    collective (Throughput reduces its own), else rank 0 waits for ranks that never join."""
    args = [*QUICK, "--trainer.enable_progress_bar=true", "--console.epoch_summary=false"]
    result = run_cli(
        ["fit", *args, "--trainer.accelerator=cpu", "--trainer.devices=2"], cwd=tmp_path, timeout=150
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scalars = read_scalars(assert_single_run(tmp_path / "logs"))
    assert scalars["perf/images_per_s"][-1] > scalars["perf/images_per_s_per_device"][-1] > 0
    assert "sync_dist=True" not in result.stderr  # the dashboard's reduced values are not Lightning's to sync


# The default run's first half: 6 of its 12 epochs (its cosine schedule still spans 12).
HALF_OF_THE_DEFAULT = 6


@pytest.mark.slow
@pytest.mark.timeout(900)  # a hang guard, not a speed limit
def test_the_embedded_default_passes_90_percent_in_the_first_half_of_its_run(
    tmp_path: Path, monkeypatch
) -> None:
    """README's first command, `python -m lit_ddp fit` with no argument (LeNet on Shapes, seed 0, 12 epochs of
    a cosine schedule), stopped after epoch 6: val/acc is already at or above the 0.90 that README promises at
    the end. The second half only lowers the learning rate along the cosine; the whole curve and the full
    run's wall time are a benchmark's (benchmarks/bench_default_fit.py, docs/benchmarks.md), not this test's:
    the whole run in a subprocess under a time limit failed on a loaded machine (issue 32)."""
    monkeypatch.chdir(tmp_path)  # the default's own default_root_dir, logs/, under tmp_path
    stop = [
        "--trainer.callbacks+=fault_probe.Fault",  # tests/helpers/: trainer.should_stop at that epoch end
        "--trainer.callbacks.action=should_stop",
        f"--trainer.callbacks.at_epoch_end={HALF_OF_THE_DEFAULT - 1}",
    ]
    cli = build_cli(["fit", "--trainer.enable_progress_bar=false", *stop])
    assert cli.trainer.max_epochs == 12 and cli.trainer.current_epoch == HALF_OF_THE_DEFAULT
    assert (type(cli.model), type(cli.datamodule), cli.datamodule.sizes["train"]) == (
        LeNetCIFAR,
        ShapesDataModule,
        20000,
    )
    val_acc = read_scalars(assert_single_run(tmp_path / "logs"))["val/acc"]
    assert len(val_acc) == HALF_OF_THE_DEFAULT and val_acc[-1] >= 0.90, val_acc


def test_sparse_step_logging_does_not_change_epoch_metrics(tmp_path: Path) -> None:
    """log_every_n_steps decides which step values are written; the epoch metrics see every batch."""
    runs = {}
    for every in (1, 50):
        args = [*QUICK, "--trainer.max_epochs=2", f"--trainer.log_every_n_steps={every}"]
        cli = build_cli(["fit", *args, f"--trainer.default_root_dir={tmp_path / str(every)}"])
        runs[every] = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if "step" not in k}
    # Timings differ from run to run; the lr monitor writes on the logging steps only.
    keys = {k for k in runs[1] if not k.startswith(("perf/", "lr-"))}
    assert {"train/loss_epoch", "train/acc", "val/loss", "val/acc"} <= keys <= runs[50].keys()
    for key in keys:
        assert runs[1][key] == pytest.approx(runs[50][key], abs=1e-6), key


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_freeze_is_opt_in_by_its_config_key(tmp_path: Path, enabled: bool) -> None:
    import gc

    import lightning as L

    frozen: list[int] = []

    class Probe(L.Callback):
        def on_train_batch_start(self, *args) -> None:
            frozen.append(gc.get_freeze_count())

    switch = ["--gc_freeze=lit_ddp.runtime.gc_freeze.FreezeGC"] if enabled else []
    cli = build_cli([*QUICK, *switch, f"--trainer.default_root_dir={tmp_path}"], run=False)
    cli.trainer.callbacks.append(Probe())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert frozen and all((count > 0) == enabled for count in frozen)
    assert gc.get_freeze_count() == 0  # unfrozen when training ends


def test_the_default_run_is_the_recipe_yaml_and_the_class_defaults(tmp_path: Path, monkeypatch) -> None:
    """`python -m lit_ddp fit` alone, configs/lenet_shapes.yaml and LeNetCIFAR's defaults agree."""
    import inspect

    from lit_ddp.models import OptimConfig

    monkeypatch.chdir(tmp_path)
    bare = build_cli([], run=False).config
    recipe = build_cli(["--config", str(REPO / "configs" / "lenet_shapes.yaml")], run=False).config
    for key in ("model", "data", "trainer", "seed_everything"):
        assert bare[key] == recipe[key], key
    defaults = {k: p.default for k, p in inspect.signature(LeNetCIFAR).parameters.items()}
    yaml_model = recipe["model"]["init_args"]
    assert OptimConfig(**vars(yaml_model["optim"])) == defaults["optim"]
    assert yaml_model["batch_norm"] == defaults["batch_norm"]


def test_seed_everything_true_draws_a_seed_that_the_run_uses_and_config_yaml_records(
    tmp_path: Path, monkeypatch
) -> None:
    """LightningCLI seeds `true` with 0 (Lightning 2.1 on), though its help says a random seed, and the run's
    config.yaml recorded 0. Each run now draws one, seeds with it and records it, so that a re-run of its
    config.yaml seeds alike."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # seed_everything sets it in this process: put back after
    seeds = []
    for name in ("a", "b"):
        build_cli(["fit", *QUICK, "--seed_everything=true", f"--trainer.default_root_dir={tmp_path / name}"])
        used = int(os.environ["PL_GLOBAL_SEED"])
        saved = yaml.safe_load(next((tmp_path / name).rglob("config.yaml")).read_text())["seed_everything"]
        assert saved == used and type(saved) is int, saved
        seeds.append(used)
    assert seeds[0] != seeds[1], seeds  # drawn: two runs agree once in 2**32


def test_a_printed_config_with_seed_everything_true_draws_a_seed_where_it_runs(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """--print_config prints `true` as given: the config saved from it draws a seed at each run, as the
    command line does, and the run's config.yaml records the number it seeded with."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # seed_everything sets it in this process: put back after
    with pytest.raises(SystemExit) as stop:
        build_cli(["fit", "--print_config", "--seed_everything=true"])
    printed = capsys.readouterr().out
    assert stop.value.code in (0, None) and yaml.safe_load(printed)["seed_everything"] is True, printed
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.yaml").write_text(printed)
    build_cli(["fit", "--config", "my.yaml", *QUICK, f"--trainer.default_root_dir={tmp_path}"])
    saved = yaml.safe_load(next(tmp_path.rglob("config.yaml")).read_text())["seed_everything"]
    assert type(saved) is int and saved == int(os.environ["PL_GLOBAL_SEED"]), saved


def test_a_fit_resuming_its_own_run_with_seed_everything_true_keeps_the_seed_that_run_drew(
    tmp_path: Path, monkeypatch
) -> None:
    """`fit --config my.yaml --ckpt_path=last` (my.yaml: `seed_everything: true`) drew a new seed, seeded the
    resumed process with it and recorded it over the run's own in config.yaml. A resume (`last`, or the path
    of the run's last.ckpt) now goes on with the run's seed; a new run from its checkpoint still draws."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # seed_everything sets it in this process: put back after
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.yaml").write_text("seed_everything: true\n")
    args = ["fit", "--config", "my.yaml", *TINY_SHAPES, "--trainer.enable_progress_bar=false"]
    build_cli([*args, "--trainer.max_epochs=1"])
    (run_config,) = (tmp_path / "logs").rglob("config.yaml")
    drawn = yaml.safe_load(run_config.read_text())["seed_everything"]
    assert drawn == int(os.environ["PL_GLOBAL_SEED"]), drawn
    last = next(run_config.parent.rglob("last.ckpt"))
    for epochs, ckpt_path in ((2, "last"), (3, str(last))):
        build_cli([*args, f"--trainer.max_epochs={epochs}", f"--ckpt_path={ckpt_path}"])
        assert list((tmp_path / "logs").rglob("config.yaml")) == [run_config]  # the same run went on
        recorded = yaml.safe_load(run_config.read_text())["seed_everything"]
        assert (int(os.environ["PL_GLOBAL_SEED"]), recorded) == (drawn, drawn), ckpt_path
    tuned = tmp_path / "tuned"
    build_cli([*args, "--trainer.max_epochs=4", f"--ckpt_path={last}", f"--trainer.default_root_dir={tuned}"])
    (new_config,) = tuned.rglob("config.yaml")
    assert yaml.safe_load(new_config.read_text())["seed_everything"] == int(os.environ["PL_GLOBAL_SEED"])
    assert int(os.environ["PL_GLOBAL_SEED"]) != drawn  # a new run draws (two draws agree once in 2**32)


def test_a_resume_with_seed_everything_true_prints_one_seed_line_the_runs_own(tmp_path: Path) -> None:
    """Such a resume printed Lightning's "Seed set to" twice: the seed drawn at parse time, then, once the
    run was found, the run's own. Only the second is true, and only it is printed now; a fit from another
    run's checkpoint (a new run) prints its drawn seed, once."""
    (tmp_path / "my.yaml").write_text("seed_everything: true\n")
    args = ["fit", "--config", "my.yaml", *TINY_SHAPES, "--trainer.enable_progress_bar=false"]

    def seed_lines(extra: list[str]) -> list[int]:
        done = run_cli([*args, *extra], tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        lines = (done.stdout + done.stderr).splitlines()
        return [int(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("Seed set to")]

    first = seed_lines(["--trainer.max_epochs=1"])
    (run_config,) = (tmp_path / "logs").rglob("config.yaml")
    drawn = yaml.safe_load(run_config.read_text())["seed_everything"]
    assert first == [drawn], first
    assert seed_lines(["--trainer.max_epochs=2", "--ckpt_path=last"]) == [drawn]
    last = next(run_config.parent.rglob("last.ckpt"))
    tuned = seed_lines(["--trainer.max_epochs=3", f"--ckpt_path={last}", "--trainer.default_root_dir=tuned"])
    (tuned_config,) = (tmp_path / "tuned").rglob("config.yaml")
    assert tuned == [yaml.safe_load(tuned_config.read_text())["seed_everything"]], tuned


def test_a_rank_lightnings_launcher_started_takes_the_seed_its_first_process_drew(monkeypatch) -> None:
    """Under --trainer.strategy=ddp each rank parses the command line again: a seed of its own would seed
    each rank otherwise. Outside a launcher, `false` and a number stay as given."""
    from lit_ddp.cli import _draw_seed

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("PL_GLOBAL_SEED", "1234")  # what seed_everything left in the first process
    config = {"seed_everything": True}
    _draw_seed(config)
    assert config == {"seed_everything": 1234}
    monkeypatch.delenv("LOCAL_RANK")
    for given in (False, 7):
        config = {"seed_everything": given}
        _draw_seed(config)
        assert config == {"seed_everything": given}


def test_every_callback_of_the_list_is_on_by_default_and_each_key_turns_one_off(tmp_path: Path) -> None:
    from lit_ddp.assembly import CALLBACKS, OPT_IN_CALLBACKS
    from lit_ddp.callbacks import PredictionWriter

    root = f"--trainer.default_root_dir={tmp_path}"
    args = [*TINY_SHAPES, root]  # with the progress bar (QUICK turns it off)
    default = build_cli(args, run=False).trainer.callbacks
    ours = [type(c) for c in default if type(c) in {cls for cls, _ in CALLBACKS.values()}]
    # Lightning moves checkpoint callbacks last; the rest keep the list's order. predictions.csv: predict's.
    assert ours == [cls for cls, _ in CALLBACKS.values() if cls is not PredictionWriter]
    assert not any(type(c) in OPT_IN_CALLBACKS.values() for c in default)
    for key, (cls, _) in CALLBACKS.items():
        if cls is PredictionWriter:
            continue
        callbacks = build_cli([*args, f"--{key}=null"], run=False).trainer.callbacks
        assert sum(type(c) is cls for c in callbacks) == ours.count(cls) - 1, key


def test_a_default_fit_runs_a_handful_of_callbacks_and_predict_adds_its_writer(tmp_path: Path) -> None:
    """Six default callbacks at most, each named for what a user sees or is protected from; a fit's
    trainer holds at most eight in all, Lightning's progress bar, model summary and config saver included."""
    from lit_ddp.assembly import CALLBACKS
    from lit_ddp.callbacks import PredictionWriter

    assert len(CALLBACKS) <= 6
    args = [*TINY_SHAPES, f"--trainer.default_root_dir={tmp_path}"]
    fit = build_cli(args, run=False).trainer.callbacks
    assert len(fit) <= 8, [type(c).__name__ for c in fit]
    assert not any(isinstance(c, PredictionWriter) for c in fit)
    predict = build_cli(
        ["predict", *args, "--ckpt_path=untrained", "--trainer.enable_progress_bar=false"]
    ).trainer.callbacks
    assert sum(isinstance(c, PredictionWriter) for c in predict) == 1


@pytest.mark.parametrize(
    ("key", "kind", "own"),
    [("progress_bar", "ProgressBar", "TQDMProgressBar"), ("model_summary", "ModelSummary", "ModelSummary")],
)
def test_a_bar_or_summary_turned_off_gets_no_lightning_default_in_its_place(
    tmp_path: Path, key: str, kind: str, own: str
) -> None:
    """`--console.progress_bar=false` showed Lightning's own bar (epochs from 0, v_num),
    `--console.model_summary=false` its summary (a FLOPs column of zeros): Lightning adds a default where no
    callback of the kind is left."""
    from lightning.pytorch import callbacks

    base = getattr(callbacks, kind)
    args = [*TINY_SHAPES, f"--trainer.default_root_dir={tmp_path}", f"--console.{key}=false"]
    assert not any(isinstance(c, base) for c in build_cli(args, run=False).trainer.callbacks)
    # Lightning's own, asked for by its flag, or a callback of the user's, stays.
    asked = build_cli([*args, f"--trainer.enable_{key}=true"], run=False).trainer.callbacks
    assert any(isinstance(c, base) for c in asked)
    added = build_cli([*args, f"--trainer.callbacks+=lightning.pytorch.callbacks.{own}"], run=False)
    assert any(isinstance(c, base) for c in added.trainer.callbacks)


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


@pytest.mark.parametrize("name", ["LearningRateMonitor", "ModelSummary"])
def test_a_lightning_callback_named_by_its_short_name_is_found(tmp_path: Path, name: str) -> None:
    """`--trainer.callbacks+=LearningRateMonitor` was `Parser key "trainer.callbacks":`, naming nothing:
    lit_ddp's forks of it had its name, and jsonargparse finds a class by its name, so two were none."""
    from lightning.pytorch import Callback, callbacks

    lightnings = {n for n in callbacks.__all__ if isinstance(getattr(callbacks, n), type)}
    ours = [c.__name__ for c in _subclasses(Callback) if c.__module__.startswith("lit_ddp.")]
    assert not lightnings & set(ours), "a lit_ddp callback takes the name of Lightning's"
    args = [*TINY_SHAPES, f"--trainer.default_root_dir={tmp_path}", f"--trainer.callbacks+={name}"]
    found = build_cli(args, run=False).trainer.callbacks
    assert any(type(c) is getattr(callbacks, name) for c in found)


@pytest.mark.parametrize(
    "switch", ["--trainer.enable_checkpointing=false", "--checkpoint=null --last_checkpoint=null"]
)
def test_checkpointing_can_be_turned_off(tmp_path: Path, switch: str) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    cli = build_cli(["fit", *QUICK, *switch.split(), f"--trainer.default_root_dir={tmp_path}"])
    assert not any(isinstance(c, ModelCheckpoint) for c in cli.trainer.callbacks)
    assert "val/acc" in cli.trainer.callback_metrics  # the run itself went through
    assert not list(tmp_path.rglob("*.ckpt"))


def test_barebones_runs_without_the_default_logger_and_the_features_it_turns_off(tmp_path: Path) -> None:
    """Lightning's raw-speed mode refuses a logger, checkpointing, a progress bar and a model summary: the
    default TensorBoard logger and our callbacks for them made every --trainer.barebones=true a refusal."""
    from lightning.pytorch.callbacks import ModelCheckpoint, ModelSummary, ProgressBar

    cli = build_cli(["fit", *QUICK, "--trainer.barebones=true", f"--trainer.default_root_dir={tmp_path}"])
    assert cli.trainer.logger is None and cli.trainer.global_step > 0
    kinds = (ModelCheckpoint, ModelSummary, ProgressBar)
    assert not any(isinstance(c, kinds) for c in cli.trainer.callbacks)
    assert not list(tmp_path.rglob("*.ckpt")) and not list(tmp_path.rglob("events.out.tfevents.*"))


@pytest.mark.parametrize("profiler", ["", "--trainer.profiler=simple"])
def test_a_fit_profiles_only_when_asked(tmp_path: Path, profiler: str) -> None:
    """By default the Trainer's profiler records nothing and costs nothing a hook (assembly.NoProfiler); one
    the user names is the one that runs, and times the steps."""
    from lightning.pytorch.profilers import SimpleProfiler

    from lit_ddp.assembly import NoProfiler

    cli = build_cli(["fit", *QUICK, *profiler.split(), f"--trainer.default_root_dir={tmp_path}"])
    assert cli.trainer.global_step > 0
    if not profiler:
        assert type(cli.trainer.profiler) is NoProfiler
    else:
        assert isinstance(cli.trainer.profiler, SimpleProfiler)
        assert cli.trainer.profiler.recorded_durations["run_training_batch"]


def test_last_ckpt_is_the_newest_state_and_best_is_kept_beside_it(tmp_path: Path) -> None:
    """last.ckpt is rewritten at every epoch end (not only when the best improves), best by val/acc too."""
    cli = build_cli(["fit", *QUICK, "--trainer.max_epochs=3", f"--trainer.default_root_dir={tmp_path}"])
    run = assert_single_run(tmp_path)
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert last["global_step"] == cli.trainer.global_step and last["epoch"] == 2
    best = [p for p in (run / "checkpoints").glob("epoch*.ckpt")]
    assert len(best) == 1 and cli.trainer.checkpoint_callback.best_model_path == str(best[0])


def test_warmup_lasts_one_epoch_of_steps_also_when_max_steps_ends_the_run(tmp_path: Path) -> None:
    """8 batches per epoch, max_steps=20 (under the default max_epochs=12): one warmup epoch is 8 steps."""
    import lightning as L

    lrs: list[float] = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, *args) -> None:
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    args = [*QUICK, "--trainer.max_epochs=12", "--trainer.max_steps=20", "--model.optim.warmup_epochs=1"]
    cli = build_cli(
        [*args, "--model.optim.schedule=constant", f"--trainer.default_root_dir={tmp_path}"], run=False
    )
    cli.trainer.callbacks.append(Record())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    peak = cli.model.optim.lr
    assert len(lrs) == 20
    assert lrs[6] < lrs[7] == pytest.approx(peak) and lrs[19] == pytest.approx(peak)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--trainer.max_epochs=-1", "--trainer.max_time=00:00:00:03", "--model.optim.schedule=constant"],
            None,
        ),
        (
            ["--trainer.max_epochs=-1", "--trainer.max_time=00:00:00:03"],
            "lit_ddp: error: --model.optim.schedule=cosine decays over the run's length, which is open-ended",
        ),
        (["--trainer.log_every_n_steps=0"], None),
        # Lightning refused it with a ValueError traceback, once the epoch's batches were known (8 here).
        (
            ["--trainer.val_check_interval=9"],
            "lit_ddp: error: --trainer.val_check_interval=9 validates every 9 training batches, and an epoch"
            " has 8 per device: pass 8 or fewer, or --trainer.check_val_every_n_epoch=null",
        ),
        (["--trainer.val_check_interval=4"], None),
    ],
)
def test_lightning_settings_users_pass_work_or_fail_in_one_line(
    tmp_path: Path, args: list[str], error: str | None, capsys
) -> None:
    from lit_ddp.cli import main

    argv = ["fit", *QUICK, *args, f"--trainer.default_root_dir={tmp_path / 'runs'}"]
    if error is None:
        main([a for a in argv if not a.startswith("--trainer.log_every_n_steps=1")])
        assert list(tmp_path.rglob("last.ckpt"))
        return
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(error) and "Traceback" not in "\n".join(err)
    # A refusal leaves none of the folders it made (the interval's left version_0 with its config.yaml).
    assert not (tmp_path / "runs").exists()


class OwnOptimizer(LeNetCIFAR):
    """A user's model with its own configure_optimizers, which need not load the training data."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_validation_interval_past_the_epoch_is_one_line_for_a_model_with_its_own_optimizers(
    tmp_path: Path, capsys
) -> None:
    """Lightning refuses it with a ValueError once the epoch's batches are known: in ImageClassifier's
    configure_optimizers as it loads them, or in Lightning's loop for a model that does not."""
    argv = ["fit", *QUICK, "--model=test_cli.OwnOptimizer", "--trainer.val_check_interval=9"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, f"--trainer.default_root_dir={tmp_path / 'runs'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("lit_ddp: error: --trainer.val_check_interval=9 validates every 9 training")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("subcommand", ["validate", "test", "predict"])
def test_evaluating_last_without_an_earlier_run_is_an_error_not_random_weights(
    tmp_path: Path, subcommand: str, capsys
) -> None:
    from lit_ddp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([subcommand, *QUICK, "--ckpt_path=last", f"--trainer.default_root_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2
    assert err.splitlines()[-1].startswith(f"lit_ddp: error: {subcommand} --ckpt_path=last: no last.ckpt")
    assert "train first with fit" in err and "Traceback" not in err
    build_cli(["fit", *QUICK, f"--trainer.default_root_dir={tmp_path}"])  # once a run exists, it is found
    cli = build_cli([subcommand, *QUICK, "--ckpt_path=last", f"--trainer.default_root_dir={tmp_path}"])
    assert cli.trainer.ckpt_path == str(next(tmp_path.rglob("last.ckpt")))


def test_step_loss_is_written_on_the_steps_lightning_writes_and_can_be_turned_off(tmp_path: Path) -> None:
    """16 optimizer steps, log_every_n_steps=4: train/loss_step at the same 4 steps as the learning rate."""
    args = [*QUICK, "--trainer.max_epochs=2", "--trainer.log_every_n_steps=4"]
    build_cli(["fit", *args, f"--trainer.default_root_dir={tmp_path / 'on'}"])
    scalars = read_scalars(assert_single_run(tmp_path / "on"))
    lr = next(v for k, v in scalars.items() if k.startswith("lr-"))
    assert len(scalars["train/loss_step"]) == len(lr) == 4
    assert all(0 < v < 10 for v in scalars["train/loss_step"])
    build_cli(["fit", *args, "--dashboard.step_loss=false", f"--trainer.default_root_dir={tmp_path / 'off'}"])
    assert "train/loss_step" not in read_scalars(assert_single_run(tmp_path / "off"))


def test_the_step_loss_under_gradient_accumulation_is_the_batch_loss_not_a_share_of_it(
    tmp_path: Path,
) -> None:
    """With --trainer.accumulate_grad_batches=2, train/loss_step (TensorBoard and the progress bar) showed
    half the batch loss, 1.15 beside a train/loss_epoch of 2.30: Lightning hands on_train_batch_end the loss
    it divided by the accumulation for the backward pass."""
    args = [*QUICK, "--trainer.accumulate_grad_batches=2", f"--trainer.default_root_dir={tmp_path}"]
    build_cli(["fit", *args])
    scalars = read_scalars(assert_single_run(tmp_path))
    (epoch_loss,) = scalars["train/loss_epoch"]
    assert len(scalars["train/loss_step"]) == 4  # 8 batches of 32, 2 per optimizer step
    # An untrained 10-class model: every batch's cross-entropy is near ln 10 = 2.30, as is their mean.
    assert all(abs(v - epoch_loss) < 0.2 * epoch_loss for v in scalars["train/loss_step"])


def test_the_console_shows_what_a_user_can_act_on_and_nothing_else(tmp_path: Path) -> None:
    fit = run_cli(["fit", *TINY_SHAPES, "--trainer.max_epochs=1"], cwd=tmp_path, timeout=180)
    assert fit.returncode == 0, fit.stderr[-2000:]
    validate = run_cli(["validate", *TINY_SHAPES, "--ckpt_path=last"], cwd=tmp_path, timeout=180)
    assert validate.returncode == 0, validate.stderr[-2000:]
    console = fit.stdout + fit.stderr + validate.stdout + validate.stderr
    # Kept: the bar, counting epochs as the summary line does; the global batch; the epoch summary.
    assert "Epoch 1/1" in console and "global batch = 32 per device" in console
    assert "epoch 1/1 | train loss" in console
    assert "62.0 K trainable parameters, 0 frozen" in console
    # The fit's last line: where its run went, and the checkpoints that --ckpt_path=best and last read.
    (saved,) = [line for line in fit.stdout.splitlines() if line.startswith("run saved in ")]
    folder, _, files = saved.removeprefix("run saved in ").partition(": best by val/acc ")
    best, _, last = files.split(" ", 1)[1].partition(", last ")
    assert last == "checkpoints/last.ckpt (--ckpt_path=last resumes it)", saved
    assert folder == "logs/lightning_logs/version_0" and (tmp_path / folder / best).is_file(), saved
    assert (tmp_path / folder / "checkpoints" / "last.ckpt").is_file()
    for noise in (
        "litlogger",
        "LeafSpec",
        "FLOPs",
        "Modules in train mode",
        "v_num",
        "Epoch 0/0",
        "dirpath has",
    ):
        assert noise not in console, noise


def test_the_step_loss_written_at_a_stop_is_that_steps_not_a_stale_one(tmp_path: Path) -> None:
    """log_every_n_steps=5, a stop decided during step 6: Lightning writes step values at that step too,
    which held the loss of step 4 until StepLoss logged at stops."""
    sys.path.insert(0, str(REPO / "tests" / "helpers"))  # fault_probe, for --trainer.callbacks
    stop = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=should_stop"]
    args = ["fit", *TINY_SHAPES, "--trainer.max_epochs=2", "--trainer.log_every_n_steps=5", *stop]
    build_cli([*args, "--trainer.callbacks.at_step=6", f"--trainer.default_root_dir={tmp_path}"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(assert_single_run(tmp_path)), size_guidance={"scalars": 0})
    events.Reload()
    written = {e.step: e.value for e in events.Scalars("train/loss_step")}
    assert sorted(written) == [4, 6] and written[6] != written[4]
    # Lightning's Timer (max_time) decides its stop in on_train_batch_end: it runs before StepLoss.
    timed = ["--trainer.max_time=00:00:10:00", f"--trainer.default_root_dir={tmp_path}"]
    cli = build_cli(timed, run=False)
    kinds = [type(c).__name__ for c in cli.trainer.callbacks]
    assert kinds.index("Timer") < kinds.index("Dashboard")  # which runs StepLoss
    from lit_ddp.callbacks import Dashboard, StepLoss

    assert next(c for c in cli.trainer.callbacks if isinstance(c, Dashboard)).member(StepLoss) is not None


def test_a_checkpoint_that_disagrees_with_the_command_line_says_which_wins(
    tmp_path: Path, capsys, caplog, monkeypatch
) -> None:
    build_cli(["fit", *QUICK, f"--trainer.default_root_dir={tmp_path}"])
    ckpt = next(tmp_path.rglob("last.ckpt"))
    evaluate = ["validate", *QUICK, f"--trainer.default_root_dir={tmp_path / 'eval'}", f"--ckpt_path={ckpt}"]
    opened = []  # by lit_ddp's checks, before Lightning's own load: once, for the note and the shape check
    load = resume.load_checkpoint_file
    counted = lambda *a, **k: opened.append(a[0]) or load(*a, **k)  # noqa: E731
    for module in (resume, checkpoint_file):  # the command line's file, then last/best and the shape check
        monkeypatch.setattr(module, "load_checkpoint_file", counted)
    with caplog.at_level("INFO"):
        cli = build_cli([*evaluate, "--model.batch_norm=true", "--model.optim.lr=0.1"])
    assert opened == [str(ckpt)]
    assert cli.model.hparams.batch_norm is False  # the checkpoint's value, which its weights need
    assert (
        f"lit_ddp: note: {ckpt} keeps the model settings it was trained with, over --model.batch_norm=True"
        " (the checkpoint's: False), --model.optim.lr=0.1 (the checkpoint's: 0.003)"
    ) in caplog.messages


def test_last_and_best_build_the_model_from_the_checkpoint_found_as_a_path_does(
    tmp_path: Path, caplog
) -> None:
    """`--ckpt_path=last` (or `best`) was resolved after the model was built from this command's settings, a
    path before it from the checkpoint's: `validate --ckpt_path=last --model.batch_norm=true` of a run
    without BatchNorm was refused ("does not fit"), where the same file by its path validated with a note."""
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *QUICK, root])
    ckpt = next(tmp_path.rglob("last.ckpt"))
    for asked in ("last", "best"):
        caplog.clear()
        with caplog.at_level("INFO"):
            cli = build_cli(["validate", *QUICK, root, f"--ckpt_path={asked}", "--model.batch_norm=true"])
        assert cli.model.hparams.batch_norm is False  # the checkpoint's, which its weights need
        found = ckpt if asked == "last" else next(tmp_path.rglob("epoch*.ckpt"))
        assert any(m.startswith(f"lit_ddp: note: {found} keeps the model settings") for m in caplog.messages)
    caplog.clear()
    with caplog.at_level("INFO"):
        resumed = build_cli(["fit", *QUICK, root, "--ckpt_path=last", "--model.batch_norm=true"])
    assert resumed.model.hparams.batch_norm is False and f"resuming from {ckpt}" in caplog.messages


def test_compile_and_cuda_graph_are_the_commands_not_the_checkpoints(tmp_path: Path, caplog) -> None:
    """How a command runs the step is its own: validate of a compiled run's checkpoint compiled the network
    again (no C compiler: no validate), and a fit resumed from a --model.cuda_graph=true run with
    --model.cuda_graph=auto and clipping was refused, telling the user to pass --model.cuda_graph=auto."""
    build_cli(["fit", *QUICK, f"--trainer.default_root_dir={tmp_path}", "--model.cuda_graph=true"])
    ckpt = next(tmp_path.rglob("last.ckpt"))
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["hyper_parameters"]["compile"] = True  # a compiled run's: the same parameter names
    torch.save(checkpoint, ckpt)
    root = f"--trainer.default_root_dir={tmp_path / 'again'}"
    with caplog.at_level("INFO"):
        cli = build_cli(["validate", *QUICK, root, f"--ckpt_path={ckpt}", "--model.compile=false"])
    assert cli.model.compile_net is False and not cli.model._net_compiled
    assert "val/acc" in cli.trainer.callback_metrics
    resumed = ["fit", *QUICK, root, f"--ckpt_path={ckpt}", "--trainer.max_epochs=2"]
    cli = build_cli([*resumed, "--model.cuda_graph=auto", "--trainer.gradient_clip_val=1.0"])
    assert cli.model.cuda_graph == "auto" and cli.trainer.current_epoch == 2
    assert not [m for m in caplog.messages if "keeps the model settings" in m]  # neither is replaced


def test_a_resumed_cuda_graph_run_names_no_lr_change(tmp_path: Path, caplog) -> None:
    """A --model.cuda_graph=true run's checkpoint holds its lr as float32 made a float (the graph reads a
    tensor): resumed at the same --model.optim.lr it said "trained at a base lr of 0.003, this run's is
    0.003"."""
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *QUICK, root, "--model.cuda_graph=true", "--model.optim.schedule=constant"])
    with caplog.at_level("INFO"):
        cli = build_cli(["fit", *QUICK, root, "--ckpt_path=last", "--trainer.max_epochs=2"])
    assert cli.trainer.current_epoch == 2
    assert not [m for m in caplog.messages if "base lr" in m], caplog.messages


def test_a_projects_shard_command_names_the_project_in_its_usage(capsys) -> None:
    """A generated project's `python -m my_project shard --help` printed `usage: python -m lit_ddp shard`."""
    from lit_ddp.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["shard", "--help"], prog="python -m my_project")
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m my_project shard ")
