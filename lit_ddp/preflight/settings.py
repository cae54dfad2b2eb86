"""The settings a command line and its config files give, checked against the parser's keys and the chosen
classes' signatures: one line for the first that does not fit, when jsonargparse refuses the command line.

jsonargparse reports a mistyped option with 70 lines of usage, a wrong type with the union's internals and
invalid YAML as ``"<unicode string>", line 2``. A user needs the option (or the file and line), what it
expects, and the closest valid name. jsonargparse's ArgumentError carries only text, so ``explain`` does not
read it: it checks what the user gave (each ``--key=value``, each ``--config`` file's keys) against the
parser's keys, the chosen classes' signatures and their arguments' types, and words the first setting that
does not fit. Where none is found, the line is jsonargparse's first one. Invalid YAML is told by yaml's own
exception types; a duplicate key or an empty file by ``preflight.arguments``, before jsonargparse reads it.
"""

import collections.abc
import dataclasses
import difflib
import enum
import functools
import importlib
import inspect
import os
import traceback
import types
import typing
from collections.abc import Iterable
from pathlib import Path

import yaml
from jsonargparse import ArgumentError, ArgumentParser, Namespace

from lit_ddp.models import RENAMED as RENAMED_MODELS
from lit_ddp.utils import NOT_SETTINGS, command_line, config_files, yaml_flow, yaml_key_line

COMMANDS: tuple[str, ...] = ("fit", "validate", "test", "predict", "new")
# Every command `main` takes, the two it hands to their own parsers included (cli.main).
ALL_COMMANDS: tuple[str, ...] = (*COMMANDS, "shard", "doctor")
# Options that other LightningCLI programs have and lit_ddp leaves out on purpose.
NOT_OPTIONS = {
    "optimizer": "the models build their optimizer from --model.optim.* (name, lr, weight_decay, momentum)",
    "lr_scheduler": "the models build their schedule from --model.optim.* (schedule, warmup_epochs)",
}
# The data keys 0.3.0 removed (CHANGELOG.md), from their value to the settings that replace them; none for
# one that set nothing (null, augment: true). A closest name would be another key (crop_scale: batch_size).
REMOVED = {
    "augment": lambda v: [] if v is True else [("augmentation", None)],
    "crop_padding": lambda v: [("augmentation", "CropFlip"), ("augmentation.padding", v)],
    "crop_scale": lambda v: [("augmentation.scale", v)],
    "crop_ratio": lambda v: [("augmentation.ratio", v)],
    "auto_augment": lambda v: [("augmentation.auto_augment", v)],
    "random_erasing": lambda v: [("augmentation.random_erasing", v)],
}
# 0.2's callback keys: those always on since, and the groups the others went into (CHANGELOG.md, 0.3.0).
ALWAYS_ON = ("failed_run_cleanup", "eval_limits")
GROUPS = ("console", "resilience", "dashboard")
# Arguments the CLI fills in itself: the data's number of classes is linked to the model's (cli.py).
PASSED = {("model", "num_classes")}
TYPE_NAMES = {type(None): "null", int: "an integer", float: "a number", bool: "true or false", str: "text"}
# What a key that takes a class holds besides that class's arguments: jsonargparse's subclass spec.
SPEC_KEYS = ("class_path", "init_args")
# How alike two names must be for one to be offered for the other: a letter or two apart, not a word that
# shares a suffix (train_size is 0.6 of val_resize, image_size, batch_size).
CLOSE = 0.75


@dataclasses.dataclass(frozen=True)
class InlineConfig:
    """A config given on the command line (``--config='{data: {class_path: ...}}'``): its settings are read
    as a file's are, and a line names it as it was given."""

    text: str

    def read_text(self) -> str:
        return self.text

    def __str__(self) -> str:
        return f"--config={self.text}"


@dataclasses.dataclass(frozen=True)
class Setting:
    """A setting the user gave: its key without ``init_args`` (a ``class_path`` is its owner's key), its
    value, its text as written, and where: the command line, or a file and the YAML keys leading to it.
    ``help``: the value is the class whose help ``--KEY.help`` asks for, not a choice of what runs.
    ``bare``: an option given no value (the next word is an option, or there is none)."""

    key: tuple[str, ...]
    value: object
    text: str
    file: Path | InlineConfig | None = None
    yaml_keys: tuple[str, ...] = ()
    help: bool = False
    bare: bool = False

    def where(self) -> str:
        if self.file is None:
            return ""
        if isinstance(self.file, InlineConfig):  # one word of the command line: no line to name
            return f"{self.file}: "
        line = yaml_key_line(self.file, self.yaml_keys)
        return f"{self.file}, line {line}: " if line else f"{self.file}: "

    def shown(self, key: str) -> str:
        if self.file:
            return f"{key}: {self.text}"
        return f"--{_option(key)}{'.help' if self.help else ''}={self.text}"


def _option(key: str) -> str:
    """``key`` as the command line spells it: a nested class's arguments without their ``init_args``
    (``--model.net.batch_norm``), which a file writes out and the command line leaves out."""
    return key.replace(".init_args.", ".")


