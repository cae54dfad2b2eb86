"""Networks by name (torchvision, timm), weights from a file, head-only training, the fine-tuning recipes.

Every weights file here is written by the test itself with torch.save: nothing is downloaded.
"""

import logging
import shlex
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY_RUN
from imagenet_tree import CLASSES, make_tree
from lightning import Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_ddp.cli import build_cli
from lit_ddp.errors import UserError
from lit_ddp.models import ArchClassifier, build_net
from lit_ddp.models.backbones import freeze_norm_stats
from lit_ddp.models.classifier import BATCH_OF_ONE, ImageClassifier, has_batch_norm

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
FINETUNE = CONFIGS / "finetune_imagefolder.yaml"
MODERN = CONFIGS / "resnet50_imagenet_modern.yaml"
DATA_DOC = CONFIGS.parent / "docs" / "data.md"


@pytest.fixture
def info_lines():
    """The lines rank_zero_info logs (Lightning's logger does not propagate to pytest's caplog)."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def weights_line(lines: list[str]) -> str:
    (line,) = [ln for ln in lines if ln.startswith("weights:")]
    return line


def save_resnet18(path: Path, num_classes: int = 1000) -> dict[str, torch.Tensor]:
    """What a user saves from torchvision's pretrained ResNet-18 (here with random values)."""
    torch.manual_seed(1)
    state = build_net("resnet18", num_classes).state_dict()
    torch.save(state, path)
    return state


def fit_steps(model: ArchClassifier, root: Path, steps: int, **trainer_args) -> Trainer:
    """``steps`` training steps on random 32×32 images, each followed by one validation batch."""
    torch.manual_seed(0)
    n = model.num_classes
    data = TensorDataset(torch.randn(32, 3, 32, 32), torch.arange(32) % n)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=steps,
        val_check_interval=1,  # validation between training steps: the modes must come back as they were
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **trainer_args,
    )
    trainer.fit(model, DataLoader(data, batch_size=8), DataLoader(data, batch_size=8))
    return trainer


# ---- networks by name ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mobilenet_v3_small", "squeezenet1_1", "googlenet"])
def test_any_torchvision_classifier_builds_by_name_and_returns_logits(arch: str) -> None:
    model = ArchClassifier(num_classes=3, arch=arch).train()
    logits = model(torch.randn(2, 3, 64, 64))  # googlenet: a tensor, not its aux-logits tuple
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 3)


def test_unknown_arch_is_one_line_with_the_closest_names() -> None:
    with pytest.raises(UserError, match=r"unknown arch 'convnxt_tiny': did you mean convnext_tiny") as err:
        ArchClassifier(num_classes=3, arch="convnxt_tiny")
    assert "\n" not in str(err.value) and "torchvision.models.list_models()" in str(err.value)
    with pytest.raises(UserError, match=r"unknown arch 'zzz': pass a name from"):
        build_net("zzz")


def test_zero_init_residual_works_for_resnets_and_is_refused_for_others() -> None:
    net = build_net("resnet18", 3, zero_init_residual=True)
    assert net.layer1[0].bn2.weight.abs().sum() == 0
    with pytest.raises(
        UserError, match=r"ResNets only, not mobilenet_v3_small: pass --model.zero_init_resid"
    ):
        build_net("mobilenet_v3_small", 3, zero_init_residual=True)


