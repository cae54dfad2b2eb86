"""``python -m lit_ddp shard SRC DEST``: a CIFAR-10 folder or an ImageFolder tree → MDS shards.

    python -m lit_ddp shard data/cifar-10-batches-py shards/cifar10
    python -m lit_ddp shard data/imagenet s3://bucket/imagenet      # AWS_ENDPOINT_URL etc. from the env

CIFAR-10's pickles hold raw pixels: each image is stored as its 3,072 raw uint8 bytes (3×32×32), no
encoding (nothing to decode when training). An ImageFolder tree's files are stored as they are on disk
(no re-encode), with their relative path. Every sample keeps its label and its index in the sorted split.

The same input gives byte-identical shards: samples in sorted order, a shard closed at a fixed size, one
writer (``MDSWriter``, data/mds.py) fed in order while a pool of processes reads the files. The shards are
written under ``DEST/.lit_ddp-partial`` (or a local temporary folder for s3://) and moved into place when
complete, ``lit_ddp.json`` last: an interrupted run leaves no manifest, and a re-run starts over. A DEST
that holds anything else is refused, and so is a second run into a DEST that one is writing (dest_lock.py).
"""

import argparse
import contextlib
import errno
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lit_ddp.data.ahead import started_ahead
from lit_ddp.data.cifar10 import (
    ARCHIVE,
    CLASS_NAMES,
    FOLDER,
    TEST_BATCH,
    TRAIN_BATCHES,
    find_folder,
    missing_files,
    read_split,
)
from lit_ddp.data.class_links import check_class_links
from lit_ddp.data.dest_lock import LOCK, local_lock, store_lock
from lit_ddp.data.folder_index import class_key, classes_train_lacks, find_classes
from lit_ddp.data.image_folder import list_images
from lit_ddp.data.mds import MDSWriter
from lit_ddp.data.shards import (
    COLUMNS,
    FOLDER_COLUMNS,
    INDEX,
    MANIFEST,
    PARTIAL,
    SPLITS,
    S3Store,
    check_url_form,
    is_remote,
    store_problem,
)
from lit_ddp.data.workers import available_cpus
from lit_ddp.errors import UserError
from lit_ddp.utils import from_here
from lit_ddp.writes import WriteError, advice, write_file

FORMAT_VERSION = 1


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise UserError(
            f"cannot read {path} ({err.strerror or type(err).__name__}): make it readable or move it out of"
            " SRC, then run the command again"
        ) from err


def _write_error(err: OSError, dest: str, path: Path | None = None) -> UserError:
    """One line for a failed write of ``path`` into DEST (or, for s3://, into the local folder the shards
    are staged in, under TMPDIR): the path, the reason and the fix (writes.py's); nothing is published
    without the manifest."""
    where = (
        path or err.filename or (dest if not is_remote(dest) else f"the staging folder for {dest} (TMPDIR)")
    )
    fix = advice(err, "a DEST")
    if err.errno == errno.EFBIG:
        fix += ", or pass a smaller --shard-mb"
    if is_remote(dest):
        fix += " (s3:// shards are staged under TMPDIR first: point TMPDIR at a disk with room)"
    return UserError(
        f"cannot write {where} ({err.strerror or type(err).__name__}): nothing is published in {dest} and"
        f" the partial shards are removed; {fix}, then run the command again"
    )


def _read_in_order(paths: list[str], pool: ThreadPoolExecutor, ahead: int) -> Iterator[bytes]:
    """Each file's bytes, in order, read by ``pool`` at most ``ahead`` files ahead of the writer (reading
    is I/O: threads overlap it; the window bounds the memory held)."""
    for read in started_ahead(paths, lambda path: pool.submit(_read_file, path), ahead):
        yield read.result()


def _progress(split: str, done: int, total: int, started: float) -> None:
    rate = done / max(time.perf_counter() - started, 1e-9)
    print(f"shard: {split} {done:,}/{total:,} samples ({rate:,.0f}/s)", file=sys.stderr, flush=True)


