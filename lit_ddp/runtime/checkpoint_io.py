"""Checkpoint files that survive crashes, and load safely or fail with one clear error.

* Writes are atomic: the checkpoint streams into a hidden temporary file *in the target directory*, is
  fsync-ed, then ``os.replace``-d over the target (and the directory fsync-ed). A job killed mid-write
  leaves the previous ``last.ckpt`` intact, plus at worst a stray ``.last.ckpt.tmp-<host>-<pid>`` that the
  next successful write of that name on that host removes. Lightning's own local save serialises the whole
  checkpoint into memory, writes it to the *system* temp dir (fsspec transaction) and ``shutil.move``-s it:
  on a cluster, where /tmp is a local disk and checkpoints live on a shared filesystem, that move is a copy,
  and a crash during it truncates the target; nothing is fsync-ed; a small /tmp fails large checkpoints.
* Reads use ``torch.load(weights_only=True)``: a checkpoint cannot run code when it is loaded. lit_ddp's
  own hyperparameter types are allow-listed. A missing, truncated or foreign file, or one that pickles
  other objects, is a ``UserError`` naming it.
"""

import os
import pathlib
import pickle
import zipfile
from pathlib import Path
from typing import Any

import fsspec
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lit_ddp.errors import UserError
from lit_ddp.models.optim import OptimConfig
from lit_ddp.runtime.write_errors import checkpoint_write_error
from lit_ddp.writes import WriteError, atomic_file

# Types that the hyperparameters of older checkpoints hold (an OptimConfig or a Path passed from Python);
# lit_ddp now writes them as plain data (utils.plain_data). Everything else is tensors and plain containers.
SAFE_GLOBALS = [OptimConfig, pathlib.PosixPath, pathlib.PurePosixPath, pathlib.WindowsPath]


def allow_checkpoint_globals() -> None:
    """Lets every weights-only load of this process read those types: LightningCLI's own ``torch.load`` of
    ``--ckpt_path``'s hyperparameters among them. Process-wide, so the CLI does it, not an import."""
    torch.serialization.add_safe_globals(SAFE_GLOBALS)


def is_local_path(path) -> bool:
    """Atomic writes apply to local paths; remote (fsspec) ones keep Lightning's own writer."""
    return fsspec.utils.get_protocol(str(path)) == "file"


def _unsafe_globals(path: Path) -> list[str]:
    """The classes and functions the file's pickle names that weights_only loading refuses."""
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in SAFE_GLOBALS}
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (ValueError, RuntimeError, OSError, zipfile.BadZipFile):  # not a readable torch.save zip
        return []
    return [name for name in names if name not in allowed]


# What torch.save writes starts with one of these: a zip archive (torch ≥ 1.6), or a pickle of protocol 2
# or later (the legacy format). Anything else (a JPEG, a text file) is not a checkpoint at all.
ZIP_MAGIC = b"PK\x03\x04"
PICKLE_MAGIC = b"\x80"


