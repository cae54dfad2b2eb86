"""Sharded data against files: decode rate per loader process, time to first batch, bytes read per node per
epoch, and the `shard` conversion rate (docs/streaming.md).

    python benchmarks/bench_streaming.py --images 600 --rounds 5 --out results/streaming.json

A synthetic ImageFolder tree of JPEGs (sizes like ImageNet's, smaller) is written to a temporary folder,
sharded with `python -m lit_ddp shard`'s code, then read three ways with the same decode (RandomResizedCrop
+ flip to 224, jpeg.py) in one process, as one DataLoader worker reads:
  shards     lit_ddp's reader (ShardImageDataset) in the (seed, epoch) order, rank 0 of 1 or 2 processes;
  folder     ImageFileDataset over the files, the ImageNetDataModule path, in a random order;
  mosaic     Mosaic's own StreamingDataset over the same shards (its own order), decoded alike: only where
             mosaicml-streaming is installed (lit_ddp does not depend on it).
Variants run interleaved (A, B, C, A, ...) and are reported as medians with min/max.

Bytes read per node per epoch are counted, not timed: the shards that the ranks of one node touch in an
epoch, for lit_ddp's order (every rank draws from every window) and for a node-local partition of the
shards (what a library that gives each node its own shards reads), over 1, 2 and 4 nodes.
"""

import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, parser, report  # noqa: E402


def make_tree(root: Path, images: int, classes: int = 10, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(images):
        label = i % classes
        w, h = int(rng.integers(300, 500)), int(rng.integers(250, 400))
        pixels = rng.integers(0, 255, (h // 8, w // 8, 3), dtype=np.uint8)
        img = Image.fromarray(pixels).resize((w, h), Image.BILINEAR)
        for split in ("train", "val") if i % 10 == 0 else ("train",):
            folder = root / split / f"class{label:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            img.save(folder / f"img{i:05d}.JPEG", quality=90)


def main() -> None:
    cli = parser(__doc__, rounds=5)
    cli.add_argument("--images", type=int, default=600, help="JPEGs in the synthetic tree")
    cli.add_argument("--shard-mb", type=float, default=4.0, help="shard size, as `shard --shard-mb`")
    args = cli.parse_args()

    import functools

    import torch

    from lit_ddp.data.convert import convert
    from lit_ddp.data.image_folder import ImageFileDataset, list_images, seeded_global_rng
    from lit_ddp.data.jpeg import load_train_crop
    from lit_ddp.data.shards import ShardedSamples
    from lit_ddp.data.streaming import ShardImageDataset, ShardOrderSampler

    tmp = Path(tempfile.mkdtemp(prefix="bench_streaming-"))
    make_tree(tmp / "tree", args.images)
    started = time.perf_counter()
    manifest = convert(str(tmp / "tree"), str(tmp / "shards"), shard_mb=args.shard_mb)
    conversion = manifest["splits"]["train"]["samples"] / (time.perf_counter() - started)

    load = functools.partial(load_train_crop, size=224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip_p=0.5)
    samples = ShardedSamples(str(tmp / "shards"), "train")
    shard_set = ShardImageDataset(samples, np.arange(len(samples)), load=load, size=224)
    classes = sorted(p.name for p in (tmp / "tree" / "train").iterdir())
    folder_set = ImageFileDataset(
        list_images(tmp / "tree" / "train", {c: i for i, c in enumerate(classes)}), load, 224
    )
    n, batch = len(samples), 32

    def rate(dataset, order) -> float:
        t = time.perf_counter()
        for k in range(0, len(order), batch):
            dataset.__getitems__(order[k : k + batch])
        return len(order) / (time.perf_counter() - t)

    def shards(world: int) -> float:
        sampler = ShardOrderSampler(shard_set, world, 0, seed=0, window=4, seeded=True)
        return rate(shard_set, list(sampler))

    def folder() -> float:
        return rate(folder_set, torch.randperm(n).tolist())

    def mosaic() -> float:
        from streaming import StreamingDataset

        ds = StreamingDataset(local=str(tmp / "shards" / "train"), shuffle=True, batch_size=batch)
        t = time.perf_counter()
        for i, sample in enumerate(ds):
            with seeded_global_rng(i):
                load(np.frombuffer(bytearray(sample["image"]), np.uint8))
        return ds.num_samples / (time.perf_counter() - t)

    def first_batch(make) -> float:
        t = time.perf_counter()
        make()
        return time.perf_counter() - t

    variants = {
        "folder": folder,
        "shards_1proc": lambda: shards(1),
        "shards_2proc": lambda: shards(2),
    }
    if importlib.util.find_spec("streaming") is not None:
        variants["mosaic"] = mosaic
    throughput = interleaved(variants, args.rounds)
    ttfb = {
        "shards": first_batch(
            lambda: ShardImageDataset(
                ShardedSamples(str(tmp / "shards"), "train"), np.arange(n), load=load, size=224
            ).__getitems__(list(range(min(batch, n))))
        ),
        "folder": first_batch(lambda: folder_set.__getitems__(list(range(min(batch, n))))),
    }

    sizes = [size for _, size, _ in samples.shards]
    starts = samples.starts
    bytes_per_node = {}
    for nodes in (1, 2, 4):
        ranks = nodes * 2  # 2 processes per node
        order = ShardOrderSampler(shard_set, ranks, 0, seed=0, window=4, seeded=False).global_order(0)
        touched = {int(np.searchsorted(starts, i, "right") - 1) for i in order[0::ranks] + order[1::ranks]}
        ours = sum(sizes[s] for s in touched)
        local = sum(sizes[s] for s in range(len(sizes)) if s % nodes == 0)
        bytes_per_node[nodes] = {"lit_ddp_order": ours, "node_local_partition": local, "dataset": sum(sizes)}

    extra = {
        "images": n,
        "shards": len(sizes),
        "time_to_first_batch_s": ttfb,
        "bytes_read_node0_per_epoch": bytes_per_node,
        "shard_conversion_img_per_s": conversion,
    }
    report(throughput, args.out, unit=" img/s per process", **extra)
    print({k: extra[k] for k in ("time_to_first_batch_s", "shard_conversion_img_per_s")})
    print(bytes_per_node)


if __name__ == "__main__":
    main()
