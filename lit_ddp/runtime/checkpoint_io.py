"""Checkpoint files that survive crashes, and load safely or fail with one clear error.

* Writes are atomic: the checkpoint streams into a hidden temporary file *in the target directory*, is
  fsync-ed, then ``os.replace``-d over the target (and the directory fsync-ed). A job killed mid-write
  leaves the previous ``last.ckpt`` intact, plus at worst a stray ``.last.ckpt.tmp-<host>-<pid>`` that the
  next successful write of that name on that host removes. Lightning's own local save serialises the whole
  checkpoint into memory, writes it to the *system* temp dir (fsspec transaction) and ``shutil.move``-s it:
  on a cluster, where /tmp is a local disk and checkpoints live on a shared filesystem, that move is a copy,
  and a crash during it truncates the target; nothing is fsync-ed; a small /tmp fails large checkpoints.
* Reads go through ``preflight.checkpoint_file.load_checkpoint_file``, as ``--ckpt_path`` is read before the
  run: weights-only (a checkpoint cannot run code when it is loaded), and a missing, truncated or foreign
  file, or one that pickles other objects, is a ``UserError`` naming it.
"""

from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lit_ddp.preflight.checkpoint_file import load_checkpoint_file
from lit_ddp.runtime.write_errors import write_error
from lit_ddp.utils import is_local_path
from lit_ddp.writes import WriteError, atomic_file


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch CheckpointIO with atomic local writes and safe, explained loads.

    Fork of ``lightning.fabric.plugins.TorchCheckpointIO``: its local save goes through the system's temporary
    folder and a move, a copy on a shared filesystem that a crash truncates, with no fsync; goes when its
    local save writes beside the target and renames it.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or not is_local_path(path):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote (fsspec): as Lightning
        path = Path(path)
        try:  # a reader sees either the old file or the complete new one
            with atomic_file(path, "checkpoint") as f:
                torch.save(checkpoint, f)
        except WriteError as err:
            # A full disk, a quota, a read-only remount: one line saying the previous file is intact (the
            # write was atomic) and how to resume.
            raise write_error(err.os_error, "checkpoint", path, path.parent) from None

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