def _is_torch_file(path: Path) -> bool:
    """Whether ``path`` is laid out as a file torch.save writes (complete or not): an empty file or one that
    starts with torch's bytes is a checkpoint cut short; a zip archive without a pickle is not one."""
    with open(path, "rb") as file:
        head = file.read(len(ZIP_MAGIC))
    if not head:
        return True  # nothing written: a truncated checkpoint
    if head.startswith(ZIP_MAGIC):
        if not zipfile.is_zipfile(path):
            return True  # a zip cut short (its directory is at the end)
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("data.pkl") for name in archive.namelist())
    return head.startswith(PICKLE_MAGIC)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` so that a reader sees either the old file or the complete new one."""
    with atomic_file(path, "checkpoint") as f:
        torch.save(obj, f)


def load_checkpoint_file(
    path: str | os.PathLike,
    map_location: Any = "cpu",
    weights_only: bool = True,
    mmap: bool = False,
    require_state_dict: bool = True,
) -> dict:
    """The checkpoint dict at ``path``, or a UserError saying why not (``mmap``: a cheap look).

    ``require_state_dict=False`` accepts any dict: Lightning's own files (e.g. the bare state_dict that
    ddp_spawn hands back to the main process in ``.temp.ckpt``) go through the same CheckpointIO."""
    path = Path(path)
    if path.is_dir():  # a run's folder or its checkpoints/, given for the checkpoint in it
        # the places a run keeps them (never a walk of the whole tree: it may be a data folder)
        patterns = ("*.ckpt", "checkpoints/*.ckpt", "*/checkpoints/*.ckpt")
        found = sorted(
            (p for pattern in patterns for p in path.glob(pattern)), key=lambda p: p.stat().st_mtime
        )
        raise UserError(
            f"checkpoint {path} is a folder, not a checkpoint file: pass --ckpt_path="
            + (f"{found[-1]} (its newest .ckpt)" if found else "PATH to a .ckpt file")
        )
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist: pass --ckpt_path=PATH to an existing .ckpt file")
    try:
        torch_file = _is_torch_file(path)
    except (OSError, zipfile.BadZipFile):  # unreadable: torch.load's error below says so
        torch_file = True
    if not torch_file:
        raise UserError(
            f"{path} is not a checkpoint (not a file torch.save writes): pass --ckpt_path=PATH to a .ckpt"
            " that a run wrote"
        )
    # torch.save's zip format: a legacy (pre-1.6) file cannot be memory-mapped, and the names a refused
    # pickle holds can be read from the zip without running it.
    is_zip = zipfile.is_zipfile(path)
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            checkpoint = torch.load(
                path, map_location=map_location, weights_only=weights_only, mmap=mmap and is_zip
            )
    except pickle.UnpicklingError as err:
        unsafe = _unsafe_globals(path) if is_zip and weights_only else []
        if unsafe:
            # Never advice to allow-list them: they are what a crafted file runs (posix.system).
            raise UserError(
                f"checkpoint {path} is not trusted: it holds pickled code or objects that lit_ddp does not"
                f" load ({', '.join(sorted(unsafe))}), which no lit_ddp or Lightning run writes, and nothing"
                " in it was run: pass --ckpt_path=PATH to a checkpoint that a run wrote"
            ) from err
        raise UserError(
            f"checkpoint {path} is corrupt or truncated (not a torch checkpoint): use an earlier checkpoint"
        ) from err
    except Exception as err:  # torch raises RuntimeError, EOFError, KeyError, ... on damaged files
        raise UserError(
            f"checkpoint {path} is corrupt or truncated ({type(err).__name__}): use an earlier checkpoint"
            " of the run"
        ) from err
    if not isinstance(checkpoint, dict) or (require_state_dict and "state_dict" not in checkpoint):
        raise UserError(
            f"checkpoint {path} is not a Lightning checkpoint (no state_dict): pass a .ckpt from a run"
        )
    return checkpoint


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch CheckpointIO with atomic local writes and safe, explained loads."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or not is_local_path(path):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote (fsspec): as Lightning
        try:
            atomic_torch_save(checkpoint, path)
        except WriteError as err:
            # A full disk, a quota, a read-only remount: one line saying the previous file is intact (the
            # write was atomic) and how to resume.
            raise checkpoint_write_error(err.os_error, Path(path)) from None

    def load_checkpoint(
        self, path, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if not is_local_path(path):
            return super().load_checkpoint(path, map_location, weights_only)
        return load_checkpoint_file(
            path,
            map_location=map_location if map_location is not None else "cpu",
            weights_only=True if weights_only is None else weights_only,
            require_state_dict=False,  # user-given paths are checked up front (resume.py), with this rule
        )


def with_atomic_checkpoint_io(plugins=None) -> list:
    """``plugins`` (None, one, or a list) plus an AtomicCheckpointIO, unless they hold a CheckpointIO."""
    from lightning.fabric.plugins import CheckpointIO

    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, list | tuple) else [plugins]
    if any(isinstance(p, CheckpointIO) for p in plugins):
        return plugins
    return [*plugins, AtomicCheckpointIO()]
