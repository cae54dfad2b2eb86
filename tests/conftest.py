"""Shared fixtures: small datasets in their real on-disk formats, and a CLI runner."""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

# Tiny Shapes runs: seconds per epoch, still a real train/val/test pipeline.
TINY_SHAPES = ["--data.train_size=256", "--data.val_size=101", "--data.test_size=64", "--data.batch_size=32"]


def write_cifar10(root: Path, per_batch: int = 20, test_size: int = 30, seed: int = 0) -> Path:
    """A miniature CIFAR-10 in the original python-pickle layout (cifar-10-batches-py)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)

    def dump(name: str, n: int) -> None:
        entry = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"img_{i}.png".encode() for i in range(n)],
        }
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f, protocol=2)

    for i in range(1, 6):
        dump(f"data_batch_{i}", per_batch)
    dump("test_batch", test_size)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [n.encode() for n in names], b"num_cases_per_batch": per_batch}, f)
    return root


@pytest.fixture
def cifar_root(tmp_path: Path) -> Path:
    return write_cifar10(tmp_path / "cifar")


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