def test_timm_arch_without_timm_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` now raises ImportError
    with pytest.raises(UserError) as err:
        ArchClassifier(num_classes=3, arch="timm/resnet18")
    assert str(err.value) == (
        '--model.arch=timm/resnet18 needs timm, which is not installed: pip install "lit_ddp[timm]"'
    )


def test_a_missing_timm_is_named_before_any_option_of_the_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    """configs/resnet_imagenet.yaml sets zero_init_residual: true; with timm/resnet18 and no timm, the first
    line asked to turn that off, and only the next run named the missing extra."""
    monkeypatch.setitem(sys.modules, "timm", None)
    with pytest.raises(UserError) as err:
        ArchClassifier(num_classes=3, arch="timm/resnet18", zero_init_residual=True)
    assert str(err.value) == (
        '--model.arch=timm/resnet18 needs timm, which is not installed: pip install "lit_ddp[timm]"'
    )
    # Likewise a misspelt name comes before the option's complaint.
    with pytest.raises(UserError, match=r"unknown arch 'resnet19': did you mean resnet18"):
        build_net("resnet19", 3, zero_init_residual=True)


def test_timm_models_build_and_load_their_state_dicts(tmp_path: Path, info_lines: list[str]) -> None:
    timm = pytest.importorskip("timm")
    source = timm.create_model("resnet18", pretrained=False, num_classes=1000)
    torch.save(source.state_dict(), tmp_path / "timm_resnet18.pth")
    model = ArchClassifier(num_classes=3, arch="timm/resnet18", weights=str(tmp_path / "timm_resnet18.pth"))
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)
    torch.testing.assert_close(model.net.conv1.weight, source.conv1.weight)
    assert "new: fc.weight, fc.bias (1000 → 3 classes)" in weights_line(info_lines)
    with pytest.raises(UserError, match=r"unknown arch 'timm/resnet19': did you mean timm/resnet18"):
        build_net("timm/resnet19")


# ---- weights from a file -----------------------------------------------------------------------------


def test_state_dict_file_loads_and_a_head_for_another_class_count_stays_fresh(
    tmp_path: Path, info_lines: list[str]
) -> None:
    path = tmp_path / "resnet18.pth"
    saved = save_resnet18(path)
    model = ArchClassifier(num_classes=3, arch="resnet18", weights=str(path), channels_last=True)
    own = model.net.state_dict()
    for key, value in own.items():
        if not key.startswith("fc."):
            torch.testing.assert_close(value, saved[key], msg=key)
    assert own["fc.weight"].shape == (3, 512)
    n = len(own)
    assert weights_line(info_lines) == (
        f"weights: {n - 2} of {n} tensors from resnet18.pth; new: fc.weight, fc.bias (1000 → 3 classes)"
    )
    # The same class count: every tensor, nothing new.
    info_lines.clear()
    same = ArchClassifier(num_classes=1000, arch="resnet18", weights=str(path))
    torch.testing.assert_close(same.net.fc.weight, saved["fc.weight"])
    assert weights_line(info_lines) == f"weights: {n} of {n} tensors from resnet18.pth"


def test_lightning_checkpoint_loads_without_its_prefix(tmp_path: Path, info_lines: list[str]) -> None:
    # A real checkpoint of a fine-tuned 3-class model (state_dict under "net.", OptimConfig in its
    # hyperparameters), started again as a 5-class model.
    trained = ArchClassifier(num_classes=3, arch="resnet18")
    trainer = fit_steps(trained, tmp_path, steps=1)
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    assert "weights" not in torch.load(tmp_path / "run.ckpt", weights_only=False)["hyper_parameters"]
    model = ArchClassifier(num_classes=5, arch="resnet18", weights=str(tmp_path / "run.ckpt"))
    torch.testing.assert_close(model.net.layer4[1].conv2.weight, trained.net.layer4[1].conv2.weight)
    torch.testing.assert_close(model.net.bn1.running_mean, trained.net.bn1.running_mean)
    assert weights_line(info_lines).endswith("from run.ckpt; new: fc.weight, fc.bias (3 → 5 classes)")


def test_weights_of_another_network_or_a_bad_file_are_one_line(tmp_path: Path) -> None:
    torch.save(build_net("mobilenet_v3_small", 10).state_dict(), tmp_path / "mobilenet.pth")
    (tmp_path / "corrupt.pth").write_bytes(b"PK\x03\x04 not really a zip")
    torch.save({"lr": 0.1}, tmp_path / "dict.pth")
    cases = {
        "mobilenet.pth": r"does not fit --model.arch=resnet18: only 0 of the network's 122 tensors match",
        "missing.pth": r"missing.pth does not exist: pass --model.weights=PATH",
        "corrupt.pth": r"corrupt.pth is corrupt, truncated or not a torch file \(.+\): pass a file",
        "dict.pth": r"dict.pth holds no state_dict",
    }
    for name, message in cases.items():
        with pytest.raises(UserError, match=message) as err:
            ArchClassifier(num_classes=3, arch="resnet18", weights=str(tmp_path / name))
        assert "\n" not in str(err.value)


def test_a_deeper_network_s_weights_are_refused_not_loaded_out_of_place(tmp_path: Path) -> None:
    # Every tensor of a resnet18 has its name and shape in a resnet34's file (layer1.0, layer1.1, ...): the
    # network started from a resnet34's blocks 0 and 1 of each layer, the blocks between them dropped.
    torch.save(build_net("resnet34", 1000).state_dict(), tmp_path / "resnet34.pth")
    with pytest.raises(UserError) as err:
        ArchClassifier(num_classes=3, arch="resnet18", weights=str(tmp_path / "resnet34.pth"))
    assert str(err.value).startswith(
        f"weights file {tmp_path / 'resnet34.pth'} does not fit --model.arch=resnet18: it holds 8 blocks in"
        " the network's layers that a resnet18 lacks (layer1.2, layer2.2, layer2.3, layer3.2, layer3.3,"
    )
    assert "pass weights saved from a resnet18, or the --model.arch the file was saved from" in str(err.value)
    # A head of another shape (fc.1: a file saved with a Sequential head) and tensors outside the network
    # (an EMA copy) are not blocks of a deeper network: the backbone loads, the head starts fresh.
    state = save_resnet18(tmp_path / "resnet18.pth")
    del state["fc.weight"], state["fc.bias"]
    state |= {"fc.1.weight": torch.zeros(5, 512), "fc.1.bias": torch.zeros(5), "ema.step": torch.zeros(())}
    torch.save(state, tmp_path / "custom_head.pth")
    ArchClassifier(num_classes=3, arch="resnet18", weights=str(tmp_path / "custom_head.pth"))


# ---- head-only training ------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Found .* module\\(s\\) in eval mode")  # the frozen BatchNorm layers
def test_freeze_backbone_trains_the_head_only_and_keeps_batchnorm_statistics(tmp_path: Path) -> None:
    path = tmp_path / "resnet18.pth"
    save_resnet18(path)
    model = ArchClassifier(num_classes=3, arch="resnet18", weights=str(path), freeze_backbone=True)
    before = {key: value.clone() for key, value in model.net.state_dict().items()}
    trainer = fit_steps(model, tmp_path, steps=3)
    assert trainer.global_step == 3
    optimized = [p for group in trainer.optimizers[0].param_groups for p in group["params"]]
    assert {id(p) for p in optimized} == {id(model.net.fc.weight), id(model.net.fc.bias)}
    after = model.net.state_dict()
    for key, value in before.items():
        if key.startswith("fc."):
            assert not torch.equal(after[key], value), key  # the head learned
        else:
            assert torch.equal(after[key], value), key  # weights, running_mean/var, num_batches_tracked
    model.train()  # also when someone calls train() again
    assert not model.net.bn1.training and model.net.fc.training


@pytest.mark.filterwarnings("ignore:Found .* module\\(s\\) in eval mode")  # the frozen BatchNorm layers
def test_a_frozen_backbone_trains_on_one_image_per_device(tmp_path: Path) -> None:
    """Preflight refused --data.batch_size=1 with --model.freeze_backbone=true, though the frozen BatchNorm
    layers normalise with their statistics, one image alike: it now trains."""
    root = f"--trainer.default_root_dir={tmp_path}"
    frozen = ["--model=ArchClassifier", "--model.arch=resnet18", "--model.freeze_backbone=true"]
    run = ["--data.batch_size=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    cli = build_cli(["fit", *TINY_RUN, "--trainer.accelerator=cpu", *frozen, *run, root])
    assert cli.trainer.global_step == 2


def test_a_batch_norm_layer_without_running_statistics_normalises_the_batch_though_frozen() -> None:
    """Frozen statistics are running ones: a layer that keeps none normalises each batch by its own in eval
    mode too, so a batch of one image through it is still refused."""
    net = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 3), nn.BatchNorm1d(3, track_running_stats=False))
    freeze_norm_stats(net)
    assert has_batch_norm(net)
    assert ImageClassifier(lambda num_classes: net, num_classes=3).batch_of_one_failure() == BATCH_OF_ONE
    del net[2]
    assert not has_batch_norm(net)
    assert ImageClassifier(lambda num_classes: net, num_classes=3).batch_of_one_failure() is None


# ---- the recipes --------------------------------------------------------------------------------------


def is_within(written, printed) -> bool:
    """Every key of ``written`` is in ``printed`` with the same value (dicts compared key by key)."""
    if isinstance(written, dict):
        return isinstance(printed, dict) and all(
            k in printed and is_within(v, printed[k]) for k, v in written.items()
        )
    return written == printed


@pytest.mark.parametrize("config", [FINETUNE, MODERN], ids=lambda p: p.name)
def test_recipe_round_trips_through_print_config(config: Path, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        build_cli(["fit", f"--config={config}", "--print_config"])
    assert done.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert is_within(yaml.safe_load(config.read_text()), printed)


def _recipe_args(root: Path, weights: Path, logs: Path) -> list[str]:
    """The fine-tune recipe on a small folder, shrunk to train in seconds on the CPU."""
    return [
        f"--config={FINETUNE}",
        f"--data.data_dir={root}",
        "--model.arch=resnet18",
        f"--model.weights={weights}",
        "--data.image_size=32",
        "--data.val_resize=36",
        "--data.batch_size=4",
        "--data.num_workers=0",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.precision=32-true",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={logs}",
    ]


def documented(command: str) -> list[str]:
    """The options of the `python -m lit_ddp <command>` line of docs/data.md's fine-tuning walk-through, the
    recipe's path made absolute."""
    section = DATA_DOC.read_text().split("### Fine-tuning your own folder")[1].split("\n## ")[0]
    prefix = f"python -m lit_ddp {command} "
    (line,) = [ln.strip() for ln in section.splitlines() if ln.strip().startswith(prefix)]
    args = shlex.split(line, comments=True)[4:]
    return [str(FINETUNE) if arg == "configs/finetune_imagefolder.yaml" else arg for arg in args]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_finetune_recipe_trains_on_a_folder_from_a_weights_file_then_predicts(
    tmp_path: Path, info_lines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/data.md's walk-through as written: a folder of class folders, fit with --model.weights, predict on
    a folder of new images. Its predict line, without the --data.data_dir its fit was given, stopped on
    the recipe's data/my_images (`--ckpt_path=last` records no classes until the run is set up)."""
    monkeypatch.chdir(tmp_path)
    make_tree(tmp_path / "my_images", train_per_class=4, val_per_class=2)
    new_images = tmp_path / "new_images"
    new_images.mkdir()
    for image in sorted((tmp_path / "my_images" / "val").rglob("*_0.JPEG")):
        image.rename(new_images / image.name)  # no class folders: images nobody has labelled
    save_resnet18(tmp_path / "resnet50.pth")  # the walk-through's file name, a ResNet-18 to train in seconds
    small = ["--model.arch=resnet18", "--data.image_size=32", "--data.val_resize=36", "--data.batch_size=4"]
    small += ["--data.num_workers=0", "--trainer.accelerator=cpu", "--trainer.devices=1"]
    small += ["--trainer.precision=32-true", "--trainer.enable_progress_bar=false"]
    short = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    cli = build_cli(["fit", *documented("fit"), *small, *short])
    assert cli.trainer.global_step == 2 and cli.model.hparams.num_classes == len(CLASSES)
    assert weights_line(info_lines).endswith("new: fc.weight, fc.bias (1000 → 3 classes)")
    build_cli(["predict", *documented("predict"), *small])
    (csv,) = (tmp_path / "logs").rglob("predictions.csv")
    rows = [row.split(",") for row in csv.read_text().splitlines()]
    assert rows[0][:3] == ["index", "path", "prediction"] and len(rows) == 1 + len(CLASSES)
    assert all(row[2] in CLASSES and row[-1] == "" for row in rows[1:])  # class names, no label


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_checkpoint_evaluates_without_the_weights_file_it_was_started_from(tmp_path: Path, capsys) -> None:
    """`predict --ckpt_path=last` of a fine-tune whose --model.weights file had moved was refused ("weights
    file ... does not exist"), though the checkpoint replaces every weight it loads: it gives the rows it
    gives with the file there, and test runs too. A fit that would start from the file still needs it."""
    from lit_ddp.cli import main

    root = tmp_path / "my_images"
    make_tree(root, train_per_class=4, val_per_class=2)
    weights = tmp_path / "resnet18.pth"
    save_resnet18(weights)
    common = _recipe_args(root, weights, tmp_path / "logs")
    short = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    build_cli(["fit", *common, *short])
    predict = ["predict", *common, "--ckpt_path=last", f"--data.predict_dir={root / 'val'}"]
    build_cli([*predict, "--predictions.filename=present.csv"])
    weights.rename(tmp_path / "moved.pth")
    build_cli([*predict, "--predictions.filename=moved.csv"])
    (present,), (moved,) = (list((tmp_path / "logs").rglob(name)) for name in ("present.csv", "moved.csv"))
    assert len(present.read_text().splitlines()) > len(CLASSES)
    assert moved.read_text() == present.read_text()
    assert 0 <= build_cli(["test", *common, "--ckpt_path=last"]).trainer.callback_metrics["test/acc"] <= 1
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *common, *short])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"lit_ddp: error: weights file {weights} does not exist: ")
