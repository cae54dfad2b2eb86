"""The ImageFolder file list at ImageNet's size: set-up time per rank, index memory and worker memory over
an epoch, for torchvision's ``ImageFolder``, lit_ddp's earlier listing (903dee7's ``list_images``,
inlined below) and lit_ddp's cached numpy index (cold: no cache yet; warm: the tree unchanged since).

    python benchmarks/bench_imagefolder_scale.py --sizes 10000 100000 1281167 --repeats 3
    python benchmarks/bench_imagefolder_scale.py --sizes 1281167 --delete   # and remove the tree after

The tree: 1,000 class folders, ``size / 1000`` training files and ``50 / 1281`` as many validation files
per class (ImageNet: 1,281 and 50), every file a hard link to one of 64 real 500×375 JPEGs (ext4 allows
65,000 links per file), under ``--root`` (default /tmp/lit_ddp_scale; 1.28 M files are 1.3 M inodes).

* **set-up per rank**: a fresh process per measurement forks ``--procs`` ranks; each times what it does
  from start to "splits ready" (train + val): torchvision builds ``ImageFolder`` twice, the listing before
  lists both, lit_ddp builds the data module, local rank 0 runs ``prepare_data``, all meet at a barrier (as
  Lightning's ``pre_setup`` barrier), then ``setup("fit")``. Variants take turns, ``--repeats`` times;
  reported: median and range over repeats of the slowest rank's time, and how many ranks listed the tree.
* **listing alone**: torchvision's ``make_dataset`` (what ``ImageFolder`` lists with) against lit_ddp's
  ``scan_split``, both splits, taking turns in one process, ``--repeats`` × 3 times.
* **index memory**: private memory (USS, /proc/PID/smaps_rollup) of a one-rank process before and after
  set-up.
* **worker USS**: the training split through a ``DataLoader`` with ``--workers`` persistent workers,
  shuffled, batch 256, decoding stubbed (a constant 8×8 image): each worker's USS after its first batch and
  after each of ``--epochs`` epochs.
"""

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from harness import interleaved, seconds_per_call  # noqa: E402

IMAGE_SIZE = (500, 375)
REAL_JPEGS = 64