def _samples_cifar(folder: Path) -> tuple[dict, dict[str, Iterator[dict]], dict[str, int]]:
    splits = {"train": TRAIN_BATCHES, "test": (TEST_BATCH,)}
    data = {name: read_split(folder, batches) for name, batches in splits.items()}

    def rows(images, labels) -> Iterator[dict]:
        for i, (x, y) in enumerate(zip(images.numpy(), labels.tolist(), strict=True)):
            yield {"image": x.tobytes(), "index": i, "label": y}

    meta = {
        "kind": "cifar10",
        "encoding": "raw",
        "image_shape": [3, 32, 32],
        "class_names": list(CLASS_NAMES),
    }
    return meta, {n: rows(*d) for n, d in data.items()}, {n: len(d[1]) for n, d in data.items()}


def _not_a_source(root: Path) -> UserError:
    """SRC is neither kind: a CIFAR-10 folder with batches missing is named as such (re-extracting it mends
    it), anything else gets both layouts."""
    for folder in (root / FOLDER, root):
        missing = missing_files(folder)
        if len(missing) < len((*TRAIN_BATCHES, TEST_BATCH)):
            return UserError(
                f"SRC {folder} is an incomplete CIFAR-10 folder: {', '.join(missing)} missing; extract"
                f" {ARCHIVE} again there"
            )
    return UserError(
        f"{root} is neither a CIFAR-10 folder ({FOLDER}) nor an ImageFolder tree with at least two class"
        " folders under train/: pass one of those as SRC"
    )


def _samples_folder(root: Path, pool) -> tuple[dict, dict[str, Iterator[dict]], dict[str, int]]:
    folders = find_classes(root / "train")
    names = [class_key(f) for f in folders]
    # by their NFC form, as ImageNetDataModule matches them: a val/ copied from a Mac names them in NFD
    class_to_idx = {n: i for i, n in enumerate(names)}
    listings = {}
    for split in SPLITS:
        if (root / split).is_dir():
            found = find_classes(root / split)
            unknown = [f for f in found if class_key(f) not in class_to_idx]
            if unknown:
                raise UserError(classes_train_lacks(root / split, unknown))
            listings[split] = list_images(root / split, class_to_idx)
    # as ImageNetDataModule: a class without a training image would be a class the model never sees
    empty = [
        folders[i]
        for i, n in enumerate(np.bincount(listings["train"].labels, minlength=len(folders)))
        if not n
    ]
    if empty:
        raise UserError(
            f"{root / 'train'} has class folders with no image file ({', '.join(map(ascii, empty[:5]))}): add"
            " images or remove the folders"
        )
    # as ImageNetDataModule: a val/ or test/ split of no sample would be one that fit validates nothing on
    barren = [split for split, listing in listings.items() if not len(listing)]
    if barren:
        raise UserError(f"{root / barren[0]} holds no image file: add images or remove the folder")

    def rows(listing) -> Iterator[dict]:
        paths = [listing.path(i) for i in range(len(listing))]
        contents = _read_in_order(paths, pool, ahead=256)
        for i, (path, data) in enumerate(zip(paths, contents, strict=True)):
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            yield {"image": data, "index": i, "label": int(listing.labels[i]), "path": rel}

    meta = {"kind": "imagefolder", "encoding": "file", "image_shape": None, "class_names": names}
    return (
        meta,
        {s: rows(listing) for s, listing in listings.items()},
        {s: len(v) for s, v in listings.items()},
    )


def _write_split(
    out: Path, split: str, rows: Iterable[dict], total: int, columns: dict, shard_mb: float
) -> dict:
    started = shown = time.perf_counter()
    done = 0
    # The index holds each shard's SHA-1: a node's cache tells a re-written shard from the one it holds.
    with MDSWriter(out / split, columns, size_limit=int(shard_mb * (1 << 20))) as writer:
        for row in rows:
            writer.write(row)
            done += 1
            if done == total or time.perf_counter() - shown > 5:
                _progress(split, done, total, started)
                shown = time.perf_counter()
    size = sum(p.stat().st_size for p in (out / split).iterdir())
    return {"samples": done, "bytes": size, "shards": len(list((out / split).glob("*.mds")))}


