"""Host time per training step around a step that computes almost nothing: what a framework costs where a
GPU makes the step itself fast (LeNet-CIFAR's step is well under a millisecond on a GPU).

A linear layer on 3×8×8 images, batch 32, AdamW with lit_ddp's schedule, batches in memory; 1 and 2 CPU
processes (gloo DDP; ``ddp_spawn`` for Lightning), one torch thread each. Variants, in fresh processes,
taking turns ``--rounds`` times:

  raw          a plain PyTorch loop (DDP when 2 processes) over pre-made, pre-normalised batches;
  bare         the same step as a bare ``LightningModule`` through ``Trainer.fit``: no logger, callbacks,
               progress bar, summary or checkpoints (Lightning's floor);
  defaults     ``bare`` with Lightning's defaults on (TensorBoard logger, progress bar, summary, checkpoint);
  callbacks    ``bare`` with lit_ddp's default callbacks (lit_ddp/assembly.py ``CALLBACKS``, every one,
               progress bar and checkpoints included) and its TensorBoard logger, as ``lit_ddp fit``;
  callbacks_redraw_each_batch
               ``callbacks`` with the progress bar redrawn after every batch, as Lightning's does
               (``console.REDRAW_S = 0``): lit_ddp's callbacks before the bar was throttled;
  empty_callbacks
               ``bare`` with as many callbacks as lit_ddp's list holds, each doing nothing: what Lightning's
               dispatch of every hook to every callback costs by itself;
  module       ``ImageClassifier`` on the ``ImageDataModule`` below with ``bare``'s settings (no logger,
               callbacks, progress bar, summary or checkpoints): lit_ddp's module and data path alone, as
               ``bench_lenet_gpu.py`` times them on a GPU;
  lit_ddp      what ``python -m lit_ddp fit`` trains: ``ImageClassifier`` (metrics, loss mean) on an
               ``ImageDataModule`` of in-memory uint8 images (on-device crop + flip, normalisation), with
               every default callback and the logger.

Each run times ``--steps`` steps after ``--warmup`` (rank 0, from the start of the first timed batch to
the end of the last), in wall time and in the process's CPU time (which other processes on a shared machine
disturb far less). Reported for each: median µs per step over rounds, the range, and the median and range
of the per-round ratio of steps/s to ``bare``.

    python benchmarks/bench_step_overhead.py --rounds 5
    python benchmarks/bench_step_overhead.py --profile callbacks   # cProfile of one 1-process run
    python benchmarks/bench_step_overhead.py --hook-costs          # each callback's own time per step
    python benchmarks/bench_step_overhead.py --device-ops          # ops of the data path and accuracy update
    python benchmarks/bench_step_overhead.py --step-ops --steps 100 # ops a whole training step dispatches
    python benchmarks/bench_step_overhead.py --procs 1 --variants bare callbacks --without dashboard
"""

import argparse
import cProfile
import io
import json
import math
import os
import pstats
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import free_port, interleaved, one_cpu_epoch, parser, summarize, write_results  # noqa: E402

from lit_ddp.assembly import CALLBACKS, NoProfiler  # noqa: E402
from lit_ddp.callbacks import CallbackGroup, console  # noqa: E402
from lit_ddp.callbacks.group import skip_unused_batch_hooks  # noqa: E402
from lit_ddp.compat import BATCH_HOOKS  # noqa: E402
from lit_ddp.data import CropFlip, ImageDataModule  # noqa: E402
from lit_ddp.data.batch import Batch  # noqa: E402
from lit_ddp.models import ImageClassifier  # noqa: E402
from lit_ddp.models.optim import OptimConfig, build_optimizer  # noqa: E402
from lit_ddp.runtime.console import Console  # noqa: E402
from lit_ddp.runtime.nvml import skip_futile_nvml_checks  # noqa: E402

BATCH, SIZE, CLASSES = 32, 8, 10
VARIANTS = [  # bare first: the variant the others are compared with
    "bare",
    "raw",
    "defaults",
    "callbacks",
    "module",
    "lit_ddp",
    "callbacks_redraw_each_batch",
    "empty_callbacks",
]
OPTIM = OptimConfig(name="adamw", lr=3e-3, weight_decay=5e-4)