@dataclasses.dataclass(frozen=True)
class Context:
    """What the settings are checked against: the parsers' keys and defaults, and the class each top-level
    key takes (``trainer``: the Trainer; ``model``: an ImageClassifier, or a subclass named by class_path)."""

    settings: list[Setting]
    keys: set[str]
    defaults: object
    bases: dict[str, type]
    command: str
    prog: str


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a key lands: a known argument (its type where known, None if not), a group of settings, or
    no argument (the keys it could have meant). ``shown``: the key as a line names it; ``owner``: the class
    whose argument it is or would be, the class at the key ``at``; ``moved``: the candidate is the one
    meant, not a name spelt alike: the same argument of a class given to ``owner`` (the model's network), or
    the key a misspelt ``init_args`` meant."""

    shown: str
    known: bool = True
    annotation: object = None
    group: bool = False
    candidates: tuple[str, ...] = ()
    owner: type | None = None
    at: tuple[str, ...] = ()
    moved: bool = False


def explain(message: str, argv: list[str], parsers: list, bases: dict[str, type], prog: str) -> str:
    """The one line for jsonargparse's ArgumentError on ``argv``: the setting at fault, found by structure;
    ``message`` words only the fallback, where no check finds one."""
    words = command_line(argv)
    command = next((word for _, option, word in words if option is None), "fit")
    line = _unknown_command(command) or _config_file(words) or _invalid_yaml(argv)
    if line:
        return line
    keys = {".".join(_normal(key.split("."))) for parser in parsers for key in parser.get_defaults().keys()}
    defaults = parsers[-1].get_defaults() if parsers else {}  # the model and data each subcommand defaults to
    settings = _settings(argv, words, command)
    ctx = Context(settings, keys, defaults, bases, command, prog)
    checks = (
        _help_of,
        _not_an_option,
        _class_choice,
        _unknown_key,
        _before_its_class,
        _group,
        _required,
        _value,
        _bare,
    )
    for check in checks:
        for setting in settings:
            if not _applies(check, setting):
                continue
            line = check(ctx, setting)
            if line:
                return line
    first = next(line.strip() for line in message.strip().splitlines() if line.strip())
    return f"{first} (see {prog} {command} --help)"


def _applies(check, s: Setting) -> bool:
    """A help request sets nothing: only its own check; an option without a value has only a name to check."""
    if s.help:
        return check is _help_of
    if s.bare:
        return check in (_not_an_option, _unknown_key, _bare)
    return check not in (_help_of, _bare)


def _normal(parts: Iterable[str]) -> tuple[str, ...]:
    """A key as the command line spells it: ``init_args`` left out, ``class_path`` its owner's key."""
    parts = [part for part in parts if part != "init_args"]
    return tuple(parts[:-1] if parts[-1:] == ["class_path"] else parts)


def _settings(argv: list[str], words: list, command: str) -> list[Setting]:
    """What the user gave, in command-line order: each option, and the keys of each config file."""
    files, settings = dict(config_files(argv)), []
    for i, option, value in words:
        if i in files:
            settings += _file_settings(files[i], command)
        elif option in ("-c", "--config") and value:  # no file: a config given inline
            settings += _file_settings(InlineConfig(value), command)
        elif option and option.startswith("--") and option not in NOT_SETTINGS:
            key = _normal(option[2:].removesuffix("+").split("."))
            if value is None:
                if key[-1] != "help":  # `--model.help` alone: the help of the option's own class
                    settings.append(Setting(key, None, "", bare=True))
                continue
            # `--model.help=NAME` (jsonargparse's help of a class) names a class for `model`: checked as one.
            help = len(key) > 1 and key[-1] == "help"
            key = key[:-1] if help else key
            try:
                settings.append(Setting(key, yaml.safe_load(value), value, help=help))
            except yaml.YAMLError:
                settings.append(Setting(key, value, value, help=help))
    return settings


def given(argv: list[str], command: str, key: tuple[str, ...]) -> bool:
    """Whether the command line or one of its config files sets ``key`` (``("trainer", "sync_batchnorm")``):
    the parsed config holds a default and a value given alike."""
    return any(s.key == key for s in _settings(argv, command_line(argv), command))


def _file_settings(path: Path | InlineConfig, command: str) -> list[Setting]:
    try:
        content = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return []
    # A config for the root parser holds each subcommand's settings under its name.
    if isinstance(content, dict) and isinstance(content.get(command), dict):
        return list(_walk(content[command], path, (command,)))
    return list(_walk(content, path, ()))


def _walk(tree: object, path: Path | InlineConfig, yaml_keys: tuple[str, ...], key: tuple[str, ...] = ()):
    for name, value in tree.items() if isinstance(tree, dict) else ():
        name, here = str(name), (*yaml_keys, str(name))
        if name == "init_args":
            yield from _walk(value, path, here, key)
        elif name == "class_path":
            yield Setting(key, value, str(value), path, yaml_keys)
        elif isinstance(value, dict) and value:
            yield from _walk(value, path, here, (*key, name))
        else:
            yield Setting((*key, name), value, yaml_flow(value), path, here)


def _closest(name: str, candidates: Iterable[str]) -> str:
    candidates = sorted(set(candidates))
    # An abbreviation is not expanded (a typo must not change what runs), but it is the likeliest meaning.
    longer = [c for c in candidates if c.startswith(name)]
    if len(longer) == 1:
        return longer[0]
    # Keys under the same parent are compared by their last part: the prefix they share made
    # model.init_args.cuda_graph "close" to model.init_args.arch. Other keys, whole (a typo in a group).
    parent, _, leaf = name.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == parent}
    match = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=CLOSE)
    if match:
        return siblings[match[0]]
    others = [c for c in candidates if c.rpartition(".")[0] != parent]
    match = difflib.get_close_matches(name, others, n=1, cutoff=CLOSE)
    return match[0] if match else ""


