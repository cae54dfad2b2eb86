"""Sharded image data: Mosaic MDS shards (``index.json`` + ``shard.NNNNN.mds`` per split) read by index.

Layout written by ``python -m lit_ddp shard`` (lit_ddp/data/convert.py)::

    DEST/lit_ddp.json            what the shards hold (classes, encoding, samples per split); written last
    DEST/<split>/index.json      Mosaic's MDS index: each shard's sample count and byte size
    DEST/<split>/shard.00000.mds samples in order; each holds ``image`` (bytes), ``index`` and ``label``

DEST is a local (or shared file system) folder, or ``s3://bucket/prefix`` with the endpoint and credentials
from the standard AWS environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...).

``ShardedSamples`` gives random access by global index: an MDS shard starts with its sample count and the
byte offset of every sample, so one sample is one slice of its shard. Remote shards are copied whole to a
node-local cache (``ChunkCache``: bounded, least recently used out first, shared by the ranks and workers
of a node through a lock file per shard and an atomic rename); local ones are read in place. A shard that
cannot be read (server down, answering errors or slower than ``read_timeout`` seconds, missing, shorter
than its index says) is tried ``retries`` times with backoff, then fails with one line naming it
(``ShardError``).

The training order (``chunk_window_order``) is a function of (seed, epoch) only: shards permuted, then
samples shuffled inside windows of ``window`` consecutive shards of that permutation, so a worker touches
few shards at once; samplers.py-style dealing to ranks (rank r takes every N-th) makes global step k hold
the same samples on any process count.
"""

import bisect
import contextlib
import hashlib
import json
import mmap
import os
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import torch

try:
    import fcntl  # POSIX: ranks of a node take turns on a shard's download
except ImportError:  # Windows: no lock; the atomic rename still keeps a shard whole
    fcntl = None

from lit_ddp.errors import UserError

MANIFEST = "lit_ddp.json"
INDEX = "index.json"
# MDS columns, in the order MDS stores them (sorted by name): variable-size first as uint32 sizes.
COLUMNS = {"image": "bytes", "index": "int", "label": "int"}
FOLDER_COLUMNS = {**COLUMNS, "path": "str"}  # ImageFolder shards also keep each file's relative path
SPLITS = ("train", "val", "test")


class ShardError(UserError):
    """A shard (or the manifest) that cannot be read after the retries: one line naming it."""


# ---- stores: a local folder or an S3-compatible bucket ---------------------------------------------


def is_remote(url: str) -> bool:
    return url.startswith("s3://")


class LocalStore:
    """Files under a folder (local disk or a shared file system)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def name(self, key: str) -> str:
        return os.path.join(self.root, key)

    def read(self, key: str) -> bytes:
        with open(self.name(key), "rb") as f:
            return f.read()

    def size(self, key: str) -> int:
        return os.path.getsize(self.name(key))


# Seconds a read waits for the server's next bytes before it fails and is retried (botocore's own: 60).
READ_TIMEOUT = 30.0


def _s3_client(read_timeout: float):
    import boto3  # the `streaming` extra; imported here so local shards never need it
    from botocore.config import Config

    # lit_ddp retries itself (bounded, naming the shard): botocore's own retries would multiply them.
    # total_max_attempts counts the first request; botocore's max_attempts counts only the retries after it.
    retries = {"total_max_attempts": 1, "mode": "standard"}
    config = Config(retries=retries, connect_timeout=5, read_timeout=read_timeout)
    return boto3.session.Session().client("s3", config=config)  # AWS_ENDPOINT_URL etc. from the env


class S3Store:
    """Objects under ``s3://bucket/prefix``; the client is made per process (boto3 clients don't fork).
    A read that waits more than ``read_timeout`` seconds for the server fails (and is retried)."""

    def __init__(self, url: str, read_timeout: float = READ_TIMEOUT) -> None:
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise UserError(f"{url} names no bucket: pass s3://bucket/prefix")
        self.url, self.bucket, self.prefix = url.rstrip("/"), bucket, prefix.strip("/")
        self.read_timeout = read_timeout
        self._client, self._pid = None, os.getpid()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_client": None}

    @property
    def client(self):
        # A forked DataLoader worker inherits the parent's client (no pickling): it makes its own.
        if self._client is None or self._pid != os.getpid():
            self._client, self._pid = _s3_client(self.read_timeout), os.getpid()
        return self._client

    def key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def name(self, key: str) -> str:
        return f"{self.url}/{key}"

    def read(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.key(key))["Body"].read()

    def write(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(key), Body=data)

    def upload(self, key: str, path: str) -> None:
        self.client.upload_file(path, self.bucket, self.key(key))

    def keys(self) -> list[str]:
        """Every key under the prefix, relative to it."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else ""
        )
        start = len(self.prefix) + 1 if self.prefix else 0
        return [obj["Key"][start:] for page in pages for obj in page.get("Contents", [])]


