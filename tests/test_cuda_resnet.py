"""The ResNet family's CUDA paths, on one GPU (``python -m pytest -m cuda``; skipped without one): ResNet-18
from JPEG files in bf16, channels-last and compiled; the batch decoded on the GPU (nvJPEG), a batch ahead;
FSDP with the template's callbacks, checkpoint I/O and resume (the recipe's channels-last SGD: the optimizer
is not fused under FSDP, test_optim_choice.py). The shared helpers are test_cuda.py's and
test_device_decode.py's, which run them on the CPU."""

from pathlib import Path

import pytest
import torch
from conftest import REPO, last_ckpt, read_scalars
from imagenet_tree import make_tree
from test_cuda import fit_ok, loads_on_cpu
from test_device_decode import data_module, loader, through_hooks

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


# ---- the batch decoded on the GPU ----------------------------------------------------------------------


def test_resnet18_fits_with_the_batches_decoded_on_the_gpu(tmp_path: Path, imagenet: Path) -> None:
    args = [*resnet18(imagenet), "--trainer.precision=bf16-mixed", "--data.decode=gpu"]
    fit_ok(tmp_path, *args, "--data.num_workers=2")
    assert len(read_scalars(last_ckpt(tmp_path, args).parent.parent)["val/acc"]) == 2
    loads_on_cpu(last_ckpt(tmp_path, args))


@pytest.mark.parametrize("split", ["train", "val"])
def test_nvjpeg_a_batch_ahead_gives_the_inline_batches_near_the_cpu_paths(imagenet: Path, split: str) -> None:
    """Decoded on a side stream a batch ahead, the batches are those decoded in the loop, exactly; and
    within a stated bound of the CPU path's pixels: a mean of at most 3 gray levels. nvJPEG's IDCT and
    chroma upsampling are not libjpeg-turbo's, and these test pictures are noisy in colour, where the two
    differ most: on an H100 a training batch (crops enlarged, which averages nothing away) measured 2.05
    gray levels (docs/gpu.md). A wrong crop box, flip or channel order is tens of levels off."""
    cuda = data_module(imagenet, True)
    ahead, inline = (list(loader(cuda, split, on, device="cuda")) for on in (True, False))
    on_cpu = data_module(imagenet, False)
    cpu = list(loader(on_cpu, split, ahead=False))
    levels = 255 * torch.tensor(cuda.std, device="cuda").view(1, 3, 1, 1)  # normalised units → gray levels
    for a, b, c in zip(ahead, inline, cpu, strict=True):
        # The typed batch says what it holds: the CPU path's pixels go through its own module's hooks.
        (xa, ya), (xb, yb) = (through_hooks(cuda, batch, "cuda") for batch in (a, b))
        xc, yc = through_hooks(on_cpu, c, "cuda")
        assert xa.is_cuda and torch.equal(xa, xb) and torch.equal(ya, yb)
        if torch.equal(ya, yc):  # the same files kept on both paths
            assert ((xa - xc).abs() * levels).mean() <= 3.0


def test_a_batch_decoded_on_the_gpu_copies_from_the_host_only_pinned_and_without_blocking(
    imagenet: Path,
) -> None:
    """The decode's own host tensors (the flip index; the pixels of the files decoded in the workers, and
    their slots) reach the GPU non-blocking from pinned memory: a blocking copy would hold the decode
    thread until the device had run every resize queued before it. The recorder's reading of torch's
    dispatch is checked on the CPU (test_augment.py); the loader and data module are
    test_device_decode.py's."""
    from copies import HostToDeviceCopies

    cuda, seen = data_module(imagenet, True), []
    for batch in loader(cuda, "train", ahead=False):
        with HostToDeviceCopies("cuda") as mode:
            batch.images.decode(torch.device("cuda"))
        torch.cuda.synchronize()
        seen += mode.copies
    assert seen and all(copy == (True, True) for copy in seen), seen


# ---- FSDP ------------------------------------------------------------------------------------------


def test_fsdp_trains_resnet_with_the_templates_callbacks_and_resumes(tmp_path: Path, imagenet: Path) -> None:
    args = [*resnet18(imagenet), "--trainer.strategy=fsdp", "--trainer.precision=bf16-mixed"]
    fit_ok(tmp_path, *args, "--trainer.max_epochs=1")
    fit_ok(tmp_path, *args, "--ckpt_path=last")
    assert len(read_scalars(last_ckpt(tmp_path, args).parent.parent)["val/acc"]) == 2