# --- the structure: classes, their arguments and types -------------------------------------------------


@functools.cache
def _class_parser(cls: type) -> ArgumentParser | None:
    """A parser of ``cls``'s arguments alone, as jsonargparse reads its signature; None where it cannot."""
    parser = ArgumentParser(exit_on_error=False)
    try:
        parser.add_class_arguments(cls, fail_untyped=False)
    except Exception:  # noqa: BLE001 (a class jsonargparse cannot read is not checked, not a crash)
        return None
    return parser


def _class_keys(cls: type) -> set[str]:
    parser = _class_parser(cls)
    return {".".join(_normal(key.split("."))) for key in parser.get_defaults().keys()} if parser else set()


def _annotations(function: object) -> dict:
    try:
        return typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 (an annotation that does not resolve: that argument is not checked)
        return {}


def _hints(cls: type) -> dict:
    """The argument types of ``cls``'s constructor and of those it passes ``**kwargs`` to."""
    hints: dict = {}
    for base in reversed(cls.__mro__):
        hints |= _annotations(base.__init__) if "__init__" in vars(base) else {}
    return hints


def _flat(tp: object) -> list:
    """The members of a union (nested unions and Optional flattened), else ``[tp]``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [member for arg in typing.get_args(tp) for member in _flat(arg)]
    return [tp]


def _type_at(hints: dict, rest: tuple[str, ...]) -> object:
    """The type of the argument ``rest`` (``optim.lr``: a field of a dataclass argument), or None."""
    tp = hints.get(rest[0])
    for part in rest[1:]:
        group = next((t for t in _flat(tp) if dataclasses.is_dataclass(t)), None)
        tp = typing.get_type_hints(group).get(part) if group else None
    return tp


def _classes(tp: object) -> list[type]:
    """The classes a type names (``Logger`` in ``Logger | Iterable[Logger] | bool``), plain types left out."""
    found = []
    for member in _flat(tp):
        origin = typing.get_origin(member)
        if origin is typing.Literal:
            continue
        if origin is not None:
            found += [cls for arg in typing.get_args(member) for cls in _classes(arg)]
        elif (
            isinstance(member, type)
            and member not in TYPE_NAMES
            and not issubclass(member, os.PathLike | enum.Enum)
        ):
            found.append(member)  # an Enum is chosen by a member's name (SIGUSR1), not by a class path
    return list(dict.fromkeys(found))


def _subclasses(base: type) -> list[type]:
    found, stack = [], list(base.__subclasses__())
    while stack:
        found.append(stack.pop())
        stack += found[-1].__subclasses__()
    return found


def _subclass_names(base: type) -> list[str]:
    return sorted({cls.__name__ for cls in _subclasses(base)})


def _named(name: object, bases: list[type]) -> type | None:
    """The class ``name`` (an import path, or the short name of one of ``bases`` or their subclasses)."""
    if not isinstance(name, str):
        return None
    if "." in name:
        module, _, attr = name.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), attr, None)
        except Exception:  # noqa: BLE001 (a module that fails to import: _class_choice words it)
            return None
        return found if isinstance(found, type) else None
    return next((c for b in bases for c in (b, *_subclasses(b)) if c.__name__ == name), None)


def _node(tree: object, key: tuple[str, ...]) -> object:
    """What a defaults tree holds at ``key``, through the ``init_args`` of each class on the way."""
    node = tree
    for i, part in enumerate(key):
        if i and hasattr(node, "get") and node.get("init_args") is not None:
            node = node["init_args"]
        node = node.get(part) if hasattr(node, "get") else None
    return node


def _default_class(tree: object, key: tuple[str, ...]) -> type | None:
    """The class a parser's defaults give ``key`` (``data.augmentation``: the default data's)."""
    node = _node(tree, key)
    return _named(node.get("class_path") if hasattr(node, "get") else node, [])


def _given(ctx: Context, key: tuple[str, ...]) -> str | None:
    """The class name the user gives ``key`` last, or None."""
    given = (s.value for s in reversed(ctx.settings) if s.key == key and not s.help)
    return next((value for value in given if isinstance(value, str)), None)


def _classes_around(ctx: Context, s: Setting) -> tuple[type | None, Setting | None]:
    """The class of ``s``'s top-level key in effect at ``s``, and the later setting that gives that key
    another class (a recipe's data, then ``--data=StreamingDataModule``), or None."""
    base = ctx.bases.get(s.key[0])
    if len(s.key) < 2 or not isinstance(base, type) or base in TYPE_NAMES or s.key[0] == "trainer":
        return None, None
    at = next((i for i, setting in enumerate(ctx.settings) if setting is s), None)
    if at is None:  # a setting derived from one given (_help_of's, without its .help)
        return None, None

    def chosen(settings: list[Setting]) -> Setting | None:
        given = (x for x in reversed(settings) if x.key == s.key[:1] and not x.help)
        return next((x for x in given if isinstance(x.value, str)), None)

    later, earlier = chosen(ctx.settings[at + 1 :]), chosen(ctx.settings[:at])
    # A class chosen later is no default (classes_named): before it, the key takes the base class.
    then = _named(earlier.value, [base]) if earlier else _default_class(ctx.defaults, s.key[:1]) or base
    if later is None or _named(later.value, [base]) is then:
        return then, None
    return then, later


def _taken_by(ctx: Context, cls: type | None, key: tuple[str, ...]) -> bool:
    return _in_class(ctx, key[:1], cls, key[1:], nested=False).known


def _class_replaced_after(ctx: Context, s: Setting) -> bool:
    """Whether a later setting gives the class of ``s``'s top-level key another class than the one in effect
    at ``s``, which takes ``s``: jsonargparse drops the arguments of the earlier class that the later one
    does not take, so they are no mistake."""
    then, later = _classes_around(ctx, s)
    return later is not None and _taken_by(ctx, then, s.key)


def _called(ctx: Context, key: tuple[str, ...]) -> bool:
    """Whether ``key`` takes a callable (the model's network: it calls ``net(num_classes, ...)``)."""
    return any(typing.get_origin(t) is collections.abc.Callable for t in _flat(_place(ctx, key).annotation))


def _place(ctx: Context, key: tuple[str, ...]) -> Place:
    """Where ``key`` lands: among the parser's keys, or the arguments of the class its first part takes."""
    base = ctx.bases.get(key[0])
    if base is None:
        name = ".".join(key)
        if name in ctx.keys:  # the subcommand's own arguments: Trainer.fit's ckpt_path, ...
            method = getattr(ctx.bases.get("trainer"), ctx.command, None)
            return Place(name, annotation=_annotations(method).get(name))
        return (
            Place(name, group=True)
            if any(k.startswith(f"{name}.") for k in ctx.keys)
            else Place(name, known=False, candidates=tuple(ctx.keys))
        )
    if key[0] == "trainer":  # the only class of its key: a group of its arguments, named as its own
        return (
            Place("trainer", group=True) if len(key) == 1 else _in_class(ctx, key[:1], base, key[1:], False)
        )
    if not isinstance(base, type) or base in TYPE_NAMES:  # a plain setting (--dist_timeout)
        return Place(".".join(key), known=len(key) == 1, annotation=base)
    if len(key) == 1:
        return Place(key[0], annotation=base | None)
    given = _given(ctx, key[:1])
    cls = _named(given, [base]) if given else _default_class(ctx.defaults, key[:1]) or base
    return _in_class(ctx, key[:1], cls, key[1:], nested=False)


def _in_class(
    ctx: Context, prefix: tuple[str, ...], cls: type | None, rest: tuple[str, ...], nested: bool
) -> Place:
    """``rest`` among the arguments of ``cls``, the class at ``prefix``; ``nested``: ``cls`` is itself an
    argument of a class (the network of the model), whose keys are written with their ``init_args``."""

    def shown(parts: Iterable[str]) -> str:
        return (
            ".init_args.".join(prefix) + ".init_args." + ".".join(parts)
            if nested
            else ".".join((*prefix, *parts))
        )

    keys = _class_keys(cls) if cls is not None else set()
    if not keys:  # no class known: the choice itself is reported by _class_choice
        return Place(shown(rest))
    if nested and _called(ctx, prefix):  # a callable's first argument comes from the class it is given to
        keys -= set(list(inspect.signature(cls).parameters)[:1])
    hints = _hints(cls)
    inner = _inner_class(ctx, prefix, cls, rest[0]) if len(rest) > 1 else None
    if inner is not None:
        deeper = nested or prefix[0] != "trainer" or len(prefix) > 1
        return _in_class(ctx, (*prefix, rest[0]), inner, rest[1:], nested=deeper)
    name, place = ".".join(rest), functools.partial(Place, shown(rest), owner=cls, at=prefix)
    if name in keys:
        return place(annotation=_type_at(hints, rest))
    if any(k.startswith(f"{name}.") for k in keys):
        return place(group=True)
    # A misspelt class_path or init_args: of this class (init_arg.batch_norm), or of an argument that takes a
    # class not known yet (net.class_pat).
    if rest[0] not in {k.split(".")[0] for k in keys} and prefix != ("trainer",):
        spec = _spec_typo(".init_args.".join(prefix) if nested else ".".join(prefix), rest)
        meant = _in_class(ctx, prefix, cls, rest[1:], nested) if spec and len(rest) > 1 else None
        if meant is not None and not (meant.known or meant.group):
            # This class takes no such argument either: what the key spelt right would have been told.
            found = meant.candidates[0] if meant.moved else _closest(meant.shown, meant.candidates)
            return place(known=False, candidates=(found,) if found else (), moved=bool(found))
    else:
        spec = (
            _spec_typo(".init_args.".join((*prefix, rest[0])), rest[1:])
            if _classes(hints.get(rest[0]))
            else ""
        )
    if spec:
        return place(known=False, candidates=(spec,))
    moved = () if nested or prefix == ("trainer",) else _moved(ctx, prefix, cls, name)
    if moved:
        return place(known=False, candidates=moved, moved=True)
    # A nested class's arguments are compared by name: the long common prefix would make any look close.
    close = difflib.get_close_matches(name, keys, n=1, cutoff=CLOSE) if nested else keys
    return place(known=False, candidates=tuple(shown(k.split(".")) for k in close))


def _spec_typo(at: str, rest: tuple[str, ...]) -> str:
    """The key ``rest`` at the class at ``at`` meant, where its first part is a misspelt class_path or
    init_args (``init_arg.batch_norm``: ``init_args.batch_norm``), else ""."""
    spec = difflib.get_close_matches(rest[0], SPEC_KEYS, n=1, cutoff=CLOSE) if rest else []
    return ".".join((at, spec[0], *rest[1:])) if spec and rest[0] not in SPEC_KEYS else ""


def _inner_class(ctx: Context, prefix: tuple[str, ...], cls: type, name: str) -> type | None:
    """The class given to ``cls``'s argument ``name`` (the model's network), by the user or by default."""
    tp = _hints(cls).get(name)
    if any(dataclasses.is_dataclass(t) for t in _flat(tp)):
        return None
    given = _given(ctx, (*prefix, name))
    if given:
        return _named(given, _classes(tp))
    defaults = _class_parser(cls).get_defaults() if _class_parser(cls) else {}
    return _default_class(ctx.defaults, (*prefix, name)) or _default_class(defaults, (name,))


def _moved(ctx: Context, prefix: tuple[str, ...], cls: type, name: str) -> tuple[str, ...]:
    """The keys of ``name`` among the arguments of the classes given to ``cls``'s (``model.batch_norm``: the
    network's, ``model.init_args.net.init_args.batch_norm``)."""
    found = []
    for arg in _hints(cls):
        inner = _inner_class(ctx, prefix, cls, arg)
        if inner is not None and inner is not cls and name in _class_keys(inner):
            found.append(".init_args.".join((*prefix, arg)) + f".init_args.{name}")
    return tuple(found)


# --- the checks: each takes one setting and returns its line, or None --------------------------------------

# The options whose value is a class chosen by short name.
CHOSEN = (("model",), ("data",))


def _unknown_command(command: str) -> str | None:
    if command in ALL_COMMANDS:
        return None
    match = _closest(command, ALL_COMMANDS)
    hint = f": did you mean {match}?" if match else ""
    return f"unknown command {command!r}{hint} (the commands are {', '.join(ALL_COMMANDS)})"


def _config_file(words: list) -> str | None:
    for _, option, value in words:
        path = os.path.abspath(value or ".")
        if option not in ("-c", "--config") or not value:
            continue
        if os.path.isdir(path):
            return f"--config: {path!r} is a folder, not a file: pass the YAML file in it"
        if not os.path.exists(path) and "\n" not in value and not value.lstrip().startswith("{"):
            return f"--config: no such file {path!r}: check the path"  # (not a config given inline)
    return None


def _invalid_yaml(argv: list[str]) -> str | None:
    for _, path in config_files(argv):
        try:
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            # The context mark is where the broken construct starts (an unclosed `[`), the problem mark
            # where the parser noticed (often the end of the file).
            mark = getattr(err, "context_mark", None) or getattr(err, "problem_mark", None)
            at = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            what = ": ".join(filter(None, (getattr(err, "context", None), getattr(err, "problem", None))))
            return f"{path}{at}: not valid YAML ({what or err}): fix the file"
    return None


def _not_an_option(ctx: Context, s: Setting) -> str | None:
    if s.key[0] not in NOT_OPTIONS:
        return None
    return f"{s.where()}there is no --{'.'.join(s.key)}: {NOT_OPTIONS[s.key[0]]}"


def _class_named(ctx: Context, s: Setting) -> tuple[Place, list[type]] | None:
    """The place and the classes it takes, for a setting naming a class (``--trainer.logger=CSVLogger``)."""
    place = _place(ctx, s.key)
    classes = _classes(place.annotation) if place.known else []
    if not (classes and isinstance(s.value, str)) or str in _flat(place.annotation):
        return None
    return place, classes


def _import_failure(module: str, err: Exception) -> str | None:
    """What stopped ``module``, which exists, from importing: a package it imports that is not installed, or
    an exception its code raised, at the file and line; None where ``module`` itself is not there."""
    missing = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
    if missing and (module == missing or module.startswith(f"{missing}.")):
        return None  # a mistyped path, not a failing module
    if isinstance(err, SyntaxError) and err.filename:
        at = f"{err.filename}, line {err.lineno}"
    else:
        frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith("<")]
        at = f"{frames[-1].filename}, line {frames[-1].lineno}" if frames else module
    if missing:
        return (
            f"{module} cannot be imported: it imports {missing}, which is not installed ({at}): install it,"
            " or fix the import"
        )
    message = " ".join(str(err.msg if isinstance(err, SyntaxError) else err).split())
    return f"{module} cannot be imported: {type(err).__name__}: {message} ({at}): fix the module"


