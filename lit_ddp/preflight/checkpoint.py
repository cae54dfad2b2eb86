"""What a checkpoint given as ``--ckpt_path`` may name and must hold, read before anything is imported from
it: the preflight's checkpoint rows (``lit_ddp.preflight.ROWS``).

What it may name: only code the user already chose.

A checkpoint loads with ``weights_only=True``, yet LightningCLI (``_parse_ckpt_path``) hands its
``hyper_parameters`` to jsonargparse, which imports whatever a class path in them names. jsonargparse finds
one in many shapes: ``_class_path``, a nested ``class_path`` (under ``init_args`` too), a dotted string
given to a ``Callable`` argument such as ``net``, and any string it reads as YAML (JSON is YAML) or as the
path of a YAML file: ``net: "class_path: evil.Net"``, ``net: '{"class_path": "evil.Net"}'``, ``net:
net.yaml``, in a dict or a list. Each string is read here as jsonargparse reads it, and the result walked.
A dotted name found that way must be one of:

- a class of lit_ddp's or of the project's own package (the packages of ``main(model=..., data=...)``);
- a name the command line or a config file gave (``--model=helpers.LeNetCIFAR`` trusts it on purpose).

Anything else that would import a module (the one ``evil.py`` or ``helpers.py`` in the working directory
among them) is one line, before any import.

What it must hold: besides its weights, what the subcommand reads (``missing_run_state``), and for a fit of a
run that averaged its weights, a callback that resumes them (``average_without_averaging``).

What it replaces: the model settings the command line gave that its own hyperparameters override, named in
a note (``checkpoint_model_overrides``), and a model class other than its own, refused.
"""

import importlib.util
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import yaml
from lightning.pytorch.callbacks import WeightAveraging

from lit_ddp.errors import UserError
from lit_ddp.utils import flatten, imported

# A dotted Python name (`helpers.LeNetCIFAR`), not a path or a number (`data/pngs`, `0.5`).
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
LIBRARY = "lit_ddp"
UNTRAINED = "untrained"  # --ckpt_path=untrained: the model as built, on purpose
# --ckpt_path values Lightning or lit_ddp resolve to a file themselves (preflight/runs.py)
SPECIAL = ("last", "best", "hpc", "registry")
# The keys whose string jsonargparse imports as it is (a dotted key such as `net.class_path` is nested).
CLASS_KEYS = ("class_path", "_class_path")
# A file a string names is read as jsonargparse would, unless it is binary (a NUL in its first bytes: a
# weights file) or larger than any config: the user's own data files (a label list) are not parsed.
PEEK_BYTES = 8192
MAX_CONFIG_BYTES = 1 << 20


def _yaml(text: str) -> object:
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError):  # not YAML: jsonargparse keeps the string
        return text


def _file_named(value: str, base: Path | None) -> Path | None:
    """The text file ``value`` names (relative to ``base``), or None: jsonargparse reads a string that is a
    readable file's path as that file's config."""
    if base is None or "\0" in value or not value.strip():
        return None
    path = base / value
    try:
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        with open(path, "rb") as file:
            return None if b"\0" in file.read(PEEK_BYTES) else path
    except OSError:
        return None


def _walk(tree, where: str, base: Path | None, seen: set) -> Iterator[tuple[str, str, bool]]:
    """``(key, string, is_class_path)`` for every string ``tree`` holds as jsonargparse reads it: nested
    dicts, lists and Namespaces, YAML and JSON in strings, and (``base``: the folder relative paths start
    from; None: not read) the files that strings name."""
    if hasattr(tree, "as_dict"):  # a jsonargparse Namespace
        tree = tree.as_dict()
    if isinstance(tree, dict | list | tuple):
        if id(tree) in seen:  # a YAML alias: the same object again (an alias bomb is not walked out)
            return
        seen.add(id(tree))
    if isinstance(tree, dict):
        for key, value in tree.items():
            inner = f"{where}.{key}" if where else str(key)
            if isinstance(value, str) and str(key).rsplit(".", 1)[-1] in CLASS_KEYS:
                yield inner, value, True  # imported as it is
            else:
                yield from _walk(value, inner, base, seen)
    elif isinstance(tree, list | tuple):
        for i, value in enumerate(tree):
            yield from _walk(value, f"{where}[{i}]", base, seen)
    elif isinstance(tree, str):
        text, read_from = tree, base
        path = _file_named(tree, base)
        if path is not None and path.resolve() not in seen:
            seen.add(path.resolve())
            try:
                text, read_from = path.read_text(), path.parent
            except (OSError, UnicodeDecodeError):  # not text: jsonargparse cannot read it either
                pass
        value = _yaml(text)
        if isinstance(value, dict | list):
            yield from _walk(value, where, read_from, seen)
            return
        yield where, text.strip(), False
        if isinstance(value, str) and value != text.strip():  # quoted or tagged (`"evil.Net"`): both
            yield where, value, False


