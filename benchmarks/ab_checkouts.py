"""Column (a) of bench_lenet_throughput.py on two checkouts of lit_ddp, alternating, on the same machine.

    git worktree add /tmp/before <commit> && git worktree add /tmp/after <commit>
    python benchmarks/ab_checkouts.py /tmp/before /tmp/after --procs 2 --rounds 6

Each run is a fresh process that imports lit_ddp and the benchmark from its checkout, so a change to the
code and a change to the benchmark's harness both count. The order alternates every round; the median of
the per-round ratios is the figure to quote (2-core machines move single runs by ±10 %).
"""

import argparse
import json
import statistics
import subprocess
import sys

RUN = (
    "import sys; sys.path[:0] = [{tree!r}, {tree!r} + '/benchmarks']; import lit_ddp;"
    " assert lit_ddp.__file__.startswith({tree!r}), lit_ddp.__file__;"
    " import bench_lenet_throughput as b; print(b._lit_ddp({procs}, {steps}, {warmup}))"
)


def run(tree: str, procs: int, steps: int, warmup: int) -> float:
    code = RUN.format(tree=tree, procs=procs, steps=steps, warmup=warmup)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/tmp")
    if out.returncode:
        sys.exit(f"{tree}: {out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
            rates[name].append(run(getattr(args, name), args.procs, args.steps, args.warmup))
        print(r, {k: round(v[-1]) for k, v in rates.items()}, flush=True)
    ratios = [a / b for a, b in zip(rates["after"], rates["before"], strict=True)]
    summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in rates.items()}
    print(json.dumps(summary))
    print(
        "after/before per round:",
        [round(x, 3) for x in ratios],
        "median",
        round(statistics.median(ratios), 3),
    )


if __name__ == "__main__":
    main()
