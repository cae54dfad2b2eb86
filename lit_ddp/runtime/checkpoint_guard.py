"""What a checkpoint may name: only code the user already chose, checked before anything is imported.

A checkpoint loads with ``weights_only=True``, yet LightningCLI (``_parse_ckpt_path``) hands its
``hyper_parameters`` to jsonargparse, which imports whatever ``_class_path`` (or a nested ``class_path``, or
a dotted string given to a ``Callable`` argument such as ``net``) names: ``helpers.LeNetCIFAR`` with a
``helpers.py`` in the working directory runs that file. So a name in a checkpoint must be one of:

- a class of lit_ddp's or of the project's own package (the packages of ``main(model=..., data=...)``);
- a name the command line or a config file gave (``--model=helpers.LeNetCIFAR`` trusts it on purpose).

Anything else is one line, before any import.
"""

import importlib.util
import re
import sys
from collections.abc import Iterable, Iterator

from lit_ddp.errors import UserError

# A dotted Python name (`helpers.LeNetCIFAR`), not a path or a number (`data/pngs`, `0.5`).
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
LIBRARY = "lit_ddp"


def _walk(tree, where: str = "") -> Iterator[tuple[str, str, bool]]:
    """``(key, value, is_class_path)`` for every string leaf of a nested dict / list / Namespace."""
    if hasattr(tree, "as_dict"):  # a jsonargparse Namespace
        tree = tree.as_dict()
    if isinstance(tree, dict):
        for key, value in tree.items():
            inner = f"{where}.{key}" if where else str(key)
            if isinstance(value, str):
                yield inner, value, str(key) in ("class_path", "_class_path")
            else:
                yield from _walk(value, inner)
    elif isinstance(tree, list | tuple):
        for i, value in enumerate(tree):
            if isinstance(value, str):
                yield f"{where}[{i}]", value, False
            else:
                yield from _walk(value, f"{where}[{i}]")


def named_by(*configs) -> set[str]:
    """Every class path and dotted name in the given config trees (the command line's, the defaults')."""
    return {value for config in configs for _, value, _ in _walk(config) if DOTTED.fullmatch(value)}


def packages_of(*configs) -> set[str]:
    """lit_ddp and the top-level packages that ``configs`` (main()'s default model and data) name."""
    return {LIBRARY, *(name.split(".", 1)[0] for name in named_by(*configs))}


def _names_a_module(name: str) -> bool:
    # Only the top-level package is looked up: finding a dotted module would import its parents.
    top = name.split(".", 1)[0]
    return top in sys.modules or importlib.util.find_spec(top) is not None


def _trusted(name: str, named: set[str], packages: Iterable[str]) -> bool:
    return name in named or any(name.startswith(f"{package}.") for package in packages)


def check_checkpoint_names(
    checkpoint: dict | None, ckpt_path: str, named: set[str], packages: set[str]
) -> None:
    """UserError when ``checkpoint``'s hyperparameters name code outside ``packages`` (lit_ddp's and the
    project's, see ``packages_of``) and ``named`` (what the command line and the configs give)."""
    if not checkpoint:
        return
    # Lightning drops `_instantiator` before jsonargparse sees the rest (it imports it only in
    # LightningModule.load_from_checkpoint, which the CLI does not call).
    hparams = {k: v for k, v in (checkpoint.get("hyper_parameters") or {}).items() if k != "_instantiator"}
    for key, value, is_class_path in _walk(hparams, "hyper_parameters"):
        if not DOTTED.fullmatch(value) or _trusted(value, named, packages):
            continue
        # A class path always imports; another dotted string only where it names a module (a Callable
        # argument): `ResNet50_Weights.IMAGENET1K_V2` is a weights name, not code.
        if is_class_path or _names_a_module(value):
            raise UserError(
                f"{ckpt_path} names {value} ({key}), which is not lit_ddp's, the project's, or named by"
                f" this command: it is not imported (a checkpoint must not run code); if you trust the file,"
                f" name the class yourself: --model={value}"
            )