def open_store(url: str, read_timeout: float = READ_TIMEOUT) -> LocalStore | S3Store:
    return S3Store(url, read_timeout) if is_remote(url) else LocalStore(url)


def _retryable_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (OSError, _Truncated)
    with contextlib.suppress(ImportError):
        from botocore.exceptions import BotoCoreError, ClientError

        errors += (BotoCoreError, ClientError)
    return errors


class _Truncated(Exception):
    pass


def _why(err: BaseException) -> str:
    response = getattr(err, "response", None)  # botocore's ClientError: the server's code and status
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code", "?")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        return f"{type(err).__name__} {code}, HTTP {status}"
    return f"{type(err).__name__}: {err}"


def store_problem(err: BaseException, url: str) -> str | None:
    """The line for an error of the S3 store itself, which no retry and no other key mends (credentials
    missing or refused, endpoint unreachable, bucket missing), read from ``err`` or what it was raised
    from (boto3's upload wraps botocore's ClientError); None for any other error."""
    try:
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )
    except ImportError:
        return None
    bucket = url[len("s3://") :].partition("/")[0]
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, NoCredentialsError | PartialCredentialsError):
            return (
                f"no S3 credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or"
                " AWS_PROFILE), and AWS_ENDPOINT_URL for a store other than AWS"
            )
        if isinstance(err, EndpointConnectionError):
            endpoint = urlsplit(err.kwargs.get("endpoint_url", ""))  # the request's URL: its server
            return (
                f"cannot connect to the S3 endpoint {endpoint.scheme}://{endpoint.netloc} for {url}: check"
                " AWS_ENDPOINT_URL and that the store is up"
            )
        if isinstance(err, ClientError):
            code = err.response.get("Error", {}).get("Code", "")
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket":
                return (
                    f"the S3 store has no bucket {bucket!r} ({url}): create it, or fix the bucket's name"
                    " (and AWS_ENDPOINT_URL)"
                )
            if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                return (
                    f"the S3 store refused {url} ({code or 'HTTP 403'}): check AWS_ACCESS_KEY_ID and"
                    " AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the bucket's permissions"
                )
        err = err.__cause__ or err.__context__
    return None


def read_with_retries(store, key: str, size: int | None, retries: int, backoff: float = 0.2) -> bytes:
    """``store.read(key)``, checked against its expected ``size``; up to ``retries`` attempts, doubling waits
    between them, then ``ShardError`` naming the shard and the last reason."""
    errors = _retryable_errors()
    last: BaseException | None = None
    for attempt in range(max(retries, 1)):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            data = store.read(key)
            if size is not None and len(data) != size:
                raise _Truncated(f"{len(data)} bytes where {INDEX} says {size}")
            return data
        except errors as err:
            last = err
    attempts = f"{max(retries, 1)} attempt{'s' if retries > 1 else ''}"
    raise ShardError(
        f"cannot read shard {store.name(key)} after {attempts} ({_why(last)}): check that the"
        " store is up and the shard is whole (re-run `python -m lit_ddp shard` into an empty DEST), then"
        " resume with --ckpt_path=last"
    ) from last  # the last reason, for read_manifest's line


def read_manifest(url: str, retries: int = 3, read_timeout: float = READ_TIMEOUT) -> dict:
    store = open_store(url, read_timeout)
    try:
        data = read_with_retries(store, MANIFEST, None, retries)
    except ShardError as err:
        # The store's own problem (credentials, endpoint, bucket) is not fixed by another --data.url.
        problem = store_problem(err.__cause__, url) if is_remote(url) else None
        raise ShardError(
            problem
            or f"no readable {MANIFEST} at {store.name(MANIFEST)}: point --data.url at a folder or s3://"
            " prefix written by `python -m lit_ddp shard SRC DEST`"
        ) from None
    return json.loads(data)


# ---- the node-local chunk cache ----------------------------------------------------------------------


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lit_ddp" / "shards"


