"""A full disk, a quota or a read-only remount during a run: one line, and what survived.

A checkpoint write that fails with ENOSPC or EROFS would end the run in chained tracebacks: torch's writer
wraps the OSError in a RuntimeError, Lightning's teardown flushes TensorBoard into the same full disk and
raises again, and TensorBoard's background writer thread dies with a traceback of its own. Checkpoint writes
are atomic (checkpoint_io.py), so the previous ``last.ckpt`` is intact; the line says so, and which path could
not be written.
"""

import contextlib
import struct
from pathlib import Path

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from lit_ddp.compat import hand_event_write_errors_to
from lit_ddp.errors import UserError
from lit_ddp.writes import advice


def write_error(err: OSError, what: str, path: str | Path, checkpoints: Path | None) -> UserError:
    """The line for a failed write of ``what`` at ``path``, naming the run's ``last.ckpt`` in the folder
    ``checkpoints`` if one is there to resume from."""
    reason = err.strerror or type(err).__name__
    last = checkpoints / "last.ckpt" if checkpoints is not None else None
    if last is not None and last.is_file():
        # The resume finds last.ckpt under this run's folder: the fix is on that disk, not another folder.
        kept, then = f"the run stops; its previous {last} is intact", "resume with --ckpt_path=last"
        fix = advice(err, None)
    else:
        kept, then, fix = "the run stops before its first checkpoint", "run it again", advice(err)
    return UserError(f"could not write {what} {path} ({reason}): {kept}; {fix}, then {then}")


def holds_no_events(path: Path) -> bool:
    """Whether the TensorBoard event file ``path`` holds its header alone: one TFRecord (length, its CRC, the
    data, its CRC) whose event is the file version every writer opens its file with."""
    from tensorboard.compat.proto.event_pb2 import Event  # at the run's end: not an import of the CLI's

    data = path.read_bytes() if path.stat().st_size < 1024 else b""
    if len(data) < 12:
        return False
    (length,) = struct.unpack("<Q", data[:8])
    return len(data) == 12 + length + 4 and Event.FromString(data[12 : 12 + length]).HasField("file_version")


class WriteSafeTensorBoardLogger(TensorBoardLogger):
    """Lightning's TensorBoardLogger whose failed writes end the run with one line, and whose event file is
    removed at the end if nothing was logged to it.

    Fork of ``lightning.pytorch.loggers.TensorBoardLogger``: a failed write ends the run in tracebacks from
    its writer thread and every later flush; goes when it raises the first OSError once.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._write_failed: OSError | None = None
        self._guarded = False
        self._opened: set[Path] | None = None  # the event file its writer opened (rank 0)

    def _event_files(self) -> set[Path]:
        return set(Path(self.log_dir).glob("events.out.tfevents.*"))

    @property
    def experiment(self):
        # Lightning opens the writer (and its event file) at set-up, before a resume is checked: a resume
        # refused there, or one with nothing left to train, would add an empty file to the run's folder.
        first = self._opened is None and rank_zero_only.rank == 0
        before = self._event_files() if first else set()
        writer = super().experiment
        if first:
            self._opened = self._event_files() - before
        if not self._guarded and getattr(writer, "file_writer", None) is not None:
            # TensorBoard writes events from a thread of its own, which dies with a printed traceback on an
            # OSError; the error is kept instead, and the next log call on the main thread reports it.
            self._guarded = hand_event_write_errors_to(writer, self._on_write_error)
        return writer

    def _on_write_error(self, err: OSError) -> None:
        self._write_failed = self._write_failed or err

    def _check(self) -> None:
        if self._write_failed is not None:
            checkpoints = Path(self.log_dir) / "checkpoints"
            raise write_error(self._write_failed, "TensorBoard events in", self.log_dir, checkpoints)

    def _guard(self, method, *args, **kwargs):
        self._check()
        try:
            return method(*args, **kwargs)
        except OSError as err:
            self._on_write_error(err)
        self._check()

    def log_metrics(self, *args, **kwargs) -> None:
        self._guard(super().log_metrics, *args, **kwargs)

    def log_hyperparams(self, *args, **kwargs) -> None:
        self._guard(super().log_hyperparams, *args, **kwargs)

    def save(self) -> None:
        self._guard(super().save)

    def finalize(self, status: str) -> None:
        if status == "success":
            self._guard(super().finalize, status)
        else:
            try:  # the run is failing already, and says why: a flush into the same full disk adds nothing
                super().finalize(status)
            except (OSError, UserError):
                pass
        for path in self._opened or ():  # closed now: a later write opens a new file
            with contextlib.suppress(OSError):  # a folder gone or read-only: the run's own line says why
                if holds_no_events(path):
                    path.unlink()