def _class_choice(ctx: Context, s: Setting) -> str | None:
    """A class name that does not import, or names a class the option does not take."""
    if isinstance(s.value, list):  # a YAML list of classes (trainer.callbacks): each one's class_path
        paths = [c.get("class_path") for c in s.value if isinstance(c, dict)]
        named = [dataclasses.replace(s, value=p, text=p) for p in paths if isinstance(p, str)]
        lines = (_class_choice(ctx, one) for one in named)
        return next(filter(None, lines), None)
    named = _class_named(ctx, s)
    if named is None:
        return None
    (place, classes), name, chosen = named, s.value, s.key in CHOSEN
    at, module_name, attr = f"{s.where()}{s.shown(place.shown)}", *s.value.rpartition(".")[::2]
    if s.key == ("model",) and not module_name and attr in RENAMED_MODELS:  # lit_ddp.models.<it> still reads
        return f"{at}: renamed in 0.3.0: name {RENAMED_MODELS[attr]} (same arguments, same weights)"
    found, problem, match = _named(name, classes), "", ""
    if found is None and module_name:
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # noqa: BLE001 (the user's module raising as it is imported)
            failed = _import_failure(module_name, err)
            if failed:
                return f"{at}: {failed}"
            problem = f"no module {err.name or module_name}"
        else:
            found = getattr(module, attr, None)
            there = [n for n in dir(module) if not n.startswith("_") and isinstance(getattr(module, n), type)]
            match = next((n for n in there if n.lower() == attr.lower()), "") or _closest(attr, there)
            problem = "" if found is not None else f"{module_name} has no {attr}"
    choices = f"(the choices are {', '.join(_subclass_names(classes[0]))})"
    if problem:
        hint = (
            f": did you mean {module_name}.{match}?"
            if match
            else ": check the import path (package.module.Class)"
        )
        return f"{at}: no such class ({problem}){hint}{f' {choices}' if chosen and not match else ''}"
    if chosen and found is None:
        names = _subclass_names(classes[0])
        match = _closest(name, names) or next((n for n in names if n.lower() == name.lower()), "")
        return f"{at}: no such {s.key[0]} class{f': did you mean {match}?' if match else ''} {choices}"
    if chosen and not (isinstance(found, type) and issubclass(found, classes[0])):
        return (  # importable, but not a model / data class (`os.system`): say that, not "null"
            f"{at}: not an {classes[0].__name__} subclass, so it is not used (nothing was run): choose one of"
            f" {', '.join(_subclass_names(classes[0]))}, or a subclass of your own"
        )
    if (
        isinstance(found, type)
        and issubclass(found, tuple(classes))
        or _called(ctx, s.key)
        and callable(found)
    ):
        return None
    return f"{at}: expected {_expected(place.annotation, s.text)}"


