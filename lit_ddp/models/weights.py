"""Start a network from a file: a state_dict or a Lightning checkpoint, matched tensor by tensor by name and
shape, so a head with another class count keeps its fresh initialisation. Nothing is downloaded."""

import pathlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import torch
from torch import Tensor, nn

from lit_ddp.errors import UserError
from lit_ddp.models.optim import OptimConfig
from lit_ddp.utils import from_here, local_path

# Besides tensors and containers, lit_ddp's own checkpoints hold their saved hyperparameters' types: an
# OptimConfig or a Path passed from Python in older ones (lit_ddp now writes them as plain data,
# utils.plain_data). Every weights-only load of lit_ddp allows these (preflight/checkpoint_file.py too).
CHECKPOINT_GLOBALS = [OptimConfig, pathlib.PosixPath, pathlib.PurePosixPath, pathlib.WindowsPath]
NAMES_SHOWN = 6  # tensor names listed in the log line before "…"
# True while the CLI builds the model of a validate, test or predict whose checkpoint replaces every weight:
# the file is not read, so a fine-tune's checkpoint still scores once its pretrained file has moved. Not a
# model argument: that would be a setting saved in the checkpoint, which a fit's resume compares.
_REPLACED = ContextVar("weights_replaced_by_checkpoint", default=False)


@contextmanager
def checkpoint_replaces_weights(replaces: bool = True) -> Iterator[None]:
    """Inside, where ``replaces``, ``load_weights`` reads no file: a checkpoint restored later replaces it."""
    token = _REPLACED.set(replaces)
    try:
        yield
    finally:
        _REPLACED.reset(token)


def _reason(err: Exception) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    unsafe = [ln for ln in lines if "Unsupported global" in ln]
    return (unsafe or lines or [type(err).__name__])[0].split(". ")[0]


def unsafe_globals(path: Path) -> list[str]:
    """The globals ``path``'s pickle names that the weights-only unpickler would refuse (read from the
    file's structure by torch, not from an error's text); [] for a file torch cannot read at all."""
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in CHECKPOINT_GLOBALS}
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a torch zip file: corrupt or truncated
        return []
    return [name for name in names if name not in allowed]


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """The tensors in ``path``: a state_dict file, or a checkpoint's ``state_dict`` entry."""
    if not path.is_file():
        raise UserError(
            f"weights file {from_here(path)} does not exist: pass --model.weights=PATH to a saved state_dict"
            " (README: Models and weights), or --model.weights=null (random, or a --ckpt_path's weights)"
        )
    try:
        with torch.serialization.safe_globals(CHECKPOINT_GLOBALS):
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError … on foreign files
        unsafe = unsafe_globals(path)
        if unsafe:
            raise UserError(
                f"weights file {path} names code that a weights-only load refuses to import"
                f" ({', '.join(unsafe[:3])}; nothing was run): if you trust the file, load it yourself and"
                " save its state_dict with torch.save(model.state_dict(), PATH)"
            ) from err
        raise UserError(
            f"weights file {path} is corrupt, truncated or not a torch file ({_reason(err)}): pass a file"
            " written by torch.save(model.state_dict(), PATH) or a Lightning .ckpt"
        ) from err
    state = loaded.get("state_dict", loaded) if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or not state or not all(isinstance(v, Tensor) for v in state.values()):
        raise UserError(
            f"weights file {path} holds no state_dict: save one with torch.save(model.state_dict(), PATH)"
        )
    return state


def _strip_prefix(state: dict[str, Tensor], wanted: set[str]) -> dict[str, Tensor]:
    """``state`` without the key prefix under which most of its keys are ``wanted``: ``net.`` in a lit_ddp
    checkpoint, the attribute name in another LightningModule's, ``module.`` from a DDP-wrapped model, or
    none in a plain state_dict."""
    prefixes = sorted({""} | {key.split(".", 1)[0] + "." for key in state if "." in key})

    def matches(prefix: str) -> int:
        return sum(key.removeprefix(prefix) in wanted for key in state if key.startswith(prefix))

    best = max(prefixes, key=matches)  # ties: the shortest (sorted), so "" when nothing is prefixed
    return {key.removeprefix(best): value for key, value in state.items() if key.startswith(best)}


def _names(keys: list[str]) -> str:
    shown = ", ".join(keys[:NAMES_SHOWN])
    return shown + (f" … ({len(keys)} in all)" if len(keys) > NAMES_SHOWN else "")


def _extra_blocks(state: dict[str, Tensor], own: dict[str, Tensor], fits: dict[str, Tensor]) -> list[str]:
    """The blocks the file holds in the network's top-level layers and the network lacks, by name: a deeper
    variant of the same network (a resnet34 file for a resnet18 matches every tensor of the resnet18 by
    name and shape, and its blocks between those would be dropped). Modules under a layer that loaded
    nothing (a head of another shape) or outside the network (an EMA copy) are not counted."""
    inside = {key.rsplit(".", n)[0] for key in own for n in range(1, key.count(".") + 1)}
    loaded = {key.split(".", 1)[0] for key in fits}
    blocks: dict[str, None] = {}
    for key in state:
        parts = key.split(".")
        if key in own or parts[0] not in loaded or key.rpartition(".")[0] in inside:
            continue
        depth = next((n for n in range(1, len(parts)) if ".".join(parts[:n]) not in inside), len(parts))
        blocks[".".join(parts[:depth])] = None
    return list(blocks)


def load_weights(net: nn.Module, path: str | Path, num_classes: int, arch: str) -> str:
    """Copies every tensor of ``path`` whose name and shape ``net`` has; returns the line to log.

    Tensors ``net`` has and the file lacks, or has with another shape (a 1000-class head in a 3-class
    network), keep their fresh initialisation. Fewer than half of ``net``'s tensors matching means the
    file is another architecture's: an error, not a silent mostly-random start; so is a file with more
    blocks in the same layers (a deeper network of the family).
    """
    path = Path(local_path(path, "--model.weights"))  # a YAML config's ~ and $VAR arrive unexpanded
    if _REPLACED.get():
        return f"weights: {path.name} not read: the --ckpt_path checkpoint replaces them"
    own = net.state_dict()
    state = _strip_prefix(read_state_dict(path), set(own))
    fits = {key: value for key, value in state.items() if key in own and value.shape == own[key].shape}
    if len(fits) * 2 < len(own):
        raise UserError(
            f"weights file {path} does not fit --model.arch={arch}: only {len(fits)} of the network's"
            f" {len(own)} tensors match by name and shape (another network's file?):"
            f" pass weights saved from a {arch}"
        )
    extra = _extra_blocks(state, own, fits)
    if extra:
        raise UserError(
            f"weights file {path} does not fit --model.arch={arch}: it holds {len(extra)} blocks in the"
            f" network's layers that a {arch} lacks ({_names(extra)}): a deeper network's file, whose other"
            f" blocks would be loaded out of place: pass weights saved from a {arch}, or the"
            " --model.arch the file was saved from"
        )
    net.load_state_dict(fits, strict=False)
    line = f"weights: {len(fits)} of {len(own)} tensors from {path.name}"
    new = [key for key in own if key not in fits]
    if new:
        line += f"; new: {_names(new)}"
        file_classes = {
            state[key].shape[0]
            for key in new
            if key in state
            and own[key].ndim
            and state[key].ndim
            and own[key].shape[0] == num_classes != state[key].shape[0]
        }
        if len(file_classes) == 1:
            line += f" ({file_classes.pop()} → {num_classes} classes)"
    unused = [key for key in state if key not in own]
    if unused:
        line += f"; not in the network: {_names(unused)}"
    return line
