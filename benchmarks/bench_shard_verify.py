"""What verifying a shard against the SHA-1 its index.json records costs (docs/streaming.md): hashing one
shard of the default size, once per node for each version of the file, and opening a shard already
verified (its seal read and compared), what every later open on that node pays.

    python benchmarks/bench_shard_verify.py --shard-mb 64 --rounds 10 --out results/shard_verify.json

The shard is random bytes in a temporary folder, read from the page cache (a node that has just
downloaded a shard, or read it before): the figure is the hash's, not the disk's. Each variant is timed in
this process's CPU seconds (what the node pays, and steady on a loaded machine) and in wall seconds.
"""

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, parser, report  # noqa: E402


def per_call(fn: Callable[[], None], calls: int, clock: Callable[[], float]) -> Callable[[], float]:
    def timed() -> float:
        start = clock()
        for _ in range(calls):
            fn()
        return (clock() - start) / calls

    return timed


def main() -> None:
    cli = parser(__doc__, rounds=10)
    cli.add_argument("--shard-mb", type=float, default=64, help="shard size in MiB, as `shard --shard-mb`")
    args = cli.parse_args()

    import hashlib

    from lit_ddp.data.shards import map_file, verified

    tmp = Path(tempfile.mkdtemp(prefix="bench_shard_verify-"))
    shard, seal = tmp / "shard.00000.mds", tmp / "shard.00000.mds.sha1"
    shard.write_bytes(os.urandom(int(args.shard_mb * (1 << 20))))
    digest = hashlib.sha1(map_file(shard)).hexdigest()

    def first_open() -> None:
        seal.unlink(missing_ok=True)
        assert verified(shard, digest, seal)

    def sealed_open() -> None:
        assert verified(shard, digest, seal)

    first_open()  # the page cache warm, the seal written
    cpu, wall = time.process_time, time.perf_counter
    variants = {
        "hash_and_seal_cpu": per_call(first_open, 1, cpu),
        "hash_and_seal_wall": per_call(first_open, 1, wall),
        "sealed_open_cpu": per_call(sealed_open, 200, cpu),
        "sealed_open_wall": per_call(sealed_open, 200, wall),
    }
    samples = interleaved(variants, args.rounds)
    shutil.rmtree(tmp)
    size = int(args.shard_mb * (1 << 20))
    summary = report(samples, args.out, unit=" s", shard_bytes=size, load_average=os.getloadavg())
    for clock in ("cpu", "wall"):
        hashed = summary[f"hash_and_seal_{clock}"]["median"]
        opened = summary[f"sealed_open_{clock}"]["median"]
        print(
            f"{clock}: SHA-1 {size / hashed / 1e6:,.0f} MB/s, {hashed * 1e3:.1f} ms per {args.shard_mb:g} MiB"
            f" shard; a sealed open {opened * 1e6:.0f} µs"
        )


if __name__ == "__main__":
    main()
