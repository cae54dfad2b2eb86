"""CIFAR-10: the reader of the original python-pickle release, the DataModule, and the recipe config,
on a miniature dataset written in the real on-disk format (no download)."""

import io
import os
import pickle
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_single_run, read_scalars, run_cli

from lit_ddp.data import CIFAR10DataModule
from lit_ddp.data.cifar10 import read_batch, read_split
from lit_ddp.errors import UserError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def write_cifar10(
    root: Path, per_batch: int = 20, test_size: int = 30, seed: int = 0, str_keys: bool = False
) -> Path:
    """A miniature CIFAR-10 in the original python-pickle layout (cifar-10-batches-py); ``str_keys``: the
    batches as Python 3 saves them again (``'data'`` instead of ``b'data'``)."""
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
        if str_keys:
            entry = {k.decode(): v for k, v in entry.items()}
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
    x, y, index = next(iter(dm.train_dataloader()))  # the indices key each sample's augmentation
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.uint8 and y.dtype == torch.int64
    assert index.shape == (8,) and int(index.max()) < len(dm.train_set)


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
    with pytest.raises(UserError, match=r"data_batch_3 is truncated or not a pickle.*replace it") as err:
        dm.setup("fit")
    assert "delete" not in str(err.value)  # the other five files are good: advice must not cost them


def test_a_batch_pickled_again_by_python3_is_read_like_the_original(tmp_path) -> None:
    original = read_split(write_cifar10(tmp_path / "py2") / "cifar-10-batches-py", ("data_batch_1",))
    py3 = write_cifar10(tmp_path / "py3", str_keys=True) / "cifar-10-batches-py"
    with open(py3 / "data_batch_1", "rb") as f:
        assert "data" in pickle.load(f)  # str keys, as torchvision also reads them
    x, y = read_batch(py3 / "data_batch_1")
    assert torch.equal(x, original[0]) and torch.equal(y, original[1])  # same seed, same batch
    dm = CIFAR10DataModule(data_dir=str(py3.parent), val_size=10)
    dm.setup("fit")
    assert len(dm.train_set) == 90


def test_a_pickle_without_cifar_data_names_what_is_missing_and_advises_no_deletion(tmp_path) -> None:
    folder = write_cifar10(tmp_path) / "cifar-10-batches-py"
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({"pixels": [1, 2, 3]}, f)
    with pytest.raises(UserError, match=r"test_batch is not a CIFAR-10 batch \(KeyError: 'data'\)") as err:
        read_batch(folder / "test_batch")
    assert "delete" not in str(err.value)


def test_cifar100_batches_are_named_as_such_in_one_line(tmp_path: Path) -> None:
    """CIFAR-100's pickles ('fine_labels', 0-99) under CIFAR-10's names trained until a label ≥ 10 met the
    10-class loss: ``IndexError: Target 36 is out of bounds``."""
    folder = write_cifar10(tmp_path) / "cifar-10-batches-py"
    rng = np.random.default_rng(0)
    cifar100 = {
        b"filenames": [b"x.png"] * 20,
        b"fine_labels": [int(v) for v in rng.integers(0, 100, 20)],
        b"coarse_labels": [int(v) for v in rng.integers(0, 20, 20)],
        b"data": rng.integers(0, 256, (20, 3072), dtype=np.uint8),
    }
    with open(folder / "data_batch_2", "wb") as f:
        pickle.dump(cifar100, f, protocol=2)
    dm = CIFAR10DataModule(data_dir=str(folder.parent))
    with pytest.raises(UserError) as err:
        dm.setup("fit")
    message = str(err.value)
    assert "\n" not in message and "data_batch_2 is a CIFAR-100 batch ('fine_labels', 100 classes)" in message
    assert "reads CIFAR-10 (10 classes): pass --data.data_dir=" in message


def test_labels_outside_the_ten_classes_are_one_line(tmp_path: Path) -> None:
    folder = write_cifar10(tmp_path) / "cifar-10-batches-py"
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({"data": np.zeros((2, 3072), np.uint8), "labels": [3, 36]}, f)
    expected = r"test_batch is not a CIFAR-10 batch \(ValueError: labels from 3 to 36, where CIFAR-10 has 0"
    with pytest.raises(UserError, match=expected):
        read_batch(folder / "test_batch")


# ---- the reader runs no code from a data file ----------------------------------------------------


