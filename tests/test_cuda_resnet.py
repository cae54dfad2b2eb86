"""The ResNet family's CUDA paths, on one GPU (``python -m pytest -m cuda``; skipped without one): ResNet-18
from JPEG files in bf16, channels-last and compiled; FSDP with the template's callbacks, checkpoint I/O and
resume (the recipe's channels-last SGD: the optimizer is not fused under FSDP, test_optim_choice.py). The
shared helpers are test_cuda.py's."""

from pathlib import Path

import pytest
import torch
from conftest import REPO, last_ckpt, read_scalars
from imagenet_tree import make_tree
from test_cuda import fit_ok, loads_on_cpu

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagenet")
    make_tree(root, train_per_class=16, val_per_class=4)
    return root


def resnet18(root: Path) -> list[str]:
    return [
        f"--config={REPO / 'configs' / 'resnet_imagenet.yaml'}",
        f"--data.data_dir={root}",
        "--model.arch=resnet18",
        "--data.image_size=64",
        "--data.val_resize=72",
        "--data.batch_size=8",
        "--trainer.max_epochs=2",
    ]


def test_resnet18_fits_from_jpeg_files_in_bf16_channels_last_compiled(tmp_path: Path, imagenet: Path) -> None:
    args = [*resnet18(imagenet), "--trainer.precision=bf16-mixed", "--model.compile=true"]
    fit_ok(tmp_path, *args, "--model.channels_last=true")
    assert len(read_scalars(last_ckpt(tmp_path, args).parent.parent)["val/acc"]) == 2  # resnet_imagenet/
    loads_on_cpu(last_ckpt(tmp_path, args))


# ---- FSDP ------------------------------------------------------------------------------------------


def test_fsdp_trains_resnet_with_the_templates_callbacks_and_resumes(tmp_path: Path, imagenet: Path) -> None:
    args = [*resnet18(imagenet), "--trainer.strategy=fsdp", "--trainer.precision=bf16-mixed"]
    fit_ok(tmp_path, *args, "--trainer.max_epochs=1")
    fit_ok(tmp_path, *args, "--ckpt_path=last")
    assert len(read_scalars(last_ckpt(tmp_path, args).parent.parent)["val/acc"]) == 2
