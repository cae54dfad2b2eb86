"""The val row of bench_input_pipeline.py on two checkouts of lit_ddp, alternating in one process.

    git archive <before> | tar -x -C /tmp/before      # or git worktree add /tmp/before <before>
    python benchmarks/ab_input_pipeline.py /tmp/before /tmp/after --dir /tmp/jpegs --images 200 --rounds 40

Each checkout's ``lit_ddp/data/jpeg.py`` is loaded from its file and feeds the same ``ImageFileDataset``
(what the val worker runs: decode + Resize + CenterCrop into a uint8 batch), so a change to the decoding
is all that differs. The two take turns in every round, the order alternating (benchmarks/harness.py);
the median of the per-round ratios is the figure to quote, since the bench's best-of rows compare runs
minutes apart.
"""

import functools
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_input_pipeline import add_image_arguments, image_dir  # noqa: E402
from harness import interleaved, parser, report, seconds_per_call  # noqa: E402

from lit_ddp.data.image_folder import ImageFileDataset  # noqa: E402


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


def main() -> None:
    p = parser(__doc__, rounds=40)
    p.add_argument("before")
    p.add_argument("after")
    add_image_arguments(p, images=200)
    args = p.parse_args()
    torch.set_num_threads(1)  # what a DataLoader worker gets
    root = image_dir(args)
    files = sorted(str(p) for p in (root / "train").rglob("*.JPEG"))[: args.images]
    n = len(files)
    variants = {}
    for side in ("before", "after"):
        jpeg = load_jpeg_module(getattr(args, side), f"jpeg_{side}")
        load = functools.partial(jpeg.load_eval_crop, size=args.size, resize=args.val_resize)
        dataset = ImageFileDataset([(f, 0) for f in files], load, args.size)
        variants[side] = functools.partial(images_per_s, dataset, n, args.batch_size)
    print(
        f"{n} JPEGs of {args.width}×{args.height}, Resize({args.val_resize}) + CenterCrop({args.size}),"
        " one thread"
    )
    report(
        interleaved(variants, args.rounds),
        args.out,
        " images/s",
        images=n,
        width=args.width,
        height=args.height,
    )


if __name__ == "__main__":
    main()
