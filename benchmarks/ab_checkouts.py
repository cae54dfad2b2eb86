"""Column (a) of bench_lenet_throughput.py on two checkouts of lit_ddp, alternating, on the same machine.

    git worktree add /tmp/before <commit> && git worktree add /tmp/after <commit>
    python benchmarks/ab_checkouts.py /tmp/before /tmp/after --procs 2 --rounds 6

Each run is a fresh process that imports lit_ddp and the benchmark from its checkout, so a change to the
code and a change to the benchmark's harness both count. The order alternates every round; the median of
the per-round ratios (``round_ratio_median``) is the figure to quote.
"""

import subprocess
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, parser, report  # noqa: E402

RUN = (
    "import sys; sys.path[:0] = [{tree!r}, {tree!r} + '/benchmarks']; import lit_ddp;"
    " assert lit_ddp.__file__.startswith({tree!r}), lit_ddp.__file__;"
    " import bench_lenet_throughput as b; print(b._lit_ddp({procs}, {steps}, {warmup}))"
)


def run(tree: str, procs: int, steps: int, warmup: int) -> float:
    """Images/s of column (a), in a fresh process that imports lit_ddp and the benchmark from ``tree``."""
    code = RUN.format(tree=tree, procs=procs, steps=steps, warmup=warmup)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/tmp")
    if out.returncode:
        sys.exit(f"{tree}: {out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = parser(__doc__, rounds=6)
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    args = p.parse_args()
    variants = {
        side: partial(run, getattr(args, side), args.procs, args.steps, args.warmup)
        for side in ("before", "after")
    }
    samples = interleaved(variants, args.rounds, on_round=lambda r, f: print(r, f, flush=True))
    report(samples, args.out, " images/s", procs=args.procs, steps=args.steps, warmup=args.warmup)


if __name__ == "__main__":
    main()
