"""What MixUp/CutMix add to a LeNet training step on the CPU: the step with mixing off and on, interleaved.

One step = the data module's on-device batch work (crop + flip, normalisation, and with mixing on the draw
and the mix of MixUp or CutMix, one per batch) + LeNetCIFAR's forward, soft- or hard-target cross-entropy
and metric update (its ``_shared_step``), backward and optimizer step, on a batch of 64 Shapes images.
Both variants train one model instance (two instances differ by as much as mixing costs) and take turns,
``--rounds`` times, each round timing ``--steps`` steps after a warm-up;
reported: the median step time of each and the median and spread of the per-round ratio on/off. Then the
mixing alone (``draw_mix`` + ``mix_batch`` on a normalised batch, half MixUp, half CutMix), which a noisy
machine resolves far better than the difference of two whole steps.

    python benchmarks/bench_mixing_overhead.py --rounds 15 --steps 200 --threads 1
    python benchmarks/bench_mixing_overhead.py --rounds 15 --steps 200 --threads 1 --control   # A/A
"""

import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, parser, report, seconds_per_call  # noqa: E402

from lit_ddp.data import ShapesDataModule  # noqa: E402
from lit_ddp.data.batch import Batch  # noqa: E402
from lit_ddp.data.batch_transforms import draw_mix, mix_batch, normalize  # noqa: E402
from lit_ddp.data.shapes import draw_shapes  # noqa: E402
from lit_ddp.models import LeNetCIFAR  # noqa: E402
from lit_ddp.models.optim import build_optimizer  # noqa: E402

BATCH = 64
VARIANTS = (("mixing off", False), ("mixing on", True))  # with --control: off in both


def make_steps(control: bool = False) -> dict[bool, object]:
    """The step with mixing off and on, both training one model with one optimizer: two instances, even of
    the same class, time apart by a few percent (their memory layout), as much as mixing costs. With
    ``control`` both variants mix nothing: the ratio that leaves is the harness's own (an A/A check)."""
    model = LeNetCIFAR()
    optimizer, _ = build_optimizer(model.net, model.optim, BATCH, 10**6, 10**6)
    x, y = draw_shapes(8 * BATCH, seed=0)
    batches = [Batch(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(y), BATCH)]
    count = [0]

    def make(mix: bool):
        alphas = (0.2, 1.0) if mix and not control else (0.0, 0.0)
        dm = ShapesDataModule(batch_size=BATCH, mixup_alpha=alphas[0], cutmix_alpha=alphas[1])
        dm.trainer = SimpleNamespace(training=True, predicting=False, current_epoch=0, global_rank=0)

        def step() -> None:
            batch = batches[count[0] % len(batches)]
            count[0] += 1
            loss, _ = model._shared_step(dm.on_after_batch_transfer(batch, 0), "train")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        return step

    return {False: make(False), True: make(True)}


def time_mixing_alone(repeats: int) -> float:
    """Median seconds of one batch's draw + mix (MixUp/CutMix chosen per batch), over ``repeats`` batches."""
    x, y = draw_shapes(BATCH, seed=0)
    dm = ShapesDataModule()
    times = []
    for i in range(repeats):
        xn = normalize(x, dm.mean, dm.std)  # the fresh normalised batch that mix_batch overwrites
        t0 = time.perf_counter()
        mix_batch(xn, y, 10, *draw_mix(32, 32, 0.2, 1.0, dm.mixing_rng(0, 0, i)))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = parser(__doc__, rounds=15)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: less exposed to neighbours)")
    p.add_argument("--control", action="store_true", help="A/A: mixing off in both variants")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    steps = make_steps(args.control)

    def ms_per_step(step) -> float:
        seconds_per_call(step, args.warmup)()
        return seconds_per_call(step, args.steps)() * 1e3

    samples = interleaved({name: lambda s=steps[mix]: ms_per_step(s) for name, mix in VARIANTS}, args.rounds)
    print(f"torch threads {torch.get_num_threads()}, {args.steps} steps per round, one model")
    summary = report(samples, args.out, " ms/step", steps=args.steps, control=args.control)
    alone = time_mixing_alone(2000) * 1e3
    share = alone / summary["mixing off"]["median"]
    print(f"mixing alone: median {alone * 1e3:.1f} µs = {share:.2%} of the median step without it")


if __name__ == "__main__":
    main()
