"""LeNet-CIFAR seconds per training epoch on one GPU: lit_ddp's Trainer.fit vs the tutorials' DDP loop.

    python benchmarks/bench_lenet_gpu.py                                # one GPU, 50,000 images, best of 3
    python benchmarks/bench_lenet_gpu.py --json lenet.json              # ... and the figures as JSON
    python benchmarks/bench_lenet_gpu.py --cli-callbacks                # lit_ddp with `fit`'s callbacks too
    python benchmarks/bench_lenet_gpu.py --compile                      # ... and lit_ddp compiled, a side too
    python benchmarks/bench_lenet_gpu.py --compile reduce-overhead      # ... compiled into CUDA graphs
    python benchmarks/bench_lenet_gpu.py --workers 1 2                  # ... and lit_ddp with 1, 2 workers
    python benchmarks/bench_lenet_gpu.py --device cpu --train-size 1024 --rounds 1 --tutorial-workers 0 \\
        --json /tmp/lenet.json                                          # proves it runs, on a laptop

Both sides train the same network (lit_ddp.models.LeNet) on the same CIFAR-shaped data held in memory as
uint8 (``--train-size`` random 3×32×32 images, 10 classes; no side's speed depends on the pixels), with
the batch size, optimizer settings and precision of configs/lenet_cifar.yaml. Each runs one warm-up epoch,
then one timed epoch, the device synchronised at the start and the end of it:

- lit_ddp: ``Trainer.fit`` of ``LeNetCIFAR`` as the recipe makes it (channels_last, AdamW and its
  schedule, torchmetrics accuracy; ``cuda_graph: auto``: on one CUDA device its training step replays as
  two CUDA graphs) on an in-memory ImageDataModule built as CIFAR10DataModule builds its splits: each
  uint8 batch is one ``index_select``, copied to the device, then cropped (4-pixel padding), flipped and
  normalised there, whole (``on_after_batch_transfer``). No validation, logger, checkpoints or progress
  bar; ``--cli-callbacks`` adds every other callback ``python -m lit_ddp fit`` runs, and a logger for them.
- lit_ddp_eager: the same with ``cuda_graph=false``: every kernel of the step launched by the host, as
  before the recipe replayed it.
- raw: the floor, the same math without a framework: the images already on the device, each batch
  cropped, flipped and normalised there with lit_ddp's batch functions (the global RNG's draws), LeNet in
  channels-last, AdamW (fused on CUDA), the recipe's precision; no metric, schedule or logging. What
  lit_ddp's step costs above it is host work a faster step cannot hide.
- lightning: the raw side's step inside Lightning's loop: a plain LightningModule (the images on the
  device, the same crop, flip, normalisation, network and fused AdamW; no metric, schedule, data module or
  callback) through the same ``Trainer`` as lit_ddp's, fed batches of sample indices. Between raw and
  lightning is what Lightning's loop costs; between lightning and lit_ddp, what lit_ddp's module, data
  module and metrics cost.
- lit_ddp_compiled (``--compile [MODE]``): the lit_ddp side with ``LeNetCIFAR(compile=True)``, or
  ``compile=MODE`` (``reduce-overhead``: the network's forward and backward replayed as CUDA graphs); its
  compilation falls in the warm-up epoch.
- raw_graphed, lightning_graphed (``--graphed``, a CUDA device only): the raw and lightning sides with the
  whole step (loss, backward, AdamW's update) captured once as one CUDA graph and replayed per batch
  (``GraphedStep``; Lightning's side under manual optimisation): the floors of a replayed step, below
  lit_ddp's (which keeps its data module, schedule, metrics and Lightning's optimizer step around its two
  graphs). Full batches only, the epoch's time scaled to all its images; a graphed side that fails is
  named on stderr and left null.
- lit_ddp_workers_N (``--workers N ...``): the lit_ddp side with N DataLoader workers (persistent, as
  lit_ddp's loader makes them) instead of the recipe's 0: whether building each batch (its
  ``index_select`` and pinning) off the main thread pays for the batch's trip between processes where
  the main thread is what limits the step.
- tutorial: what the PyTorch DDP tutorials write: a Dataset that makes a PIL image per sample (as
  torchvision's CIFAR10 does) and transforms it with RandomCrop(32, padding=4) + RandomHorizontalFlip +
  ToTensor + Normalize in ``--tutorial-workers`` DataLoader workers, a DistributedSampler, the network in
  DistributedDataParallel on a one-process group (nccl on CUDA, gloo on CPU), AdamW, cross-entropy.

The sides take turns, ``--rounds`` times, so that drift on the machine hits both alike; each keeps its
best (shortest) epoch. ``--json`` writes "lenet_cifar_epoch_s", "tutorial_lenet_epoch_s",
"lenet_cifar_eager_epoch_s", "raw_lenet_epoch_s", "lightning_lenet_epoch_s", "lenet_cifar_compiled_epoch_s"
(null without ``--compile``), "raw_graphed_lenet_epoch_s" and "lightning_graphed_lenet_epoch_s" (null
without ``--graphed``), "lenet_cifar_workers_epoch_s" ({N: seconds} for ``--workers``) and "device", with
the arguments used (the compile mode among them).
"""

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import get_args

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from harness import free_port, interleaved, settings, synchronize, training_only, write_results
from PIL import Image
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torchvision import transforms

