"""Synchronised BatchNorm that runs anywhere torch.distributed runs (CPU/gloo included), and the Lightning
plugin that uses it whenever ``--trainer.sync_batchnorm=true``.

torch's ``nn.SyncBatchNorm`` only runs on GPUs: on CPU, DDP raises "SyncBatchNorm layers only work with GPU
modules". ``AllReduceSyncBatchNorm`` computes the batch mean and variance over all ranks with one
differentiable all-reduce, so gradients flow through the global statistics exactly as in one process with
the concatenated batch. ``SyncBatchNormPlugin`` converts to torch's fused ``nn.SyncBatchNorm`` on CUDA and to
``AllReduceSyncBatchNorm`` elsewhere, and reverts to the original BatchNorm classes after fitting.

With your own Trainer (the CLI adds the plugin itself)::

    Trainer(sync_batchnorm=True, plugins=[SyncBatchNormPlugin()], ...)

Lightning accepts the pair because the plugin subclasses its default ``TorchSyncBatchNorm``.
"""

import torch
import torch.distributed as dist
from lightning.pytorch.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
from torch import Tensor, nn

# Every BatchNorm torch has (the Lazy ones subclass these): public classes, no private common base.
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
BatchNormLike = nn.BatchNorm2d | nn.BatchNorm1d | nn.BatchNorm3d | nn.SyncBatchNorm


class _AllReduceSum(torch.autograd.Function):
    """all_reduce(SUM) with a gradient: d(Σ_ranks t)/dt is an all-reduce of the incoming gradients.

    As ``torch.distributed.nn.functional._AllReduce`` (its public wrapper is deprecated); works on gloo.
    """

    @staticmethod
    def forward(ctx, tensor: Tensor, group) -> Tensor:
        ctx.group = group
        tensor = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return _AllReduceSum.apply(grad, ctx.group), None


def _sync_stats(x: Tensor, group, world_size: int, rank: int) -> tuple[Tensor, Tensor, int]:
    """Mean, biased variance (both (C,)) and count of values per channel over every rank's ``x``.

    Each rank contributes (local mean, local sum of squared deviations, count) as its row of a
    (world_size, 2C+1) table that one all-reduce fills in everywhere; the rows are combined with Chan et al.'s
    parallel formula, which, unlike Σx² − N·mean², does not cancel catastrophically when |mean| ≫ std.
    Counts travel with the rows, so ranks may hold different batch sizes, including none at all.
    """
    c = x.shape[1]
    dims = [0, *range(2, x.ndim)]
    n = x.numel() // c
    shape = (1, c) + (1,) * (x.ndim - 2)
    # An empty batch gives zero rows (mean over 0 values would be NaN); x.sum keeps them in the graph.
    mean = x.mean(dims) if n > 0 else x.sum(dims)
    m2 = (x - mean.view(shape)).square().sum(dims)
    row = torch.cat([mean, m2, mean.new_full((1,), float(n))])
    table = torch.stack([row if r == rank else torch.zeros_like(row) for r in range(world_size)])
    table = _AllReduceSum.apply(table, group)  # (W, 2C+1), identical on every rank
    means, m2s, counts = table[:, :c], table[:, c : 2 * c], table[:, 2 * c :]
    total = counts.sum()
    if total.item() <= 1:
        # The same check as plain BatchNorm, on the global count: every rank raises, none hangs.
        raise ValueError(f"Expected more than 1 value per channel when training, got {int(total.item())}")
    global_mean = (counts * means).sum(0) / total
    global_m2 = (m2s + counts * (means - global_mean).square()).sum(0)
    return global_mean, global_m2 / total, int(total.item())


