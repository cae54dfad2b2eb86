"""The one A/B harness every benchmark here shares: interleaved rounds, a summary, a JSON record.

    from harness import interleaved, summarize, write_results
    samples = interleaved({"before": run_before, "after": run_after}, rounds=10)
    summary = summarize(samples)
    write_results("out.json", {"summary": summary, "samples": samples})

Variants take turns within every round (A, B; then B, A), so a machine that slows down or speeds up over
minutes moves both alike; the ratio of medians against the first variant is the figure to quote, with the
min and max beside it. ``write_results`` adds what makes a figure checkable: the command that produced it,
the git commit of the tree and the machine.
"""

import argparse
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def seconds_per_call(fn: Callable[[], object], calls: int = 1) -> Callable[[], float]:
    """A variant for ``interleaved``: calls ``fn`` ``calls`` times, returns the seconds per call."""

    def timed() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls

    return timed


def interleaved(
    variants: dict[str, Callable[[], float]],
    rounds: int,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, list[float]]:
    """Call each variant once per round, the order reversed on odd rounds; its figures by variant.

    ``on_round(r, {name: figure})`` is called after each round (to print progress)."""
    if not variants or rounds < 1:
        raise ValueError("interleaved needs at least one variant and one round")
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        figures = {}
        for name in names if r % 2 == 0 else reversed(names):
            figures[name] = float(variants[name]())
            samples[name].append(figures[name])
        if on_round is not None:
            on_round(r, {name: figures[name] for name in names})
    return samples


def summarize(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Median, min, max and count per variant, and each median's ratio to the first variant's median.

    Per-round ratios (``round_ratio_median``, ``_min``, ``_max``) are given too: with interleaved rounds they
    cancel a drift that affects both variants of a round."""
    if not samples:
        raise ValueError("summarize needs at least one variant")
    first = next(iter(samples))
    base = samples[first]
    out: dict[str, dict[str, float]] = {}
    for name, values in samples.items():
        if not values:
            raise ValueError(f"variant {name!r} has no samples")
        median = statistics.median(values)
        row = {"median": median, "min": min(values), "max": max(values), "n": len(values)}
        base_median = statistics.median(base)
        row["ratio"] = median / base_median if base_median else float("nan")
        if len(values) == len(base) and all(base):
            ratios = [v / b for v, b in zip(values, base, strict=True)]
            row["round_ratio_median"] = statistics.median(ratios)
            row["round_ratio_min"], row["round_ratio_max"] = min(ratios), max(ratios)
        out[name] = row
    return out


def git_commit(cwd: Path | None = None) -> str | None:
    """The commit of the tree the benchmark runs from, with ``+dirty`` when it has uncommitted changes.
    ``BENCH_COMMIT`` overrides it: a tree copied to another machine can carry a ``.git`` of another commit."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    cwd = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha + ("+dirty" if dirty else "")


def machine() -> dict[str, object]:
    """What the figures were taken on: host, CPU count, platform, Python, torch and the GPU if any."""
    info: dict[str, object] = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import torch
    except ImportError:
        return info
    info["torch"] = torch.__version__
    info["threads"] = torch.get_num_threads()
    if "lightning" in sys.modules:  # the benchmark imported it: its version belongs with the figures
        info["lightning"] = sys.modules["lightning"].__version__
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def command() -> str:
    """The command line that is running, as one could type it again."""
    return shlex.join([Path(sys.executable).name, *sys.argv])


def write_results(path: str | Path, payload: dict) -> dict:
    """Write ``payload`` as JSON with ``command``, ``commit`` and ``machine`` added; returns the record."""
    record = {"command": command(), "commit": git_commit(), "machine": machine(), **payload}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def settings(args: argparse.Namespace) -> dict:
    """A benchmark's arguments for its record: paths as text, the output file's own option left out."""
    return {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in ("json", "out")
    }


def format_summary(summary: dict[str, dict[str, float]], unit: str = "") -> str:
    """One line per variant: median (min-max), ratio of medians to the first, median of per-round ratios."""
    lines = []
    for name, row in summary.items():
        line = f"{name}: median {row['median']:.4g}{unit} ({row['min']:.4g}-{row['max']:.4g})"
        line += f", ratio {row['ratio']:.3f}"
        if "round_ratio_median" in row:
            line += f", per round {row['round_ratio_median']:.3f}"
            line += f" ({row['round_ratio_min']:.3f}-{row['round_ratio_max']:.3f})"
        lines.append(line)
    return "\n".join(lines)


def parser(doc: str, rounds: int) -> argparse.ArgumentParser:
    """A benchmark's argument parser: its docstring as help, ``--rounds`` and ``--out`` (a JSON record)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds (default %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="also write the samples and summary here (JSON)")
    return p


def report(samples: dict[str, list[float]], out: Path | None, unit: str = "", **extra) -> dict:
    """Print the summary; with ``out``, write it with the samples and ``extra`` (the settings) as JSON."""
    summary = summarize(samples)
    print(format_summary(summary, unit))
    if out is not None:
        write_results(out, {"unit": unit, "summary": summary, "samples": samples, **extra})
    return summary


def free_port() -> int:
    """A free TCP port on 127.0.0.1, for a benchmark's own process group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def training_only(root: str | None = None) -> dict:
    """``Trainer`` settings that leave out what no benchmark times: validation and its sanity check, the
    progress bar, the model summary and checkpoints; ``root`` the run folder, where one is written."""
    settings = dict(
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    return settings if root is None else {**settings, "default_root_dir": root}


def one_cpu_epoch(world: int, root: str) -> dict:
    """``Trainer`` settings for one timed training epoch on ``world`` CPU processes (``ddp_spawn`` for 2+)."""
    strategy = "ddp_spawn" if world > 1 else "auto"
    return dict(accelerator="cpu", devices=world, strategy=strategy, max_epochs=1, **training_only(root))


def synchronize(device) -> None:
    """Wait for the work queued on ``device`` (a ``torch.device``): a timer read after it counts that work.
    CPU work is done when its call returns."""
    if device.type == "cuda":
        import torch  # as in machine(): the harness itself runs without torch

        torch.cuda.synchronize(device)
