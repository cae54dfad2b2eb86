"""One measurement on two checkouts of lit_ddp, taking turns on the same machine (benchmarks/harness.py).

    git worktree add /tmp/before <commit> && git worktree add /tmp/after <commit>
    python benchmarks/ab_checkouts.py /tmp/before /tmp/after --procs 2 --rounds 6
    python benchmarks/ab_checkouts.py /tmp/before /tmp/after --measure step --steps 500 --warmup 50
    python benchmarks/ab_checkouts.py /tmp/before /tmp/after --measure val_jpeg --dir /tmp/jpegs --rounds 40

``--measure``:

  lenet     column (a) of bench_lenet_throughput.py, images/s of LeNet training through Lightning. Each run
            is a fresh process that imports lit_ddp and the benchmark from its checkout, so a change to the
            code and a change to the benchmark both count.
  step      bench_step_overhead.py's ``lit_ddp`` variant (what ``fit`` trains, a near-empty model: the host's
            work around the step), one process, as steps per second of the process's CPU time. Each run is a
            fresh process that imports lit_ddp and the benchmark from its checkout. ``--variant callbacks``
            times that benchmark's ``callbacks`` variant instead (the default callbacks around a bare step).
  val_jpeg  the val row of bench_input_pipeline.py, images/s of one validation worker. Each checkout's
            ``lit_ddp/data/jpeg.py`` is loaded from its file and feeds this checkout's ``ImageFileDataset``
            (decode + Resize + CenterCrop into a uint8 batch) in this one process, one thread, so a change
            to the decoding is all that differs.

The order alternates every round; the median of the per-round ratios (``round_ratio_median``) is the figure
to quote, since single runs minutes apart move by more than most changes do on a shared machine.
"""

import argparse
import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_input_pipeline import add_image_arguments, image_dir  # noqa: E402
from harness import interleaved, parser, report, seconds_per_call, settings  # noqa: E402

from lit_ddp.data.image_folder import ImageFileDataset  # noqa: E402

SIDES = ("before", "after")
# Run in a fresh process with lit_ddp and the benchmarks imported from the checkout ``tree``.
IN_CHECKOUT = (
    "import sys; sys.path[:0] = [{tree!r}, {tree!r} + '/benchmarks']; import lit_ddp;"
    " assert lit_ddp.__file__.startswith({tree!r}), lit_ddp.__file__; "
)


def last_line_in_checkout(tree: str, code: str) -> str:
    """The last line ``code`` prints, run in a fresh process importing lit_ddp from ``tree``."""
    run = [sys.executable, "-c", IN_CHECKOUT.format(tree=tree) + code]
    out = subprocess.run(run, capture_output=True, text=True, cwd="/tmp")
    if out.returncode:
        sys.exit(f"{tree}: {out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


def lenet_run(tree: str, procs: int, steps: int, warmup: int) -> float:
    """Images/s of column (a), in a fresh process that imports lit_ddp and the benchmark from ``tree``."""
    code = f"import bench_lenet_throughput as b; print(b._lit_ddp({procs}, {steps}, {warmup}))"
    return float(last_line_in_checkout(tree, code))


def lenet(args: argparse.Namespace) -> dict:
    return {
        side: functools.partial(lenet_run, getattr(args, side), args.procs, args.steps, args.warmup)
        for side in SIDES
    }


def step_run(tree: str, variant: str, steps: int, warmup: int) -> float:
    """Steps per CPU second of bench_step_overhead's ``variant`` child, imported from ``tree``."""
    code = f"import bench_step_overhead as b; b.child({variant!r}, 1, {steps}, {warmup}, profile=False)"
    return 1e6 / json.loads(last_line_in_checkout(tree, code))["cpu_us"]


def step(args: argparse.Namespace) -> dict:
    run = functools.partial(step_run, variant=args.variant, steps=args.steps, warmup=args.warmup)
    return {side: functools.partial(run, getattr(args, side)) for side in SIDES}


def load_jpeg_module(tree: str, name: str):
    spec = importlib.util.spec_from_file_location(name, Path(tree) / "lit_ddp" / "data" / "jpeg.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def images_per_s(dataset: ImageFileDataset, n: int, batch_size: int) -> float:
    """One pass over the ``n`` files, batch by batch as a validation worker reads them."""
    pass_time = seconds_per_call(
        lambda: [dataset.__getitems__(range(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]
    )
    return n / pass_time()


def val_jpeg(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)  # what a DataLoader worker gets
    files = sorted(str(p) for p in (image_dir(args) / "train").rglob("*.JPEG"))[: args.images]
    args.images = len(files)
    variants = {}
    for side in SIDES:
        jpeg = load_jpeg_module(getattr(args, side), f"jpeg_{side}")
        load = functools.partial(jpeg.load_eval_crop, size=args.size, resize=args.val_resize)
        dataset = ImageFileDataset([(f, 0) for f in files], load, args.size)
        variants[side] = functools.partial(images_per_s, dataset, len(files), args.batch_size)
    crop = f"Resize({args.val_resize}) + CenterCrop({args.size})"
    print(f"{len(files)} JPEGs of {args.width}×{args.height}, {crop}, one thread")
    return variants


MEASURES = {"lenet": lenet, "step": step, "val_jpeg": val_jpeg}


def main() -> None:
    p = parser(__doc__, rounds=6)
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--measure", choices=list(MEASURES), default="lenet")
    p.add_argument("--procs", type=int, default=2, help="lenet: processes")
    p.add_argument("--steps", type=int, default=300, help="lenet, step: timed steps")
    p.add_argument("--warmup", type=int, default=30, help="lenet, step: untimed steps")
    p.add_argument("--variant", choices=["lit_ddp", "callbacks"], default="lit_ddp", help="step: the variant")
    add_image_arguments(p, images=200)  # val_jpeg
    args = p.parse_args()
    variants = MEASURES[args.measure](args)
    samples = interleaved(variants, args.rounds, on_round=lambda r, f: print(r, f, flush=True))
    report(samples, args.out, " steps/s" if args.measure == "step" else " images/s", **settings(args))


if __name__ == "__main__":
    main()