def _help_of(ctx: Context, s: Setting) -> str | None:
    """``--KEY.help=NAME``: a NAME that is no class KEY takes, or a KEY that takes no class (no such
    option)."""
    if _class_named(ctx, s) is None:
        return _unknown_key(ctx, dataclasses.replace(s, key=(*s.key, "help"), help=False))
    return _class_choice(ctx, s)


def _replacement(ctx: Context, one: Setting) -> list[tuple[str, object]] | None:
    """What replaces a key 0.3.0 removed, at its value: the settings (none: it is the default now), or None
    for any other key. 0.2's callback keys are the parameters of the groups they went into (a default
    callback's bare key turns it off; its arguments keep their names, but nan_guard's read)."""
    key = one.key
    if key[0] == "data" and len(key) == 2 and key[1] in REMOVED:
        return [] if one.value is None else [(f"data.{k}", v) for k, v in REMOVED[key[1]](one.value)]
    if key[0] in ALWAYS_ON and len(key) <= 2:
        return []
    for group in (g for g in GROUPS if g in ctx.bases):
        params = inspect.signature(ctx.bases[group]).parameters
        param = params.get({"read": "nan_read"}.get(key[-1], key[-1]))
        if key[0] not in params or param is None or len(key) > 2:
            continue
        if len(key) == 1:
            return [(f"{group}.{key[0]}", False)] if one.value is None else []
        default = getattr(param.default, "name", param.default)  # an enum as YAML writes it
        return [] if one.value == default else [(f"{group}.{param.name}", one.value)]
    return None


