"""Where the time goes in the two GPU paths that missed their goals (docs/gpu.md): the GPU-decode batch and
the LeNet-CIFAR step. One call each, made to fit a short lease on a GPU machine; on a CPU they run the same
code.

    python benchmarks/profile_gpu.py decode --dir /tmp/gpu/jpegs --json decode.json   # the suite's JPEGs
    python benchmarks/profile_gpu.py lenet --json lenet_profile.json --table lenet_ops.txt
    python benchmarks/profile_gpu.py decode --device cpu --images 64 --batch-size 8 --batches 2   # a laptop

decode: ``--data.decode=gpu``'s stages for one batch at a time, each timed alone with the device
synchronised around it, so that their sum is an upper bound of the real, overlapped step's share:
  load      the DataLoader's wait for the next batch of bytes (its workers read files and headers and draw
            boxes), with the main process doing nothing else: the workers' own rate;
  nvjpeg    the decoder's call (codec.py ``decode_jpegs``: TorchCodec's) on the batch's bytes, alone;
  decode    ``EncodedBatch.decode``: that same decode, then each image's crop and resize, and the flips;
  crop      decode − nvjpeg: the per-image crop and resize (into one float batch on a GPU, rounded once);
  crop_each each image cropped, resized and rounded alone (jpeg.py ``crop_resize``), from nvjpeg's images:
            how the decode cropped before, timed beside it.
Each as milliseconds per batch (median over ``--batches`` after one untimed) and images/s.

lenet: ``torch.profiler`` over ``--steps`` training steps of LeNet-CIFAR as bench_lenet_gpu.py trains it
(``--side lit_ddp``: bare Trainer, the recipe's settings, in-memory data; ``--side floor``: the same math in a
plain loop, no framework): wall ms per step, device kernels launched per step, the device's busy time per
step (the union of the kernels' spans) and its share of the wall time, and the operators by host (self CPU)
time, as a table (``--table``). A busy share far below 1 says the step waits on the host's launches, which
CUDA graphs remove; near 1, the kernels themselves are the limit and only fewer or faster kernels help.
"""

import argparse
import functools
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from bench_jpeg_gpu import generate  # benchmarks/ is on sys.path when this script runs
from bench_lenet_gpu import (
    InMemoryCIFAR,
    cifar_shaped,
    floor_optimizer,
    floor_step,
    precision_context,
    read_recipe,
)
from harness import settings, synchronize, training_only, write_results
from torch.profiler import ProfilerActivity, profile

from lit_ddp.data import ImageNetDataModule
from lit_ddp.data.codec import decode_jpegs
from lit_ddp.data.jpeg import crop_resize
from lit_ddp.models import LeNet, LeNetCIFAR


def timed(fn, device: torch.device) -> tuple[object, float]:
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


# ---- decode --------------------------------------------------------------------------------------------


