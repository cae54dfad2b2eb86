"""The one way lit_ddp writes a file: a temporary file beside it, fsync, rename; a failure is one line.

A reader (a resumed run, a script reading predictions.csv, TensorBoard) sees the old file or the whole new
one, never half of one: a killed job leaves at worst a hidden ``.<name>.tmp-<pid>``, which the next write of
that name removes. A full disk, a quota, a file size limit, a read-only or unwritable folder raise
``WriteError``, a ``UserError`` naming the file and the fix, instead of an OSError traceback (torch's zip
writer wraps the OSError in a RuntimeError: it is found in the chain). docs/faults.md lists every writer.
"""

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from lit_ddp.errors import UserError

# What to do about each kind of failed write; any other OSError gets its own text and the generic advice.
ADVICE = {
    errno.ENOSPC: "free space on that disk",
    errno.EDQUOT: "free some of your quota",
    errno.EFBIG: "raise the file size limit (ulimit -f)",
    errno.EROFS: "remount it writable or pass --trainer.default_root_dir on a writable disk",
    errno.EACCES: "make it writable or pass --trainer.default_root_dir on a writable disk",
    errno.EPERM: "make it writable or pass --trainer.default_root_dir on a writable disk",
}


def os_error_in(exc: BaseException | None) -> OSError | None:
    """The OSError behind ``exc``: torch's zip writer reports a failed write as a RuntimeError raised while
    handling it ("unexpected pos ...")."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class WriteError(UserError):
    """A file lit_ddp writes could not be written: ``path``, what it is (``what``) and the ``os_error``."""

    def __init__(self, what: str, path: str | os.PathLike, os_error: OSError) -> None:
        self.what, self.path, self.os_error = what, Path(path), os_error
        reason = os_error.strerror or type(os_error).__name__
        advice = ADVICE.get(os_error.errno, "fix the disk")
        super().__init__(f"could not write {what} {path} ({reason}): {advice}, then run it again")


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable (POSIX); not possible on every platform/filesystem.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, what: str, mode: str = "wb", **open_args) -> Iterator[IO]:
    """A file object whose contents become ``path`` when the block ends; nothing changes at ``path`` if it
    raises. ``what`` names the file in the line a failed write gives (``WriteError``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, mode, **open_args) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        failed = None if isinstance(err, UserError) else os_error_in(err)
        if failed is None:
            raise
        raise WriteError(what, path, failed) from None
    _fsync_dir(path.parent)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by an earlier writer that was killed
        with contextlib.suppress(OSError):
            stale.unlink()


def write_file(path: str | os.PathLike, data: str | bytes, what: str) -> None:
    """``data`` (text as UTF-8) atomically at ``path``: see ``atomic_file``."""
    with atomic_file(path, what) as f:
        f.write(data.encode() if isinstance(data, str) else data)
