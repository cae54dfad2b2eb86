"""One rank of tests/test_sync_batchnorm.py: AllReduceSyncBatchNorm on a slice of a fixed global batch.

Started by the test with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (as torchrun would); joins a gloo
group and saves, for each case, this rank's output, input gradient, parameter gradients and running
statistics to ``<out_dir>/rank<r>.pt``. The test compares them with plain BatchNorm on the whole batch.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lit_ddp.runtime.sync_batchnorm import AllReduceSyncBatchNorm

# (name, per-rank batch sizes, input shape after the batch dim, BatchNorm/input options): uneven shards, a
# rank with none, the cumulative average (momentum=None), no affine parameters, a channels-last input, and
# bfloat16 (statistics in float32, the output in bfloat16, as mixed precision runs it).
CASES = [
    ("bn2d_5_3", (5, 3), (4, 3, 3), {}),
    ("bn2d_8_0", (8, 0), (4, 3, 3), {}),
    ("bn1d_2_7", (2, 7), (6,), {}),
    ("momentum_none", (3, 4), (4, 3, 3), {"momentum": None}),
    ("no_affine", (4, 2), (4, 3, 3), {"affine": False}),
    ("channels_last", (3, 5), (4, 3, 3), {"channels_last": True}),
    ("bfloat16", (6, 2), (4, 3, 3), {"dtype": torch.bfloat16}),
]
STEPS = 2  # two training forwards, so the running statistics are blended with momentum twice


def global_batch(
    name: str, sizes: tuple[int, ...], shape: tuple[int, ...], options: dict
) -> tuple[Tensor, Tensor]:
    """Input (N, C, *) with channel offsets far from zero, and the fixed weights of the test loss."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    x = torch.randn(sum(sizes), *shape, generator=g) * 3.0 + 10.0
    x = x.to(options.get("dtype", torch.float32))
    if options.get("channels_last"):
        x = x.contiguous(memory_format=torch.channels_last)
    return x, torch.randn(x.shape, generator=g)


def batchnorm_options(options: dict) -> dict:
    return {key: options[key] for key in ("momentum", "affine") if key in options}


def set_affine(bn: nn.Module, channels: int) -> None:
    if bn.affine:
        with torch.no_grad():  # non-trivial affine parameters
            bn.weight.copy_(torch.linspace(0.5, 1.5, channels))
            bn.bias.copy_(torch.linspace(-1.0, 1.0, channels))


def run_case(name: str, sizes: tuple[int, ...], shape: tuple[int, ...], options: dict, rank: int) -> dict:
    x_all, w_all = global_batch(name, sizes, shape, options)
    start = sum(sizes[:rank])
    x = x_all[start : start + sizes[rank]].clone(memory_format=torch.preserve_format).requires_grad_(True)
    bn = AllReduceSyncBatchNorm(shape[0], **batchnorm_options(options))
    set_affine(bn, shape[0])
    for _ in range(STEPS - 1):
        bn(x.detach())
    y = bn(x)
    # Loss Σ y·w over the whole batch = Σ over ranks of this rank's part.
    (y.float() * w_all[start : start + sizes[rank]]).sum().backward()
    bn.eval()
    y_eval = bn(x.detach())  # plain BatchNorm with the running statistics: no collective
    return {
        "y": y.detach(),
        "y_channels_last": y.is_contiguous(memory_format=torch.channels_last) and y.shape[0] > 1,
        "grad_x": x.grad,
        "grad_weight": bn.weight.grad if bn.affine else None,
        "grad_bias": bn.bias.grad if bn.affine else None,
        "running_mean": bn.running_mean,
        "running_var": bn.running_var,
        "num_batches_tracked": bn.num_batches_tracked,
        "y_eval": y_eval,
    }


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {name: run_case(name, sizes, shape, options, rank) for name, sizes, shape, options in CASES}
    if rank == 0:
        # Eval on one rank only: it would hang here if eval mode ran a collective.
        bn = AllReduceSyncBatchNorm(4).eval()
        results["eval_only_rank0"] = bn(torch.randn(3, 4, 2, 2))
    dist.barrier()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
    # Done, results on disk: skip the interpreter's finalisation, where gloo's worker threads can still
    # abort a finished process ("terminate called without an active exception", SIGABRT; faults.py says
    # why). Seen once in a loaded CI run, on rank 1, after both ranks had saved.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