@contextlib.contextmanager
def _s3_errors(dest: str) -> Iterator[None]:
    """botocore's and boto3's errors while listing or writing DEST, as one line: the store's problem and
    its fix (credentials, endpoint, bucket), else the error itself; nothing is published without the
    manifest, so running the command again starts over."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError, Boto3Error) as err:
        problem = store_problem(err, dest)
        if problem is None:
            problem = (
                f"cannot write the shards to {dest} ({type(err).__name__}: {err}): check that the store is"
                " up, then run the command again"
            )
        raise UserError(problem) from err


def _check_apart(src: Path, dest: str) -> None:
    """Refuse a local DEST that is SRC, lies inside it or holds it (links resolved): publishing replaces
    DEST's split folders, which would be SRC's own images."""
    if is_remote(dest):
        return
    s, d = os.path.realpath(src), os.path.realpath(dest)
    if s == d or os.path.commonpath([s, d]) in (s, d):
        where = "is SRC" if s == d else "lies inside SRC" if os.path.commonpath([s, d]) == s else "holds SRC"
        raise UserError(
            f"DEST {dest} {where} ({src}): the shards would replace or mix with the images; pass a DEST"
            " outside SRC"
        )


# What a run writes into DEST/<split>/ (MDS's names); the publish step replaces a split folder that holds
# only these, left by an interrupted run. Anything else in it is a user's and is never deleted.
OURS_IN_SPLIT = re.compile(r"index\.json|shard\.\d+\.mds")


def _not_ours(dest: str) -> list[str]:
    """The entries of a local DEST that no run of ``shard`` wrote, as paths relative to DEST."""
    others = []
    for name in sorted(os.listdir(dest)):
        path = os.path.join(dest, name)
        if name == LOCK:
            continue  # this run's
        if name == PARTIAL and os.path.isdir(path) and not os.path.islink(path):
            continue  # an interrupted run's work folder: started over
        if name not in SPLITS or os.path.islink(path) or not os.path.isdir(path):
            others.append(name)
            continue
        for folder, dirs, names in os.walk(path):  # links to folders are listed, not followed
            rel = os.path.relpath(folder, dest).replace(os.sep, "/")
            top = folder == path
            others += [f"{rel}/{n}" for n in names if not (top and OURS_IN_SPLIT.fullmatch(n))]
            others += [f"{rel}/{n}" for n in dirs if os.path.islink(os.path.join(folder, n))]
            if not (top or names or dirs):
                others.append(f"{rel}/")
    return sorted(others)


def _check_dest(dest: str) -> None:
    """Refuse a DEST holding finished shards or anything not written by an earlier, interrupted run."""
    if is_remote(dest):
        with _s3_errors(dest):
            keys = S3Store(dest).keys()
        if MANIFEST in keys:
            raise UserError(
                f"{dest} already holds shards ({MANIFEST}): pass an empty DEST or delete them first"
            )
        others = [k for k in keys if not _ours_in_store(k)]
    else:
        if (Path(dest) / MANIFEST).exists():
            raise UserError(
                f"{dest} already holds shards ({MANIFEST}): pass an empty DEST or delete them first"
            )
        others = _not_ours(dest)
    if others:
        raise UserError(f"{dest} holds other files ({', '.join(others[:3])}): pass an empty DEST")


def _ours_in_store(key: str) -> bool:
    if key == LOCK:
        return True  # this run's
    split, _, name = key.partition("/")
    return split in SPLITS and OURS_IN_SPLIT.fullmatch(name) is not None


def _publish(work: Path, dest: str, splits: list[str], manifest: bytes, still_ours=None) -> None:
    if is_remote(dest):
        store = S3Store(dest)
        with _s3_errors(dest):
            still_ours()
            for split in splits:  # shards first, each split's index after its shards, the manifest last
                for shard in sorted((work / split).glob("*.mds")):
                    store.upload(f"{split}/{shard.name}", str(shard))
                store.upload(f"{split}/{INDEX}", str(work / split / INDEX))
            still_ours()
            store.write(MANIFEST, manifest)
        return
    for split in splits:
        target = Path(dest) / split
        if target.exists():
            shutil.rmtree(target)  # left by an interrupted run (no manifest, or _check_dest refused)
        os.replace(work / split, target)
    write_file(Path(dest) / MANIFEST, manifest, "the shards' manifest", elsewhere="a DEST")


def _check_options(shard_mb: float, workers: int | None) -> None:
    """Before DEST is touched: MDSWriter and the thread pool refuse these only with a traceback, and a size
    under one byte would be taken as 0, no limit. (0 is no size limit, one shard per split, as MDSWriter
    takes it; --workers=0, as left out, is 4 threads per CPU; at most 256 reads are in flight whatever the
    count.)"""
    size = shard_mb * (1 << 20)
    advice = "pass a shard size in MiB (64 by default), or 0 for one shard per split"
    if math.isnan(shard_mb) or shard_mb < 0:
        raise UserError(f"--shard-mb={shard_mb} cannot be negative or nan: {advice}")
    if size >= 1 << 32:  # MDS stores each sample's byte offset in its shard as a uint32
        raise UserError(f"--shard-mb={shard_mb} is 4096 MiB or more, over an MDS shard's 4 GiB: {advice}")
    if 0 < size < 1:
        raise UserError(f"--shard-mb={shard_mb} is under one byte: {advice}")
    if workers is not None and workers < 0:
        raise UserError(
            f"--workers={workers} cannot be negative: pass a count of file-reading threads, or leave it out"
            " (4 per CPU)"
        )


def convert(src: str, dest: str, shard_mb: float = 64, workers: int | None = None) -> dict:
    """Shard ``src`` into ``dest``; returns the manifest."""
    _check_options(shard_mb, workers)
    root = Path(src)
    if not root.is_dir():
        where = from_here(src)
        raise UserError(f"SRC {where} is not a folder: pass a CIFAR-10 folder or an ImageFolder tree")
    check_url_form(dest, f"DEST {dest}")
    _check_apart(root, dest)
    cifar = find_folder(root)
    if cifar is None and len(find_classes(root / "train")) < 2:  # before DEST is touched
        raise _not_a_source(root)
    if cifar is None:
        for split in SPLITS:  # a split that is not a folder would be left out without a word
            if (root / split).exists() and not (root / split).is_dir():
                raise UserError(
                    f"{root / split} is a file, not a folder of class folders: move it out of SRC"
                )
        check_class_links(root, SPLITS)
    try:
        return _convert_locked(root, cifar, dest, shard_mb, workers)
    except WriteError as err:
        raise _write_error(err.os_error, dest, err.path) from None
    except OSError as err:  # reading SRC raised its own line (_read_file): this is a write
        raise _write_error(err, dest) from err


def _convert_locked(root: Path, cifar: Path | None, dest: str, shard_mb: float, workers: int | None) -> dict:
    if is_remote(dest):
        store = S3Store(dest)
        with _s3_errors(dest), store_lock(store) as still_ours:
            _check_dest(dest)
            return _shard_into(root, cifar, dest, shard_mb, workers, still_ours)
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise UserError(f"{dest} is a file: pass a folder (or s3://bucket/prefix) as DEST")
    if os.path.islink(dest) and not os.path.exists(dest):  # mkdir's "File exists" read as a disk fault
        raise UserError(
            f"DEST {dest} is a link to {os.readlink(dest)}, which does not exist: create that folder, or pass"
            " another DEST"
        )
    created = not os.path.exists(dest)
    Path(dest).mkdir(parents=True, exist_ok=True)
    try:
        with local_lock(Path(dest)):
            _check_dest(dest)
            try:
                return _shard_into(root, cifar, dest, shard_mb, workers, None)
            except BaseException:  # an error, Ctrl-C, SIGTERM: no half-written shards left behind
                shutil.rmtree(Path(dest) / PARTIAL, ignore_errors=True)
                raise
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(dest)  # made by this run and left empty
        raise


def _shard_into(
    root: Path, cifar: Path | None, dest: str, shard_mb: float, workers: int | None, still_ours
) -> dict:
    """The conversion, DEST's lock held and DEST checked; ``still_ours``: S3's check that the lock is still
    this run's, before uploading and before publishing."""
    if is_remote(dest):
        work = _staging()
        with local_lock(work):  # held while this run lives: the next run's _staging leaves it alone
            try:
                return _shard_work(root, cifar, dest, shard_mb, workers, still_ours, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    work = Path(dest) / PARTIAL
    shutil.rmtree(work, ignore_errors=True)  # an interrupted run's: started over
    work.mkdir(parents=True)
    manifest = _shard_work(root, cifar, dest, shard_mb, workers, still_ours, work)
    shutil.rmtree(work, ignore_errors=True)
    return manifest


STAGING = "lit_ddp-shard-"


def _staging() -> Path:
    """A new folder in TMPDIR for an s3:// DEST's shards until they are uploaded (a dataset's size). Those
    that runs killed outright left there (SIGKILL, the OOM killer: no clean-up ran) are removed first: a
    folder is a killed run's when its lock file is there and no process holds it."""
    for old in Path(tempfile.gettempdir()).glob(STAGING + "*"):
        try:
            if old.stat().st_uid != os.getuid() or not (old / LOCK).is_file():
                continue  # another user's, or one whose run is just starting
            with local_lock(old):
                shutil.rmtree(old)
        except (UserError, OSError):
            continue  # held by a live run, or not ours to remove
    return Path(tempfile.mkdtemp(prefix=STAGING))


def _shard_work(
    root: Path, cifar: Path | None, dest: str, shard_mb: float, workers: int | None, still_ours, work: Path
) -> dict:
    # CIFAR's pickles are read whole in this process; an ImageFolder tree's files by a pool of readers.
    pool = None if cifar is not None else ThreadPoolExecutor(workers or 4 * available_cpus())
    try:
        if cifar is not None:
            meta, rows, totals = _samples_cifar(cifar)
            columns = COLUMNS
        else:
            meta, rows, totals = _samples_folder(root, pool)
            columns = FOLDER_COLUMNS
        splits = {
            name: _write_split(work, name, rows[name], totals[name], columns, shard_mb) for name in rows
        }
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    manifest = {"lit_ddp_shards": FORMAT_VERSION, "format": "mds", **meta, "splits": splits}
    encoded = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    _publish(work, dest, list(splits), encoded, still_ours)
    return manifest


class _Stopped(KeyboardInterrupt):
    """SIGTERM, raised where the run is, as Ctrl-C's KeyboardInterrupt is: the same clean-up follows."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM (a scheduler's stop, ``kill``) ends the command as Ctrl-C does, through the clean-up that
    removes the partial shards and an S3 DEST's lock; outside the main thread, signals stay as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise _Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str], prog: str = "python -m lit_ddp shard") -> None:
    """``prog``: the name in its usage and errors (a project's own: ``python -m my_project shard``)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="a CIFAR-10 folder (cifar-10-batches-py) or an ImageFolder tree")
    parser.add_argument("dest", help="an empty folder, or s3://bucket/prefix")
    parser.add_argument("--shard-mb", type=float, default=64, help="shard size limit in MiB (default 64)")
    parser.add_argument("--workers", type=int, default=None, help="file-reading threads (default: 4 per CPU)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        with _stopped_by_sigterm():
            manifest = convert(args.src, args.dest, args.shard_mb, args.workers)
    except KeyboardInterrupt as stop:
        signum = getattr(stop, "signum", signal.SIGINT)
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        print(
            f"lit_ddp: shard stopped by {name}: nothing is published in {args.dest} (its partial shards"
            " removed); run the command again to shard it",
            file=sys.stderr,
        )
        sys.exit(128 + signum)
    seconds = time.perf_counter() - started
    samples = sum(s["samples"] for s in manifest["splits"].values())
    print(f"shard: {samples:,} samples in {seconds:.1f} s ({samples / seconds:,.0f}/s) → {args.dest}")