class Payload:
    """What a crafted batch holds: unpickling it calls ``func(*args)``."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize("func", [os.system, exec], ids=["os.system", "builtins.exec"])
def test_a_crafted_batch_runs_no_code_and_is_one_line(tmp_path: Path, func) -> None:
    folder = write_cifar10(tmp_path / "cifar") / "cifar-10-batches-py"
    marker = tmp_path / "pwned"
    command = f"touch {marker}" if func is os.system else f"open({str(marker)!r}, 'w').close()"
    # The payload sits where the pixels belong, inside an otherwise well-formed batch.
    crafted = {b"data": Payload(func, command), b"labels": [0]}
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        with open(folder / "data_batch_1", "wb") as f:
            pickle.dump(crafted, f, protocol=protocol)
        with pytest.raises(UserError) as err:
            read_batch(folder / "data_batch_1")
        assert not marker.exists()
        message = str(err.value)
        assert "\n" not in message and "data_batch_1 is not a CIFAR-10 batch" in message
        # Named as the file spells it: posix.system; __builtin__.exec in protocol 2.
        assert f".{func.__name__}, which the format never does" in message and "re-download" in message
        with pytest.raises(UserError):  # the data module stops the same way, before any training
            CIFAR10DataModule(data_dir=str(folder.parent)).setup("fit")
        assert not marker.exists()
    with open(folder / "data_batch_1", "rb") as f:
        pickle.load(f)  # the file is a real exploit: what pickle.load did before
    assert marker.exists()


class Python2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 wrote its ``str`` (BINSTRING), as in the official files, where Python 3's
    protocol 2 writes ``_codecs.encode(...)`` calls."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_bytes(self, obj: bytes) -> None:
        n = len(obj)
        head = pickle.SHORT_BINSTRING + bytes([n]) if n < 256 else pickle.BINSTRING + struct.pack("<i", n)
        self.write(head + obj)
        self.memoize(obj)

    dispatch[bytes] = save_bytes


def test_batches_from_python_2_and_every_python_3_protocol_are_read_alike(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    entry = {
        b"batch_label": b"training batch 1 of 5",
        b"labels": [int(v) for v in rng.integers(0, 10, 7)],
        b"data": rng.integers(0, 256, (7, 3072), dtype=np.uint8),
        b"filenames": [f"img_{i}.png".encode() for i in range(7)],
    }
    expected = (torch.from_numpy(entry[b"data"]).reshape(7, 3, 32, 32), torch.tensor(entry[b"labels"]))
    files = {}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):  # 5: numpy writes arrays through _frombuffer
        for keys, value in (("bytes", entry), ("str", {k.decode(): v for k, v in entry.items()})):
            files[f"py3_protocol{protocol}_{keys}_keys"] = pickle.dumps(value, protocol=protocol)
    buffer = io.BytesIO()
    Python2Pickler(buffer, protocol=2).dump(entry)
    # numpy before 2.0 (and Python 2's numpy, which wrote the official files) named its module numpy.core.
    files["python2_numpy1"] = buffer.getvalue().replace(b"numpy._core.", b"numpy.core.")
    assert b"numpy.core.multiarray\n_reconstruct" in files["python2_numpy1"]
    assert b"_codecs" not in files["python2_numpy1"]
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        x, y = read_batch(tmp_path / name)
        assert torch.equal(x, expected[0]) and torch.equal(y, expected[1]), name


# ---- --data.download=true without a network ------------------------------------------------------


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No network: every urlopen (torchvision's download uses urllib) fails as an offline machine's does."""
    opened: list[str] = []

    def urlopen(request, *args, **kwargs):
        opened.append(getattr(request, "full_url", request))
        raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return opened


def test_offline_download_is_one_line_and_removes_only_what_it_made(tmp_path: Path, offline) -> None:
    fresh = tmp_path / "new" / "data"  # neither folder exists: the download would create both
    with pytest.raises(UserError) as err:
        CIFAR10DataModule(data_dir=str(fresh), download=True).prepare_data()
    message = str(err.value)
    assert len(message.splitlines()) == 1 and offline and offline[0].startswith("https://")
    assert message.startswith("download of CIFAR-10 from https://") and "name resolution" in message
    assert f"place cifar-10-batches-py in {fresh} yourself, or check the network" in message
    assert list(tmp_path.iterdir()) == []  # no empty folders left behind

    # A folder of the user's, with a partial copy of the data: all of it stays.
    mine = tmp_path / "mine"
    (mine / "cifar-10-batches-py").mkdir(parents=True)
    keep = [
        mine / "notes.txt",
        mine / "cifar-10-batches-py" / "data_batch_1",
        mine / "cifar-10-python.tar.gz",
    ]
    for path in keep:
        path.write_bytes(b"user data")
    with pytest.raises(UserError, match="download of CIFAR-10"):
        CIFAR10DataModule(data_dir=str(mine), download=True).prepare_data()
    assert all(path.read_bytes() == b"user data" for path in keep)
    assert sorted(p.name for p in mine.rglob("*")) == sorted(["cifar-10-batches-py", *(p.name for p in keep)])


