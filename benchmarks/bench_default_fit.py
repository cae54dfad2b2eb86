"""Wall time of README's first command, ``python -m lit_ddp fit`` with no argument (the embedded default:
LeNet on Shapes, 12 epochs), from start to exit, in a fresh process and a fresh folder each round; with the
run's val/acc after each epoch beside it: the outcome that tests/test_cli.py asserts on the first half of
the run, and the curve that shows what the second half adds.

    python benchmarks/bench_default_fit.py --rounds 3 --out default_fit.json
    python benchmarks/bench_default_fit.py --rounds 1 --trainer.max_epochs=1   # arguments after the options
                                                                                # go to fit (a shorter run)

The checkout this file is in is the lit_ddp that runs (first on PYTHONPATH). The load average before each
round is recorded: on a shared machine a wall time means little without it.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, parser, report  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def val_acc_curve(root: Path) -> list[float]:
    """The val/acc values, epoch by epoch, that the run under ``root`` wrote to TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = {p.parent for p in root.rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return [e.value for e in events.Scalars("val/acc")] if "val/acc" in events.Tags()["scalars"] else []


def main() -> None:
    p = parser(__doc__, rounds=3)
    args, fit_args = p.parse_known_args()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    curves: list[list[float]] = []
    load: list[float] = []

    def fit() -> float:
        with tempfile.TemporaryDirectory(prefix="bench_default_fit_") as tmp:
            load.append(os.getloadavg()[0])
            start = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "lit_ddp", "fit", *fit_args],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
            )
            seconds = time.perf_counter() - start
            if proc.returncode != 0:
                sys.exit(f"fit failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            curves.append(val_acc_curve(Path(tmp)))
        return seconds

    samples = interleaved(
        {"fit": fit}, args.rounds, on_round=lambda r, f: print(f"round {r}: {f['fit']:.1f} s")
    )
    print(f"val/acc by epoch, per round: {curves}; load average (1 min) before each round: {load}")
    report(samples, args.out, " s", fit_args=fit_args, val_acc_by_epoch=curves, load_average_1min=load)


if __name__ == "__main__":
    main()