class AllReduceSyncBatchNorm(nn.BatchNorm2d):  # any (N, C, *) input: _check_input_dim below
    """BatchNorm over the whole distributed batch, for any backend with all_reduce (gloo, nccl, ...).

    In training with more than one rank: normalise with the mean and variance of all ranks' batches and
    update the running statistics with them, identically on every rank (unbiased variance, as BatchNorm).
    In eval, with one rank, or without an initialised process group: plain BatchNorm. Accepts (N, C, *).

    Fork of ``torch.nn.SyncBatchNorm``: it raises on a CPU (pytorch/pytorch#78078 was closed unmerged); goes
    when it runs on gloo.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: dist.ProcessGroup | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _world(self) -> tuple[int, int]:
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return 1, 0
        group = self.process_group or dist.group.WORLD
        return dist.get_world_size(group), dist.get_rank(group)

    def forward(self, input: Tensor) -> Tensor:
        world_size, rank = self._world()
        if world_size == 1:
            return super().forward(input)
        self._check_input_dim(input)
        # Statistics in at least float32 (as cuDNN does for half inputs); the output keeps the input dtype.
        x = input.to(torch.promote_types(input.dtype, torch.float32))
        mean, var, count = _sync_stats(x, self.process_group or dist.group.WORLD, world_size, rank)
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), count)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(input.dtype)

    @torch.no_grad()
    def _update_running_stats(self, mean: Tensor, var: Tensor, count: int) -> None:
        # Momentum handling as in torch's _BatchNorm.forward: None means a cumulative average.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        unbiased = var * (count / (count - 1))
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)


class _BatchNormXd(nn.BatchNorm2d):
    """Plain BatchNorm for any input rank: the revert target when the original class is unknown."""

    def _check_input_dim(self, input: Tensor) -> None:
        return


SYNC_CLASSES = (nn.SyncBatchNorm, AllReduceSyncBatchNorm)


def _bn_args(m: BatchNormLike) -> tuple:
    return m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats


def _copy_state(src: BatchNormLike, dst: BatchNormLike) -> BatchNormLike:
    """Share parameters and buffers (as torch's convert_sync_batchnorm does), keep train/eval mode."""
    if src.affine:
        with torch.no_grad():
            dst.weight, dst.bias = src.weight, src.bias
    dst.running_mean, dst.running_var = src.running_mean, src.running_var
    dst.num_batches_tracked = src.num_batches_tracked
    dst.train(src.training)
    if hasattr(src, "qconfig"):
        dst.qconfig = src.qconfig
    return dst


def convert_sync_batchnorm(
    module: nn.Module, sync_class: type[BatchNormLike] = AllReduceSyncBatchNorm, process_group=None
) -> nn.Module:
    """Replace every BatchNorm*d in ``module`` by ``sync_class``; remember the original class for revert."""
    out = module
    if isinstance(module, BATCH_NORMS) and not isinstance(module, SYNC_CLASSES):
        out = _copy_state(module, sync_class(*_bn_args(module), process_group))
        out._lit_ddp_bn_class = type(module)
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, sync_class, process_group))
    return out


def revert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """Inverse of ``convert_sync_batchnorm`` (also for torch's own SyncBatchNorm): back to plain BatchNorm."""
    out = module
    if isinstance(module, SYNC_CLASSES):
        bn_class = getattr(module, "_lit_ddp_bn_class", _BatchNormXd)
        out = _copy_state(module, bn_class(*_bn_args(module)))
    for name, child in module.named_children():
        out.add_module(name, revert_sync_batchnorm(child))
    return out


def _runs_on_cuda(model: nn.Module) -> bool:
    # Lightning applies layer sync before moving the model, so ask the trainer where it is going.
    try:
        return model.trainer.strategy.root_device.type == "cuda"
    except (AttributeError, RuntimeError):  # not a LightningModule, or not attached to a Trainer
        return any(p.is_cuda for p in model.parameters())


class SyncBatchNormPlugin(TorchSyncBatchNorm):
    """Lightning LayerSync: torch's nn.SyncBatchNorm on CUDA, AllReduceSyncBatchNorm elsewhere (CPU/gloo).

    Lightning applies it when fitting with a multi-process strategy and reverts it at the end of fit.

    Fork of ``lightning.pytorch.plugins.TorchSyncBatchNorm``: it converts to ``torch.nn.SyncBatchNorm``, which
    raises on a CPU; goes when that runs on gloo.
    """

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        self.process_group = process_group

    def apply(self, model: nn.Module) -> nn.Module:
        sync_class = nn.SyncBatchNorm if _runs_on_cuda(model) else AllReduceSyncBatchNorm
        return convert_sync_batchnorm(model, sync_class, self.process_group)

    def revert(self, model: nn.Module) -> nn.Module:
        return revert_sync_batchnorm(model)


def with_sync_batchnorm(plugins=None) -> list:
    """``plugins`` (None, one, or a list) plus a SyncBatchNormPlugin, unless a LayerSync is already there."""
    plugins = [] if plugins is None else plugins if isinstance(plugins, list) else [plugins]
    if any(isinstance(p, LayerSync) for p in plugins):
        return plugins
    return [*plugins, SyncBatchNormPlugin()]