def test_offline_download_through_the_cli_is_one_line_exit_2(
    tmp_path: Path, offline, capsys, monkeypatch
) -> None:
    from lit_ddp.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                "--config",
                str(CONFIGS / "lenet_cifar.yaml"),
                "--data.download=true",
                f"--data.data_dir={tmp_path / 'data'}",
                "--trainer.enable_progress_bar=false",
            ]
        )
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err[-3000:]
    assert err.startswith("lit_ddp: error: download of CIFAR-10") and "Traceback" not in err
    assert not (tmp_path / "data").exists()


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


def test_bad_data_found_in_setup_leaves_no_run_directory(
    cifar_root: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    from lit_ddp.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs" / "lightning_logs" / "version_0").mkdir(parents=True)  # an earlier run's: kept
    args = ["fit", "--data=CIFAR10DataModule", f"--data.data_dir={cifar_root}", "--data.val_size=5000"]
    with pytest.raises(SystemExit) as stop:
        main([*args, "--trainer.enable_progress_bar=false"])
    assert stop.value.code == 2 and "val_size=5000 must be in [0, 99]" in capsys.readouterr().err
    # The failed run's version_1 (TensorBoard writer, config.yaml) is gone; the next run will be version_1.
    assert sorted(p.name for p in (tmp_path / "logs" / "lightning_logs").iterdir()) == ["version_0"]


def test_nodes_sharing_a_filesystem_download_once(tmp_path: Path, monkeypatch) -> None:
    """prepare_data runs on local rank 0 of every node: with a shared data_dir the first downloads, the
    others wait for its lock and then find the data (two threads: flock locks separate open files)."""
    downloads = []

    def download(self, new_folders) -> None:
        downloads.append(threading.get_ident())
        time.sleep(0.5)  # long enough for the other to be waiting on the lock
        write_cifar10(self.data_dir)

    monkeypatch.setattr(CIFAR10DataModule, "_download", download)
    data_dir = tmp_path / "shared" / "data"
    nodes = [
        threading.Thread(target=CIFAR10DataModule(data_dir=str(data_dir), download=True).prepare_data)
        for _ in range(2)
    ]
    for node in nodes:
        node.start()
    for node in nodes:
        node.join(timeout=30)
    assert len(downloads) == 1
    assert sorted(p.name for p in data_dir.iterdir()) == ["cifar-10-batches-py"]  # no lock file left


def test_a_resume_with_another_val_size_is_refused_in_one_line(cifar_root: Path) -> None:
    """val_size draws the held-out split from the training batches: a fit resumed with another one trained
    the rest of the epoch on a permutation of other images (some twice, others never) and, larger,
    validated on images the model had trained on. Refused, as another seed is; evaluation reads it."""
    stopped = CIFAR10DataModule(data_dir=str(cifar_root), val_size=20, batch_size=8)
    stopped._epoch, stopped._samples, stopped._batches = 1, 16, 2  # 2 batches of epoch 1 trained
    state = stopped.state_dict()
    for epoch_complete in (False, True):
        resumed = CIFAR10DataModule(data_dir=str(cifar_root), val_size=30, batch_size=8)
        with pytest.raises(UserError) as err:
            resumed.load_state_dict({**state, "epoch_complete": epoch_complete})
        assert str(err.value).startswith(
            "the checkpoint's run shuffled (and split) its data with --data.val_size=20, this run has"
            " --data.val_size=30: resume with --data.val_size=20"
        )
        assert "\n" not in str(err.value)
    same = CIFAR10DataModule(data_dir=str(cifar_root), val_size=20, batch_size=8)
    same.load_state_dict(state)
    assert same.resume_point == (1, 16)
    del state["split_options"]  # a checkpoint from before they were saved: resumed as before
    assert (
        CIFAR10DataModule(data_dir=str(cifar_root), val_size=30, batch_size=8).load_state_dict(state) is None
    )