def _removed(ctx: Context, s: Setting) -> str:
    """Every key 0.3.0 removed that ``s``'s file (or the command line) gives, with what replaces it at its
    value, in one line: a config.yaml 0.2 saved holds some thirty."""
    given = [o for o in ctx.settings if o.file == s.file and _replacement(ctx, o) is not None]
    given = [o for o in given if not _place(ctx, o.key).known]
    parts = []
    for one in given:
        new = _replacement(ctx, one)
        if not new:
            continue
        if one.file:
            fix = f"delete it and set {', '.join(f'{k}: {yaml_flow(v)}' for k, v in new)}"
        else:
            fix = f"pass {' '.join(f'--{k}={yaml_flow(v)}' for k, v in new)}"
        parts.append(
            f"{'.'.join(one.key)}: {yaml_flow(one.value)}: {fix}"
            if one.file
            else f"--{'.'.join(one.key)}={one.text}: {fix}"
        )
    same = [".".join(o.key) if o.file else f"--{'.'.join(o.key)}" for o in given if not _replacement(ctx, o)]
    if same:
        parts.append(f"{', '.join(same)}: the default now, {'delete them' if s.file else 'leave them out'}")
    return f"{s.where()}removed in 0.3.0: {'; '.join(parts)}"


def _unknown_key(ctx: Context, s: Setting) -> str | None:
    place = _place(ctx, s.key)
    if place.known or _class_replaced_after(ctx, s):
        return None
    key, where = place.shown, s.where()
    if _replacement(ctx, s) is not None:
        return _removed(ctx, s)
    what = f"unknown key {key}" if where else f"unknown option --{_option(key)}"
    owner = place.owner
    first = next(iter(inspect.signature(owner).parameters), None) if owner else None
    if ".init_args." in key and s.key[-1] == first:
        # The network's first argument is not an option: the model calls Net(num_classes, ...) with the
        # data's classes.
        name = f"{owner.__module__}.{owner.__qualname__}"
        if first != "num_classes":  # left out, it would silently be given the number of classes
            return (
                f"{where}{what}: {first} is the first argument of {name}, which the model fills with the"
                f" number of classes (from the data): make num_classes its first argument (def __init__(self,"
                f" num_classes, {first}, ...)); if {first} is the number of classes, leave it out"
            )
        return (
            f"{where}{what}: {first} is the first argument of {name}, which the model passes itself (the"
            " number of classes, from the data): leave it out"
        )
    chooser = _chooser(ctx, place)
    others = [] if chooser or place.moved else _taken_elsewhere(ctx, place, s.key[len(place.at)])
    if others:  # the default class's near name (val_size for val_resize) would set something else
        one = others[0]
        example = (
            f"class_path: {one.__module__}.{one.__name__} in {place.at[0]}:"
            if where
            else f"--{place.at[0]}={one.__name__} before it"
        )
        takes, pick = ("takes", "it") if len(others) == 1 else ("take", "one")
        return (
            f"{where}{what}: {place.owner.__name__}, the default {place.at[0]} class, takes no"
            f" {s.key[len(place.at)]}; {', '.join(c.__name__ for c in others)} {takes} it: choose {pick}"
            f" first ({example})"
        )
    match = place.candidates[0] if place.moved else _closest(key, place.candidates)
    hint = f": did you mean {match if where else '--' + _option(match)}?" if match else ""
    if chooser is None or match and not place.moved:  # a misspelt name, or the default class's
        return f"{where}{what}{hint or f': see {ctx.prog} {ctx.command} --help for the options'}"
    # The class a file or an option chose takes no such argument (another class does): name that class.
    owner, by = place.owner.__name__, chooser.file or chooser.shown(".".join(place.at))
    options = f" (see {ctx.prog} {ctx.command} --{place.at[0]}.help {owner})" if len(place.at) == 1 else ""
    argument = s.key[len(place.at) :]
    if len(argument) > 1 and difflib.get_close_matches(argument[0], SPEC_KEYS, n=1, cutoff=CLOSE):
        argument = argument[1:]  # a misspelt init_args before it
    taken = f"{owner}, the {'.'.join(place.at)} class {by} chooses, takes no {'.'.join(argument)}"
    return f"{where}{what}: {taken}{hint or options}"


