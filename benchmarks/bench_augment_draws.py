"""The on-device crop + flip of one training batch: draws from a per-batch generator (before issue 22) vs
per-sample draws from (seed, epoch, index) (``SampleRandom``), interleaved in one process.

Times ``random_crop_flip`` with each source of random numbers on a (B, 3, 32, 32) uint8 CPU batch, the
generator re-seeded per batch as data/base.py did, the per-sample hash keyed as it does now. Alternates the
two every round and reports the median per-batch time of each and the median of the per-round ratios: the
augmentation's own share of a step, which whole-step A/B runs on a busy 2-core machine cannot resolve.

    python benchmarks/bench_augment_draws.py --batch 128 --rounds 30 --reps 50
"""

import argparse
import statistics
import time

import torch

from lit_ddp.data.base import _stable_seed
from lit_ddp.data.batch_transforms import SampleRandom, random_crop_flip


def per_batch_generator(x: torch.Tensor, generator: torch.Generator, epoch: int, batch: int) -> torch.Tensor:
    generator.manual_seed(_stable_seed(0, 0, epoch, batch))  # (seed, rank, epoch, batch)
    return random_crop_flip(x, 4, generator=generator)


def per_sample(x: torch.Tensor, index: torch.Tensor, epoch: int, batch: int) -> torch.Tensor:
    return random_crop_flip(x, 4, rand=SampleRandom(index, _stable_seed(0, epoch)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--reps", type=int, default=50, help="batches per timing")
    args = parser.parse_args()
    x = torch.randint(0, 256, (args.batch, 3, 32, 32), dtype=torch.uint8)
    index = torch.randperm(50000)[: args.batch]
    generator = torch.Generator()
    variants = {
        "per-batch generator": lambda i: per_batch_generator(x, generator, 1, i),
        "per-sample SampleRandom": lambda i: per_sample(x, index, 1, i),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():  # warm-up
        for i in range(args.reps):
            fn(i)
    for r in range(args.rounds):
        for name in list(variants)[:: 1 if r % 2 == 0 else -1]:
            t0 = time.perf_counter()
            for i in range(args.reps):
                variants[name](i)
            times[name].append((time.perf_counter() - t0) / args.reps * 1e6)
    names = list(variants)
    ratios = [b / a for a, b in zip(times[names[0]], times[names[1]], strict=True)]
    for name in names:
        t = times[name]
        print(f"{name}: median {statistics.median(t):.0f} µs per batch (min {min(t):.0f}, max {max(t):.0f})")
    quartiles = statistics.quantiles(ratios, n=4)
    print(
        f"per-sample / per-batch per round: median {statistics.median(ratios):.3f}"
        f" (quartiles {quartiles[0]:.3f}–{quartiles[2]:.3f}), batch {args.batch}, torch threads"
        f" {torch.get_num_threads()}"
    )


if __name__ == "__main__":
    main()