from lit_ddp.data import CIFAR10DataModule, CropFlip, ImageDataModule
from lit_ddp.data.batch_transforms import normalize, random_crop_flip
from lit_ddp.models import LeNet, LeNetCIFAR, OptimConfig
from lit_ddp.models.classifier import CompileMode
from lit_ddp.runtime.nvml import skip_futile_nvml_checks

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "lenet_cifar.yaml"
WARMUP_EPOCHS = 1  # the epoch after it is timed


def read_recipe() -> dict:
    """What the benchmark takes from configs/lenet_cifar.yaml: the batch size, the loader's workers, the
    precision (Lightning's default if the recipe names none) and LeNetCIFAR's arguments."""
    config = yaml.safe_load(RECIPE.read_text())
    data, model = config["data"]["init_args"], dict(config["model"]["init_args"])
    model["optim"] = OptimConfig(**model["optim"])
    precision = config["trainer"].get("precision", "32-true")
    return dict(
        batch_size=data["batch_size"], num_workers=data["num_workers"], precision=precision, model=model
    )


def cifar_shaped(n: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``n`` random (3, 32, 32) uint8 images and their labels (10 classes)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
    return images, torch.randint(0, 10, (n,), generator=g)


# ---- (a) lit_ddp ---------------------------------------------------------------------------------------


class InMemoryCIFAR(ImageDataModule):
    """CIFAR10DataModule without its files: the same statistics, crop padding and TensorImageDataset."""

    num_classes = CIFAR10DataModule.num_classes
    class_names = CIFAR10DataModule.class_names
    mean, std = CIFAR10DataModule.mean, CIFAR10DataModule.std

    def __init__(self, images: Tensor, labels: Tensor, batch_size: int, num_workers: int | None) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers, augmentation=CropFlip(padding=4))
        self.images, self.labels = images, labels

    def load_split(self, split: str) -> tuple[Tensor, Tensor]:
        return self.images, self.labels  # every split: validation is off (limit_val_batches=0)


