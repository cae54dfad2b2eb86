"""The val row of bench_input_pipeline.py on two checkouts of lit_ddp, alternating in one process.

    git archive <before> | tar -x -C /tmp/before      # or git worktree add /tmp/before <before>
    python benchmarks/ab_input_pipeline.py /tmp/before /tmp/after --dir /tmp/jpegs --images 200 --rounds 40

Each checkout's ``lit_ddp/data/jpeg.py`` is loaded from its file and feeds the same ``ImageFileDataset``
(what the val worker runs: decode + Resize + CenterCrop into a uint8 batch), so a change to the decoding
is all that differs. The two take turns in every round, the order alternating; the median of the per-round
time ratios is the figure to quote: on a shared 2-core machine single passes move by ±20 %, and the
bench's best-of rows compare runs minutes apart.
"""

import argparse
import functools
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_input_pipeline import make_images  # noqa: E402

from lit_ddp.data.image_folder import ImageFileDataset  # noqa: E402


def load_jpeg_module(tree: str, name: str):
    spec = importlib.util.spec_from_file_location(name, Path(tree) / "lit_ddp" / "data" / "jpeg.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--width", type=int, default=500)
    parser.add_argument("--height", type=int, default=375)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--val-resize", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--dir", type=Path, default=None, help="keep the generated images here (and reuse)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # what a DataLoader worker gets
    root = args.dir or Path(tempfile.mkdtemp(prefix="ab_jpeg_"))
    if not (root / "train").is_dir():
        make_images(root, args.images, args.width, args.height)
    files = sorted(str(p) for p in (root / "train").rglob("*.JPEG"))[: args.images]
    n = len(files)
    datasets = {}
    for side in ("before", "after"):
        jpeg = load_jpeg_module(getattr(args, side), f"jpeg_{side}")
        load = functools.partial(jpeg.load_eval_crop, size=args.size, resize=args.val_resize)
        datasets[side] = ImageFileDataset([(f, 0) for f in files], load, args.size)

    def run(dataset: ImageFileDataset) -> float:
        start = time.perf_counter()
        for i in range(0, n, args.batch_size):
            _, _, bad = dataset.__getitems__(range(i, min(i + args.batch_size, n)))
            assert not bad
        return time.perf_counter() - start

    best, ratios = {"before": float("inf"), "after": float("inf")}, []
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        times = {side: run(datasets[side]) for side in order}
        for side, t in times.items():
            best[side] = min(best[side], t)
        ratios.append(times["after"] / times["before"])
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    print(
        f"{n} JPEGs of {args.width}×{args.height}, Resize({args.val_resize}) + CenterCrop({args.size}),"
        f" one thread, {args.rounds} alternating rounds"
    )
    print(f"  best: before {n / best['before']:.0f} images/s, after {n / best['after']:.0f} images/s")
    print(
        f"  after/before time per round: median {statistics.median(ratios):.3f} (quartiles {q1:.3f}-{q3:.3f})"
    )


if __name__ == "__main__":
    main()