@contextlib.contextmanager
def _locked(path: Path, wait: bool = True) -> Iterator[bool]:
    """Holds ``path``'s lock while inside; yields False, holding nothing, where ``wait`` is off and another
    process holds it."""
    with open(path, "a+") as f:
        if fcntl is not None:
            try:
                fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
        try:
            yield True
        finally:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_UN)


def map_file(path: Path) -> memoryview:
    with open(path, "rb") as f:
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


class ChunkCache:
    """Whole shards copied from a remote store to ``root`` (one folder per store URL), at most
    ``limit_bytes`` in all; the least recently opened shards are deleted first. A shard another rank of the
    node is downloading is waited for (its lock file), never fetched twice; a download lands under a
    temporary name and is renamed into place, so a reader never sees part of one. A shard is mapped while
    its lock is held and eviction passes over a locked shard, so another rank's eviction cannot delete a
    shard between its download and its mapping (a mapped shard stays readable once deleted: POSIX)."""

    def __init__(self, root: Path, url: str, limit_bytes: int) -> None:
        self.root = root / hashlib.sha1(url.encode()).hexdigest()[:16]
        self.limit_bytes = limit_bytes

    def open(self, store, key: str, size: int, retries: int, digest: str | None = None) -> memoryview:
        """Shard ``key`` mapped from its local copy, downloaded if missing. A shard with a ``digest`` (its
        SHA-1) is cached under it: shards written again under the same URL (labels fixed, say) have other
        contents at the same byte sizes, and a copy known only by name and size was read in their place."""
        target = self.root / key
        if digest is not None:
            target = target.with_name(f"{digest[:16]}.{target.name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with _locked(self._lock(target)):
            if target.is_file() and target.stat().st_size == size:
                os.utime(target)  # recently used
            else:
                data = read_with_retries(store, key, size, retries)
                partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
                partial.write_bytes(data)
                os.replace(partial, target)
            view = map_file(target)
        self._evict(keep=target)
        return view

    @staticmethod
    def _lock(shard: Path) -> Path:
        return shard.with_name(shard.name + ".lock")

    def _evict(self, keep: Path) -> None:
        """Deletes the least recently opened shards but ``keep`` (this process's newest) until the rest fit;
        ``keep`` may be gone already, evicted by another rank once its lock was released."""
        with _locked(self.root / ".evict.lock"):
            shards = sorted(((p.stat(), p) for p in self.root.rglob("*.mds")), key=lambda s: s[0].st_mtime)
            total = sum(stat.st_size for stat, _ in shards)
            for stat, p in shards:
                if total <= self.limit_bytes:
                    break
                if p == keep:
                    continue
                with _locked(self._lock(p), wait=False) as free:
                    if free:  # else being opened by another process: the next eviction looks again
                        p.unlink()
                        total -= stat.st_size


# ---- samples by global index ---------------------------------------------------------------------------


@dataclass
class Sample:
    image: memoryview
    label: int
    index: int
    path: str = ""  # ImageFolder shards: the file it was read from, relative to SRC


class ShardedSamples:
    """One split's samples by global index (0 .. len-1), read from their shards on demand.

    Picklable for DataLoader workers: each process opens (maps) the shards it reads itself, keeping at most
    ``open_shards`` mapped.
    """

    def __init__(
        self,
        url: str,
        split: str,
        cache_dir: Path | None = None,
        cache_limit_bytes: int = 50 << 30,
        retries: int = 4,
        open_shards: int = 8,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self.url, self.split, self.retries, self.open_shards = url, split, retries, open_shards
        self.store = open_store(url, read_timeout)
        index = json.loads(read_with_retries(self.store, f"{split}/{INDEX}", None, retries))
        self.shards = [
            (s["raw_data"]["basename"], s["raw_data"]["bytes"], s["samples"]) for s in index["shards"]
        ]
        bad = [s for s in index["shards"] if s.get("compression") or s["column_names"][:3] != list(COLUMNS)]
        if bad:
            raise ShardError(f"{self.store.name(split + '/' + INDEX)} holds shards lit_ddp did not write")
        # Variable-size columns (image, and path in ImageFolder shards) lead each sample with their sizes.
        self.header = (
            4 * sum(size is None for size in index["shards"][0]["column_sizes"]) if self.shards else 4
        )
        self.starts = np.cumsum([0] + [n for *_, n in self.shards]).tolist()
        # Each shard's SHA-1, which `shard` writes into the index (None in shards written before it did).
        self.digests = [(s["raw_data"].get("hashes") or {}).get("sha1") for s in index["shards"]]
        self.cache = (
            ChunkCache(cache_dir or default_cache_dir(), url, cache_limit_bytes) if is_remote(url) else None
        )
        self._open: OrderedDict[int, memoryview] = OrderedDict()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": OrderedDict()}

    def __len__(self) -> int:
        return self.starts[-1]

    def shard_sizes(self) -> list[int]:
        return [n for *_, n in self.shards]

    def _shard(self, s: int) -> memoryview:
        view = self._open.get(s)
        if view is not None:
            self._open.move_to_end(s)
            return view
        name, size, _ = self.shards[s]
        key = f"{self.split}/{name}"
        if self.cache is not None:
            view = self.cache.open(self.store, key, size, self.retries, self.digests[s])
        else:
            path = Path(self.store.name(key))
            if not path.is_file() or path.stat().st_size != size:
                read_with_retries(self.store, key, size, self.retries)  # retries, then names the shard
            view = map_file(path)
        self._open[s] = view
        while len(self._open) > self.open_shards:
            self._open.popitem(last=False)
        return view

    def __getitem__(self, index: int) -> Sample:
        s = bisect.bisect_right(self.starts, index) - 1
        data = self._shard(s)
        j = index - self.starts[s]
        # A shard of the right size can still hold garbage (a disk or copy error): every offset is checked
        # against the shard and the sample's own layout (the variable columns' sizes, the two int64s, the
        # path), so damage is one line naming the shard, not numpy's error from deep in a DataLoader.
        if 4 + 4 * (j + 2) > len(data):
            raise self._corrupt(s, j)
        begin, end = (int(v) for v in np.frombuffer(data, np.uint32, 2, 4 + 4 * j))
        if not begin + self.header <= end <= len(data):
            raise self._corrupt(s, j)
        sizes = np.frombuffer(data, np.uint32, self.header // 4, begin).tolist()
        size, length = sizes[0], sizes[1] if self.header == 8 else 0  # image; ImageFolder's path
        first = begin + self.header
        if end - first != size + 16 + length:
            raise self._corrupt(s, j)
        image = data[first : first + size]
        sample_index, label = np.frombuffer(data, np.int64, 2, first + size)
        path = ""
        if self.header == 8:  # ImageFolder shards: the file's relative path after the fixed columns
            try:
                path = bytes(data[first + size + 16 : end]).decode()
            except UnicodeDecodeError:
                raise self._corrupt(s, j) from None
        return Sample(image, int(label), int(sample_index), path)

    def _corrupt(self, s: int, j: int) -> ShardError:
        return ShardError(
            f"shard {self.store.name(self.split + '/' + self.shards[s][0])} is corrupt (its sample {j} does"
            " not fit the shard's layout): re-run `python -m lit_ddp shard` into an empty DEST, then resume"
            " with --ckpt_path=last"
        )


def read_image_bytes(image: memoryview) -> np.ndarray:
    """A writable uint8 copy of one encoded image (PIL and torch take it without further copies)."""
    return np.frombuffer(bytearray(image), np.uint8)


def chunk_window_order(
    shard_sizes: list[int], positions: np.ndarray, seed: int, epoch: int, window: int
) -> list[int]:
    """The training order of one epoch, as positions into ``positions`` (the global indices that make up
    the training set, ascending): shards permuted by (seed, epoch), samples shuffled inside each window of
    ``window`` shards of that permutation. Depends on nothing but its arguments."""
    g = torch.Generator().manual_seed(seed + epoch)
    starts = np.cumsum([0, *shard_sizes])
    # positions of each shard's samples: positions is sorted, so each shard's are one contiguous run
    bounds = np.searchsorted(positions, starts)
    chunks = torch.randperm(len(shard_sizes), generator=g).tolist()
    order: list[int] = []
    for w in range(0, len(chunks), max(window, 1)):
        pos = np.concatenate([np.arange(bounds[c], bounds[c + 1]) for c in chunks[w : w + window]])
        order += pos[torch.randperm(len(pos), generator=g).numpy()].tolist()
    return order


def decode_raw(image: memoryview, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.frombuffer(bytearray(image), dtype=torch.uint8).reshape(shape)


__all__ = [
    "ChunkCache",
    "ShardError",
    "ShardedSamples",
    "chunk_window_order",
    "decode_raw",
    "open_store",
    "read_manifest",
]