class EpochTimer(L.Callback):
    """Seconds from the start of epoch ``epoch`` to the end of training (the module's epoch-end work
    included), the device synchronised at both ends."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.start = self.seconds = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            synchronize(pl_module.device)
            self.start = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        synchronize(pl_module.device)
        self.seconds = time.perf_counter() - self.start


def timed_fit(
    args: argparse.Namespace,
    device: torch.device,
    fit: Callable[[L.Trainer], None],
    callbacks: Sequence[L.Callback] = (),
    logger: bool = False,
) -> float:
    """The timed epoch's seconds of ``fit(trainer)`` on one device at the recipe's precision, with nothing
    but training on (``training_only``); ``logger`` True: Lightning's default one, in a temporary folder."""
    timer = EpochTimer(WARMUP_EPOCHS)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(
            accelerator=device.type,
            devices=1,
            precision=args.precision,
            max_epochs=WARMUP_EPOCHS + 1,
            logger=logger,
            callbacks=[timer, *callbacks],
            **training_only(tmp),
        )
        fit(trainer)
    return timer.seconds


def lit_ddp_epoch(
    args: argparse.Namespace,
    recipe: dict,
    data: tuple[Tensor, Tensor],
    device: torch.device,
    compile: bool | str = False,
    num_workers: int | None = None,
    cuda_graph: bool | str | None = None,
) -> float:
    """``num_workers``: the DataLoader's workers, None for the recipe's; ``cuda_graph`` likewise."""
    torch.manual_seed(0)
    callbacks: list[L.Callback] = []
    if args.cli_callbacks:  # what `fit` adds, less what the Trainer flags turn off (as the CLI does)
        from lit_ddp.assembly import CALLBACKS, OFF_SWITCHES

        off = tuple(OFF_SWITCHES.values())
        callbacks += [cls(**kw) for cls, kw in CALLBACKS.values() if not issubclass(cls, off)]
    workers = recipe["num_workers"] if num_workers is None else num_workers
    dm = InMemoryCIFAR(*data, batch_size=args.batch_size, num_workers=workers)
    overrides = {"compile": compile} | ({} if cuda_graph is None else {"cuda_graph": cuda_graph})
    model = LeNetCIFAR(**{**recipe["model"], **overrides})
    # With fit's callbacks, a logger: they write to one.
    return timed_fit(
        args, device, lambda t: t.fit(model, datamodule=dm), callbacks, logger=args.cli_callbacks
    )


# ---- (b) the floor: the same math, no framework -------------------------------------------------------


def precision_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The recipe's precision in a plain loop: bf16 autocast for "bf16-mixed", else float32 as it is."""
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def floor_loss(net: torch.nn.Module, images: Tensor, labels: Tensor, index: Tensor) -> Tensor:
    """The floor's step up to its loss, shared by the raw and lightning sides: the batch ``index`` of images
    on the device, cropped, flipped and normalised there with lit_ddp's batch functions, through the
    network in channels-last."""
    x = normalize(random_crop_flip(images[index], padding=4), CIFAR10DataModule.mean, CIFAR10DataModule.std)
    return F.cross_entropy(net(x.contiguous(memory_format=torch.channels_last)), labels[index])


def floor_optimizer(params, recipe: dict, device: torch.device) -> torch.optim.AdamW:
    """The recipe's AdamW settings, fused on CUDA."""
    optim = recipe["model"]["optim"]
    fused = device.type == "cuda"
    return torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay, fused=fused)


def floor_step(
    net: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    autocast: contextlib.AbstractContextManager,
    images: Tensor,
    labels: Tensor,
    index: Tensor,
    clear_grads: bool = True,
) -> None:
    """One training step of the floor, no framework: ``floor_loss`` under ``autocast``, backward, update,
    then the gradients cleared (``clear_grads``; not in ``GraphedStep``'s capture, whose replays overwrite
    the gradients the captured backward wrote)."""
    with autocast:
        loss = floor_loss(net, images, labels, index)
    loss.backward()
    optimizer.step()
    if clear_grads:
        optimizer.zero_grad(set_to_none=True)


