"""A ``~`` in a folder a run reads or writes means the home folder, and ``$VAR`` (``${VAR}``) the
environment's, as in a shell: YAML configs (and quoted arguments) pass them on unexpanded. Lightning's
TensorBoard writer expanded ``~`` and its checkpoints did not, which split one run between ``~/runs`` and
``./~/runs``; the data modules looked for ``./~/data``, and for a folder literally named ``$SCRATCH``."""

from pathlib import Path

import pytest
from conftest import TINY_RUN
from imagenet_tree import make_tree
from test_cifar10 import write_cifar10

from lit_ddp.cli import build_cli, main
from lit_ddp.data import CIFAR10DataModule, ImageNetDataModule, ShapesDataModule
from lit_ddp.errors import UserError


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home folder of the test's own, and a working folder beside it (where ``./~`` would appear)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def test_a_runs_folders_under_a_tilde_are_the_home_folders(home: Path) -> None:
    build_cli(["fit", *TINY_RUN, "--trainer.default_root_dir=~/runs"])
    run = home / "runs" / "lightning_logs" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "config.yaml").is_file()
    resumed = build_cli(["fit", *TINY_RUN, "--trainer.default_root_dir=~/runs", "--ckpt_path=last"])
    assert resumed.trainer.ckpt_path == str(run / "checkpoints" / "last.ckpt")
    csv = ["--trainer.logger=CSVLogger", "--trainer.logger.init_args.save_dir=~/csv"]
    build_cli(["fit", *TINY_RUN, *csv])
    assert (home / "csv" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    assert not (home.parent / "~").exists()


def test_the_data_modules_read_folders_under_a_tilde(home: Path) -> None:
    write_cifar10(home / "cifar")
    cifar = CIFAR10DataModule(data_dir="~/cifar", val_size=10)
    cifar.setup("fit")
    assert cifar.data_dir == home / "cifar" and len(cifar.val_set) == 10
    make_tree(home / "tree")
    assert ImageNetDataModule(data_dir="~/tree", index_cache=str(home / "index")).num_classes == 3
    predict = ShapesDataModule(predict_dir="~/tree/val")
    assert predict.predict_files and all(
        f.startswith(str(home / "tree" / "val")) for f in predict.predict_files
    )


def test_shards_under_a_tilde_are_read_from_the_home_folder(home: Path) -> None:
    from streaming_runs import make_cifar_shards

    from lit_ddp.data import StreamingDataModule

    make_cifar_shards(home / "c")
    dm = StreamingDataModule(url="~/c/shards", val_size=10, cache_dir=str(home / "cache"))
    assert dm.url == str(home / "c" / "shards") and dm.num_classes == 10


def test_a_checkpoint_and_a_weights_file_under_a_tilde_are_found(home: Path) -> None:
    import torch
    import torchvision

    from lit_ddp.models import ArchClassifier

    build_cli(["fit", *TINY_RUN, "--trainer.default_root_dir=~/runs"])
    ckpt = "~/runs/lightning_logs/version_0/checkpoints/last.ckpt"
    scored = build_cli(["validate", *TINY_RUN, "--trainer.default_root_dir=~/runs", f"--ckpt_path={ckpt}"])
    assert scored.trainer.ckpt_path == str(home / ckpt.removeprefix("~/"))
    saved = torchvision.models.mobilenet_v3_small(num_classes=10).state_dict()
    torch.save(saved, home / "w.pth")
    model = ArchClassifier(arch="mobilenet_v3_small", num_classes=10, weights="~/w.pth")
    loaded = model.net.state_dict()
    assert all(torch.equal(loaded[key], value) for key, value in saved.items())


def test_environment_variables_in_a_configs_paths_are_the_environments(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster's config names its folders by $SCRATCH: the data, the runs and the resumed checkpoint."""
    monkeypatch.setenv("SCRATCH", str(tmp_path / "scratch"))
    make_tree(tmp_path / "scratch" / "tree")
    dm = ImageNetDataModule(data_dir="$SCRATCH/tree", index_cache="${SCRATCH}/index")
    assert dm.data_dir == tmp_path / "scratch" / "tree" and dm.num_classes == 3
    assert dm.index_cache == tmp_path / "scratch" / "index"
    config = tmp_path / "run.yaml"
    config.write_text("trainer:\n  default_root_dir: $SCRATCH/runs\n")
    build_cli(["fit", *TINY_RUN, f"--config={config}"])
    run = tmp_path / "scratch" / "runs" / "lightning_logs" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    ckpt = "${SCRATCH}/runs/lightning_logs/version_0/checkpoints/last.ckpt"
    scored = build_cli(["validate", *TINY_RUN, f"--config={config}", f"--ckpt_path={ckpt}"])
    assert scored.trainer.ckpt_path == str(run / "checkpoints" / "last.ckpt")
    assert not list(tmp_path.glob("$*"))


def test_a_variable_the_environment_lacks_is_one_line_naming_the_option(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delenv("SCRATCH", raising=False)
    with pytest.raises(UserError, match=r"^--data.data_dir=\$SCRATCH/tree: \$SCRATCH is not set in this"):
        ImageNetDataModule(data_dir="$SCRATCH/tree")
    with pytest.raises(SystemExit):
        main(["fit", *TINY_RUN, "--trainer.default_root_dir=${SCRATCH}/runs"])
    err = capsys.readouterr().err.strip()
    assert err == (
        "lit_ddp: error: --trainer.default_root_dir=${SCRATCH}/runs: $SCRATCH is not set in this environment:"
        " export SCRATCH=<folder>, or write the path out"
    )
    assert not list(tmp_path.glob("$*")) and not list(tmp_path.glob("lightning_logs"))


def _weights(name: str) -> None:
    from lit_ddp.models import ArchClassifier

    ArchClassifier(arch="mobilenet_v3_small", num_classes=10, weights=name)


# (what reads the path, the line's start): each is read from the current folder.
MISSING = [
    (lambda name: CIFAR10DataModule(data_dir=name).prepare_data(), "CIFAR-10 not found in {name}/cifar-10"),
    (lambda name: ShapesDataModule(predict_dir=name), "predict_dir={name} "),
    (_weights, "weights file {name} "),
]


@pytest.mark.parametrize(("reads", "line"), MISSING, ids=["cifar", "predict_dir", "weights"])
def test_a_relative_path_that_is_not_there_names_the_folder_it_was_read_from(
    home: Path, reads, line: str
) -> None:
    """A relative path read in a job started in another folder said only `not found in data/...`."""
    with pytest.raises(UserError) as err:
        reads("gone")
    read_as = f"(read from the current folder, as {home.parent / 'gone'}"
    assert str(err.value).startswith(line.format(name="gone")) and read_as in str(err.value), err.value
    with pytest.raises(UserError) as err:
        reads(str(home.parent / "gone"))  # an absolute path says where it is itself
    assert "read from the current folder" not in str(err.value), err.value


def test_a_remote_root_is_not_named_as_read_from_the_current_folder(home: Path, capsys) -> None:
    """The runs' folder under a URL root said `under s3:/bucket/runs/lightning_logs (read from the current
    folder, as <cwd>/s3:/bucket/runs/lightning_logs)`: a folder of no disk of this machine."""
    with pytest.raises(SystemExit):
        main(["test", *TINY_RUN, "--trainer.default_root_dir=s3://bucket/runs", "--ckpt_path=last"])
    err = capsys.readouterr().err
    assert "test --ckpt_path=last: no last.ckpt" in err and "read from the current folder" not in err, err


def test_a_remote_root_is_named_as_given_and_not_said_to_be_empty(home: Path, monkeypatch) -> None:
    """A URL root was named with one slash (`under s3:/bucket/runs/lightning_logs`), as a Path writes it, and
    said to hold no run, though its runs are not searched: fit's note and test's line name it as given and
    say so (read from the plan: the test stops each command at preflight, which without s3fs would stop it
    at its package's line)."""
    seen = []
    monkeypatch.setattr("lit_ddp.cli.problems", lambda plan: seen.append(plan) or ["stopped at preflight"])
    root = "--trainer.default_root_dir=s3://bucket/runs"
    csv = [root, "--trainer.logger=CSVLogger", "--trainer.logger.init_args.save_dir=s3://bucket/csv"]
    for command in (["fit", root], ["test", root], ["test", *csv, "--trainer.logger.init_args.version=3"]):
        with pytest.raises(SystemExit):
            main([*command, *TINY_RUN, "--ckpt_path=last"])
    fit, test, pinned = seen
    assert fit.ckpt_note == (
        "lit_ddp: note: --ckpt_path=last: the runs under s3://bucket/runs/lightning_logs are not searched"
        " (lit_ddp looks for runs on this machine's disks only), so this fit starts a new one: pass a run's"
        " last.ckpt there as --ckpt_path to train on from it"
    )
    assert test.checkpoint_problem == (
        "test --ckpt_path=last: no last.ckpt from an earlier run under s3://bucket/runs/lightning_logs is"
        " looked for (lit_ddp looks for runs on this machine's disks only): pass --ckpt_path=PATH to a"
        " checkpoint there"
    )
    assert pinned.checkpoint_problem.startswith(
        "test --ckpt_path=last: no last.ckpt from an earlier run under"
        " s3://bucket/csv/lightning_logs/version_3 is looked for"
    ), pinned.checkpoint_problem
