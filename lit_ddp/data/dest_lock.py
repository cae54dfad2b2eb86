"""One ``shard`` run at a time per DEST: a second run into the same folder or S3 prefix is refused.

Two runs into one DEST would each start over the other's work folder (locally: a ``FileExistsError`` in one
of them), or both upload and both report success while the store holds a mix of the two (S3). Each run
takes DEST's lock before it looks at DEST, and holds it until its manifest is published:

* **A folder**: ``DEST/.lit_ddp-lock``, held with ``flock``. The kernel releases it when the process ends,
  however it ends (SIGKILL, a lost node on a local disk), so a dead run never blocks the next one. NFS
  carries ``flock`` as a POSIX lock (Linux ≥ 2.6.12). Where there is no ``flock`` (Windows, Lustre mounted
  without ``-o flock``), the file is created exclusively and its existence is the lock, as on S3.
* **An S3 prefix**: the object ``.lit_ddp-lock`` under it, created with a conditional put (``If-None-Match:
  *``): the store creates it for one run only and answers the others 412. It names its holder (host, pid,
  start). A run that ends, also by Ctrl-C or SIGTERM, deletes it; one killed outright leaves it, and the
  line says to delete it. A store that does not implement conditional puts (HTTP 501) gets a plain put,
  and the run reads the object back before it uploads and before it publishes: it stops if another run
  has written its own there since.
"""

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: the lock file's existence is the lock
    fcntl = None

from lit_ddp.errors import UserError

LOCK = ".lit_ddp-lock"


def _holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}"


def _busy(dest: str, holder: str, then: str = "") -> UserError:
    return UserError(
        f"another shard run is writing into {dest} ({holder or 'holder unknown'}): wait for it to end, or"
        f" pass another DEST{then}"
    )


def _flock(fd: int) -> bool | None:
    """True: locked; False: another process holds it; None: no file locks here (Windows, Lustre mounted
    without ``-o flock``)."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return None


@contextlib.contextmanager
def local_lock(dest: Path) -> Iterator[None]:
    """Hold ``dest/.lit_ddp-lock`` (``dest`` exists); removed on the way out, so a finished DEST holds only
    the shards. Where ``flock`` works, a lock file left by a killed run is taken over; where it does not,
    the file's existence is the lock (created exclusively) and a killed run's must be deleted by hand."""
    path = dest / LOCK
    while True:
        try:
            fd, created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            try:
                fd, created = os.open(path, os.O_RDWR), False
            except FileNotFoundError:  # its holder removed it just now: try again
                continue
        try:
            locked = _flock(fd)
            if locked is False or (locked is None and not created):
                holder = os.read(fd, 512).decode(errors="replace").strip()
                stale = f"; if none is running, delete {path}" if locked is None else ""
                raise _busy(str(dest), holder, stale)
            # flock holds the file, not the path: go on only if it is still the one at the path
            if locked is None or _same_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, _holder().encode())
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _status(err: BaseException) -> int | None:
    response = getattr(err, "response", None)  # botocore's ClientError: the server's answer
    return response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(response, dict) else None


@contextlib.contextmanager
def store_lock(store) -> Iterator[Callable[[], None]]:
    """Hold ``.lit_ddp-lock`` under an ``S3Store``'s prefix; yields a check that the lock is still this
    run's (called before uploading and before publishing). boto3's errors pass through to the caller."""
    from botocore.exceptions import BotoCoreError, ClientError

    token = f"{_holder()}, run {uuid.uuid4().hex[:12]}"
    put = {"Bucket": store.bucket, "Key": store.key(LOCK), "Body": token.encode()}
    stale = f"; if none is running, delete {store.name(LOCK)}"
    try:
        store.client.put_object(**put, IfNoneMatch="*")
    except ClientError as err:
        status = _status(err)
        if status == 501:  # conditional puts not implemented: held by reading back (module docstring)
            store.client.put_object(**put)
        elif status in (409, 412):  # 412: the object exists; 409: another put of it is under way
            holder = ""
            with contextlib.suppress(ClientError):
                holder = store.read(LOCK).decode(errors="replace")
            raise _busy(store.url, holder, stale) from None
        else:
            raise

    def check() -> None:
        holder = store.read(LOCK).decode(errors="replace")
        if holder != token:
            raise _busy(store.url, holder, f"; this run stopped and published nothing{stale}")

    try:
        yield check
    finally:
        with contextlib.suppress(BotoCoreError, ClientError):
            if store.read(LOCK).decode(errors="replace") == token:
                store.client.delete_object(Bucket=store.bucket, Key=store.key(LOCK))