def uss_mib(pid: int | str = "self") -> float:
    """Private memory (USS) of a process: pages no other process maps."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":"):
                fields[parts[0][:-1]] = int(parts[1])
    return (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024


# ---- the tree -----------------------------------------------------------------------------------------


def make_jpegs(folder: Path) -> list[Path]:
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for k in range(REAL_JPEGS):
        path = folder / f"real{k:02d}.JPEG"
        if not path.exists():
            w, h = IMAGE_SIZE
            yy, xx = np.mgrid[0:h, 0:w] / 40.0
            base = np.stack([np.sin(xx + k), np.cos(yy - k), np.sin(xx + yy)], -1) * 80 + 128
            Image.fromarray(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)).save(
                path, quality=90
            )
        paths.append(path)
    return paths


def build_tree(root: Path, size: int, jpegs: list[Path]) -> Path:
    """1,000 classes × size/1000 training files (+ ImageNet's share of validation files), hard links."""
    tree = root / f"n{size}"
    done = tree / ".complete"
    if done.exists():
        return tree
    if tree.exists():
        shutil.rmtree(tree)
    per_class = size // 1000
    per_split = {"train": per_class, "val": max(1, round(per_class * 50 / 1281))}
    start, k = time.perf_counter(), 0
    for split, n in per_split.items():
        for c in range(1000):
            folder = tree / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            for i in range(n):
                os.link(jpegs[k % REAL_JPEGS], folder / f"n{c:08d}_{i}.JPEG")
                k += 1
    done.touch()
    print(f"built {tree}: {k:,} files in {time.perf_counter() - start:.0f} s", flush=True)
    return tree


# ---- the variants --------------------------------------------------------------------------------------


def list_images_before(root: Path, class_to_idx: dict[str, int]) -> list[tuple[str, int]]:
    """lit_ddp's list_images at 903dee7, verbatim but for the names."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    def is_junk(name: str) -> bool:
        return name.startswith(".") or name == "__MACOSX"

    def find_classes(root: Path) -> list[str]:
        return sorted(e.name for e in os.scandir(root) if e.is_dir() and not is_junk(e.name))

    samples = []
    for name in find_classes(root):
        folder = root / name
        files = sorted(
            e.name
            for e in os.scandir(folder)
            if e.name.lower().endswith(IMG_EXTENSIONS) and not is_junk(e.name) and e.is_file()
        )
        samples += [(str(folder / f), class_to_idx[name]) for f in files]
    return samples


def set_up(variant: str, tree: Path, cache: Path, local_rank: int, barrier) -> tuple[object, bool]:
    """Both splits ready, as ``variant`` does it; returns the training split and whether this rank listed."""
    if variant == "torchvision":
        from torchvision.datasets import ImageFolder

        train = ImageFolder(str(tree / "train"))
        ImageFolder(str(tree / "val"))
        return train, True
    if variant == "before":
        classes = sorted(e.name for e in os.scandir(tree / "train") if e.is_dir())
        class_to_idx = {c: i for i, c in enumerate(classes)}
        train = list_images_before(tree / "train", class_to_idx)
        list_images_before(tree / "val", class_to_idx)
        return train, True
    from lit_ddp.data import ImageNetDataModule

    dm = ImageNetDataModule(data_dir=str(tree), num_workers=0, index_cache=str(cache))
    if local_rank == 0:
        dm.prepare_data()
    barrier.wait()
    dm.setup("fit")
    return dm.train_set, bool(dm.scans)


def rank_main(variant, tree, cache, rank, barrier, queue) -> None:
    barrier.wait()  # every rank starts together, as after a launch
    before = uss_mib()
    start = time.perf_counter()
    train, listed = set_up(variant, tree, cache, rank, barrier)
    seconds = time.perf_counter() - start
    queue.put({"rank": rank, "s": seconds, "listed": listed, "uss_mib": uss_mib() - before, "n": len(train)})


def child_setup(args) -> None:
    """One measurement of set-up: ``--procs`` forked ranks."""
    from lit_ddp.data import ImageNetDataModule  # noqa: F401  (imported before the fork, as a launch would)

    if args.variant == "lit_ddp cold":
        shutil.rmtree(args.cache, ignore_errors=True)
    variant = "lit_ddp" if args.variant.startswith("lit_ddp") else args.variant
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(args.procs), ctx.Queue()
    procs = [
        ctx.Process(target=rank_main, args=(variant, args.tree, args.cache, r, barrier, queue))
        for r in range(args.procs)
    ]
    for p in procs:
        p.start()
    results = sorted((queue.get() for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    print(json.dumps(results))


def child_listing(args) -> None:
    """Listing alone, torchvision's and lit_ddp's, taking turns in one process."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    from lit_ddp.data.folder_index import scan_split

    classes = sorted(e.name for e in os.scandir(args.tree / "train") if e.is_dir())
    class_to_idx = {c: i for i, c in enumerate(classes)}
    splits = [str(args.tree / split) for split in ("train", "val")]
    variants = {
        "torchvision": seconds_per_call(
            lambda: [make_dataset(s, class_to_idx, IMG_EXTENSIONS) for s in splits]
        ),
        "lit_ddp": seconds_per_call(lambda: [scan_split(s) for s in splits]),
    }
    print(json.dumps(interleaved(variants, args.rounds)))  # seconds for train + val, per round


class StubLegacyDataset:
    """The dataset before issue 24 (its ``samples`` a list of tuples), with decoding stubbed."""

    def __init__(self, samples) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitems__(self, indices):
        import torch

        paths = [self.samples[i][0] for i in indices]  # what _load read
        y = torch.tensor([self.samples[i][1] for i in indices], dtype=torch.long)
        return torch.zeros(len(paths), 3, 8, 8, dtype=torch.uint8), y


def stub_load(path: str):
    import numpy as np

    return np.zeros((8, 8, 3), np.uint8)


def stub_pil(path: str):
    import torch

    return torch.zeros(3, 8, 8, dtype=torch.uint8)


def record_pid(folder: str):
    def init(worker_id: int) -> None:
        Path(folder, str(worker_id)).write_text(str(os.getpid()))

    return init


def child_epoch(args) -> None:
    """Worker USS over ``--epochs`` epochs of the training split, decoding stubbed."""
    import torch
    from torch.utils.data import DataLoader

    from lit_ddp.data.image_folder import ImageFileDataset

    class Barrier:
        def wait(self) -> None:
            pass

    train, _ = set_up(args.variant, args.tree, args.cache, 0, Barrier())
    if args.variant == "torchvision":
        train.loader = stub_pil
        dataset, collate = train, None
    elif args.variant == "before":
        dataset, collate = StubLegacyDataset(train), lambda b: b
    else:
        dataset, collate = ImageFileDataset(train.samples, stub_load, 8), lambda b: b
    pids = tempfile.mkdtemp()
    loader = DataLoader(
        dataset,
        batch_size=256,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=True,
        collate_fn=collate,
        worker_init_fn=record_pid(pids),
        generator=torch.Generator().manual_seed(0),
    )
    result = {"epochs": []}
    for epoch in range(args.epochs):
        start = time.perf_counter()
        for i, _ in enumerate(loader):
            if epoch == 0 and i == 4 * args.workers:  # every worker has made a few batches
                result["start"] = [uss_mib(Path(pids, str(w)).read_text()) for w in range(args.workers)]
        result["epochs"].append(
            {
                "s": time.perf_counter() - start,
                "uss": [uss_mib(Path(pids, str(w)).read_text()) for w in range(args.workers)],
            }
        )
    shutil.rmtree(pids)
    print(json.dumps(result))


# ---- the driver -------------------------------------------------------------------------------------------


def run_child(kind: str, variant: str, tree: Path, cache: Path, **extra) -> dict | list:
    cmd = [sys.executable, str(HERE), "--child", kind, "--variant", variant, "--tree", str(tree)]
    cmd += ["--cache", str(cache)] + [f"--{k}={v}" for k, v in extra.items()]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_281_167])
    parser.add_argument("--root", type=Path, default=Path("/tmp/lit_ddp_scale"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--delete", action="store_true", help="remove the trees at the end")
    parser.add_argument("--rounds", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=["setup", "epoch", "listing"], help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.procs = args.procs[0]
        return {"setup": child_setup, "epoch": child_epoch, "listing": child_listing}[args.child](args)

    jpegs = make_jpegs(args.root / "jpegs")
    variants = ["torchvision", "before", "lit_ddp cold", "lit_ddp warm"]
    report = {}
    for size in args.sizes:
        tree = build_tree(args.root, size, jpegs)
        cache = args.root / f"cache{size}"
        listing = run_child("listing", "both", tree, cache, rounds=3 * args.repeats)
        report[f"{size} listing"] = {k: spread(v) for k, v in listing.items()}
        print(size, "listing", json.dumps(listing), flush=True)
        for procs in args.procs:
            times = {v: [] for v in variants}
            for r in range(args.repeats):
                for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
                    if v == "lit_ddp warm" and not (cache.exists() and any(cache.iterdir())):
                        run_child("setup", "lit_ddp cold", tree, cache, procs=procs)
                        time.sleep(2.5)  # past SETTLE_NS, so that the listing is trusted by a later run
                    ranks = run_child("setup", v, tree, cache, procs=procs)
                    times[v].append(ranks)
                    print(size, procs, v, json.dumps(ranks), flush=True)
            for v in variants:
                rows = times[v]
                report[f"{size} {procs} {v}"] = {
                    "slowest_rank_s": spread([max(r["s"] for r in ranks) for ranks in rows]),
                    "ranks_listing": sorted({sum(r["listed"] for r in ranks) for ranks in rows}),
                    "uss_growth_mib": spread([max(r["uss_mib"] for r in ranks) for ranks in rows]),
                    "n": rows[0][0]["n"],
                }
        for v in ["torchvision", "before", "lit_ddp warm"]:
            result = run_child("epoch", v, tree, cache, workers=args.workers, epochs=args.epochs)
            report[f"{size} epoch {v}"] = result
            print(size, "epoch", v, json.dumps(result), flush=True)
        shutil.rmtree(cache, ignore_errors=True)
        if args.delete:
            shutil.rmtree(tree)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