class TinyNet(nn.Module):
    """Compute negligible next to the framework: one (3·8·8 → classes) linear layer."""

    def __init__(self, num_classes: int = CLASSES) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * SIZE * SIZE, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def premade(n: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(BATCH, 3, SIZE, SIZE, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
        for _ in range(n)
    ]


class Batches(Dataset):
    """Pre-made batches, cycled: one batch per item (``batch_size=None``)."""

    def __init__(self, length: int) -> None:
        self.batches, self.length = premade(), length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        return self.batches[i % len(self.batches)]


class BareModule(L.LightningModule):
    num_classes = CLASSES  # read by lit_ddp's confusion-matrix callback

    def __init__(self) -> None:
        super().__init__()
        self.net = TinyNet()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        steps = int(self.trainer.estimated_stepping_batches)
        opt, schedule = build_optimizer(self.net, OPTIM, BATCH * self.trainer.world_size, steps, steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class TinyImages(ImageDataModule):
    """In-memory uint8 3×8×8 images: lit_ddp's data path (sampler, ``__getitems__``, on-device crop + flip
    and normalisation) with nothing to decode."""

    image_size = val_resize = SIZE
    num_classes = CLASSES

    def __init__(self, n: int) -> None:
        super().__init__(batch_size=BATCH, num_workers=0, augmentation=CropFlip(padding=1))
        self.n = n

    def load_split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(0)  # every split the same images
        images = torch.randint(0, 256, (self.n, 3, SIZE, SIZE), dtype=torch.uint8, generator=g)
        return images, torch.randint(0, CLASSES, (self.n,), generator=g)


def clocks() -> tuple[float, float]:
    """Wall time and this process's CPU time (all its threads: a progress bar's or a logger's too). On a
    shared machine the CPU time moves far less than the wall time when other processes take the cores."""
    return time.perf_counter(), time.process_time()


class Timer(L.Callback):
    """Rank 0's wall and CPU time from the start of batch ``warmup`` to the end of the last batch."""

    def __init__(self, warmup: int, out_file: str, profiler: cProfile.Profile | None = None) -> None:
        self.warmup, self.out_file, self.profiler = warmup, out_file, profiler
        self.timing = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.warmup:
            self.t0 = clocks()
            self.timing = True
            if self.profiler is not None:  # the timed steps only, not the set-up
                self.profiler.enable()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.t1 = clocks()
        if self.profiler is not None and batch_idx == trainer.num_training_batches - 1:
            self.profiler.disable()

    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            with open(self.out_file, "w") as f:
                json.dump([b - a for a, b in zip(self.t0, self.t1, strict=True)], f)


class Redraw(L.Callback):
    """Sets the progress bar's redraw interval on each rank (a spawned rank imports console.py afresh)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def setup(self, trainer, pl_module, stage):
        console.REDRAW_S = self.seconds


def lit_ddp_callbacks(leave_out: tuple[str, ...] = ()) -> list[L.Callback]:
    """The CLI's default callbacks, with the progress bar and model summary the console asks for."""
    ours = [cls(**init_args) for key, (cls, init_args) in CALLBACKS.items() if key not in leave_out]
    ours += [part for c in ours if isinstance(c, Console) for part in c.lightning_parts()]
    return [skip_unused_batch_hooks(c) for c in ours]  # as assembly.py hands them to the Trainer


STEP_HOOKS = tuple(
    hook for hook in BATCH_HOOKS if "validation" not in hook and "test" not in hook and "predict" not in hook
)


def time_step_hooks(
    callbacks: list[L.Callback], timer: "Timer", spent: dict[str, float] | None = None
) -> dict[str, float]:
    """Wrap each callback's own per-step hooks to add their wall time during the timed steps to the
    returned dict: native time, without a profiler's inflation of Python calls."""
    spent = {} if spent is None else spent
    for callback in callbacks:
        if isinstance(callback, CallbackGroup):  # each part of a group on its own
            time_step_hooks(callback.members, timer, spent)
            callback.index_hooks()
            continue
        for hook in STEP_HOOKS:
            if getattr(type(callback), hook) is getattr(L.Callback, hook) or getattr(callback, hook) is None:
                continue  # not called (None: Lightning passes over it)
            key = f"{type(callback).__name__}.{hook}"
            setattr(callback, hook, _timed_hook(getattr(callback, hook), key, timer, spent))
    return spent


def _timed_hook(fn, key: str, timer: "Timer", spent: dict[str, float]):
    def timed(*args, **kwargs):
        if not timer.timing:
            return fn(*args, **kwargs)
        start = time.perf_counter()
        fn(*args, **kwargs)
        spent[key] = spent.get(key, 0.0) + time.perf_counter() - start

    return timed


def run_lightning(
    variant: str,
    world: int,
    steps: int,
    warmup: int,
    root: str,
    profiler: cProfile.Profile | None = None,
    hook_costs: dict[str, dict[str, float]] | None = None,
    extra: tuple[L.Callback, ...] = (),
) -> list[float]:
    redraw_each_batch = variant == "callbacks_redraw_each_batch"
    if redraw_each_batch:
        console.REDRAW_S = 0.0  # ddp_spawn's ranks import this module afresh: set again in each (Redraw)
        variant = "callbacks"
    leave_out = ()
    if variant.startswith("callbacks_without_"):  # --without KEY: every default callback but KEY
        leave_out, variant = (variant.removeprefix("callbacks_without_"),), "callbacks"
    out_file = os.path.join(root, "seconds")
    n = (steps + warmup) * world
    logger = False
    if variant in ("callbacks", "lit_ddp", "defaults"):
        logger = L.pytorch.loggers.TensorBoardLogger(root, name="run", default_hp_metric=False)
    on = variant not in ("bare", "empty_callbacks", "module")
    callbacks = [*extra, Timer(warmup, out_file, profiler)]
    if variant == "empty_callbacks":
        callbacks = [L.Callback() for _ in CALLBACKS] + callbacks
    if variant in ("callbacks", "lit_ddp"):
        # The CLI's order, then the timer; the redraw setting only where it differs from the default (any
        # entry of trainer.callbacks costs a few µs a step in Lightning's dispatch of each hook to it).
        ours = lit_ddp_callbacks(leave_out)
        if hook_costs is not None:
            hook_costs.update(spent=time_step_hooks(ours, callbacks[0]))  # filled in during the fit
        callbacks = ours + callbacks + ([Redraw(console.REDRAW_S)] if redraw_each_batch else [])
    settings = one_cpu_epoch(world, root)
    # Without the console, `fit` turns Lightning's bar and summary off too (assembly.py), rather than let
    # Lightning add its own, which redraws after every batch.
    shown = on and "console" not in leave_out
    settings.update(enable_progress_bar=shown, enable_model_summary=shown, enable_checkpointing=on)
    if variant in ("callbacks", "lit_ddp"):
        settings.update(profiler=NoProfiler())  # as assembly.py gives `fit` (bare keeps Lightning's default)
    trainer = L.Trainer(**settings, logger=logger, callbacks=callbacks)
    if variant in ("lit_ddp", "module"):
        model = ImageClassifier(TinyNet(), num_classes=CLASSES, optim=OPTIM)
        trainer.fit(model, datamodule=TinyImages(n * BATCH))
    else:
        trainer.fit(BareModule(), train_dataloaders=DataLoader(Batches(n), batch_size=None))
    with open(out_file) as f:
        return json.load(f)


def _raw_rank(rank: int, world: int, port: int, steps: int, warmup: int, out_file: str) -> None:
    torch.set_num_threads(1)
    net: nn.Module = TinyNet()
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        net = nn.parallel.DistributedDataParallel(net)
    opt, schedule = build_optimizer(net, OPTIM, BATCH * world, steps + warmup, steps + warmup)
    batches = premade()
    for step in range(steps + warmup):
        if step == warmup:
            t0 = clocks()
        x, y = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()
        schedule.step()
    t1 = clocks()
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump([b - a for a, b in zip(t0, t1, strict=True)], f)
    if world > 1:
        dist.destroy_process_group()


def run_raw(world: int, steps: int, warmup: int, root: str) -> list[float]:
    out_file = os.path.join(root, "seconds")
    if world == 1:
        _raw_rank(0, 1, 0, steps, warmup, out_file)
    else:
        args = (world, free_port(), steps, warmup, out_file)
        torch.multiprocessing.spawn(_raw_rank, args=args, nprocs=world)
    with open(out_file) as f:
        return json.load(f)


def print_profile(profiler: cProfile.Profile, steps: int) -> None:
    """The largest own-time entries, then the CPU time spent in each callback hook, µs per step (under the
    profiler, which inflates every Python call several times: compare entries, not with the tables)."""
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(25)
    print(text.getvalue(), file=sys.stderr)
    rows = [
        (cumulative / steps * 1e6, calls, f"{file.split('site-packages/')[-1]}:{line} {name}")
        for (file, line, name), (_, calls, _, cumulative, _) in stats.stats.items()
        if name.startswith("on_") and ("callbacks" in file or "lit_ddp/runtime" in file)
    ]
    print("CPU µs per step inside each callback hook (cumulative, under cProfile):", file=sys.stderr)
    for us, calls, where in sorted(rows, reverse=True)[:20]:
        print(f"  {us:8.1f}  x{calls:6d}  {where}", file=sys.stderr)


def print_hook_costs(steps: int, warmup: int) -> None:
    """Each default callback's own hooks, µs per step, in one 1-process run of ``callbacks`` (wall time
    around each call, no profiler), next to that run's whole step."""
    costs: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as root:
        wall, _ = run_lightning("callbacks", 1, steps, warmup, root, hook_costs=costs)
    spent = costs["spent"]
    print("| callback hook | µs per step |\n|---|---:|")
    for key, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"| {key} | {seconds / steps * 1e6:.1f} |")
    print(f"| all of them | {sum(spent.values()) / steps * 1e6:.1f} |")
    print(f"| (the whole step) | {wall / steps * 1e6:.0f} |")


class DispatchedOps(TorchDispatchMode):
    """The name of every tensor op dispatched while it is entered (views included), in ``names``."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def print_device_ops() -> None:
    """The tensor ops a CIFAR-shaped training batch (128 × 3 × 32 × 32, crop + flip, normalisation) costs
    on the device it was copied to, counted at dispatch (on a GPU each op but a view is a kernel launch):
    with the per-sample draws hashed after the copy, as lit_ddp did before, and before it, as it does."""
    from types import SimpleNamespace

    from lightning.pytorch.trainer.states import RunningStage

    views = {"view", "select", "unsqueeze", "as_strided", "detach", "lift_fresh", "alias", "expand", "slice"}
    dm = ImageDataModule(batch_size=128, augmentation=CropFlip(padding=4))
    dm.mean, dm.std = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
    training = SimpleNamespace(stage=RunningStage.TRAINING)
    dm.trainer = SimpleNamespace(
        training=True, predicting=False, current_epoch=0, global_rank=0, world_size=1, state=training
    )
    g = torch.Generator().manual_seed(0)
    batch = (torch.randint(0, 256, (128, 3, 32, 32), dtype=torch.uint8, generator=g), torch.zeros(128).long())
    index = torch.arange(128)
    with DispatchedOps() as host:
        drawn_first = dm.on_before_batch_transfer((*batch, index), 0)
    print("| draws hashed | ops on the device | of them not views | ops on the host before the copy |")
    print("|---|---:|---:|---:|")
    for label, ready, host_count in (
        ("after the copy", Batch(*batch, index=index), 0),
        ("before the copy", drawn_first, len(host.names)),
    ):
        with DispatchedOps() as device:
            dm.on_after_batch_transfer(ready, 0)
        kernels = sum(name not in views for name in device.names)
        print(f"| {label} | {len(device.names)} | {kernels} | {host_count} |")
    print_metric_update_ops(views)
    print_nan_check_cost()


class StepOps(L.Callback):
    """Records every tensor op dispatched from the start of training batch ``first`` to the end of batch
    ``last`` (``DispatchedOps``): what a training step runs, the framework's and the model's alike."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.ops = DispatchedOps()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx == self.first:
            self.ops.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if batch_idx == self.last:
            self.ops.__exit__(None, None, None)


def print_step_ops(variants: list[str], steps: int, warmup: int) -> None:
    """Tensor ops dispatched per training step, per variant, counted over ``steps`` steps after ``warmup``
    in one 1-process run each: on a CPU each op costs its dispatch on the host, on a GPU each op but a view
    is a kernel launch."""
    views = {"view", "select", "unsqueeze", "as_strided", "detach", "lift_fresh", "alias", "expand", "slice"}
    print("| variant | ops per step | of them not views |")
    print("|---|---:|---:|")
    for variant in variants:
        counter = StepOps(warmup, warmup + steps - 1)
        with tempfile.TemporaryDirectory() as root:
            run_lightning(variant, 1, steps + 10, warmup, root, extra=(counter,))
        names = counter.ops.names
        kernels = sum(name not in views for name in names)
        print(f"| {variant} | {len(names) / steps:.1f} | {kernels / steps:.1f} |")


def print_nan_check_cost(checks: int = 400, rounds: int = 7) -> None:
    """NanGuard's check of a step's gradients on a CPU, read as one verdict: torch's ``get_total_norm``
    against the guard's own (runtime/nan_guard.py: the sum of squares in numpy), on TinyNet's gradient
    shapes and LeNet's; host µs of one check (``checks`` in a row, ``rounds`` taking turns, one thread)."""
    from lit_ddp.runtime.nan_guard import _finite_on_cpu

    g = torch.Generator().manual_seed(0)
    lenet = ((6, 3, 5, 5), (6,), (16, 6, 5, 5), (16,), (120, 400), (120,), (84, 120), (84,), (10, 84), (10,))
    models = {"TinyNet": [p.shape for p in TinyNet().parameters()], "LeNet": lenet}
    checks_of = {
        "torch get_total_norm": lambda grads: math.isfinite(torch.nn.utils.get_total_norm(grads, 2.0).item()),
        "lit_ddp NanGuard": _finite_on_cpu,
    }

    def seconds(check, grads: list[torch.Tensor]) -> float:
        start = time.perf_counter()
        for _ in range(checks):
            check(grads)
        return (time.perf_counter() - start) / checks * 1e6

    cases = {}
    for model, shapes in models.items():
        grads = [torch.randn(shape, generator=g) for shape in shapes]
        label = f"{model} ({len(shapes)} tensors)"
        cases |= {f"{name}, {label}": partial(seconds, check, grads) for name, check in checks_of.items()}
    timed = summarize(interleaved(cases, rounds))
    print("\n| gradients' check, CPU | host µs per step, median (range) |")
    print("|---|---:|")
    for name, row in timed.items():
        print(f"| {name} | {row['median']:.1f} ({row['min']:.1f}–{row['max']:.1f}) |")


def print_metric_update_ops(views: set[str], updates: int = 2000, rounds: int = 7) -> None:
    """The training accuracy's update on a LeNet-shaped batch ((128, 10) logits): its ops, counted at
    dispatch, and the host µs of one update (``updates`` in a row, ``rounds`` taking turns, one thread),
    for torchmetrics' micro ``MulticlassAccuracy`` (lit_ddp's metric before) and ``TopKAccuracy``."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy

    from lit_ddp.models.classifier import build_metrics

    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(128, 10, generator=g), torch.randint(0, 10, (128,), generator=g)
    before = MulticlassAccuracy(10, average="micro", validate_args=False)
    collections = {  # the training accuracy as the classifier builds it, and as it was built before
        "torchmetrics MulticlassAccuracy": MetricCollection({"acc": before}).clone(prefix="train/"),
        "lit_ddp TopKAccuracy": build_metrics(10, (1,)).clone(prefix="train/"),
    }
    for metrics in collections.values():
        metrics.update(logits, labels)  # the first update settles a collection's compute groups

    def seconds(metrics: MetricCollection) -> float:
        start = time.perf_counter()
        for _ in range(updates):
            metrics.update(logits, labels)
        return (time.perf_counter() - start) / updates * 1e6

    timed = summarize(interleaved({name: partial(seconds, m) for name, m in collections.items()}, rounds))
    print("\n| accuracy update, 128 samples | ops | of them not views | host µs, median (range) |")
    print("|---|---:|---:|---:|")
    for name, metrics in collections.items():
        with DispatchedOps() as ops:
            metrics.update(logits, labels)
        kernels = sum(op not in views for op in ops.names)
        row = timed[name]
        us = f"{row['median']:.1f} ({row['min']:.1f}–{row['max']:.1f})"
        print(f"| {name} | {len(ops.names)} | {kernels} | {us} |")


def child(variant: str, world: int, steps: int, warmup: int, profile: bool) -> None:
    # As `python -m lit_ddp` does at start-up (cli.main): Adam's step would otherwise ask NVML for a GPU.
    skip_futile_nvml_checks()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        if variant == "raw":
            seconds = run_raw(world, steps, warmup, root)
        else:
            # CPU clock: the profile of a run that other processes slow down stays the same.
            profiler = cProfile.Profile(time.process_time) if profile else None
            seconds = run_lightning(variant, world, steps, warmup, root, profiler)
            if profiler is not None:
                print_profile(profiler, steps)
    wall, cpu = seconds
    print(json.dumps({"wall_us": wall / steps * 1e6, "cpu_us": cpu / steps * 1e6}))


def measure(variant: str, world: int, steps: int, warmup: int) -> dict[str, float]:
    """One run of ``variant`` in a fresh process: rank 0's wall and CPU µs per step."""
    cmd = [sys.executable, __file__, "--child", variant, "--world", str(world)]
    cmd += ["--steps", str(steps), "--warmup", str(warmup)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{variant} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def rounds(args: argparse.Namespace, world: int) -> dict[str, dict[str, list[float]]]:
    """Every variant once per round (benchmarks/harness.py), by clock: {"cpu_us" | "wall_us": samples}."""
    wall: dict[str, list[float]] = {}

    def cpu_us(variant: str) -> float:  # the harness's figure; the wall time rides along
        measured = measure(variant, world, args.steps, args.warmup)
        wall.setdefault(variant, []).append(measured["wall_us"])
        return measured["cpu_us"]

    def progress(r: int, figures: dict[str, float]) -> None:
        print(f"procs {world} round {r}: CPU µs/step {json.dumps(figures)}", flush=True)

    cpu = interleaved({v: partial(cpu_us, v) for v in args.variants}, args.rounds, on_round=progress)
    return {"cpu_us": cpu, "wall_us": wall}


def print_table(results: dict[int, dict[str, dict[str, list[float]]]], clock: str) -> None:
    """µs per step and, per round, steps/s against the first variant (bare), as medians with ranges."""
    print(f"\n{clock[:-3]} time of rank 0")
    print("| procs | variant | µs/step, median (range) | steps/s vs bare, median (range) |")
    print("|---|---|---:|---:|")
    for world, clocks_ in results.items():
        us = summarize(clocks_[clock])
        per_s = summarize({v: [1 / x for x in samples] for v, samples in clocks_[clock].items()})
        for variant, row in us.items():
            r = per_s[variant]
            us_cell = f"{row['median']:.0f} ({row['min']:.0f}–{row['max']:.0f})"
            ratio = f"{r['round_ratio_median']:.2f}× ({r['round_ratio_min']:.2f}–{r['round_ratio_max']:.2f})"
            print(f"| {world} | {variant} | {us_cell} | {ratio} |")


def main() -> None:
    p = parser(__doc__, rounds=5)
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    lightning_variants = [v for v in VARIANTS if v != "raw"]
    p.add_argument("--profile", choices=lightning_variants, help="cProfile one 1-process run's timed steps")
    p.add_argument(
        "--hook-costs", action="store_true", help="each default callback's per-step hooks, one 1-process run"
    )
    p.add_argument(
        "--device-ops",
        action="store_true",
        help="ops the data path and the accuracy update run on the device",
    )
    p.add_argument(
        "--step-ops", action="store_true", help="tensor ops dispatched per training step, one run per variant"
    )
    p.add_argument(
        "--without",
        nargs="+",
        default=[],
        choices=list(CALLBACKS),
        metavar="KEY",
        help="also run `callbacks` without each of these default callbacks (what each one costs a step)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.world, args.steps, args.warmup, profile=False)
    if args.profile:
        return child(args.profile, 1, args.steps, args.warmup, profile=True)
    if args.device_ops:
        torch.set_num_threads(1)
        return print_device_ops()
    if args.step_ops:
        skip_futile_nvml_checks()
        torch.set_num_threads(1)
        return print_step_ops([v for v in args.variants if v != "raw"], args.steps, args.warmup)
    if args.hook_costs:
        skip_futile_nvml_checks()
        torch.set_num_threads(1)
        return print_hook_costs(args.steps, args.warmup)

    # bare first (the baseline of every ratio), then the others as given, then the left-out callbacks.
    args.variants = ["bare", *(v for v in args.variants if v != "bare")]
    args.variants += [f"callbacks_without_{key}" for key in args.without]
    results = {world: rounds(args, world) for world in args.procs}
    for clock in ("wall_us", "cpu_us"):
        print_table(results, clock)
    if args.out is not None:
        samples = {str(world): clocks_ for world, clocks_ in results.items()}
        write_results(args.out, {"unit": "µs per step", "samples": samples, "steps": args.steps})


if __name__ == "__main__":
    main()
