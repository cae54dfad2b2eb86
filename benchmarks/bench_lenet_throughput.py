"""LeNet training throughput (images/s) on CPU, 1 and 2 processes, batch 64 per process, side by side:

  (a) lit_ddp through Lightning (LeNetCIFAR + CIFAR-shaped in-memory uint8 data, batched on-device
      augmentation and normalisation, DDP when 2 processes);
  (b) the hand-written DDP loop the usual tutorials teach: the tutorial's own LeNet, a torchvision-style
      dataset returning PIL images, ToTensor + Normalize per sample, DataLoader + DistributedSampler, DDP,
      Adam;
  (c) lit_ddp's model step alone, on pre-made, pre-normalised tensors under DDP: the same network, memory
      format, optimizer and schedule as (a), without Lightning or data (the compute limit of (a));
  (c0) the tutorial's model step alone, the same way (the compute limit of (b)), for reference;
  (d) Lightning's floor: (c)'s step as a bare LightningModule (``training_step`` = forward + loss) on the
      same pre-made tensors, through the same Trainer/DDP, with no callbacks, logger or metrics, and
      Lightning's per-batch stop-flag broadcast switched off as (a) switches it off: what Lightning's loop
      alone costs (a)'s step, which no Lightning-based (a) can beat.

    python benchmarks/bench_lenet_throughput.py                  # all, 1 and 2 processes
    python benchmarks/bench_lenet_throughput.py --procs 2 --steps 200 --repeats 1

Every variant times the same number of optimizer steps after the same warm-up, in fresh processes, and
(a) does strictly more work per image than (b) (random crop + flip). Not a test: run it on a quiet machine.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torchvision import transforms

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import free_port, interleaved, one_cpu_epoch  # noqa: E402

from lit_ddp.assembly import CALLBACKS, OFF_SWITCHES
from lit_ddp.compat import restore_stop_flag_broadcast, skip_stop_flag_broadcast
from lit_ddp.data import ShapesDataModule
from lit_ddp.data.shapes import draw_shapes
from lit_ddp.models import LeNetCIFAR
from lit_ddp.models.optim import build_optimizer
from lit_ddp.runtime.nvml import skip_futile_nvml_checks

BATCH = 64
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def _init(rank: int, world: int, port: int) -> None:
    # Importing Lightning (this script does) makes Adam's step check for a GPU through NVML: ~0.3 ms per
    # step on a machine without the driver, which a plain-PyTorch script does not pay; lit_ddp skips it.
    skip_futile_nvml_checks()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _images(n: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = draw_shapes(n, seed=0)
    return x.permute(
        0, 2, 3, 1
    ).contiguous().numpy(), y.numpy()  # (N, 32, 32, 3) HWC like torchvision's CIFAR10


# ---- (b) the tutorial loop ---------------------------------------------------------------------------


class TutorialNet(nn.Module):
    """The PyTorch CIFAR-10 tutorial's network: LeNet-5, ReLU then pool, NCHW."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 6, 5), nn.Conv2d(6, 16, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1, self.fc2, self.fc3 = nn.Linear(16 * 5 * 5, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class PILDataset(Dataset):
    """What torchvision.datasets.CIFAR10 does per sample: a PIL image through the transform."""

    def __init__(self, data: np.ndarray, targets: np.ndarray, transform) -> None:
        self.data, self.targets, self.transform = data, targets, transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        return self.transform(Image.fromarray(self.data[i])), int(self.targets[i])