def timed_epoch(
    device: torch.device, n: int, batch: int, step: Callable[[Tensor], None], full_only: bool = False
) -> float:
    """Seconds of the epoch after ``WARMUP_EPOCHS``, each epoch a fresh permutation of ``n`` samples on the
    device fed to ``step`` ``batch`` indices at a time. ``full_only``: the epoch's last, partial batch left
    out (a CUDA graph replays one batch size) and the time scaled to all ``n`` samples."""
    full = n // batch * batch if full_only else n
    for epoch in range(WARMUP_EPOCHS + 1):
        if epoch == WARMUP_EPOCHS:
            synchronize(device)
            start = time.perf_counter()
        order = torch.randperm(n, device=device)
        for first in range(0, full, batch):
            step(order[first : first + batch])
    synchronize(device)
    return (time.perf_counter() - start) * n / full


def raw_epoch(
    args: argparse.Namespace, recipe: dict, data: tuple[Tensor, Tensor], device: torch.device
) -> float:
    torch.manual_seed(0)
    images, labels = (t.to(device) for t in data)
    net = LeNet().to(device, memory_format=torch.channels_last)
    optimizer = floor_optimizer(net.parameters(), recipe, device)
    autocast = precision_context(args.precision, device)
    step = lambda index: floor_step(net, optimizer, autocast, images, labels, index)  # noqa: E731
    return timed_epoch(device, len(labels), args.batch_size, step)


# ---- (b') the floor inside Lightning's loop -------------------------------------------------------------


class PlainLeNet(L.LightningModule):
    """``raw_epoch``'s step as a LightningModule: batches are sample indices into images on the device."""

    def __init__(self, images: Tensor, labels: Tensor, recipe: dict) -> None:
        super().__init__()
        self.net = LeNet().to(memory_format=torch.channels_last)
        self.images, self.labels, self.recipe = images, labels, recipe

    def on_fit_start(self) -> None:
        self.images, self.labels = self.images.to(self.device), self.labels.to(self.device)

    def training_step(self, index: Tensor, batch_idx: int) -> Tensor:
        return floor_loss(self.net, self.images, self.labels, index)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return floor_optimizer(self.parameters(), self.recipe, self.device)


def lightning_epoch(
    args: argparse.Namespace, recipe: dict, data: tuple[Tensor, Tensor], device: torch.device
) -> float:
    torch.manual_seed(0)
    module = PlainLeNet(*data, recipe)
    # Pinned, as lit_ddp's loader pins its batches: the index batch's copy then waits for nothing.
    indices = DataLoader(
        range(len(data[1])), batch_size=args.batch_size, shuffle=True, pin_memory=device.type == "cuda"
    )
    return timed_fit(args, device, lambda t: t.fit(module, train_dataloaders=indices))


# ---- (b'') the floor's whole step as one CUDA graph (--graphed) -----------------------------------------


