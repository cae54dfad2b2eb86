"""CIFAR-10 from its original python-pickle release (``cifar-10-batches-py``), held in memory as uint8.

The 50,000 training images are split by a seeded permutation into train and ``val_size`` validation
images (the same split on every rank); ``test`` is the official 10,000-image test batch.
"""

import codecs
import pickle
import shutil
import tarfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

try:
    import fcntl  # POSIX: a lock that nodes on a shared filesystem see
except ImportError:  # Windows: one machine, one download
    fcntl = None

from lit_ddp.data.base import ImageDataModule
from lit_ddp.data.datasets import TensorImageDataset, split_indices
from lit_ddp.errors import UserError
from lit_ddp.utils import from_here, local_path

FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
ARCHIVE = "cifar-10-python.tar.gz"  # what torchvision's download writes beside FOLDER
LOCK = ".cifar-10-download.lock"


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """What ``_codecs.encode`` does in a protocol-2 pickle written by Python 3 (its ``bytes`` are stored as
    ``_codecs.encode(str, "latin1")``), for that codec only."""
    if codecs.lookup(encoding).name != "iso8859-1":
        raise _Refused(f"_codecs.encode(..., {encoding!r})")
    return codecs.encode(text, "latin1")


def _numpy_globals() -> dict[tuple[str, str], object]:
    """The globals an ndarray pickle names, under the module names numpy 1 and numpy 2 write (and Python 2's
    numpy, which wrote the official files). The objects are taken from numpy's own reductions, so no
    deprecated ``numpy.core`` import is needed and the table holds on either numpy."""
    array = np.zeros(1, np.uint8)
    reconstruct, frombuffer = array.__reduce__()[0], array.__reduce_ex__(5)[0]
    make_scalar = np.int64(0).__reduce__()[0]
    found = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for core in ("numpy.core", "numpy._core"):
        found[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        found[(f"{core}.multiarray", "scalar")] = make_scalar
        found[(f"{core}.numeric", "_frombuffer")] = frombuffer
    return found


class _Refused(pickle.UnpicklingError):
    """A pickle asked for a global that a CIFAR batch never names."""


class _BatchUnpickler(pickle.Unpickler):
    """Loads only what a CIFAR batch holds: dicts, lists, bytes, str, ints (pickle opcodes, no global needed)
    and numpy arrays and scalars. Any other global (``os.system``, ``builtins.eval``, ...) is refused before
    it is even imported, so a crafted file cannot run code; ``pickle.load`` would call whatever it names."""

    ALLOWED = {**_numpy_globals(), ("_codecs", "encode"): _latin1_encode}

    def find_class(self, module: str, name: str) -> object:
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None


def read_batch(path: Path) -> tuple[Tensor, Tensor]:
    """One pickled batch → images (N, 3, 32, 32) uint8 and labels (N,) int64.

    The official files are Python 2 pickles with bytes keys (``b"data"``, ``b"labels"``); a batch saved
    again by Python 3 has str keys. Both are read, as torchvision does, but with ``_BatchUnpickler``: a file
    that asks for anything besides plain containers and numpy arrays is refused unrun.
    """
    # Each failure names the file and a fix that keeps it: the file may be good data in another form.
    try:
        with open(path, "rb") as f:
            entry = _BatchUnpickler(f, encoding="bytes").load()
    except OSError as err:
        raise UserError(f"cannot read CIFAR-10 file {path} ({err}): check that it is readable") from None
    except _Refused as err:
        raise UserError(
            f"CIFAR-10 file {path} is not a CIFAR-10 batch: it asks to call {err}, which the format never"
            f" does (refused, nothing was run): delete it and take the file of that name from {ARCHIVE}"
            " (re-download)"
        ) from None
    except Exception as err:  # a truncated or foreign file makes unpickling raise nearly anything
        raise UserError(
            f"CIFAR-10 file {path} is truncated or not a pickle ({type(err).__name__}: {err}):"
            f" replace it with the file of that name from {ARCHIVE}"
        ) from None
    try:
        entry = {k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()}
    except (AttributeError, TypeError):
        entry = {}  # not a dict: reported below as a missing 'data'
    if "fine_labels" in entry and "labels" not in entry:
        # CIFAR-100's release (train/test, 'fine_labels' 0-99) under CIFAR-10's file names: without this,
        # labels up to 99 reach a 10-class loss as "IndexError: Target 36 is out of bounds".
        raise UserError(
            f"CIFAR-10 file {path} is a CIFAR-100 batch ('fine_labels', 100 classes), but this data module"
            f" reads CIFAR-10 (10 classes): pass --data.data_dir=<folder holding {FOLDER}>"
        )
    try:
        data = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(entry["labels"], dtype=np.int64)
        if labels.ndim != 1 or len(labels) != len(data):
            raise ValueError(f"{len(data)} images but labels of shape {labels.shape}")
        if len(labels) and not 0 <= labels.min() <= labels.max() < len(CLASS_NAMES):
            raise ValueError(f"labels from {labels.min()} to {labels.max()}, where CIFAR-10 has 0 to 9")
    except (AttributeError, KeyError, ValueError, TypeError) as err:
        raise UserError(
            f"CIFAR-10 file {path} is not a CIFAR-10 batch ({type(err).__name__}: {err}): expected a pickled"
            f" dict with 'data' (N×3072 uint8) and 'labels' (N ints), as in {ARCHIVE}"
        ) from None
    return torch.from_numpy(data.copy()), torch.from_numpy(labels)


def read_split(folder: Path, names: tuple[str, ...]) -> tuple[Tensor, Tensor]:
    batches = [read_batch(folder / name) for name in names]
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


def find_folder(data_dir: Path) -> Path | None:
    """``data_dir/cifar-10-batches-py`` (torchvision's layout) or ``data_dir`` itself."""
    for folder in (data_dir / FOLDER, data_dir):
        if not missing_files(folder):
            return folder
    return None


def missing_files(folder: Path) -> list[str]:
    """The batch files of the release that ``folder`` lacks."""
    return [name for name in (*TRAIN_BATCHES, TEST_BATCH) if not (folder / name).is_file()]


def not_found(data_dir: Path) -> UserError:
    """Not there at all, or a folder with some batches missing (named: re-extracting restores them)."""
    for folder in (data_dir / FOLDER, data_dir):
        missing = missing_files(folder)
        if len(missing) < len((*TRAIN_BATCHES, TEST_BATCH)):
            return UserError(
                f"CIFAR-10 in {folder} is incomplete: {', '.join(missing)} missing; extract {ARCHIVE} again"
                " there, or pass --data.download=true into an empty --data.data_dir"
            )
    return UserError(
        f"CIFAR-10 not found in {from_here(data_dir / FOLDER)}: pass --data.download=true to fetch it,"
        f" or --data.data_dir=<folder holding {FOLDER}>"
    )


class CIFAR10DataModule(ImageDataModule):
    """CIFAR-10, with random crop (4-pixel padding) and horizontal flip done on whole batches on the device.

    Args:
        data_dir: folder holding ``cifar-10-batches-py`` (or that folder itself).
        download: fetch the dataset into ``data_dir`` first (in ``prepare_data``: one process per node).
        val_size: training images held out for validation by a seeded split (``seed`` decides it).
        num_workers: 0 by default: the images are in memory, no decoding to spread, and no IPC is fastest.
        **kwargs: ``ImageDataModule``'s (batch_size, seed, augmentation, predict_dir, mixup_alpha, ...).
    """

    num_classes = 10
    class_names = CLASS_NAMES
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)

    def __init__(
        self,
        data_dir: str = "data/",
        download: bool = False,
        val_size: int = 5000,
        num_workers: int | None = 0,
        **kwargs,
    ) -> None:
        super().__init__(num_workers=num_workers, **kwargs)
        self.data_dir = Path(local_path(data_dir, "--data.data_dir"))  # a YAML config's ~, $VAR unexpanded
        self.download = download
        self.val_size = val_size
        self._train_val: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # images, labels, train, val
        # Fail here, in the launching process, before any rank is spawned.
        if not download and find_folder(self.data_dir) is None:
            raise not_found(self.data_dir)

    def prepare_data(self) -> None:
        if not self.download or find_folder(self.data_dir) is not None:
            return
        # Lightning calls this on local rank 0 of every node: nodes sharing a filesystem would download and
        # extract into the same folder at once. The first takes the lock; the others wait, then find it.
        new_folders = [p for p in (self.data_dir, *self.data_dir.parents) if not p.exists()]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / LOCK, "a") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if find_folder(self.data_dir) is None:
                    self._download(new_folders)
            finally:
                # Gone with the download, so the user's folder holds only the data; a node still waiting
                # on it checks for the data again once it has the lock, and finds it.
                (self.data_dir / LOCK).unlink(missing_ok=True)
                if fcntl is not None:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def _download(self, new_folders: list[Path]) -> None:
        """torchvision's download; a failure is one line, and what the failed attempt made is removed
        (``new_folders``: the folders, deepest first, that did not exist before it)."""
        from torchvision.datasets import CIFAR10
        from torchvision.datasets.utils import download_and_extract_archive

        # Only these can be the download's own: the archive and the extracted folder if absent before, and the
        # folders it creates (data_dir and its missing parents). Anything else in data_dir is the user's.
        new_entries = [p for p in (self.data_dir / ARCHIVE, self.data_dir / FOLDER) if not p.exists()]
        (self.data_dir / LOCK).unlink(missing_ok=True)  # else the folder made for the download is not empty
        try:
            # The archive holds all six batches; md5-checked (what CIFAR10(download=True) does, without
            # then loading the 150 MB training set into memory).
            download_and_extract_archive(
                CIFAR10.url, str(self.data_dir), filename=ARCHIVE, md5=CIFAR10.tgz_md5
            )
        except (OSError, RuntimeError, tarfile.TarError) as err:  # URLError is an OSError; md5 → RuntimeError
            for path in new_entries:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            for path in new_folders:
                if path.is_dir() and not any(path.iterdir()):
                    path.rmdir()
            reason = getattr(err, "reason", None) or err
            raise UserError(
                f"download of CIFAR-10 from {CIFAR10.url} failed ({reason}): place {FOLDER} in"
                f" {self.data_dir} yourself, or check the network"
            ) from None

    def split_options(self) -> dict:
        return {**super().split_options(), "val_size": self.val_size}  # held out of train by the seed

    def load_split(self, split: str) -> TensorImageDataset:
        folder = find_folder(self.data_dir)
        if folder is None:
            raise not_found(self.data_dir)
        if split == "test":
            return TensorImageDataset(*read_split(folder, (TEST_BATCH,)))
        # train and val are one read of the training batches, split by seed: read once for both
        if self._train_val is None:
            images, labels = read_split(folder, TRAIN_BATCHES)
            self._train_val = (images, labels, *split_indices(len(images), self.val_size, self.seed))
        images, labels, train_idx, val_idx = self._train_val
        if split == "val":
            self._train_val = None  # setup asks for train, then val: nothing to keep after that
        idx = train_idx if split == "train" else val_idx
        return TensorImageDataset(images[idx], labels[idx])