def named_by(*configs) -> set[str]:
    """Every class path and dotted name in the given config trees (the command line's, the defaults')."""
    return {
        value
        for config in configs
        for _, value, _ in _walk(config, "", None, set())
        if DOTTED.fullmatch(value)
    }


def packages_of(*configs) -> set[str]:
    """lit_ddp and the top-level packages that ``configs`` (main()'s default model and data) name."""
    return {LIBRARY, *(name.split(".", 1)[0] for name in named_by(*configs))}


def _names_a_module(name: str) -> bool:
    # Only the top-level package is looked up: finding a dotted module would import its parents.
    top = name.split(".", 1)[0]
    return top in sys.modules or importlib.util.find_spec(top) is not None


def _trusted(name: str, named: set[str], packages: Iterable[str]) -> bool:
    return name in named or any(name.startswith(f"{package}.") for package in packages)


def _option(key: str, saved_class: object) -> str:
    """The command-line option that names the class at ``key`` (``hyper_parameters.net.class_path``)
    on purpose: ``--model`` for the model's own class, ``--model=<its class> --model.net`` for an
    argument's."""
    key = re.sub(r"\[\d+\]", "", key.removeprefix("hyper_parameters."))  # a list's item: the list's option
    parts = [p for p in key.split(".") if p != "init_args"]
    if parts[-1] in CLASS_KEYS:
        parts.pop()
    if not parts:
        return "--model"
    option = "--model." + ".".join(parts)
    return f"--model={saved_class} {option}" if isinstance(saved_class, str) else option


def untrusted_name(
    checkpoint: dict | None, ckpt_path: str, named: set[str], packages: set[str]
) -> str | None:
    """The line for a name in ``checkpoint``'s hyperparameters outside ``packages`` (lit_ddp's and the
    project's, see ``packages_of``) and ``named`` (what the command line and the configs give), or None."""
    if not checkpoint:
        return None
    # Lightning drops `_instantiator` before jsonargparse sees the rest (it imports it only in
    # LightningModule.load_from_checkpoint, which the CLI does not call).
    hparams = {k: v for k, v in (checkpoint.get("hyper_parameters") or {}).items() if k != "_instantiator"}
    for key, value, is_class_path in _walk(hparams, "hyper_parameters", Path.cwd(), set()):
        if not DOTTED.fullmatch(value) or _trusted(value, named, packages):
            continue
        # A class path always imports; another dotted string only where it names a module (a Callable
        # argument): `ResNet50_Weights.IMAGENET1K_V2` is a weights name, not code.
        if is_class_path or _names_a_module(value):
            return (
                f"{ckpt_path} names {value} ({key}), which is not lit_ddp's, the project's, or named by"
                f" this command: it is not imported (a checkpoint must not run code); if you trust the file,"
                f" name the class yourself: {_option(key, hparams.get('_class_path'))}={value}"
            )
    return None


# What a checkpoint needs besides its weights: Lightning's version (which its loader reads first), and to be
# resumed by fit, the loops' position (epoch, batch) and the optimizer's state.
LIGHTNING_VERSION = "pytorch-lightning_version"
RUN_STATE = {"loops": "loop state (epoch, batch)", "optimizer_states": "optimizer state"}


def missing_run_state(
    checkpoint: dict | None, ckpt_path: str, subcommand: str, takes_weights: bool
) -> str | None:
    """The line for a ``checkpoint`` of weights without what ``subcommand`` needs, or None: fit resumed its
    epoch 1 from a file with no loop state, with no word, and stopped on Lightning's KeyError (a traceback)
    for one with no optimizer state or Lightning version (``torch.save({"state_dict": ...})``,
    ``ModelCheckpoint(save_weights_only=True)``). ``takes_weights``: the model has ``--model.weights``,
    which starts a new run from a file's weights."""
    if not checkpoint:
        return None
    needed = {LIGHTNING_VERSION: "Lightning version", **(RUN_STATE if subcommand == "fit" else {})}
    missing = [name for key, name in needed.items() if key not in checkpoint]
    if not missing:
        return None
    if takes_weights and subcommand == "fit":
        fix = f"to train a new run from its weights, pass --model.weights={ckpt_path} in place of --ckpt_path"
    elif takes_weights:
        fix = f"to {subcommand} with its weights, pass --model.weights={ckpt_path} and no --ckpt_path"
    elif subcommand == "fit":
        fix = "resume from a checkpoint that a fit wrote (its run's last.ckpt), or start a new run without it"
    else:
        fix = "pass a checkpoint that a run wrote (its run's last.ckpt or best checkpoint)"
    what = "a run's state to resume" if subcommand == "fit" else "a Lightning checkpoint"
    return f"checkpoint {ckpt_path} holds weights only, not {what} (no {', no '.join(missing)}): {fix}"


# A checkpoint of a run that averaged its weights holds the average as its state_dict and the raw weights
# beside it (Lightning's WeightAveraging layout, which lit_ddp's EMA keeps): only such a callback puts the raw
# ones back into the module when fit resumes.
RAW_WEIGHTS = "current_model_state"
# lit_ddp's EMA, by name: the preflight comes before the callbacks and does not import them.
AVERAGING_CLASSES = ("lit_ddp.callbacks.ema.EMA",)
EMA_PRESET = "configs/presets/ema.yaml"


