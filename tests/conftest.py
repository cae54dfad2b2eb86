"""Shared fixtures: small datasets in their real on-disk formats, and a CLI runner."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "tests" / "helpers"
sys.path.insert(0, str(HELPERS))  # the tests import the helper scripts (imagenet_tree, the probes) by name

# Tiny Shapes runs: seconds per epoch, still a real train/val/test pipeline.
TINY_SHAPES = ["--data.train_size=256", "--data.val_size=101", "--data.test_size=64", "--data.batch_size=32"]
# In-process runs of one epoch of two batches, quiet: a mistake's line, or a run folder, in a second.
TINY_RUN = [
    "--data.train_size=64",
    "--data.val_size=16",
    "--data.test_size=16",
    "--data.batch_size=32",
    "--trainer.max_epochs=1",
    "--trainer.enable_progress_bar=false",
]


def run_cli(
    args: list[str], cwd: Path, timeout: float = 240, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``python -m lit_ddp ARGS`` in a subprocess; fails the test (not hangs) past ``timeout`` seconds."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "lit_ddp", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_scalars(run_dir: Path) -> dict[str, list[float]]:
    """Every scalar tag in a TensorBoard run directory → its values in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def run_dirs(root: Path) -> list[Path]:
    """Run directories (each holds event files) under ``root``."""
    return sorted({p.parent for p in root.rglob("events.out.tfevents.*")})


def assert_single_run(root: Path) -> Path:
    """Exactly one run directory with one config.yaml and checkpoints; returns it."""
    runs = run_dirs(root)
    assert len(runs) == 1, runs
    run = runs[0]
    assert [p.relative_to(root) for p in root.rglob("config.yaml")] == [
        (run / "config.yaml").relative_to(root)
    ]
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    return run
