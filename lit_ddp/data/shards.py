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
than its index says, other bytes than the SHA-1 its index records) is tried ``retries`` times with
backoff, then fails with one line naming it (``ShardError``); a file missing from a local folder is looked
for twice more within a second (``LocalStore.missing_waits``), then named.

Every byte read is checked against what the index promises, so damage is one line naming the file and
"re-shard", never a traceback or a silent wrong: ``lit_ddp.json`` and ``index.json`` must parse and hold
the fields lit_ddp writes; the columns must be lit_ddp's, with their encodings (bytes, int, str: any other
is refused before a shard is read, so a ``pkl`` column is never unpickled); each sample's offsets and sizes
must fit its shard; and each shard's bytes must match its SHA-1, verified once per node for each version
of the file (``verified``: a seal beside the node cache's copy, or under the cache folder for local
shards, records the file's size, times and inode with the digest).

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
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
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
from lit_ddp.writes import WriteError, write_file

MANIFEST = "lit_ddp.json"
INDEX = "index.json"
PARTIAL = ".lit_ddp-partial"  # where `shard` writes until it completes, inside DEST
# MDS columns, in the order MDS stores them (sorted by name): variable-size first as uint32 sizes.
COLUMNS = {"image": "bytes", "index": "int", "label": "int"}
FOLDER_COLUMNS = {**COLUMNS, "path": "str"}  # ImageFolder shards also keep each file's relative path
SPLITS = ("train", "val", "test")
# Each column's MDS encoding and fixed size (None: variable, a uint32 size leads the sample).
LAYOUTS = {
    tuple(columns): ([columns[c] for c in columns], [None if columns[c] != "int" else 8 for c in columns])
    for columns in (COLUMNS, FOLDER_COLUMNS)
}
RESHARD = "re-shard: run `python -m lit_ddp shard` again into an empty DEST"


class ShardError(UserError):
    """A shard (or the manifest) that cannot be read after the retries: one line naming it."""


# ---- stores: a local folder or an S3-compatible bucket ---------------------------------------------


def is_remote(url: str) -> bool:
    return url.startswith("s3://")


# A URL's scheme at the start of a location (two characters or more: a drive letter, C:, is a path).
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")


def check_url_form(url: str, named: str) -> None:
    """Refuse a location that names a store lit_ddp does not read or write (gs://, S3://, s3:/): taken as a
    local path, ``shard`` wrote a folder named `S3:` in the working directory while the user took the shards
    for uploaded, and a data module looked for them there. ``named``: the location as the user wrote it."""
    scheme = SCHEME.match(url)
    if scheme and not is_remote(url):
        raise UserError(
            f"{named} is not an s3:// URL (it would be a local folder named {scheme.group(0)}): pass"
            f" s3://bucket/prefix (S3 or a store compatible with it), or ./{url} for a local folder"
        )


class LocalStore:
    """Files under a folder (local disk or a shared file system)."""

    # Seconds before each new look for a missing file, whatever --data.retries: on NFS or Lustre a file
    # another node wrote can take a moment to show, while S3's backoff would keep a wrong path waiting.
    missing_waits = (0.25, 0.5)

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
    errors: tuple[type[BaseException], ...] = (OSError, _Truncated, _Altered)
    with contextlib.suppress(ImportError):
        from botocore.exceptions import BotoCoreError, ClientError

        errors += (BotoCoreError, ClientError)
    return errors


class _Truncated(Exception):
    pass


class _Altered(Exception):
    """A shard's bytes whose SHA-1 is not the one its index records."""


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


def read_with_retries(
    store, key: str, size: int | None, retries: int, backoff: float = 0.2, digest: str | None = None
) -> bytes:
    """``store.read(key)``, checked against its expected ``size`` and SHA-1 ``digest``; up to ``retries``
    attempts, doubling waits between them (a file missing from a folder: the store's ``missing_waits``),
    then ``ShardError`` naming the shard and the last reason."""
    errors = _retryable_errors()
    last: BaseException | None = None
    wait, waits = 0.0, None  # before the next attempt; the missing file's waits, where one is missing
    for attempt in range(max(retries, 1)):
        if attempt:
            time.sleep(wait)
        try:
            data = store.read(key)
            if size is not None and len(data) != size:
                raise _Truncated(f"{len(data)} bytes where {INDEX} says {size}")
            if digest is not None and hashlib.sha1(data).hexdigest() != digest:
                raise _Altered()
            return data
        except errors as err:
            last = err
        waits = getattr(store, "missing_waits", None) if isinstance(last, FileNotFoundError) else None
        if waits is not None and attempt == len(waits):
            break
        wait = backoff * 2**attempt if waits is None else waits[attempt]
    attempts = f"{attempt + 1} attempt{'s' if attempt else ''}"
    if waits is not None:
        raise ShardError(
            f"shard {store.name(key)} is missing ({attempts}): it was moved or deleted since `shard` wrote"
            f" it; put it back, or {RESHARD}; then resume with --ckpt_path=last"
        ) from last  # the reason, for read_before_training's line
    if isinstance(last, _Altered):
        raise ShardError(
            f"shard {store.name(key)} does not match the SHA-1 its {INDEX} records ({attempts}): the store"
            f" holds other bytes than `shard` wrote; {RESHARD}"
        )
    raise ShardError(
        f"cannot read shard {store.name(key)} after {attempts} ({_why(last)}): check that the"
        " store is up and the shard is whole (re-run `python -m lit_ddp shard` into an empty DEST), then"
        " resume with --ckpt_path=last"
    ) from last  # the last reason, for read_manifest's line


def read_before_training(store, key: str, retries: int, url: str, said: Callable[[str], str]) -> bytes:
    """``read_with_retries`` for a file read before the first step (the manifest, a split's index), whose
    failure is not a shard's (``read_with_retries`` says to resume): the store's own problem (credentials,
    endpoint, bucket), which another --data.url does not fix, else ``said(why)``."""
    try:
        return read_with_retries(store, key, None, retries)
    except ShardError as err:
        problem = store_problem(err.__cause__, url) if is_remote(url) else None
        raise ShardError(problem or said(_why(err.__cause__))) from None


def _no_manifest(url: str, name: str) -> str:
    """The line for a --data.url with no manifest, saying what a local folder there is instead: the three
    folders users point it at by mistake are one split of the shards, an interrupted ``shard``'s DEST and
    the image folder itself."""
    said = f"no readable {MANIFEST} at {name}"
    folder = None if is_remote(url) else Path(url)
    if folder is not None and (folder / INDEX).is_file() and (folder.parent / MANIFEST).is_file():
        shards = folder.parent
        return f"{said}: {url} is the {folder.name} split of the shards at {shards}: pass --data.url={shards}"
    if folder is not None and (folder / PARTIAL).is_dir():
        return (
            f"{said}: {url} holds an interrupted `shard` run's {PARTIAL} (it writes {MANIFEST} last): run"
            f" `python -m lit_ddp shard SRC {url}` again to complete it"
        )
    if folder is not None and (folder / "train").is_dir() and not (folder / "train" / INDEX).is_file():
        return (
            f"{said}: {url} is an image folder, not shards: shard it (`python -m lit_ddp shard {url} DEST`,"
            f" then --data.url=DEST), or train from it as it is with --data=ImageNetDataModule"
            f" --data.data_dir={url}"
        )
    return (
        f"{said}: point --data.url at a folder or s3:// prefix written by `python -m lit_ddp shard SRC DEST`"
    )


def read_manifest(url: str, retries: int = 3, read_timeout: float = READ_TIMEOUT) -> dict:
    store = open_store(url, read_timeout)
    data = read_before_training(
        store,
        MANIFEST,
        retries,
        url,
        lambda why: _no_manifest(url, store.name(MANIFEST)),
    )
    manifest = parse_json(data, store.name(MANIFEST))
    try:
        shape = manifest["image_shape"]
        fits = (
            isinstance(manifest["splits"], dict)
            and {"train"} <= set(manifest["splits"]) <= set(SPLITS)
            and all(isinstance(s["samples"], int) for s in manifest["splits"].values())
            and isinstance(manifest["kind"], str)
            and len(manifest["class_names"]) > 0
            and all(isinstance(name, str) for name in manifest["class_names"])
            and manifest["encoding"] in ("raw", "file")
            and (manifest["encoding"] == "file" or _is_shape(shape))
        )
    except (KeyError, TypeError):
        fits = False
    if not fits:
        raise ShardError(
            f"{store.name(MANIFEST)} lacks the fields `python -m lit_ddp shard` writes: {RESHARD}"
        )
    return manifest


def _is_shape(shape) -> bool:
    return isinstance(shape, list) and len(shape) == 3 and all(isinstance(n, int) and n > 0 for n in shape)


def parse_json(data: bytes, name: str):
    """``data`` as JSON, or one line naming the file ``name`` (a disk or copy error, an edit)."""
    try:
        return json.loads(data)
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ShardError(f"{name} is not valid JSON ({type(err).__name__}): {RESHARD}") from None


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


def _seal(path: Path, digest: str) -> str:
    """What a seal records: the digest and this version of the file (any write changes its mtime and ctime,
    a replacement its inode)."""
    st = path.stat()
    return f"{digest} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}\n"


def _write_seal(path: Path, digest: str, seal: Path) -> None:
    write_file(seal, _seal(path, digest), "the seal", elsewhere="--data.cache_dir")


def verified(path: Path, digest: str, seal: Path) -> bool:
    """Whether the file at ``path`` holds the bytes of SHA-1 ``digest``. The file is hashed only where
    ``seal`` does not record this version of it as verified, and sealed when it matches; a seal that cannot
    be written (a read-only cache folder) costs a hash at the next open, nothing else. The caller holds the
    seal's lock, so one process of a node hashes while the others wait for its seal."""
    with contextlib.suppress(OSError):
        if seal.read_text() == _seal(path, digest):
            return True
    if hashlib.sha1(map_file(path)).hexdigest() != digest:
        return False
    with contextlib.suppress(WriteError):
        _write_seal(path, digest, seal)
    return True


class CacheWriteError(ShardError):
    """The node cache's folder cannot be written (full, read-only, no permission)."""

    def __init__(self, root: Path, err: OSError) -> None:
        super().__init__(
            f"cannot write the node cache {root} ({err.strerror or type(err).__name__}): pass"
            " --data.cache_dir=<a writable folder with room> (or free space there, or lower"
            " --data.cache_limit_gb)"
        )


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
        contents at the same byte sizes, and a copy known only by name and size was read in their place.
        A download is checked against the digest before it lands; a copy whose bytes changed since (a disk
        error, an edit) is downloaded again, and refused if the store's bytes do not match either."""
        target = self.root / key
        if digest is not None:
            target = target.with_name(f"{digest[:16]}.{target.name}")
        seal = self._seal(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with _locked(self._lock(target)):
                whole = target.is_file() and target.stat().st_size == size
                if whole and (digest is None or verified(target, digest, seal)):
                    os.utime(target)  # recently used; its seal follows the new times
                else:
                    target.unlink(missing_ok=True)  # a damaged copy is never read again
                    data = read_with_retries(store, key, size, retries, digest=digest)
                    write_file(target, data, "the cached shard", elsewhere="--data.cache_dir")
                if digest is not None:
                    _write_seal(target, digest, seal)
                view = map_file(target)
            self._evict(keep=target)
        except WriteError as err:
            raise CacheWriteError(self.root, err.os_error) from None
        except OSError as err:
            raise CacheWriteError(self.root, err) from None
        return view

    @staticmethod
    def _seal(shard: Path) -> Path:
        return shard.with_name(shard.name + ".sha1")

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
                        self._seal(p).unlink(missing_ok=True)
                        total -= stat.st_size


# ---- samples by global index ---------------------------------------------------------------------------


def _is_count(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def read_index(index, name: str) -> tuple[list[tuple[str, int, int]], list[int | None], list[str | None]]:
    """One split's ``index.json`` (parsed), checked against what lit_ddp writes: (basename, bytes, samples)
    per shard, the column sizes, each shard's SHA-1 (None where absent). One line naming ``name`` for an
    index of another shape, another writer's columns, or a basename that is not a plain file name (it would
    be read, or cached, outside the split's folder)."""
    try:
        entries = index["shards"]
        shards = [(e["raw_data"]["basename"], e["raw_data"]["bytes"], e["samples"]) for e in entries]
        digests = [(e["raw_data"].get("hashes") or {}).get("sha1") for e in entries]
        keys = ("column_names", "column_encodings", "column_sizes")
        columns = {tuple(tuple(e[k]) for k in keys) for e in entries}
        written = {(e.get("format"), e.get("compression")) for e in entries}
    except (KeyError, TypeError, AttributeError):
        raise ShardError(f"{name} lacks the fields of an MDS index: {RESHARD}") from None
    plain = all(
        isinstance(base, str)
        and base == os.path.basename(base)
        and base.endswith(".mds")
        and not base.startswith(".")
        and _is_count(n)
        and _is_count(size)
        and size >= 4 * (n + 2)  # the count and n + 1 offsets
        for base, size, n in shards
    ) and all(d is None or (isinstance(d, str) and len(d) == 40) for d in digests)
    if not plain:
        raise ShardError(f"{name} names shards or sizes `python -m lit_ddp shard` does not write: {RESHARD}")
    if written - {("mds", None)}:
        raise ShardError(f"{name} holds shards lit_ddp did not write (compressed, or not MDS): {RESHARD}")
    layouts = {(names, tuple(enc), tuple(sizes)) for names, (enc, sizes) in LAYOUTS.items()}
    if len(columns) > 1 or columns - layouts:
        names, encodings, _ = sorted(columns, key=str)[0]
        found = ", ".join(f"{c}: {e}" for c, e in zip(names, encodings, strict=False))
        # Only bytes, int and str columns are read, as bytes: a pkl column (pickles) is refused here, before
        # any shard is read, and never unpickled.
        raise ShardError(
            f"{name} holds columns lit_ddp does not read ({found}; it reads image: bytes, index: int, label:"
            f" int and path: str): {RESHARD}"
        )
    sizes = list(next(iter(columns))[2]) if columns else [None]
    return shards, sizes, digests


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
        name = self.store.name(f"{split}/{INDEX}")
        check = "check that the store is up; if it is, " if is_remote(url) else ""
        data = read_before_training(
            self.store,
            f"{split}/{INDEX}",
            retries,
            url,
            lambda why: (
                f"cannot read {name}, the {split} split's index ({why}): {check}the shards at {url}"
                f" are not whole; {RESHARD}"
            ),
        )
        self.shards, layout, self.digests = read_index(parse_json(data, name), name)
        # Variable-size columns (image, and path in ImageFolder shards) lead each sample with their sizes.
        self.header = 4 * sum(size is None for size in layout)
        self.starts = np.cumsum([0] + [n for *_, n in self.shards]).tolist()
        cache_dir = cache_dir or default_cache_dir()
        self.cache = ChunkCache(cache_dir, url, cache_limit_bytes) if is_remote(url) else None
        # Local shards are read in place; their seals (``verified``) live in the cache folder.
        self.seals = cache_dir / hashlib.sha1(os.path.abspath(url).encode()).hexdigest()[:16]
        self._open: OrderedDict[int, memoryview] = OrderedDict()
        self._checked: set[int] = set()  # local shards this process verified: one hash, even with no seal

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": OrderedDict(), "_checked": set()}

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
            if s not in self._checked and self.digests[s] is not None:
                if not self._verified_in_place(path, key, self.digests[s]):
                    raise ShardError(
                        f"shard {path} does not match the SHA-1 its {INDEX} records (its bytes changed since"
                        f" `shard` wrote it: a disk or copy error, an edit): {RESHARD}"
                    )
                self._checked.add(s)
            view = map_file(path)
        self._open[s] = view
        while len(self._open) > self.open_shards:
            self._open.popitem(last=False)
        return view

    def _verified_in_place(self, path: Path, key: str, digest: str) -> bool:
        seal = self.seals / f"{key}.sha1"
        with contextlib.ExitStack() as lock:
            with contextlib.suppress(OSError):  # no seal where the cache folder cannot be written
                seal.parent.mkdir(parents=True, exist_ok=True)
                lock.enter_context(_locked(seal.with_name(seal.name + ".lock")))
            return verified(path, digest, seal)

    def __getitem__(self, index: int) -> Sample:
        s = bisect.bisect_right(self.starts, index) - 1
        data = self._shard(s)
        j = index - self.starts[s]
        # A shard of the right size can still hold garbage (a disk or copy error): every offset is checked
        # against the shard and the sample's own layout (the variable columns' sizes, the two int64s, the
        # path), so damage is one line naming the shard, not numpy's error from deep in a DataLoader.
        if 4 + 4 * (j + 2) > len(data):
            raise self.corrupt(index)
        begin, end = (int(v) for v in np.frombuffer(data, np.uint32, 2, 4 + 4 * j))
        if not begin + self.header <= end <= len(data):
            raise self.corrupt(index)
        sizes = np.frombuffer(data, np.uint32, self.header // 4, begin).tolist()
        size, length = sizes[0], sizes[1] if self.header == 8 else 0  # image; ImageFolder's path
        first = begin + self.header
        if end - first != size + 16 + length:
            raise self.corrupt(index)
        image = data[first : first + size]
        sample_index, label = np.frombuffer(data, np.int64, 2, first + size)
        path = ""
        if self.header == 8:  # ImageFolder shards: the file's relative path after the fixed columns
            try:
                path = bytes(data[first + size + 16 : end]).decode()
            except UnicodeDecodeError:
                raise self.corrupt(index) from None
        return Sample(image, int(label), int(sample_index), path)

    def corrupt(self, index: int, why: str = "does not fit the shard's layout") -> ShardError:
        """The line for sample ``index`` (global), damaged in a way ``why`` says: it names the shard."""
        s = bisect.bisect_right(self.starts, index) - 1
        return ShardError(
            f"shard {self.store.name(self.split + '/' + self.shards[s][0])} is corrupt (its sample"
            f" {index - self.starts[s]} {why}): {RESHARD}, then resume with --ckpt_path=last"
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