def warm_up(step: Callable[[], None], optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Before a capture, after torch's CUDA-graph docs ("whole network capture"): a few ``step``s on a side
    stream (cuDNN's choices, the optimizer's state, lazily made constants), then the gradients set to None
    (the captured backward then writes them, and each replay overwrites them)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    optimizer.zero_grad(set_to_none=True)


def capture_step(
    step: Callable[[], None], optimizer: torch.optim.Optimizer, device: torch.device
) -> torch.cuda.CUDAGraph:
    """``step`` (forward, backward, ``optimizer``'s update) captured as one CUDA graph after ``warm_up``.
    The optimizer must be ``capturable``."""
    warm_up(step, optimizer, device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


class GraphedStep:
    """The floor's whole step (``floor_loss``, backward, AdamW's update) captured once as one CUDA graph
    (``capture_step``) and replayed for each full batch: the host launches one graph a step instead of ~90
    kernels. The step's host time is then what is left of the framework around it. The graph's input is
    static: the batch's sample indices are copied into ``index`` before each replay. Off CUDA (a CPU test)
    the same step runs eagerly, the gradients cleared before it."""

    def __init__(
        self, net: torch.nn.Module, images: Tensor, labels: Tensor, recipe: dict, precision: str, batch: int
    ) -> None:
        device = images.device
        capture = device.type == "cuda"
        optim = recipe["model"]["optim"]
        self.optimizer = torch.optim.AdamW(
            net.parameters(), lr=optim.lr, weight_decay=optim.weight_decay, foreach=True, capturable=capture
        )
        self.index = torch.zeros(batch, dtype=torch.long, device=device)
        autocast = precision_context(precision, device)

        def step() -> None:
            floor_step(net, self.optimizer, autocast, images, labels, self.index, clear_grads=False)

        self.step = step
        self.graph = capture_step(step, self.optimizer, device) if capture else None

    def __call__(self, index: Tensor) -> None:
        self.index.copy_(index, non_blocking=True)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.optimizer.zero_grad(set_to_none=True)
            self.step()


def raw_graphed_epoch(
    args: argparse.Namespace, recipe: dict, data: tuple[Tensor, Tensor], device: torch.device
) -> float:
    """``raw_epoch`` with ``GraphedStep``: full batches only (``timed_epoch``'s ``full_only``)."""
    torch.manual_seed(0)
    images, labels = (t.to(device) for t in data)
    net = LeNet().to(device, memory_format=torch.channels_last)
    step = GraphedStep(net, images, labels, recipe, args.precision, args.batch_size)
    return timed_epoch(device, len(labels), args.batch_size, step, full_only=True)


class GraphedLeNet(PlainLeNet):
    """``PlainLeNet`` under manual optimisation, its whole step a ``GraphedStep`` made at the start of
    training: what Lightning's loop costs around a step that launches one graph."""

    def __init__(self, images: Tensor, labels: Tensor, recipe: dict, batch: int) -> None:
        super().__init__(images, labels, recipe)
        self.automatic_optimization = False
        self.batch = batch

    def on_train_start(self) -> None:
        precision = self.trainer.precision
        self.step = GraphedStep(self.net, self.images, self.labels, self.recipe, precision, self.batch)

    def training_step(self, index: Tensor, batch_idx: int) -> None:
        self.step(index)

    def configure_optimizers(self) -> None:
        return None  # the graph holds its own AdamW


def lightning_graphed_epoch(
    args: argparse.Namespace, recipe: dict, data: tuple[Tensor, Tensor], device: torch.device
) -> float:
    """``lightning_epoch`` with ``GraphedLeNet``; full batches only, scaled as ``raw_graphed_epoch``'s."""
    torch.manual_seed(0)
    module = GraphedLeNet(*data, recipe, args.batch_size)
    n = len(data[1])
    indices = DataLoader(range(n), batch_size=args.batch_size, shuffle=True, pin_memory=True, drop_last=True)
    seconds = timed_fit(args, device, lambda t: t.fit(module, train_dataloaders=indices))
    return seconds * n / (len(indices) * args.batch_size)


# ---- (c) the tutorial loop ---------------------------------------------------------------------------


class PILImages(Dataset):
    """What torchvision.datasets.CIFAR10 does per sample: HWC uint8 → PIL image → the transform."""

    def __init__(self, images: Tensor, labels: Tensor, transform: transforms.Compose) -> None:
        self.images = images.permute(0, 2, 3, 1).contiguous().numpy()  # (N, 32, 32, 3), as CIFAR10 holds it
        self.labels, self.transform = labels.tolist(), transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return self.transform(Image.fromarray(self.images[i])), self.labels[i]


def tutorial_epoch(
    args: argparse.Namespace, recipe: dict, data: tuple[Tensor, Tensor], device: torch.device
) -> float:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        mean, std = CIFAR10DataModule.mean, CIFAR10DataModule.std
        augment = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()]
        to_tensor = [transforms.ToTensor(), transforms.Normalize(mean, std)]
        dataset = PILImages(*data, transforms.Compose([*augment, *to_tensor]))
        sampler = DistributedSampler(dataset)  # shuffles, reseeded by set_epoch
        # As the tutorials write it: pinned memory, and workers started afresh every epoch (no
        # persistent_workers), which the timed epoch pays for.
        loader = DataLoader(
            dataset,
            batch_size=args.batch_size,
            sampler=sampler,
            num_workers=args.tutorial_workers,
            pin_memory=device.type == "cuda",
        )
        net = LeNet().to(device)
        model = DistributedDataParallel(net, device_ids=[device] if device.type == "cuda" else None)
        # The recipe's AdamW settings, without lit_ddp's fused kernel and its no-decay group.
        optim = recipe["model"]["optim"]
        optimizer = torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)
        autocast = precision_context(args.precision, device)
        for epoch in range(WARMUP_EPOCHS + 1):
            if epoch == WARMUP_EPOCHS:
                synchronize(device)
                start = time.perf_counter()
            sampler.set_epoch(epoch)
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                with autocast:
                    loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
        synchronize(device)
        return time.perf_counter() - start
    finally:
        dist.destroy_process_group()


