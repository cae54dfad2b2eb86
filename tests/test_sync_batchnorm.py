"""AllReduceSyncBatchNorm and its Lightning plugin: conversion, plain behaviour on one process, and on two
gloo processes the same outputs, gradients and running statistics as BatchNorm on the whole batch."""

import os
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import python
from lightning import Trainer
from sync_batchnorm_worker import CASES, STEPS, batchnorm_options, global_batch, set_affine
from torch import nn

from lit_ddp.cli import build_cli
from lit_ddp.models import LeNet
from lit_ddp.runtime.sync_batchnorm import (
    AllReduceSyncBatchNorm,
    SyncBatchNormPlugin,
    convert_sync_batchnorm,
    revert_sync_batchnorm,
    with_sync_batchnorm,
)

HERE = Path(__file__).resolve().parent


def bn_types(model: nn.Module) -> list[type]:
    return [type(m) for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def test_convert_and_revert_round_trip_keeps_classes_state_and_outputs() -> None:
    torch.manual_seed(0)
    model = LeNet(batch_norm=True)
    model(torch.randn(8, 3, 32, 32))  # non-trivial running statistics
    model.eval()
    x = torch.randn(4, 3, 32, 32)
    expected, state = model(x), {k: v.clone() for k, v in model.state_dict().items()}
    original = bn_types(model)
    assert original == [nn.BatchNorm2d, nn.BatchNorm2d, nn.BatchNorm1d, nn.BatchNorm1d]

    synced = convert_sync_batchnorm(model)
    assert bn_types(synced) == [AllReduceSyncBatchNorm] * 4
    assert not synced.training and synced.state_dict().keys() == state.keys()
    torch.testing.assert_close(synced(x), expected, rtol=0, atol=0)  # eval: plain BatchNorm

    torch_synced = convert_sync_batchnorm(revert_sync_batchnorm(synced), nn.SyncBatchNorm)
    assert bn_types(torch_synced) == [nn.SyncBatchNorm] * 4
    reverted = revert_sync_batchnorm(torch_synced)
    assert bn_types(reverted) == original  # the original classes, not a generic BatchNorm
    for key, value in reverted.state_dict().items():
        torch.testing.assert_close(value, state[key], rtol=0, atol=0)
    # A plain model loads the reverted weights (the export path).
    fresh = LeNet(batch_norm=True).eval()
    fresh.load_state_dict(reverted.state_dict())
    torch.testing.assert_close(fresh(x), expected, rtol=0, atol=0)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_one_process_is_plain_batchnorm(momentum: float | None) -> None:
    """Without a process group (or with one rank) training mode is exactly nn.BatchNorm2d."""
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(3, momentum=momentum)
    synced = convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(3, momentum=momentum)))[0]
    for _ in range(3):
        x = torch.randn(5, 3, 4, 4) * 2 + 1
        torch.testing.assert_close(synced(x), plain(x), rtol=0, atol=0)
    torch.testing.assert_close(synced.running_mean, plain.running_mean, rtol=0, atol=0)
    torch.testing.assert_close(synced.running_var, plain.running_var, rtol=0, atol=0)
    assert int(synced.num_batches_tracked) == 3


def test_plugin_picks_allreduce_batchnorm_off_cuda_and_reverts() -> None:
    plugin = SyncBatchNormPlugin()
    model = plugin.apply(LeNet(batch_norm=True))
    assert bn_types(model) == [AllReduceSyncBatchNorm] * 4
    assert bn_types(plugin.revert(model)) == [nn.BatchNorm2d, nn.BatchNorm2d, nn.BatchNorm1d, nn.BatchNorm1d]


