"""A 0.2 user's runs, configs and checkpoints under 0.3: each works, or is one line naming what replaces it
(CHANGELOG.md, 0.3.0 "Removed"). The 0.2 files are built here in the shape 0.2 wrote them."""

from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY_RUN, run_cli
from test_mistakes import one_error_line

from lit_ddp.cli import build_cli

# The data section of a config.yaml that 0.2 saved for `fit --config configs/lenet_cifar.yaml
# --data.crop_padding=2`: the recipe's augmentation, and the deprecated keys as given (or null).
SAVED_02 = """\
data:
  class_path: lit_ddp.data.ShapesDataModule
  init_args:
    augmentation:
      class_path: lit_ddp.data.CropFlip
      init_args:
        padding: 4
    augment: null
    crop_padding: 2
"""


def test_a_config_yaml_02_saved_names_each_removed_key_and_what_replaces_it(tmp_path: Path) -> None:
    """`augment: null` was 'did you mean data.augmentation?' (the file has one: `augmentation: null` in its
    place turns the augmentation off), and `crop_padding: 2`, a line later, had no value in its line, while
    the changelog said to delete it (padding 4 then). One line names both, the fix as it reads."""
    config = tmp_path / "config.yaml"
    config.write_text(SAVED_02)
    proc = run_cli(["fit", f"--config={config}"], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"lit_ddp: error: {config}, line 8: removed in 0.3.0: data.crop_padding: 2: delete it and set"
        " data.augmentation: CropFlip, data.augmentation.padding: 2; data.augment: the default now, delete"
        " them"
    ), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
    fixed = SAVED_02.replace("    augment: null\n    crop_padding: 2\n", "").replace(
        "padding: 4", "padding: 2"
    )
    config.write_text(fixed)
    proc = run_cli(["fit", f"--config={config}", "--print_config"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    augmentation = yaml.safe_load(proc.stdout)["data"]["init_args"]["augmentation"]
    assert augmentation == {"class_path": "lit_ddp.data.CropFlip", "init_args": {"padding": 2}}


# The default callbacks as a config.yaml of the 0.2.0 release saves them, one set off, one changed.
SAVED_020 = """\
preemption:
  class_path: lit_ddp.runtime.preemption.PreemptionCheckpoint
  init_args:
    requeue_signal: SIGUSR1
    check_every_n_batches: 1
progress_bar: null
failed_run_cleanup:
  class_path: lit_ddp.runtime.failed_run.RemoveFailedRunDir
  init_args: {}
"""


def test_a_config_yaml_020_saved_names_the_groups_its_callback_keys_went_into(tmp_path: Path) -> None:
    """Each of its thirty callback keys was one try, with the closest key: 'unknown key preemption: did you
    mean predictions?'. A setting not at 0.3's default is named with its new key."""
    config = tmp_path / "config.yaml"
    config.write_text(SAVED_020)
    proc = run_cli(["fit", f"--config={config}"], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"lit_ddp: error: {config}, line 1: removed in 0.3.0: preemption.check_every_n_batches: 1: delete it"
        " and set resilience.check_every_n_batches: 1; progress_bar: null: delete it and set"
        " console.progress_bar: false; preemption, preemption.requeue_signal, failed_run_cleanup: the"
        " default now, delete them"
    ), proc.stderr


@pytest.mark.parametrize(
    ("given", "fix"),
    [
        ("--data.augment=false", "pass --data.augmentation=null"),
        ("--data.crop_padding=2", "pass --data.augmentation=CropFlip --data.augmentation.padding=2"),
        ("--data.crop_scale=[0.5,1]", "pass --data.augmentation.scale=[0.5, 1]"),  # was: batch_size?
        ("--data.crop_ratio=[0.75,1.33]", "pass --data.augmentation.ratio=[0.75, 1.33]"),  # was: draft?
        ("--data.auto_augment=randaugment", "pass --data.augmentation.auto_augment=randaugment"),
        ("--data.random_erasing=0.25", "pass --data.augmentation.random_erasing=0.25"),
        ("--quiet=null", "pass --console.quiet=false"),
        ("--nan_guard.read=now", "pass --resilience.nan_read=now"),
        ("--lr_monitor=null", "pass --dashboard.lr_monitor=false"),
    ],
)
def test_a_removed_option_names_its_replacement_with_the_value(capsys, given: str, fix: str) -> None:
    line = one_error_line(capsys, ["fit", "--data=ImageNetDataModule", given])
    assert line == f"removed in 0.3.0: {given}: {fix}"


def test_removed_options_that_set_the_default_are_named_to_leave_out(capsys) -> None:
    line = one_error_line(capsys, ["fit", "--data.augment=true", "--eval_limits=null"])
    assert line == "removed in 0.3.0: --data.augment, --eval_limits: the default now, leave them out"


def test_resnetimagenet_by_its_short_name_is_told_its_new_one(capsys) -> None:
    """It was 'no such model class (the choices are ArchClassifier, LeNetCIFAR)'."""
    line = one_error_line(capsys, ["fit", "--model=ResNetImageNet"])
    assert (
        line == "--model=ResNetImageNet: renamed in 0.3.0: name ArchClassifier (same arguments, same weights)"
    )


ARCH = ["--model=ArchClassifier", "--model.arch=resnet18", "--model.channels_last=false"]


@pytest.fixture(scope="module")
def run_02(tmp_path_factory) -> Path:
    """A finished ResNet run whose checkpoint names its model as 0.2 did: ResNetImageNet."""
    root = tmp_path_factory.mktemp("run")
    build_cli(["fit", *TINY_RUN, *ARCH, f"--trainer.default_root_dir={root}"])
    (last,) = root.rglob("last.ckpt")
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["hyper_parameters"]["_class_path"] == "lit_ddp.models.ArchClassifier"
    checkpoint["hyper_parameters"]["_class_path"] = "lit_ddp.models.ResNetImageNet"
    torch.save(checkpoint, last)
    return root


def test_a_02_resnet_checkpoint_resumes_and_validates_as_arch_classifier(run_02: Path) -> None:
    """fit --ckpt_path=last was refused ('the runs under ... are other experiments', model ResNetImageNet),
    --ckpt_path=PATH with the new name too ('holds a ResNetImageNet'), and without --model it was
    jsonargparse's traceback: a 0.2 ResNet run could be neither resumed nor scored."""
    root = f"--trainer.default_root_dir={run_02}"
    (last,) = run_02.rglob("last.ckpt")
    proc = run_cli(["validate", *TINY_RUN, root, f"--ckpt_path={last}"], cwd=run_02)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    proc = run_cli(["fit", *TINY_RUN, *ARCH, root, "--trainer.max_epochs=2", "--ckpt_path=last"], cwd=run_02)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Restored all states" in proc.stdout + proc.stderr
    resumed = torch.load(last, weights_only=True)
    assert (
        resumed["epoch"] == 1
        and resumed["hyper_parameters"]["_class_path"] == "lit_ddp.models.ArchClassifier"
    )
    for config in run_02.rglob("config.yaml"):  # each re-runs with --config
        assert yaml.safe_load(config.read_text())["model"]["class_path"] == "lit_ddp.models.ArchClassifier"