def _taken_elsewhere(ctx: Context, place: Place, name: str) -> list[type]:
    """The model or data classes other than ``place``'s owner (the default one) that take the argument
    ``name``, which the owner does not take; none for another key."""
    if place.owner is None or len(place.at) != 1 or place.at not in CHOSEN:
        return []
    base = ctx.bases.get(place.at[0])
    if not isinstance(base, type) or name in _argument_names(place.owner):
        return []
    found = (c for c in (base, *_subclasses(base)) if c is not place.owner and not inspect.isabstract(c))
    taking = [c for c in found if not c.__name__.startswith("_") and name in _argument_names(c)]
    # The first class of each line that takes it (ImageClassifier for net), not every subclass of it that
    # happens to be imported: the line names the class to choose, and its subclasses take it from there.
    roots = [c for c in taking if not any(other is not c and issubclass(c, other) for other in taking)]
    return sorted(roots, key=lambda c: c.__name__)


def _argument_names(cls: type) -> set[str]:
    return {k.split(".")[0] for k in _class_keys(cls)}


def _chooser(ctx: Context, place: Place) -> Setting | None:
    """The setting that chose ``place``'s owner class (a file's class_path, ``--data=NAME``), or None for a
    default class."""
    given = (
        s for s in reversed(ctx.settings) if s.key == place.at and not s.help and isinstance(s.value, str)
    )
    chooser = next(given, None)
    if chooser is None or place.owner is None or _named(chooser.value, [place.owner]) is not place.owner:
        return None
    return chooser


def _config_named(file: Path | InlineConfig) -> str:
    return str(file) if isinstance(file, InlineConfig) else f"--config {file}"


def _before_its_class(ctx: Context, s: Setting) -> str | None:
    """A setting of the model or the data given before the setting that chooses their class (``--data.strict
    --config recipe.yaml``): jsonargparse reads it against the class in effect where it stands, which does
    not take it, though the class chosen after it does."""
    then, later = _classes_around(ctx, s)
    if later is None or _taken_by(ctx, then, s.key) or not _place(ctx, s.key).known:
        return None
    given = s.shown(_place(ctx, s.key).shown)
    chooser = _config_named(later.file) if later.file else later.shown(later.key[0])
    fix = f"give {_config_named(s.file)} after {chooser}" if s.file else f"put {given} after {chooser}"
    chosen = getattr(_named(later.value, [ctx.bases[s.key[0]]]), "__name__", later.text)
    return (
        f"{s.where()}{given} comes before {chooser}, which chooses the {s.key[0]} class ({chosen}), and is"
        f" read as a setting of {getattr(then, '__name__', 'the base class')}, which does not take it: {fix}"
    )


def _bare(ctx: Context, s: Setting) -> str | None:
    """An option that takes a value given none: argparse names the option its key starts with instead
    (``--model.optim.lr``: "argument --model: expected one argument"). A true-or-false one may stand alone."""
    place = _place(ctx, s.key)
    if not place.known or place.group or bool in _flat(place.annotation):
        return None
    key = _option(place.shown)
    return (
        f"--{key} is given no value: pass --{key}=VALUE (an empty shell variable, `--{key} $X`, leaves it"
        " out)"
    )


