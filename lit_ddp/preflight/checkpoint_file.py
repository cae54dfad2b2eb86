"""A checkpoint file read as data: weights-only (loading it runs no code), memory-mapped for a look, and one
line for each way it is not a checkpoint a run wrote (a folder, a missing or foreign file, one cut short, one
that pickles code). The ``--ckpt_path`` file is read here before anything is built; the run's own loads
(``runtime/checkpoint_io.py``) and ``last``/``best`` (``preflight/runs.py``) read through the same function.
"""

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from lit_ddp.errors import UserError
from lit_ddp.models import current_name
from lit_ddp.models.weights import CHECKPOINT_GLOBALS, unsafe_globals
from lit_ddp.preflight.checkpoint import SPECIAL, UNTRAINED
from lit_ddp.utils import from_here, is_local_path


def allow_checkpoint_globals() -> None:
    """Lets every weights-only load of this process read lit_ddp's hyperparameter types (CHECKPOINT_GLOBALS):
    LightningCLI's own ``torch.load`` of ``--ckpt_path``'s hyperparameters among them. Process-wide, so the
    CLI does it, not an import."""
    torch.serialization.add_safe_globals(CHECKPOINT_GLOBALS)


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
        where = from_here(path)
        raise UserError(f"checkpoint {where} does not exist: pass --ckpt_path=PATH to an existing .ckpt file")
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
        with torch.serialization.safe_globals(CHECKPOINT_GLOBALS):
            checkpoint = torch.load(
                path, map_location=map_location, weights_only=weights_only, mmap=mmap and is_zip
            )
    except pickle.UnpicklingError as err:
        unsafe = unsafe_globals(path) if is_zip and weights_only else []
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
    hparams = checkpoint.get("hyper_parameters")
    if isinstance(hparams, dict) and "_class_path" in hparams:
        hparams["_class_path"] = current_name(hparams["_class_path"])
    return checkpoint


def load_ckpt_file(ckpt_path: str | None) -> dict | None:
    """An explicit local ``ckpt_path`` file, loaded (safely, memory-mapped), or UserError naming what is
    wrong with it; None for the special values (``last``, ...), a URL, or None."""
    if ckpt_path and ckpt_path not in (*SPECIAL, UNTRAINED) and is_local_path(ckpt_path):
        return load_checkpoint_file(ckpt_path, mmap=True)
    return None
