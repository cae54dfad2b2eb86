"""The one way lit_ddp writes a file: a temporary file beside it, fsync, rename; a failure is one line.

A reader (a resumed run, a script reading predictions.csv, TensorBoard) sees the old file or the whole new
one, never half of one: a killed job leaves at worst a hidden ``.<name>.tmp-<host>-<pid>``, which the next
write of that name on that host removes once that process is gone. In a folder that several nodes share, a
pid names no process on another host: its temporary files are its own to remove, so two writers never
share one, nor remove each other's. A full disk, a quota, a file size limit, a read-only or unwritable
folder raise ``WriteError``, a ``UserError`` naming the file and the fix (``advice``: the fix on that disk,
then the option that puts the file elsewhere), instead of an OSError traceback (torch's zip writer wraps
the OSError in a RuntimeError: it is found in the chain). A lock, whose creation is the claim, cannot be a
rename: ``create_file`` makes it with O_EXCL and fails the same way. docs/faults.md lists every writer."""

import contextlib
import errno
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from lit_ddp.errors import UserError, exception_chain

# What to do about each kind of failed write on that disk; any other OSError: its own text, "fix the disk".
ADVICE = {
    errno.ENOSPC: "free space on that disk",
    errno.EDQUOT: "free some of your quota",
    errno.EFBIG: "raise the file size limit (ulimit -f)",
    errno.EROFS: "remount it writable",
    errno.EACCES: "make it writable",
    errno.EPERM: "make it writable",
    errno.ENOTDIR: "move away the file that stands in place of a folder on that path",
}
# Which other place helps: none for a file size limit, which is the process's wherever it writes.
_ELSEWHERE = {
    errno.ENOSPC: "on another disk",
    errno.EDQUOT: "on another disk",
    errno.EFBIG: None,
    errno.EROFS: "on a writable disk",
    errno.EACCES: "you can write to",
    errno.EPERM: "you can write to",
    errno.ENOTDIR: "in another folder",
}
# Where a run's files go: what a writer of the run folder offers as the other place.
RUN_FOLDER = "--trainer.default_root_dir"


def advice(err: OSError, elsewhere: str | None = RUN_FOLDER) -> str:
    """What to do about the failed write ``err``: its fix on that disk, then, where ``elsewhere`` names the
    option or argument that chooses the place, passing it another one."""
    fix = ADVICE.get(err.errno, "fix the disk")
    place = _ELSEWHERE.get(err.errno, "on another disk")
    return fix if elsewhere is None or place is None else f"{fix}, or pass {elsewhere} {place}"


def os_error_in(exc: BaseException | None) -> OSError | None:
    """The OSError behind ``exc``: torch's zip writer reports a failed write as a RuntimeError raised while
    handling it ("unexpected pos ...")."""
    return next((e for e in exception_chain(exc) if isinstance(e, OSError)), None)


class WriteError(UserError):
    """A file lit_ddp writes could not be written: ``path``, what it is (``what``) and the ``os_error``;
    ``elsewhere``: the option that puts it on another disk (``advice``)."""

    def __init__(
        self, what: str, path: str | os.PathLike, os_error: OSError, elsewhere: str | None = RUN_FOLDER
    ) -> None:
        self.what, self.path, self.os_error = what, Path(path), os_error
        reason = os_error.strerror or type(os_error).__name__
        super().__init__(
            f"could not write {what} {path} ({reason}): {advice(os_error, elsewhere)}, then run it again"
        )


@contextlib.contextmanager
def _failing_as(what: str, path: str | os.PathLike, elsewhere: str | None = RUN_FOLDER) -> Iterator[None]:
    """An OSError raised inside (or behind what is raised inside) as ``WriteError`` naming ``path``: the
    failure handling of ``atomic_file`` and ``create_file``."""
    try:
        yield
    except BaseException as err:
        failed = None if isinstance(err, UserError) else os_error_in(err)
        if failed is None:
            raise
        raise WriteError(what, path, failed, elsewhere) from None


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


def _temporary_prefix(path: Path) -> str:
    """``.<name>.tmp-<host>-``: this host's temporary files of ``path`` end in their writer's pid."""
    return f".{path.name}.tmp-{socket.gethostname().replace(os.sep, '_')}-"


def gone(pid: int) -> bool:
    """Whether no process has this pid (on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        pass
    return False


def _remove_stale(path: Path) -> None:
    """This host's temporary files of ``path`` whose writer was killed; a live writer's, and other hosts',
    stay."""
    prefix = _temporary_prefix(path)
    for stale in path.parent.glob(f"{prefix}*"):
        pid = stale.name[len(prefix) :]
        if pid.isdigit() and gone(int(pid)):
            with contextlib.suppress(OSError):
                stale.unlink()


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike, what: str, mode: str = "wb", elsewhere: str | None = RUN_FOLDER, **open_args
) -> Iterator[IO]:
    """A file object whose contents become ``path`` when the block ends; nothing changes at ``path`` if it
    raises. ``what`` names the file in the line a failed write gives (``WriteError``), ``elsewhere`` the
    option that puts it on another disk."""
    path = Path(path)
    tmp = path.with_name(f"{_temporary_prefix(path)}{os.getpid()}")
    try:
        with _failing_as(what, path, elsewhere):
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, mode, **open_args) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    _remove_stale(path)


def write_file(
    path: str | os.PathLike, data: str | bytes, what: str, elsewhere: str | None = RUN_FOLDER
) -> None:
    """``data`` (text as UTF-8) atomically at ``path``: see ``atomic_file``."""
    with atomic_file(path, what, elsewhere=elsewhere) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def create_file(path: str | os.PathLike, data: str, what: str, elsewhere: str | None = RUN_FOLDER) -> None:
    """A new file at ``path`` holding ``data``; FileExistsError, as itself, where one is there already. For
    a lock, whose creation is the claim (so not a rename); a failed write removes the file it created."""
    path = Path(path)
    with _failing_as(what, path, elsewhere):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            f = open(path, "x")
        except FileExistsError:  # a name taken, not a disk fault: the caller's to handle
            f = None
        if f is not None:
            try:
                with f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except BaseException:
                with contextlib.suppress(OSError):
                    path.unlink()
                raise
    if f is None:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