def _group(ctx: Context, s: Setting) -> str | None:
    """A group of settings (``--model.optim``) given one value: jsonargparse read it as a file name; or given
    a file that holds the group's own name at its top (a preset: ``--trainer=debug.yaml``)."""
    place = _place(ctx, s.key)
    if not place.group or isinstance(s.value, dict):
        return None
    if Path(s.text).is_file():
        return None if s.file else _group_file(place, Path(s.text))
    key, listed = place.shown, f"{ctx.prog} {ctx.command} --help lists them"
    if s.file:
        return (
            f"{s.where()}{key}: {s.text}: {key} is a group of settings, not one value: write them on the"
            f" lines below it, indented ({listed})"
        )
    key = _option(key)
    return (
        f"--{key}={s.text}: {key} is a group of settings, not one value: set them one by one,"
        f" --{key}.FIELD=VALUE ({listed}), or give a YAML file of them"
    )


def _group_file(place: Place, path: Path) -> str | None:
    """A file given to a group (``--trainer=FILE``) is its settings; one under the group's name is read as
    a setting named ``trainer.trainer``."""
    try:
        content = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    name, key = place.shown.split(".")[-1], _option(place.shown)
    if not (isinstance(content, dict) and name in content):
        return None
    return (
        f"--{key}={path} holds {name}: at its top, as a --config file does: pass it as --config {path}, or"
        f" write the file's settings at its top, not under {name}:"
    )


def _required(ctx: Context, s: Setting) -> str | None:
    """A class named without an argument it requires (``--model=ImageClassifier`` without its net)."""
    named = _class_named(ctx, s)
    cls = _named(s.value, named[1]) if named else None
    if cls is None:
        return None
    place = named[0]
    called = _called(ctx, s.key)  # its first argument comes from the class it is given to
    # A null is no value: jsonargparse counts a required argument given null (--print_config writes one
    # that has no default as null) as missing.
    given = {
        x.key[len(s.key)]
        for x in ctx.settings
        if x.key[: len(s.key)] == s.key and x.key != s.key and (x.value is not None or not x.file)
    }
    defaults = _node(ctx.defaults, s.key)  # a project's default model may give its network
    init_args = defaults.get("init_args") if hasattr(defaults, "get") else None
    given |= set(vars(init_args) if isinstance(init_args, Namespace) else init_args or {})
    params = list(inspect.signature(cls).parameters.values())[1 if called else 0 :]
    missing = [
        p.name
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        if p.name not in given and (*s.key, p.name) not in PASSED
    ]
    if not missing:
        return None
    key, name, needs = place.shown, s.text.rpartition(".")[2], ", ".join(missing)
    if s.file:
        return f"{s.where()}{key}: {name} needs {needs}: set it under its init_args"
    key = _option(key)
    return f"--{key}={name} needs {needs}: add {' '.join(f'--{key}.{a}=VALUE' for a in missing)}"


def _value(ctx: Context, s: Setting) -> str | None:
    """A value its argument's type refuses, checked alone by a parser of that one argument."""
    place = _place(ctx, s.key)
    if not place.known or place.group or place.annotation is None or _class_named(ctx, s):
        return None
    parser = ArgumentParser(exit_on_error=False)
    try:
        parser.add_argument("--value", type=place.annotation)
    except Exception:  # noqa: BLE001 (a type jsonargparse cannot take is not checked here)
        return None
    try:
        if s.file:
            parser.parse_object({"value": s.value})
        else:
            parser.parse_args([f"--value={s.text}"])
    except ArgumentError:
        return f"{s.where()}{s.shown(place.shown)}: expected {_expected(place.annotation, s.text)}"
    return None


def _expected(tp: object, text: str) -> str:
    """What a type allows, in words: the choices of its Literals, its classes, its plain types."""
    members = _flat(tp)
    choices = [
        c if isinstance(c, str) else yaml_flow(c)
        for m in members
        if typing.get_origin(m) is typing.Literal
        for c in typing.get_args(m)
    ]
    kinds, plain = [], []
    for member in members:
        origin = typing.get_origin(member)
        if isinstance(member, type) and issubclass(member, enum.Enum):  # by name: --x=SIGUSR1
            choices += list(member.__members__)
        elif origin in (list, tuple, set, collections.abc.Iterable, collections.abc.Sequence):
            item = (typing.get_args(member) or (object,))[0]
            kinds.append(f"a list of {item.__name__ if isinstance(item, type) else 'them'}")
        elif origin is collections.abc.Callable:  # the model's network: a class, or a function building one
            returned = typing.get_args(member)[-1] if typing.get_args(member) else object
            kinds.append(f"a {getattr(returned, '__name__', 'callable')} class or a function returning one")
        elif member in TYPE_NAMES:
            plain.append(TYPE_NAMES[member])
        elif isinstance(member, type):
            kinds.append(f"a {member.__name__} (or a subclass)")
    allowed = ([f"one of {', '.join(dict.fromkeys(choices))}"] if choices else []) + kinds
    allowed += list(dict.fromkeys(plain))
    concrete = [c for cls in _classes(tp) for c in (cls, *_subclasses(cls)) if not inspect.isabstract(c)]
    names = sorted({c.__name__ for c in concrete})
    match = _closest(text, choices) or _closest(text.rpartition(".")[2], names)
    hint = f" (did you mean {match}?)" if match and match != text else ""
    if not hint and names and "." not in text and text not in names:  # no class near that name: list them
        hint = f" (the classes are {', '.join(names)})"
    return f"{' or '.join(allowed) or 'another value'}{hint}"
