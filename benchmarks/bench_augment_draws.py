"""The on-device crop + flip of one training batch: draws from a per-batch generator (the earlier way) vs
per-sample draws from (seed, epoch, index) (``SampleRandom``), interleaved in one process.

Times ``random_crop_flip`` with each source of random numbers on a (B, 3, 32, 32) uint8 CPU batch, the
generator re-seeded per batch as data/base.py did, the per-sample hash keyed as it does now. Alternates the
two every round and reports the median per-batch time of each and the median of the per-round ratios: the
augmentation's own share of a step, which whole-step A/B runs on a busy 2-core machine cannot resolve.

    python benchmarks/bench_augment_draws.py --batch 128 --rounds 30 --reps 50
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, parser, report, seconds_per_call  # noqa: E402

from lit_ddp.data.base import stable_seed  # noqa: E402
from lit_ddp.data.batch_transforms import SampleRandom, random_crop_flip  # noqa: E402


def per_batch_generator(x: torch.Tensor, generator: torch.Generator, epoch: int, batch: int) -> torch.Tensor:
    generator.manual_seed(stable_seed(0, 0, epoch, batch))  # (seed, rank, epoch, batch)
    return random_crop_flip(x, 4, generator=generator)


def per_sample(x: torch.Tensor, index: torch.Tensor, epoch: int, batch: int) -> torch.Tensor:
    return random_crop_flip(x, 4, rand=SampleRandom(index, stable_seed(0, epoch)))


def main() -> None:
    p = parser(__doc__, rounds=30)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--reps", type=int, default=50, help="batches per timing")
    args = p.parse_args()
    x = torch.randint(0, 256, (args.batch, 3, 32, 32), dtype=torch.uint8)
    index = torch.randperm(50000)[: args.batch]
    generator = torch.Generator()
    draws = {
        "per-batch generator": lambda: per_batch_generator(x, generator, 1, 0),
        "per-sample SampleRandom": lambda: per_sample(x, index, 1, 0),
    }
    timed = {name: seconds_per_call(fn, args.reps) for name, fn in draws.items()}
    interleaved(timed, 1)  # warm-up
    samples = interleaved({name: lambda t=t: t() * 1e6 for name, t in timed.items()}, args.rounds)
    print(f"batch {args.batch}, torch threads {torch.get_num_threads()}")
    report(samples, args.out, " µs per batch", batch=args.batch, threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
