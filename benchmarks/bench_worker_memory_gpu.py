"""Memory per DataLoader worker of the ImageNet recipe's JPEG loader: what each automatic worker costs, the
figure behind lit_ddp.data.workers.WORKER_BYTES (docs/gpu.md). Linux only (it reads /proc).

    python benchmarks/bench_worker_memory_gpu.py                       # 2 workers, batch 256, 224 px
    python benchmarks/bench_worker_memory_gpu.py --workers 4 --json mem.json

ImageNetDataModule's training loader (the recipe's batch, crop size and prefetch) iterates ``--batches``
batches over generated 500×375 JPEGs (bench_input_pipeline.make_images); every 0.2 s each worker's
/proc/PID/smaps_rollup is read. Per worker, the peak over the run of:

- USS (Private_Clean + Private_Dirty): memory only that worker holds, what one more worker adds;
- PSS: its fair share of pages shared with the main process and the other workers;
- RSS: everything it maps, shared pages counted in full (an upper bound, not a cost).

Its batches waiting in shared memory (``prefetch_factor`` per worker, in /dev/shm, not in its USS) are
counted apart: ``prefetch_factor × batch bytes``. The cost of a worker is USS + its prefetched batches.
"""

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from bench_input_pipeline import make_images  # benchmarks/ is on sys.path when this script runs
from harness import settings, write_results

from lit_ddp.data import ImageNetDataModule

FIELDS = {"Rss": "rss", "Pss": "pss", "Private_Clean": "uss", "Private_Dirty": "uss"}


def memory_of(pid: int) -> dict[str, int]:
    """Bytes of RSS, PSS and USS of process ``pid`` (its /proc/PID/smaps_rollup)."""
    out = {"rss": 0, "pss": 0, "uss": 0}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":")
        if key in FIELDS:
            out[FIELDS[key]] += int(value.split()[0]) * 1024
    return out


def children_of(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--images", type=int, default=768)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_worker_memory_") as tmp:
        make_images(Path(tmp), args.images, 500, 375)
        dm = ImageNetDataModule(
            data_dir=tmp, image_size=args.image_size, batch_size=args.batch_size, num_workers=args.workers
        )
        dm.setup("fit")
        loader = dm.train_dataloader()
        peaks: dict[int, dict[str, int]] = {}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                for pid in children_of(os.getpid()):
                    try:
                        now = memory_of(pid)
                    except (FileNotFoundError, ProcessLookupError):
                        continue
                    peak = peaks.setdefault(pid, now)
                    for k, v in now.items():
                        peak[k] = max(peak[k], v)
                time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        batches, start = 0, time.perf_counter()
        while batches < args.batches:  # epoch after epoch (the loader keeps its workers)
            for batch in loader:
                if batches == 0:
                    sampler.start()  # the workers exist once the first batch arrives
                batches += 1
                batch_bytes = batch[0].numel() * batch[0].element_size()
                if batches == args.batches:
                    break
        seconds = time.perf_counter() - start
        done.set()
        sampler.join()
    workers = sorted(peaks.values(), key=lambda m: m["uss"])
    mb = 1 << 20
    prefetch = 2 * batch_bytes  # the DataLoader's prefetch_factor (2) batches of uint8 images per worker
    uss = max(w["uss"] for w in workers)
    print(
        f"{len(workers)} workers, batch {args.batch_size} of {args.image_size} px,"
        f" {batches} batches in {seconds:.1f} s"
    )
    for w in workers:
        print(
            f"  worker  USS {w['uss'] / mb:7.1f} MiB  PSS {w['pss'] / mb:7.1f} MiB"
            f"  RSS {w['rss'] / mb:7.1f} MiB"
        )
    print(
        f"  prefetched batches per worker {prefetch / mb:.1f} MiB;"
        f" cost per worker {(uss + prefetch) / mb:.1f} MiB"
    )
    if args.json is not None:
        figures = {
            "worker_uss_mib": [w["uss"] / mb for w in workers],
            "worker_pss_mib": [w["pss"] / mb for w in workers],
            "worker_rss_mib": [w["rss"] / mb for w in workers],
            "prefetch_mib_per_worker": prefetch / mb,
            "worker_cost_mib": (uss + prefetch) / mb,
        }
        write_results(args.json, {**figures, "settings": settings(args)})


if __name__ == "__main__":
    main()
