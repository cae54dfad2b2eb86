"""The automatic fused-optimizer choice (models/optim.py) follows what the strategy's parameters support.

CUDA's fused SGD/Adam/AdamW kernels have no slow path: a parameter whose gradient has other strides, or a
tensor subclass, crashes the first step on a GPU (issue 30: FSDP with a channels-last ResNet). CPU's kernels
accept both, so these tests check the layouts and types themselves, on real FSDP and DTensor parameters
built on a one-process gloo group.
"""

import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from lenet_fits import fit, lenet, trainer
from torch import nn

from lit_ddp.errors import UserError
from lit_ddp.models.optim import OptimConfig, build_optimizer, fused_available

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="this torch build has no torch.distributed")


def conv_net(channels_last: bool) -> nn.Module:
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    return net.to(memory_format=torch.channels_last) if channels_last else net


def step_grads(module: nn.Module, params: list[nn.Parameter]) -> None:
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    module(x).sum().backward()
    assert all(p.grad is not None for p in params)


@pytest.fixture(scope="module")
def one_process_group() -> Iterator[None]:
    """A real gloo group of one process, taken down again so that no later test sees it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def fsdp(net: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel

    # As Lightning's FSDPStrategy wraps it: the original parameters stay visible to configure_optimizers.
    return FullyShardedDataParallel(net, use_orig_params=True, device_id=torch.device("cpu"))


def test_plain_parameters_on_cpu_take_the_fused_kernels() -> None:
    assert fused_available(conv_net(channels_last=False))
    # Autograd (and DDP) lay each gradient out like its parameter: channels-last weights stay fused.
    net = conv_net(channels_last=True)
    assert fused_available(net, trained_as=net)
    params = list(net.parameters())
    step_grads(net, params)
    assert all(p.grad.stride() == p.stride() for p in params)


def test_mixed_dtypes_are_grouped_by_the_kernels_and_take_a_fused_step() -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).double())
    assert fused_available(net)
    optimizer, _ = build_optimizer(net, OptimConfig(name="sgd", lr=0.1), 1, 10, 1)
    assert optimizer.defaults["fused"] is True
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    before = net[1].bias.detach().clone()
    optimizer.step()
    assert torch.allclose(net[1].bias, before - 0.1)


def test_parameters_off_the_kernels_devices_or_not_floating_go_to_torchs_default() -> None:
    assert not fused_available(nn.Linear(4, 4, device="meta"))
    optimizer, _ = build_optimizer(nn.Linear(4, 4, device="meta"), OptimConfig(), 1, 10, 1)
    assert optimizer.defaults["fused"] is None  # None, not False: torch then picks foreach where it can


def test_under_fsdp_channels_last_weights_get_contiguous_gradients_so_no_fused(one_process_group) -> None:
    net = conv_net(channels_last=True)
    wrapped = fsdp(net)
    params = list(net.parameters())
    step_grads(wrapped, params)
    # The premise: FSDP hands a channels-last weight a contiguous gradient, which CUDA's kernels refuse.
    weight = net[0].weight
    assert not weight.is_contiguous() and weight.grad.is_contiguous()
    assert not fused_available(net, trained_as=wrapped)
    assert fused_available(net)  # the same parameters, not known to be under FSDP: the old, crashing choice
    optimizer, _ = build_optimizer(net, OptimConfig(name="sgd", lr=0.1), 1, 10, 1, trained_as=wrapped)
    assert optimizer.defaults["fused"] is None
    optimizer.step()  # and the unfused step takes those gradients


def test_under_fsdp_contiguous_parameters_stay_fused(one_process_group) -> None:
    net = conv_net(channels_last=False)
    assert fused_available(net, trained_as=fsdp(net))


def test_asking_for_fused_under_fsdp_with_channels_last_is_one_clear_line(one_process_group) -> None:
    net = conv_net(channels_last=True)
    wrapped = fsdp(net)
    with pytest.raises(UserError, match="--model.channels_last=false"):
        build_optimizer(net, OptimConfig(fused=True), 1, 10, 1, trained_as=wrapped)


def test_dtensor_parameters_go_to_torchs_default(one_process_group) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    net = nn.Linear(4, 4)
    net.weight = nn.Parameter(distribute_tensor(net.weight.detach(), mesh))
    assert isinstance(net.weight, DTensor)  # FSDP2 / tensor parallelism's parameters
    assert not fused_available(net)
    optimizer, _ = build_optimizer(net, OptimConfig(), 1, 10, 1)
    assert optimizer.defaults["fused"] is None


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_clipping_trains_under_any_precision_with_the_automatic_choice(tmp_path, precision: str) -> None:
    # Lightning's mixed precision refuses to clip for a fused optimizer under bf16 as well as 16: the
    # automatic choice crashed the first step of bf16-mixed with --trainer.gradient_clip_val.
    model = lenet(False)
    fit(model, trainer(tmp_path, epochs=1, precision=precision, gradient_clip_val=1.0))
    assert model.trainer.global_step == 4
    fused = model.trainer.optimizers[0].defaults["fused"]
    assert fused is (None if precision == "bf16-mixed" else True)  # full precision clips after a fused step


def test_a_resumed_optimizer_keeps_this_runs_implementation_not_the_checkpoints() -> None:
    # A 16-mixed run without clipping is built fused, so its loss scaler hands the step its scale; resumed
    # from a run that clipped (unfused), torch's load_state_dict took the unfused flags and the first step
    # failed ("Expected grad_scale and found_inf to be None"). Under FSDP, the fused flag of a DDP run's
    # checkpoint is the crash the automatic choice avoids.
    net = nn.Linear(4, 2)
    saved, _ = build_optimizer(net, OptimConfig(schedule="constant"), 1, 10, 1, clips_under_amp=True)
    net(torch.randn(3, 4)).sum().backward()
    saved.step()
    resumed, _ = build_optimizer(net, OptimConfig(schedule="constant"), 1, 10, 1)
    assert resumed.defaults["fused"] and not saved.defaults["fused"]
    resumed.load_state_dict(saved.state_dict())
    assert resumed.param_groups[0]["fused"] is True
    # The step counter where a fused update reads it (the parameter's device; a GPU here would show it).
    step = resumed.state[net.weight]["step"]
    assert (step.device, step.dtype) == (net.weight.device, torch.float32)
    assert resumed.state_dict()["state"][0]["exp_avg"].equal(saved.state_dict()["state"][0]["exp_avg"])
    scaler = torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = net(torch.randn(3, 4)).float().sum()
    scaler.scale(loss).backward()
    scaler.step(resumed)


def test_trainer_fit_resumed_with_another_choice_steps_with_it(tmp_path) -> None:
    fit(lenet(False, optim=OptimConfig(schedule="constant", fused=True)), trainer(tmp_path / "a", epochs=1))
    resumed = lenet(False, optim=OptimConfig(schedule="constant", fused=False))
    fit(resumed, trainer(tmp_path / "b", epochs=2), ckpt_path=tmp_path / "a" / "last.ckpt")
    assert resumed.trainer.global_step == 8
    assert all(group["fused"] is None for group in resumed.trainer.optimizers[0].param_groups)
