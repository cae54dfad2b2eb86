"""CIFAR-10: the reader of the original python-pickle release, the DataModule, and the recipe config,
on a miniature dataset written in the real on-disk format (no download)."""

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_single_run, read_scalars, run_cli

from lit_ddp.data import CIFAR10DataModule
from lit_ddp.data.cifar10 import read_batch
from lit_ddp.errors import UserError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


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


def test_cifar_reader_reads_the_original_pickle_format(cifar_root) -> None:
    folder = cifar_root / "cifar-10-batches-py"
    images, labels = read_batch(folder / "data_batch_1")
    with open(folder / "data_batch_1", "rb") as f:
        raw = pickle.load(f, encoding="bytes")
    assert images.shape == (20, 3, 32, 32) and images.dtype == torch.uint8
    # Row layout of the release: 1024 red, then 1024 green, then 1024 blue values, row-major.
    assert images[3, 1, 2, 5] == raw[b"data"][3][1024 + 2 * 32 + 5]
    assert labels.tolist() == raw[b"labels"]


def test_cifar_datamodule_splits_train_into_train_and_val(cifar_root) -> None:
    dm = CIFAR10DataModule(data_dir=str(cifar_root), val_size=17, batch_size=8)
    dm.setup("fit")
    assert len(dm.train_set) == 100 - 17 and len(dm.val_set) == 17
    dm.setup("test")
    assert len(dm.test_set) == 30
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.uint8 and y.dtype == torch.int64


def test_cifar_accepts_the_batches_folder_itself(cifar_root) -> None:
    dm = CIFAR10DataModule(data_dir=str(cifar_root / "cifar-10-batches-py"), val_size=10)
    dm.setup("fit")
    assert len(dm.val_set) == 10


def test_missing_cifar_names_the_folder_and_the_fix(tmp_path) -> None:
    with pytest.raises(UserError) as err:
        CIFAR10DataModule(data_dir=str(tmp_path / "nowhere"))
    message = str(err.value)
    assert str(tmp_path / "nowhere" / "cifar-10-batches-py") in message and "--data.download=true" in message


def test_corrupt_cifar_file_names_the_file(tmp_path) -> None:
    root = write_cifar10(tmp_path)
    bad = root / "cifar-10-batches-py" / "data_batch_3"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated download
    dm = CIFAR10DataModule(data_dir=str(root))
    with pytest.raises(UserError, match="data_batch_3"):
        dm.setup("fit")


def test_missing_cifar_is_one_clear_error_without_traceback(tmp_path: Path) -> None:
    result = run_cli(
        [
            "fit",
            "--config",
            str(CONFIGS / "lenet_cifar.yaml"),
            f"--data.data_dir={tmp_path / 'none'}",
        ],
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 2
    assert "--data.download=true" in result.stderr and str(tmp_path / "none") in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "logs").exists()  # nothing written


def test_cifar_config_runs_on_generated_cifar(tmp_path: Path, cifar_root: Path) -> None:
    cfg = CONFIGS / "lenet_cifar.yaml"
    result = run_cli(
        [
            "fit",
            "--config",
            str(cfg),
            "--config",
            str(CONFIGS / "presets/debug.yaml"),
            f"--data.data_dir={cifar_root}",
            "--data.val_size=20",
            "--data.batch_size=16",
        ],
        cwd=tmp_path,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = assert_single_run(tmp_path / "logs")
    assert "val/acc" in read_scalars(run)