def _tutorial(rank: int, world: int, port: int, steps: int, warmup: int, workers: int, out) -> None:
    _init(rank, world, port)
    data, targets = _images((steps + warmup) * BATCH * world)
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    ds = PILDataset(data, targets, tf)
    loader = DataLoader(
        ds,
        batch_size=BATCH,
        sampler=DistributedSampler(ds),
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    model = DDP(TutorialNet())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    t0 = None
    for step, (x, y) in enumerate(loader):
        if step == warmup:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    dist.barrier()
    if rank == 0:
        out.put(steps * BATCH * world / (time.perf_counter() - t0))
    dist.destroy_process_group()


# ---- (c) the compute limits ---------------------------------------------------------------------------


def _premade_batches(
    seed: int, memory_format: torch.memory_format = torch.contiguous_format
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Eight pre-made, pre-normalised batches (xs, ys) of BATCH images, cycled by (c) and (d)."""
    g = torch.Generator().manual_seed(seed)
    xs = [
        torch.randn(BATCH, 3, 32, 32, generator=g).contiguous(memory_format=memory_format) for _ in range(8)
    ]
    return xs, [torch.randint(0, 10, (BATCH,), generator=g) for _ in range(8)]


def _bare(rank: int, world: int, port: int, steps: int, warmup: int, model: str, out) -> None:
    """``model="lit_ddp"``: (a)'s network, memory format, optimizer and schedule; ``"tutorial"``: (b)'s."""
    _init(rank, world, port)
    if model == "lit_ddp":
        system = LeNetCIFAR()
        net, (xs, ys) = system.net, _premade_batches(rank, system.memory_format)
        opt, schedule = build_optimizer(net, system.optim, BATCH * world, warmup + steps, warmup + steps)
    else:
        net, (xs, ys) = TutorialNet(), _premade_batches(rank)
        opt, schedule = torch.optim.Adam(net.parameters(), lr=1e-3), None
    ddp = DDP(net)
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(xs[step % 8]), ys[step % 8]).backward()
        opt.step()
        if schedule is not None:
            schedule.step()
    dist.barrier()
    if rank == 0:
        out.put(steps * BATCH * world / (time.perf_counter() - t0))
    dist.destroy_process_group()


# ---- (d) Lightning's floor ------------------------------------------------------------------------------


class _PremadeBatches(Dataset):
    """Eight pre-made, pre-normalised (x, y) batches, cycled: one batch per item (``batch_size=None``)."""

    def __init__(self, length: int, memory_format: torch.memory_format) -> None:
        self.xs, self.ys = _premade_batches(0, memory_format)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        return self.xs[i % 8], self.ys[i % 8]


class _BareSystem(L.LightningModule):
    """(c)'s step as a LightningModule: lit_ddp's network, optimizer and schedule, nothing else."""

    def __init__(self) -> None:
        super().__init__()
        system = LeNetCIFAR()
        self.net, self.optim = system.net, system.optim

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        steps = int(self.trainer.estimated_stepping_batches)
        opt, schedule = build_optimizer(self.net, self.optim, BATCH * self.trainer.world_size, steps, steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class _NoStopFlagBroadcast(L.Callback):
    """What (a)'s PreemptionCheckpoint does to Lightning's loop, without its own signal agreement."""

    def on_train_start(self, trainer, pl_module):
        skip_stop_flag_broadcast(trainer)

    def on_train_end(self, trainer, pl_module):
        restore_stop_flag_broadcast(trainer)


def _lightning_floor(world: int, steps: int, warmup: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "rate")
        data = _PremadeBatches((steps + warmup) * world, torch.channels_last)
        trainer = L.Trainer(
            **one_cpu_epoch(world, tmp),
            logger=False,
            callbacks=[_NoStopFlagBroadcast(), Timer(world, steps, warmup, out_file)],
        )
        trainer.fit(_BareSystem(), train_dataloaders=DataLoader(data, batch_size=None))
        with open(out_file) as f:
            return float(f.read())


def _spawn(fn, world: int, *args) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(fn, args=(world, free_port(), *args, out), nprocs=world, start_method="spawn")
    return out.get()


# ---- (a) lit_ddp -------------------------------------------------------------------------------------


class Timer(L.Callback):
    """Rank 0 times steps [warmup, warmup + steps); DDP's all-reduce keeps the ranks in lock-step."""

    def __init__(self, world: int, steps: int, warmup: int, out_file: str) -> None:
        self.world, self.steps, self.warmup, self.out_file = world, steps, warmup, out_file

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.warmup:
            self.t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module):
        rate = self.steps * BATCH * self.world / (time.perf_counter() - self.t0)
        if trainer.is_global_zero:
            with open(self.out_file, "w") as f:
                f.write(str(rate))


def _lit_ddp(world: int, steps: int, warmup: int) -> float:
    skip_futile_nvml_checks()  # as `python -m lit_ddp` does at start-up (lit_ddp/cli.py main)
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "rate")
        dm = ShapesDataModule(train_size=(steps + warmup) * BATCH * world, val_size=BATCH, batch_size=BATCH)
        trainer = L.Trainer(
            **one_cpu_epoch(world, tmp),
            # What `python -m lit_ddp fit` adds: every callback of its list but the checkpoints (not timed).
            callbacks=[
                # The CLI's list, less what the flags below switch off (checkpoints, progress bar, summary).
                *(
                    cls(**init_args)
                    for cls, init_args in CALLBACKS.values()
                    if not issubclass(cls, tuple(OFF_SWITCHES.values()))
                ),
                Timer(world, steps, warmup, out_file),
            ],
        )
        trainer.fit(LeNetCIFAR(), datamodule=dm)
        with open(out_file) as f:
            return float(f.read())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=300, help="timed optimizer steps per process")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--tutorial-workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per variant; best is kept")
    args = parser.parse_args()

    # Shared machines are noisy: the variants take turns, `--repeats` times, and each keeps its best.
    results = []
    for world in args.procs:
        runs = {"lit_ddp": partial(_lit_ddp, world, args.steps, args.warmup)}
        for w in args.tutorial_workers:
            runs[f"tutorial_w{w}"] = partial(_spawn, _tutorial, world, args.steps, args.warmup, w)
        runs["bare_step"] = partial(_spawn, _bare, world, args.steps, args.warmup, "lit_ddp")
        runs["bare_tutorial_step"] = partial(_spawn, _bare, world, args.steps, args.warmup, "tutorial")
        runs["lightning_floor"] = partial(_lightning_floor, world, args.steps, args.warmup)
        row = {"procs": world, **{name: max(r) for name, r in interleaved(runs, args.repeats).items()}}
        best_tutorial = max(row[f"tutorial_w{w}"] for w in args.tutorial_workers)
        row["lit_ddp/best_tutorial"] = row["lit_ddp"] / best_tutorial
        row["lit_ddp/bare_step"] = row["lit_ddp"] / row["bare_step"]
        row["lightning_floor/bare_step"] = row["lightning_floor"] / row["bare_step"]
        row["lit_ddp/lightning_floor"] = row["lit_ddp"] / row["lightning_floor"]
        results.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)

    print(
        f"\n| procs | (a) lit_ddp | (b) tutorial, workers {args.tutorial_workers} | (c) lit_ddp's step"
        " | (c0) tutorial's step | (d) Lightning's floor | a/b | a/c | d/c | a/d |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        tut = " / ".join(f"{r[f'tutorial_w{w}']:.0f}" for w in args.tutorial_workers)
        print(
            f"| {r['procs']} | {r['lit_ddp']:.0f} | {tut} | {r['bare_step']:.0f}"
            f" | {r['bare_tutorial_step']:.0f} | {r['lightning_floor']:.0f} |"
            f" {r['lit_ddp/best_tutorial']:.2f}× | {r['lit_ddp/bare_step']:.2f}× |"
            f" {r['lightning_floor/bare_step']:.2f}× | {r['lit_ddp/lightning_floor']:.2f}× |"
        )


if __name__ == "__main__":
    main()
