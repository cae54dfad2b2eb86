"""ResNet training images/s on synthetic device-resident data: the Lightning system vs a raw PyTorch loop.

    python benchmarks/bench_resnet_gpu.py                          # one GPU: resnet50, batch 256, bf16, NHWC
    python benchmarks/bench_resnet_gpu.py --compile                # both sides torch.compile'd
    python benchmarks/bench_resnet_gpu.py --json out.json          # the figures as JSON too (gpu_suite.sh)
    python benchmarks/bench_resnet_gpu.py --device cpu --arch resnet18 --batch-size 8 --image-size 64 \\
        --precision 32-true --warmup 2 --steps 4                   # proves it runs, on a laptop

Both sides run the same network (``build_net``, as ArchClassifier), the same optimizer and per-step schedule
(``build_optimizer``: SGD momentum 0.9, weight decay 1e-4 off BN/bias, warmup + cosine), label smoothing
0.1, channels_last and the same autocast, on one fixed batch that already sits on the device, so only the
training step and what wraps it are measured. The Lightning side is the real ArchClassifier system: its
torchmetrics top-1/top-5 updates and per-step loss logging are part of what it costs. Targets (issue 4):
Lightning ≥ 0.97 × the raw loop, and ≥ 3,500 images/s for ResNet-50 on one H100.
"""

import argparse
import contextlib
import itertools
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from harness import interleaved, settings, synchronize, training_only, write_results  # benchmarks/: sys.path

from lit_ddp.models import ArchClassifier, OptimConfig, build_net
from lit_ddp.models.optim import build_optimizer

OPTIM = OptimConfig(name="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4, schedule="cosine", warmup_epochs=0.1)


def synthetic_batch(args: argparse.Namespace, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=g)
    y = torch.randint(0, args.num_classes, (args.batch_size,), generator=g)
    return x.to(device).contiguous(memory_format=torch.channels_last), y.to(device)


def raw_loop(args: argparse.Namespace, device: torch.device) -> float:
    """images/s of a hand-written loop: forward, loss, backward, step, schedule."""
    torch.manual_seed(0)
    model = build_net(args.arch, args.num_classes).to(device, memory_format=torch.channels_last)
    total = args.warmup + args.steps
    optimizer, scheduler = build_optimizer(model, OPTIM, args.batch_size, total, steps_per_epoch=total)
    if args.compile:
        model.compile()
    x, y = synthetic_batch(args, device)
    bf16 = args.precision == "bf16-mixed"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    model.train()
    for step in range(total):
        if step == args.warmup:
            synchronize(device)
            start = time.perf_counter()
        with autocast:
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
    synchronize(device)
    return args.steps * args.batch_size / (time.perf_counter() - start)


class RepeatBatch:
    """An iterable of ``n`` times the same batch (a plain list would read as a list of loaders)."""

    def __init__(self, batch: tuple[torch.Tensor, torch.Tensor], n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return itertools.repeat(self.batch, self.n)


class StepTimer(L.Callback):
    """Wall time from the first timed batch to the end of training, with the device synchronised."""

    def __init__(self, warmup: int, device: torch.device) -> None:
        self.warmup, self.device = warmup, device
        self.start = self.seconds = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.warmup:
            synchronize(self.device)
            self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self.start


def lightning_loop(args: argparse.Namespace, device: torch.device) -> float:
    """images/s of the same training through Trainer.fit and the ArchClassifier system."""
    torch.manual_seed(0)
    system = ArchClassifier(
        num_classes=args.num_classes,
        arch=args.arch,
        optim=OPTIM,
        label_smoothing=0.1,
        channels_last=True,
        compile=args.compile,
    )
    total = args.warmup + args.steps
    batches = RepeatBatch(synthetic_batch(args, device), total)
    timer = StepTimer(args.warmup, device)
    trainer = L.Trainer(
        accelerator=device.type,
        devices=1,
        precision=args.precision,
        max_steps=total,
        logger=False,
        benchmark=device.type == "cuda",
        callbacks=[timer],
        **training_only(),
    )
    trainer.fit(system, train_dataloaders=batches)
    return args.steps * args.batch_size / timer.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "32-true"])
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps (cudnn autotuning, compile)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps")
    parser.add_argument(
        "--rounds", type=int, default=2, help="alternate raw/Lightning, keep the best of each"
    )
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        name = torch.cuda.get_device_name(device)
    else:
        name = "CPU"
    sides = {"raw": lambda: raw_loop(args, device), "lightning": lambda: lightning_loop(args, device)}
    rates = interleaved(sides, args.rounds)  # the sides take turns; each keeps its best
    raw, lightning = max(rates["raw"]), max(rates["lightning"])
    print(
        f"{args.arch}, batch {args.batch_size}, {args.image_size}px, {args.precision}, channels_last,"
        f" compile={args.compile}, on {name}; {args.steps} timed steps after {args.warmup},"
        f" best of {args.rounds}"
    )
    print(f"  raw PyTorch loop     {raw:9.1f} images/s")
    print(f"  Lightning (lit_ddp)  {lightning:9.1f} images/s")
    print(f"  Lightning / raw      {lightning / raw:9.3f}")
    if args.json is not None:
        figures = {"raw_img_s": raw, "lightning_img_s": lightning, "ratio": lightning / raw}
        write_results(args.json, {"device": name, **figures, "samples": rates, "settings": settings(args)})


if __name__ == "__main__":
    main()