def resumes_averages(callbacks) -> bool:
    """Whether a config's ``trainer.callbacks`` (one or a list) hold a callback that resumes a checkpoint's
    average and raw weights: lit_ddp's EMA, Lightning's WeightAveraging (EMAWeightAveraging), a subclass."""
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        cls = imported(str(callback.get("class_path"))) if hasattr(callback, "get") else None
        if not isinstance(cls, type):
            continue
        if issubclass(cls, WeightAveraging) or any(
            f"{base.__module__}.{base.__qualname__}" in AVERAGING_CLASSES for base in cls.__mro__
        ):
            return True
    return False


def average_without_averaging(
    checkpoint: dict | None, ckpt_path: str, subcommand: str, averages: bool, takes_weights: bool
) -> str | None:
    """The line for a fit that resumes a checkpoint of averaged weights with no callback that averages
    (``averages``: see ``resumes_averages``), or None: Lightning loads the state_dict, the average, into the
    module, so training went on from the average, not from where the run stopped, with Lightning's warning
    alone. validate, test and predict score the average, as the checkpoint's state_dict, on purpose."""
    if subcommand != "fit" or averages or not checkpoint or RAW_WEIGHTS not in checkpoint:
        return None
    fix = f"resume with the EMA it was trained with (--config {EMA_PRESET}, or your recipe's)"
    if takes_weights:
        fix += f", or train a new run from the average: --model.weights={ckpt_path} in place of --ckpt_path"
    return (
        f"{ckpt_path} holds averaged weights (EMA) beside the raw ones, and this fit has no EMA callback to"
        f" resume them: it would train on from the average, not from where the run stopped; {fix}"
    )


# Model settings that say how this command runs the step (torch.compile, CUDA graphs), not what the weights
# learned: the command's value holds over the checkpoint's, so a compiled run's checkpoint validates without a
# compiler and a run resumed where graphs cannot replay takes --model.cuda_graph=auto.
RUN_OPTIONS = ("compile", "cuda_graph")
# Settings for how training goes on from the checkpoint: where the command gives one (other than its default),
# it holds over the checkpoint's, and the optimizer names each it changes (models/optim.keep_implementation).
# Not the lr: the schedule's state in the checkpoint carries it on.
GIVEN_HOLDS = ("optim",)
SCHEDULE_KEEPS = ("optim.lr",)


def checkpoint_model_overrides(
    chosen: dict, defaults: dict, default_class: str, ckpt_path: str, checkpoint: dict
) -> tuple[str | None, dict]:
    """A line naming the model settings the user chose that the checkpoint replaces (or None), and the
    command's settings that hold over the checkpoint's (``RUN_OPTIONS``, ``GIVEN_HOLDS``), by dotted key.

    LightningCLI re-reads the model's class and arguments from the checkpoint's hyperparameters, over the
    command line and config files: the checkpoint's values win (they shaped its weights), silently.
    ``chosen`` is the parsed ``model`` config, ``defaults`` its class's defaults, and ``default_class`` the
    model class when no --model is given; ``checkpoint`` is the file, loaded. A model class other than the
    checkpoint's, chosen explicitly, is an error: it cannot load those weights.
    """
    hparams = checkpoint.get("hyper_parameters") or {}
    saved_class, chosen_class = hparams.get("_class_path"), chosen.get("class_path")
    if saved_class and chosen_class not in (saved_class, default_class):
        short, saved = chosen_class.rsplit(".", 1)[-1], saved_class.rsplit(".", 1)[-1]
        a = lambda name: f"{'an' if name[:1] in 'AEIOU' else 'a'} {name}"  # noqa: E731 - "an ArchClassifier"
        raise UserError(
            f"--model={short}, but {ckpt_path} holds {a(saved)}: leave --model out (the checkpoint decides"
            f" the model) or pass {a(short)} checkpoint"
        )
    given = flatten(chosen.get("init_args") or {}, sep=".")
    default = flatten(defaults.get("init_args") or {}, sep=".")
    saved = flatten(hparams, sep=".")
    changed = [
        key
        for key in given
        if key in saved
        and key not in RUN_OPTIONS
        and given[key] != default.get(key)
        and given[key] != saved[key]
    ]
    holds = {
        key: given[key]
        for key in changed
        if key.split(".", 1)[0] in GIVEN_HOLDS and key not in SCHEDULE_KEEPS
    }
    replaced = [
        f"--model.{key}={given[key]} (the checkpoint's: {saved[key]})" for key in changed if key not in holds
    ]
    kept = {key: given[key] for key in RUN_OPTIONS if key in given} | holds
    if not replaced:
        return None, kept
    return f"{ckpt_path} keeps the model settings it was trained with, over {', '.join(replaced)}", kept