def shortest(times: list[float]) -> float | None:
    """A side's best epoch: the shortest of its rounds that ran (None if none did)."""
    return min((t for t in times if not math.isnan(t)), default=None)


def guarded(name: str, side: Callable[[], float]) -> Callable[[], float]:
    """``side``, its failure printed (the traceback, then one line naming it) and counted as NaN: a side
    that has never run on a GPU cannot take the figures of the sides beside it down with it."""

    def run() -> float:
        try:
            return side()
        except Exception:
            traceback.print_exc()
            print(f"bench_lenet_gpu: side {name} failed (above); its figure is left null", file=sys.stderr)
            return math.nan

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    recipe = read_recipe()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--train-size", type=int, default=50000, help="training images (CIFAR-10: 50,000)")
    parser.add_argument("--batch-size", type=int, default=recipe["batch_size"], help="default: the recipe's")
    parser.add_argument("--precision", default=recipe["precision"], choices=["32-true", "bf16-mixed"])
    parser.add_argument("--tutorial-workers", type=int, default=4, help="the tutorial's DataLoader workers")
    parser.add_argument("--rounds", type=int, default=3, help="the sides alternate; each keeps its best")
    parser.add_argument("--cli-callbacks", action="store_true", help="lit_ddp with `fit`'s callbacks")
    parser.add_argument(
        "--compile", nargs="?", const=True, default=False, choices=[True, *get_args(CompileMode)],
        metavar="MODE", help="also lit_ddp with --model.compile=true, or =MODE (torch.compile's mode)",
    )  # fmt: skip
    parser.add_argument(
        "--graphed",
        action="store_true",
        help="also the floor's whole step as one CUDA graph, raw and in Lightning",
    )
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[],
        metavar="N",
        help="also the lit_ddp side with N DataLoader workers (the recipe has 0), a side for each N",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    if args.graphed and not args.device.startswith("cuda"):
        parser.error(f"--graphed captures CUDA graphs: it needs a CUDA device, not --device={args.device}")

    skip_futile_nvml_checks()  # as `python -m lit_ddp` does first; only machines without a driver differ
    # The in-memory loader runs in the main process on purpose (the recipe's num_workers: 0).
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())  # what devices=1 picks
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    data = cifar_shaped(args.train_size)

    sides = {
        "lit_ddp": lambda: lit_ddp_epoch(args, recipe, data, device),
        "lit_ddp_eager": lambda: lit_ddp_epoch(args, recipe, data, device, cuda_graph=False),
        "tutorial": lambda: tutorial_epoch(args, recipe, data, device),
        "raw": lambda: raw_epoch(args, recipe, data, device),
        "lightning": lambda: lightning_epoch(args, recipe, data, device),
    }
    if args.compile:
        sides["lit_ddp_compiled"] = lambda: lit_ddp_epoch(args, recipe, data, device, compile=args.compile)
    for n in args.workers:
        sides[f"lit_ddp_workers_{n}"] = partial(lit_ddp_epoch, args, recipe, data, device, num_workers=n)
    if args.graphed:
        # First runs on a GPU: a side that fails is named and left null, and the others still count.
        sides["raw_graphed"] = guarded("raw_graphed", lambda: raw_graphed_epoch(args, recipe, data, device))
        sides["lightning_graphed"] = guarded(
            "lightning_graphed", lambda: lightning_graphed_epoch(args, recipe, data, device)
        )
    epochs = interleaved(sides, args.rounds)
    best = {side: shortest(times) for side, times in epochs.items()}

    print(
        f"LeNet-5, {args.train_size:,} CIFAR-shaped uint8 images, batch {args.batch_size}, {args.precision},"
        f" on {name}; one epoch after {WARMUP_EPOCHS} warm-up, best of {args.rounds}"
    )
    callbacks = " + fit's callbacks" if args.cli_callbacks else ""
    rows = [
        (f"lit_ddp: Trainer.fit, augmentation on the device{callbacks}", epochs["lit_ddp"]),
        (f"lit_ddp_eager: the same, --model.cuda_graph=false{callbacks}", epochs["lit_ddp_eager"]),
        (f"tutorial: PIL transforms in {args.tutorial_workers} workers, DDP", epochs["tutorial"]),
        ("raw: the same math, no framework (the floor)", epochs["raw"]),
        ("lightning: the same math in a plain LightningModule, Trainer.fit", epochs["lightning"]),
    ]
    if args.compile:
        mode = "" if args.compile is True else f" ({args.compile})"
        rows.append((f"lit_ddp compiled{mode}{callbacks}", epochs["lit_ddp_compiled"]))
    for n in args.workers:
        rows.append((f"lit_ddp with {n} DataLoader workers{callbacks}", epochs[f"lit_ddp_workers_{n}"]))
    if args.graphed:
        rows.append(("raw, the whole step one CUDA graph", epochs["raw_graphed"]))
        rows.append(
            ("lightning, the whole step one CUDA graph (manual optimisation)", epochs["lightning_graphed"])
        )
    for label, times in rows:
        each = " ".join(f"{t:.3f}" for t in times)
        best_s = shortest(times) or math.nan
        rate = args.train_size / best_s
        print(f"  {label:<68} {best_s:8.3f} s/epoch {rate:10,.0f} images/s   (rounds: {each})")
    print(f"  tutorial / lit_ddp epoch time: {best['tutorial'] / best['lit_ddp']:.2f}×")
    print(f"  lit_ddp / raw epoch time: {best['lit_ddp'] / best['raw']:.2f}×")
    saved = best["lit_ddp_eager"] / best["lit_ddp"]
    print(f"  lit_ddp_eager / lit_ddp (what replaying the step saves): {saved:.2f}×")
    print(
        f"  lightning / raw (Lightning's loop): {best['lightning'] / best['raw']:.2f}×;"
        f" lit_ddp / lightning (lit_ddp's module, data, metrics): {best['lit_ddp'] / best['lightning']:.2f}×"
    )

    if args.json is not None:
        figures = {
            "lenet_cifar_epoch_s": best["lit_ddp"],
            "lenet_cifar_eager_epoch_s": best["lit_ddp_eager"],
            "tutorial_lenet_epoch_s": best["tutorial"],
            "raw_lenet_epoch_s": best["raw"],
            "lightning_lenet_epoch_s": best["lightning"],
            "lenet_cifar_compiled_epoch_s": best.get("lit_ddp_compiled"),
            "raw_graphed_lenet_epoch_s": best.get("raw_graphed"),
            "lightning_graphed_lenet_epoch_s": best.get("lightning_graphed"),
            "lenet_cifar_workers_epoch_s": {n: best[f"lit_ddp_workers_{n}"] for n in args.workers},
        }
        write_results(args.json, {"device": name, **figures, "samples": epochs, "settings": settings(args)})


if __name__ == "__main__":
    main()