def test_plugin_is_accepted_with_sync_batchnorm_and_added_by_the_cli(tmp_path: Path) -> None:
    # Lightning refuses sync_batchnorm=True with a LayerSync that is not a TorchSyncBatchNorm: ours is one.
    trainer = Trainer(
        sync_batchnorm=True, plugins=[SyncBatchNormPlugin()], accelerator="cpu", devices=2, strategy="ddp"
    )
    assert isinstance(trainer.strategy._layer_sync, SyncBatchNormPlugin)
    assert with_sync_batchnorm(None)[0].__class__ is SyncBatchNormPlugin
    custom = SyncBatchNormPlugin()
    assert with_sync_batchnorm([custom]) == [custom]  # a user's own LayerSync is kept, not doubled

    args = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]
    args += [f"--trainer.default_root_dir={tmp_path}", "--model.batch_norm=true"]
    cli = build_cli([*args, "--trainer.sync_batchnorm=true"], run=False)
    assert isinstance(cli.trainer.strategy._layer_sync, SyncBatchNormPlugin)
    cli = build_cli(args, run=False)
    assert cli.trainer.strategy._layer_sync is None  # off unless asked for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Run sync_batchnorm_worker.py on 2 gloo ranks; their saved results."""
    out = tmp_path_factory.mktemp("syncbn")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    procs = [
        python(  # forked (conftest.python): the ranks start without importing torch again
            [str(HERE / "helpers" / "sync_batchnorm_worker.py"), str(out)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        logs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)[-4000:]
    return [torch.load(out / f"rank{rank}.pt") for rank in range(2)]


@pytest.mark.ddp
@pytest.mark.timeout(360)
@pytest.mark.parametrize("name, sizes, shape, options", CASES, ids=[c[0] for c in CASES])
def test_two_ranks_match_batchnorm_on_the_whole_batch(
    two_rank_results: list[dict], name: str, sizes: tuple[int, ...], shape: tuple[int, ...], options: dict
) -> None:
    """Forward, input and parameter gradients, and running stats equal one BatchNorm over both ranks' data,
    for uneven shards, a rank with no samples, momentum=None, no affine parameters, channels-last and
    bfloat16 inputs; running stats identical on both ranks."""
    x, w = global_batch(name, sizes, shape, options)
    # The reference: float32 BatchNorm on the whole batch (bfloat16's reference is its rounded input).
    x = x.float().requires_grad_(True)
    bn = (nn.BatchNorm2d if len(shape) == 3 else nn.BatchNorm1d)(shape[0], **batchnorm_options(options))
    set_affine(bn, shape[0])
    for _ in range(STEPS - 1):
        bn(x.detach())
    y = bn(x)
    (y * w).sum().backward()
    bn.eval()
    y_eval = bn(x.detach())

    ranks = [r[name] for r in two_rank_results]
    low = options.get("dtype") == torch.bfloat16
    tol = {"rtol": 2e-2, "atol": 5e-2} if low else {"rtol": 1e-5, "atol": 1e-5}
    assert all(r["y"].dtype == options.get("dtype", torch.float32) for r in ranks)  # the input's dtype
    if options.get("channels_last"):
        assert all(r["y_channels_last"] for r in ranks)  # no hidden copy to contiguous on the way out
    torch.testing.assert_close(torch.cat([r["y"] for r in ranks]).float(), y.detach(), **tol)
    torch.testing.assert_close(torch.cat([r["grad_x"] for r in ranks]).float(), x.grad, **tol)
    if bn.affine:  # each rank holds the gradient of its own part of the loss; DDP sums (averages) them
        torch.testing.assert_close(sum(r["grad_weight"] for r in ranks), bn.weight.grad, **tol)
        torch.testing.assert_close(sum(r["grad_bias"] for r in ranks), bn.bias.grad, **tol)
    else:
        assert all(r["grad_weight"] is None for r in ranks)
    for key in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(ranks[0][key], ranks[1][key], rtol=0, atol=0)  # bitwise, every rank
        torch.testing.assert_close(ranks[0][key].float(), getattr(bn, key).float(), **tol)
    torch.testing.assert_close(torch.cat([r["y_eval"] for r in ranks]).float(), y_eval, **tol)


def test_plugin_picks_torch_syncbatchnorm_for_a_model_going_to_cuda() -> None:
    """On CUDA torch's nn.SyncBatchNorm (NCCL kernels) is the right one; the choice follows the trainer's
    root device, since Lightning applies layer sync before it moves the model there."""
    model = LeNet(batch_norm=True)
    model.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
    assert bn_types(SyncBatchNormPlugin().apply(model)) == [nn.SyncBatchNorm] * 4


@pytest.mark.ddp
@pytest.mark.timeout(180)
def test_eval_mode_runs_no_collective(two_rank_results: list[dict]) -> None:
    # Rank 0 alone ran an eval forward; had it waited for rank 1 the worker would have hung.
    assert two_rank_results[0]["eval_only_rank0"].shape == (3, 4, 2, 2)
    assert "eval_only_rank0" not in two_rank_results[1]


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_syncbn_keeps_a_last_batch_of_one_image_per_device_as_one_process_keeps_it(
    tmp_path: Path,
) -> None:
    """66 training images, 2 × 32 with SyncBatchNorm against 1 × 64: the last global batch holds 2 images,
    1 per device, which synchronised BatchNorm normalises together. The 2-process run left it out (as plain
    BatchNorm must), took 1 step where one process took 2, and trained another model."""
    from conftest import run_cli

    common = ["--model.batch_norm=true", "--data.train_size=66", "--data.val_size=16", "--data.num_workers=0"]
    common += ["--model.optim.name=sgd", "--model.optim.lr=0.05", "--trainer.max_epochs=1"]
    common += ["--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false"]
    two = ["fit", *common, "--data.batch_size=32", "--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    run = run_cli([*two, "--trainer.sync_batchnorm=true"], tmp_path / "two", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    build_cli(["fit", *common, "--data.batch_size=64", f"--trainer.default_root_dir={tmp_path / 'one'}"])
    two_ckpt, one_ckpt = (torch.load(next((tmp_path / r).rglob("last.ckpt"))) for r in ("two", "one"))
    assert two_ckpt["global_step"] == one_ckpt["global_step"] == 2
    for name, value in one_ckpt["state_dict"].items():
        torch.testing.assert_close(two_ckpt["state_dict"][name], value, rtol=0, atol=1e-5, msg=name)


REFUSED = (
    "lit_ddp: error: batch_size=1 with a BatchNorm model: BatchNorm cannot normalise a batch of one image per"
    " device; pass --data.batch_size=2 or more, or a model without BatchNorm"
)


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(("sync", "logger"), [(True, True), (False, True), (False, False)])
def test_syncbn_over_two_devices_trains_a_batch_of_one_image_per_device(
    tmp_path: Path, sync: bool, logger: bool
) -> None:
    """SyncBatchNorm over 2 processes normalises their 2 images together, yet fit refused batch_size=1: the
    data module asked the model in its setup, before the strategy swapped the synchronised layers in.
    Without sync, each device's one image is refused, as before, and leaves no file: without a logger the
    refused run had written config.yaml into the root folder that every logger-less run shares."""
    from conftest import read_scalars, run_cli

    args = [
        "fit",
        "--model.batch_norm=true",
        "--data.train_size=4",
        "--data.val_size=2",
        "--data.test_size=2",
    ]
    args += ["--data.batch_size=1", "--data.num_workers=0", "--trainer.max_epochs=1", "--trainer.devices=2"]
    args += [
        "--trainer.strategy=ddp_spawn",
        "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false",
    ]
    args += [f"--trainer.sync_batchnorm={str(sync).lower()}", *([] if logger else ["--trainer.logger=false"])]
    earlier = tmp_path / "logs" / "config.yaml"  # a logger-less run's, in the root folder they all share
    if not logger:
        earlier.parent.mkdir()
        earlier.write_text("seed_everything: 7\n")
    run = run_cli(args, tmp_path, timeout=300)
    if not sync:
        lines = [line for line in run.stderr.splitlines() if line.startswith("lit_ddp: error:")]
        assert run.returncode != 0 and lines == [REFUSED] and "Traceback" not in run.stderr, run.stderr[
            -3000:
        ]
        left = [path for path in tmp_path.rglob("*") if path.is_file()]  # the failed run's folder went
        assert left == ([] if logger else [earlier]), left
        assert logger or earlier.read_text() == "seed_everything: 7\n"
        return
    assert run.returncode == 0, run.stderr[-3000:]
    (events,) = tmp_path.rglob("events.out.tfevents.*")
    scalars = read_scalars(events.parent)
    assert scalars["train/loss_epoch"] and all(torch.isfinite(torch.tensor(scalars["train/loss_epoch"])))
    assert torch.load(next(tmp_path.rglob("last.ckpt")), weights_only=False)["global_step"] == 2