def crop_each_alone(encoded, images: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The training batch's crops as the decode made them before it resized into one float batch: each
    image cropped, resized, rounded and cast alone (``crop_resize``), then the flips."""
    out = torch.zeros((len(encoded), 3, encoded.size, encoded.size), dtype=torch.uint8, device=device)
    out = out.contiguous(memory_format=torch.channels_last)
    jpegs = [(i, slot) for i, slot in enumerate(encoded.slots) if slot.kind == "jpeg"]
    for (i, slot), image in zip(jpegs, images, strict=True):
        out[i] = crop_resize(image, slot.box, encoded.size)
    flips = [i for i, slot in jpegs if slot.flip]
    if flips:
        index = torch.tensor(flips, device=device)
        out[index] = out[index].flip(-1)
    return out


def profile_decode(args: argparse.Namespace, device: torch.device) -> dict:
    root = args.dir or Path(tempfile.mkdtemp(prefix="profile_decode_"))
    if not (root / "train").is_dir():
        generate(root, args.images, args.width, args.height)
    dm = ImageNetDataModule(
        data_dir=str(root), batch_size=args.batch_size, num_workers=args.num_workers, decode="gpu"
    )
    dm.prepare_data()
    dm.setup("fit")
    stages: dict[str, list[float]] = {"load": [], "nvjpeg": [], "decode": [], "crop_each": []}
    loader = iter(dm.train_dataloader())
    for k in range(args.batches + 1):  # the first batch starts the workers: untimed
        batch, load = timed(lambda: next(loader), device)
        encoded = batch.images
        jpegs = [encoded.data[slot.start : slot.end] for slot in encoded.slots if slot.kind == "jpeg"]
        nvjpeg_call = functools.partial(decode_jpegs, jpegs, device)
        images, nvjpeg = timed(nvjpeg_call, device)
        _, decode = timed(functools.partial(encoded.decode, device), device)
        _, crop_each = timed(functools.partial(crop_each_alone, encoded, images, device), device)
        if k:
            for name, seconds in (
                ("load", load),
                ("nvjpeg", nvjpeg),
                ("decode", decode),
                ("crop_each", crop_each),
            ):
                stages[name].append(seconds)
    ms = {name: 1e3 * statistics.median(values) for name, values in stages.items()}
    ms["crop"] = ms["decode"] - ms["nvjpeg"]
    return {
        "batch_size": args.batch_size,
        "num_workers": dm.workers_per_device(),
        "ms_per_batch": ms,
        "img_s": {name: 1e3 * args.batch_size / value for name, value in ms.items() if value > 0},
    }


# ---- lenet ---------------------------------------------------------------------------------------------


class StepProfiler(L.Callback):
    """torch.profiler around training steps [warmup, warmup + steps), the device synchronised at both ends: a
    Lightning callback, or ``begin``/``end`` called by a plain loop."""

    def __init__(self, warmup: int, steps: int, device: torch.device) -> None:
        self.first, self.last, self.device = warmup, warmup + steps - 1, device
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.profiler = profile(activities=activities)
        self.seconds = 0.0

    def begin(self, step: int) -> None:
        if step == self.first:
            synchronize(self.device)
            self.profiler.start()
            self.start = time.perf_counter()

    def end(self, step: int) -> None:
        if step == self.last:
            synchronize(self.device)
            self.seconds = time.perf_counter() - self.start
            self.profiler.stop()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self.begin(batch_idx)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.end(batch_idx)


def device_work(events: list) -> list:
    """The events of work on the device: kernels, copies and memsets. Kineto also lays each
    ``record_function`` range (Lightning's and the optimizer's step) on the device's timeline, spanning the
    kernels launched inside it, as a user annotation: counted, one would cover the step's idle gaps."""
    return [e for e in events if e.device_type.name == "CUDA" and not e.is_user_annotation]


def busy_us(kernels: list) -> float:
    """The device's busy time: the union of the kernels' [start, end) spans, in µs (kernels on several
    streams may overlap; counted once)."""
    busy, reach = 0.0, float("-inf")
    for start, end in sorted((k.time_range.start, k.time_range.end) for k in kernels):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy


def lit_ddp_steps(args: argparse.Namespace, device: torch.device, recipe: dict, probe: StepProfiler) -> None:
    data = cifar_shaped(args.batch_size * (args.warmup + args.steps))
    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(
            accelerator=device.type,
            devices=1,
            precision=recipe["precision"],
            max_steps=args.warmup + args.steps,
            logger=False,
            callbacks=[probe],
            **training_only(tmp),
        )
        dm = InMemoryCIFAR(*data, batch_size=args.batch_size, num_workers=recipe["num_workers"])
        trainer.fit(LeNetCIFAR(**recipe["model"]), datamodule=dm)


def floor_steps(args: argparse.Namespace, device: torch.device, recipe: dict, probe: StepProfiler) -> None:
    """bench_lenet_gpu.py's ``raw_epoch`` step at the recipe's precision, with the probe's hooks around it."""
    images, labels = (t.to(device) for t in cifar_shaped(args.batch_size * (args.warmup + args.steps)))
    net = LeNet().to(device, memory_format=torch.channels_last)
    optimizer = floor_optimizer(net.parameters(), recipe, device)
    autocast = precision_context(recipe["precision"], device)
    for step, index in enumerate(torch.randperm(len(labels), device=device).split(args.batch_size)):
        probe.begin(step)
        floor_step(net, optimizer, autocast, images, labels, index)
        probe.end(step)


LENET_SIDES = {"lit_ddp": lit_ddp_steps, "floor": floor_steps}


def profile_lenet(args: argparse.Namespace, device: torch.device) -> tuple[dict, str]:
    recipe = read_recipe()
    probe = StepProfiler(args.warmup, args.steps, device)
    torch.manual_seed(0)
    LENET_SIDES[args.side](args, device, recipe, probe)
    events = probe.profiler.events()
    kernels = device_work(events)
    ops = probe.profiler.key_averages()
    table = ops.table(sort_by="self_cpu_time_total", row_limit=40)
    ms_per_step = 1e3 * probe.seconds / args.steps
    device_ms = busy_us(kernels) / 1e3 / args.steps
    return {
        "side": args.side,
        "steps": args.steps,
        "ms_per_step": ms_per_step,
        "kernels_per_step": len(kernels) / args.steps,
        "device_busy_ms_per_step": device_ms,
        "device_busy_share": device_ms / ms_per_step,
        "host_self_ms_per_step": sum(e.self_cpu_time_total for e in ops) / 1e3 / args.steps,
    }, table


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("what", choices=["decode", "lenet"])
    cli.add_argument("--device", default="cuda")
    cli.add_argument("--batch-size", type=int, default=None, help="default: 256 (decode), 128 (lenet)")
    cli.add_argument("--num-workers", type=int, default=None, help="decode: default the data module's auto")
    cli.add_argument("--dir", type=Path, default=None, help="decode: a JPEG tree (made if absent)")
    cli.add_argument("--images", type=int, default=1024, help="decode: JPEGs to generate")
    cli.add_argument("--width", type=int, default=500)
    cli.add_argument("--height", type=int, default=375)
    cli.add_argument("--batches", type=int, default=10, help="decode: timed batches")
    cli.add_argument("--warmup", type=int, default=50, help="lenet: untimed steps")
    cli.add_argument("--steps", type=int, default=50, help="lenet: profiled steps")
    cli.add_argument("--side", choices=sorted(LENET_SIDES), default="lit_ddp", help="lenet: which step")
    cli.add_argument("--json", type=Path, default=None)
    cli.add_argument("--table", type=Path, default=None, help="lenet: the operator table")
    args = cli.parse_args()
    args.batch_size = args.batch_size or (256 if args.what == "decode" else 128)
    device = torch.device(args.device)
    if args.what == "decode":
        result, table = profile_decode(args, device), None
        for name, value in result["ms_per_batch"].items():
            print(f"  {name:8s} {value:9.1f} ms a batch of {args.batch_size}")
    else:
        result, table = profile_lenet(args, device)
        print(
            f"  {args.side}: {result['ms_per_step']:.2f} ms a step, {result['kernels_per_step']:.1f} device"
            f" kernels a step, the device busy {result['device_busy_ms_per_step']:.2f} ms a step"
            f" ({result['device_busy_share']:.0%}), {result['host_self_ms_per_step']:.2f} ms of operator host"
            " time a step"
        )
        if args.table:
            args.table.write_text(table)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if args.json:
        write_results(args.json, {"device": device_name, **result, "settings": settings(args)})


if __name__ == "__main__":
    main()
