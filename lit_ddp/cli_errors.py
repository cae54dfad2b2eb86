"""One line for each way a command line or a config file can be wrong.

jsonargparse reports a mistyped option with 70 lines of usage, a wrong type with the union's internals and
invalid YAML as ``"<unicode string>", line 2``. A user needs the option (or the file and line), what it
expects, and the closest valid name: ``explain`` turns jsonargparse's message into that line.

jsonargparse raises one type (``ArgumentError``) whose only structure is its message, so the rules read the
phrases in ``JSONARGPARSE_PHRASES``; tests/test_cli_errors.py makes the installed jsonargparse (4.53) emit
each one, so a reworded phrase fails there. Invalid YAML is told by yaml's own exception types, re-reading
the file; a duplicate key or an empty file by our own loader, before jsonargparse reads the file.
"""

import difflib
import importlib
import inspect
import re
from collections.abc import Iterable
from pathlib import Path

import yaml
from jsonargparse import ArgumentParser

from lit_ddp.data import ImageDataModule
from lit_ddp.models import ImageClassifier
from lit_ddp.utils import config_files

COMMANDS: tuple[str, ...] = ("fit", "validate", "test", "predict", "new")
# Every command `main` takes, the two it hands to their own parsers included (cli.main).
ALL_COMMANDS: tuple[str, ...] = (*COMMANDS, "shard", "doctor")
# The options whose value is a class chosen by short name.
CLASS_OPTIONS = {"model": ImageClassifier, "data": ImageDataModule}
# Options that other LightningCLI programs have and lit_ddp leaves out on purpose.
NOT_OPTIONS = {
    "optimizer": "the models build their optimizer from --model.optim.* (name, lr, weight_decay, momentum)",
    "lr_scheduler": "the models build their schedule from --model.optim.* (schedule, warmup_epochs)",
}
TYPE_NAMES = {
    "NoneType": "null",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "text",
}


# The phrases of jsonargparse's messages that the rules below read (text is all an ArgumentError carries).
JSONARGPARSE_PHRASES = {
    "config": r"Problems parsing config",
    "missing_file": r'Parser key "([\w.]+)":\s*File does not exist: (.+)',
    "not_a_file": r'Parser key "([\w.]+)":\s*Path is not a file: (.+)',
    "command": r"invalid choice: '([^']*)'",
    "parser_key": r'Parser key "([\w.]+)"',
    "class_path": r"Problem with given class_path '([\w.]+)'",
    "class_option": (
        r"Option '([\w.]+)' is not accepted|unrecognized arguments: --([\w.]+)"
        r"|Group '([\w.]+)' does not accept option '([\w.]+)'"
    ),
    "unrecognized": r"unrecognized arguments: (\S+)",
    "not_accepted": r"(?:Group '([\w.]+)'|Subcommand '\w+') does not accept option '([\w.]+)'",
    "value": r"(?:Given value|Got value): (.*)",
    "import_path": r"dot import path",
    "literal": r"Literal\[(.*?)\]",
    "type": r"Expected a <class '(\w+)'>",
    "subtypes": r"Subtypes: \[(.*)\]",
    "required": r"the following arguments are required: ([\w.]+(?:, [\w.]+)*)",
    "group": r"Unable to load config ['\"](.*?)['\"]",
}
_PHRASE = {name: re.compile(pattern) for name, pattern in JSONARGPARSE_PHRASES.items()}


def explain(message: str, argv: list[str], option_keys: Iterable[str], prog: str) -> str:
    """``message`` (jsonargparse's) as one line naming the option or file and line, and the fix."""
    message = message.strip()
    for rule in RULES:
        line = rule(message, argv, set(option_keys), prog)
        if line:
            return line
    first = next(line.strip() for line in message.splitlines() if line.strip())
    return f"{first} (see {prog} {_command(argv)} --help)"


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _DuplicateKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (YAML keeps the last,
    silently: `max_epochs: 1` above `max_epochs: 90` would run 90 epochs)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                problem = f"{key!r} is given already on line {seen[key]}"
                raise _DuplicateKey(None, None, problem, key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep)


def config_file_problem(argv: list[str]) -> str | None:
    """The line for a ``--config`` file that is empty or gives a key twice, or None: jsonargparse takes the
    last value of a duplicate without a word, and reports an empty file as ``Unexpected config: ``."""
    for path in _config_files(argv):
        try:
            content = yaml.load(path.read_text(), Loader=_DuplicateKeyLoader)  # noqa: S506 (a SafeLoader)
        except _DuplicateKey as err:
            return f"{path}, line {err.problem_mark.line + 1}: {err.problem}: keep one of them"
        except yaml.YAMLError:
            continue  # jsonargparse reports invalid YAML itself (see _invalid_yaml)
        if content is None:
            return (
                f"{path} holds no settings (it is empty or only comments): put settings in it, or leave out"
                f" --config {path}"
            )
        problem = _trainer_not_a_mapping(path, content)
        if problem:
            return problem
    return None


def _trainer_not_a_mapping(path: Path, content: object) -> str | None:
    """The line for a ``trainer:`` that holds no mapping of settings: left empty (its lines commented out),
    a value, or a list. jsonargparse takes it as the whole trainer group, dropping every trainer setting of
    the files before it, and the run then failed on it with an AttributeError traceback."""
    if not isinstance(content, dict):
        return None
    # A config for the root parser holds each subcommand's settings under its name.
    sections = [((), content)] + [
        ((cmd,), content[cmd]) for cmd in COMMANDS if isinstance(content.get(cmd), dict)
    ]
    for keys, section in sections:
        if "trainer" in section and not isinstance(section["trainer"], dict):
            value = section["trainer"]
            flow = (
                yaml.safe_dump(value, default_flow_style=True).partition("\n...")[0].strip()
            )  # no end marker
            shown = "" if value is None else f" {flow}"
            line = _key_line(path, (*keys, "trainer"))
            at = f", line {line}" if line else ""
            return (
                f"{path}{at}: trainer:{shown} holds no Trainer settings: write them on the lines below it,"
                " indented (`  max_epochs: 3`), or remove the line"
            )
    return None


def _key_line(path: Path, keys: tuple[str, ...]) -> int | None:
    """The line (from 1) of the mapping key reached through ``keys`` in the YAML file ``path``."""
    node = yaml.compose(path.read_text(), Loader=yaml.SafeLoader)
    line = None
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return None
        found = next(((k, v) for k, v in node.value if getattr(k, "value", None) == key), None)
        if found is None:
            return None
        line, node = found[0].start_mark.line + 1, found[1]
    return line


def _command(argv: list[str]) -> str:
    return next((arg for arg in argv if arg in COMMANDS), "fit")


def _config_files(argv: list[str]) -> list[Path]:
    return [path for _, path in config_files(argv)]


def _where(key: str, argv: list[str]) -> str:
    """``FILE, line N: `` where a config file on the command line sets ``key``, else ``--key``'s spelling."""
    if any(arg == f"--{key}" or arg.startswith(f"--{key}=") for arg in argv):
        return ""
    leaf = re.escape(key.rsplit(".", 1)[-1])
    for path in _config_files(argv):
        for number, text in enumerate(path.read_text().splitlines(), start=1):
            if re.match(rf"\s*{leaf}\s*:", text):
                return f"{path}, line {number}: "
    return ""


def _closest(name: str, candidates: Iterable[str]) -> str:
    candidates = sorted(set(candidates))
    # An abbreviation is not expanded (a typo must not change what runs), but it is the likeliest meaning.
    longer = [c for c in candidates if c.startswith(name)]
    match = longer if len(longer) == 1 else difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return match[0] if match else ""


def _class_keys(class_path: str) -> set[str]:
    module, _, name = class_path.rpartition(".")
    parser = ArgumentParser()
    parser.add_class_arguments(getattr(importlib.import_module(module), name), fail_untyped=False)
    return set(parser.get_defaults().keys())


def _first_argument(class_path: str) -> str | None:
    module, _, name = class_path.rpartition(".")
    try:
        params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    return next(iter(params), None)


def _subclass_names(base: type, concrete: bool = False) -> list[str]:
    names, stack = [], list(base.__subclasses__())
    while stack:
        cls = stack.pop()
        if not (concrete and inspect.isabstract(cls)):
            names.append(cls.__name__)
        stack += cls.__subclasses__()
    return sorted(names)


def _unknown(key: str, candidates: Iterable[str], argv: list[str], prog: str) -> str:
    where = _where(key, argv)
    if key.split(".")[0] in NOT_OPTIONS:
        return f"{where}there is no --{key}: {NOT_OPTIONS[key.split('.')[0]]}"
    what = f"unknown key {key}" if where else f"unknown option --{key}"
    match = _closest(key, candidates)
    if match:
        return f"{where}{what}: did you mean {'' if where else '--'}{match}?"
    return f"{where}{what}: see {prog} {_command(argv)} --help for the options"


def _invalid_yaml(message: str, argv: list[str], keys: set[str], prog: str) -> str | None:
    if not _PHRASE["config"].match(message):
        return None
    for path in _config_files(argv):
        try:
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            # The context mark is where the broken construct starts (an unclosed `[`), the problem mark
            # where the parser noticed (often the end of the file).
            mark = getattr(err, "context_mark", None) or getattr(err, "problem_mark", None)
            at = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            what = ": ".join(filter(None, (getattr(err, "context", None), getattr(err, "problem", None))))
            return f"{path}{at}: not valid YAML ({what or err}): fix the file"
    return f"a value is not valid YAML ({message.splitlines()[0].partition(': ')[2]})"


def _missing_file(message: str, argv: list[str], keys: set[str], prog: str) -> str | None:
    found = _PHRASE["missing_file"].search(message)
    if not found:
        return None
    return f"--{found.group(1)}: no such file {found.group(2).strip()}: check the path"


def _not_a_file(message: str, argv: list[str], keys: set[str], prog: str) -> str | None:
    found = _PHRASE["not_a_file"].search(message)
    if not found:
        return None
    return f"--{found.group(1)}: {found.group(2).strip()} is a folder, not a file: pass the YAML file in it"


def _unknown_command(message: str, argv: list[str], keys: set[str], prog: str) -> str | None:
    found = _PHRASE["command"].search(message)
    if not found:
        return None
    match = _closest(found.group(1), ALL_COMMANDS)
    hint = f": did you mean {match}?" if match else ""
    return f"unknown command {found.group(1)!r}{hint} (the commands are {', '.join(ALL_COMMANDS)})"


def _unknown_class_option(message: str, argv: list[str], keys: set[str], prog: str) -> str | None:
    # `--model.lrr=3` or a YAML `model: init_args: lrr:` fails inside the model class's own parser.
    owner = _PHRASE["parser_key"].search(message)
    class_path = _PHRASE["class_path"].search(message)
    inner = _PHRASE["class_option"].search(message)
    if not (owner and class_path and inner):
        return None
    # A key inside a group of the class's settings (YAML `optim: {lrr: ...}`) is named by group and key.
    option = inner.group(1) or inner.group(2) or f"{inner.group(3)}.{inner.group(4)}"
    prefix = owner.group(1)
    if nested := _nested_class(message):  # refused by a class inside the model's own arguments
        prefix, refused_by = nested
        if option == _first_argument(refused_by):
            # The network's first argument is not an option: the model calls Net(num_classes, ...) with the
            # data's classes. It was "did you mean <the same key>?".
            key = f"{prefix}.{option}"
            where = _where(key, argv)
            what = f"unknown key {key}" if where else f"unknown option --{key}"
            return (
                f"{where}{what}: {option} is the first argument of {refused_by}, which the model passes"
                " itself (the number of classes, from the data): leave it out"
            )
        # Compared by name: the long common prefix would make any argument look close.
        close = difflib.get_close_matches(option, _class_keys(refused_by), n=1, cutoff=0.6)
        return _unknown(f"{prefix}.{option}", (f"{prefix}.{k}" for k in close), argv, prog)
    keys = _class_keys(class_path.group(1))
    return _unknown(f"{prefix}.{option}", (f"{prefix}.{k}" for k in keys), argv, prog)


def _nested_class(message: str) -> tuple[str, str] | None:
    """For an option refused by a class given as another class's argument (the network in
    ``model.init_args.net``, the augmentation in ``data.init_args.augmentation``): the full key of that
    class's arguments and its class_path, else None."""
    keys = re.findall(r'Parser key "([\w.]+)"', message)
    # A callable argument (the network) names its class in the value it got; a subclass argument (the
    # augmentation) in its own "Problem with given class_path", after its owner's.
    refused_by = re.search(r"Got value: Namespace\(class_path='([\w.]+)'", message)
    class_paths = _PHRASE["class_path"].findall(message)
    if len(keys) < 2 or not (refused_by or len(class_paths) > 1):
        return None
    return ".init_args.".join(keys) + ".init_args", refused_by.group(1) if refused_by else class_paths[-1]


def _unknown_option(message: str, argv: list[str], keys: set[str], prog: str) -> str | None:
    found = _PHRASE["unrecognized"].search(message)
    if found:
        return _unknown(found.group(1).partition("=")[0].lstrip("-"), keys, argv, prog)
    found = _PHRASE["not_accepted"].search(message)
    if found:  # a group's message names the key inside the group: the full key is group.key
        return _unknown(".".join(filter(None, found.groups())), keys, argv, prog)
    found = _PHRASE["class_option"].search(message)
    if found and found.group(1) and not _PHRASE["parser_key"].search(message):  # a top-level key
        return _unknown(found.group(1), keys, argv, prog)
    return None


def _required_argument(message: str, argv: list[str], keys: set[str], prog: str) -> str | None:
    # `--model=ImageClassifier` without --model.net: jsonargparse's union ends on the whole namespace and
    # `Expected a <class 'NoneType'>`, which read as a class of the wrong kind.
    found = _PHRASE["required"].search(message)
    owner = _PHRASE["parser_key"].search(message)
    class_path = _PHRASE["class_path"].search(message)
    if not (found and owner and class_path):
        return None
    key, name = owner.group(1), class_path.group(1).rpartition(".")[2]
    missing = [arg.strip() for arg in found.group(1).split(",")]
    where = _where(key, argv)
    if where:
        return f"{where}{key}: {name} needs {', '.join(missing)}: set it under its init_args"
    return f"--{key}={name} needs {', '.join(missing)}: add {' '.join(f'--{key}.{a}=VALUE' for a in missing)}"


def _class_not_importable(message: str, argv: list[str], keys: set[str], prog: str) -> str | None:
    # `--trainer.callbacks+=lit_ddp.callbacks.EMAA` or `class_path: nosuchpkg.Model`: jsonargparse's union
    # ends on `Expected a <class 'NoneType'>`, which read as "expected null". Whether the path imports is
    # checked here, not read from the message.
    owner = _PHRASE["parser_key"].search(message)
    class_path = _PHRASE["class_path"].search(message)
    if not (owner and class_path) or "." not in class_path.group(1):
        return None
    path = class_path.group(1)
    module_name, _, name = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        problem, match = f"no module {err.name or module_name}", ""
    else:
        if hasattr(module, name):
            return None  # it imports: another rule says what is wrong with it
        problem = f"{module_name} has no {name}"
        classes = [n for n in dir(module) if not n.startswith("_") and isinstance(getattr(module, n), type)]
        match = next((n for n in classes if n.lower() == name.lower()), "") or _closest(name, classes)
    key = owner.group(1)
    where = _where(key, argv)
    setting = f"{key}: {path}" if where else f"--{key}={path}"
    hint = (
        f": did you mean {module_name}.{match}?"
        if match
        else ": check the import path (package.module.Class)"
    )
    base = CLASS_OPTIONS.get(key)
    choices = (
        f" (the choices are {', '.join(_subclass_names(base))})" if base is not None and not match else ""
    )
    return f"{where}{setting}: no such class ({problem}){hint}{choices}"


def _wrong_value(message: str, argv: list[str], keys: set[str], prog: str) -> str | None:
    keys = _PHRASE["parser_key"].findall(message)
    value = _PHRASE["value"].search(message)
    if not (keys and value):
        return None
    # `--model.optim.lr=x` fails inside the model's parser: its key is the model's key plus its own, and
    # only the inner part of the message is about it (the outer union adds its own `Expected NoneType`).
    nested = len(keys) > 1 and _PHRASE["class_path"].search(message) is not None
    key, value = (f"{keys[0]}.{keys[-1]}" if nested else keys[0]), value.group(1).strip()
    if nested:
        message = message[message.rfind(f'Parser key "{keys[-1]}"') :]
        message = message[: _PHRASE["value"].search(message).start()]
    where = _where(key, argv)
    group = _PHRASE["group"].search(message)
    if group:  # a group of settings (--model.optim) given one value: jsonargparse read it as a file name
        listed = f"{prog} {_command(argv)} --help lists them"
        if where:
            return (
                f"{where}{key}: {group.group(1)}: {key} is a group of settings, not one value: write them on"
                f" the lines below it, indented ({listed})"
            )
        return (
            f"--{key}={group.group(1)}: {key} is a group of settings, not one value: set them one by one,"
            f" --{key}.FIELD=VALUE ({listed}), or give a YAML file of them"
        )
    setting = f"{key}: {value}" if where else f"--{key}={value}"
    base = CLASS_OPTIONS.get(key)
    if base is not None and _PHRASE["import_path"].search(message):
        names = _subclass_names(base)
        match = _closest(value, names) or next((n for n in names if n.lower() == value.lower()), "")
        hint = f": did you mean {match}?" if match else ""
        return f"{where}{setting}: no such {key} class{hint} (the choices are {', '.join(names)})"
    if base is not None:  # importable, but not a model / data class (`os.system`): say that, not "null"
        value = re.sub(r"NestedArg\(key='class_path', val='(.*)'\)", r"\1", value)
        setting = f"{key}: {value}" if where else f"--{key}={value}"
        return (
            f"{where}{setting}: not an {base.__name__} subclass, so it is not used (nothing was run): choose"
            f" one of {', '.join(_subclass_names(base))}, or a subclass of your own"
        )
    return f"{where}{setting}: expected {_expected(message, value)}"


def _expected(message: str, value: str) -> str:
    """What the message's `Expected a ...` lines allow: types, the choices of Literal types, and the classes
    of a union (`--checkpoint` takes a ModelCheckpoint or null, not only the null its last line names)."""
    choices = [c.strip(" '\"") for group in _PHRASE["literal"].findall(message) for c in group.split(",")]
    kinds, classes = _union_classes(message)
    types = [TYPE_NAMES.get(t, t) for t in _PHRASE["type"].findall(message)]
    if any(kind.startswith("a list of") for kind in kinds):
        types = [t for t in types if t != "list"]  # said as "a list of X" already
    allowed = [f"one of {', '.join(dict.fromkeys(choices))}"] if choices else []
    allowed += kinds + [t for t in dict.fromkeys(types) if t not in allowed]
    names = _class_names(classes)
    match = _closest(value, choices) or _closest(value.rpartition(".")[2], names)
    hint = f" (did you mean {match}?)" if match and match != value else ""
    if not hint and names and "." not in value and value not in names:  # no class near that name: list them
        hint = f" (the classes are {', '.join(sorted(set(names)))})"
    return f"{' or '.join(allowed) or 'another value'}{hint}"


def _union_classes(message: str) -> tuple[list[str], list[str]]:
    """The classes a union option takes, as words (``a ModelCheckpoint (or a subclass)``, ``a list of
    Callback``), and their import paths; empty for a union of plain types."""
    found = _PHRASE["subtypes"].search(message)
    kinds, classes = [], []
    for single, item in re.findall(r"<class '([\w.]+)'>|[\w.]+\[([\w.]+)\]", found.group(1) if found else ""):
        path = single or item
        if "." not in path:
            continue  # a builtin type: its own `Expected a <class ...>` line names it
        name = path.rpartition(".")[2]
        kinds.append(f"a list of {name}" if item else f"a {name} (or a subclass)")
        classes.append(path)
    return kinds, classes


def _class_names(paths: list[str]) -> list[str]:
    """The short names of the classes at ``paths`` and of their imported subclasses that can be created (an
    abstract base such as Logger is no choice)."""
    names = []
    for path in paths:
        module, _, name = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        names += [] if inspect.isabstract(cls) else [cls.__name__]
        names += _subclass_names(cls, concrete=True)
    return names


# In order: the first that recognises the message words it.
RULES = (
    _invalid_yaml,
    _missing_file,
    _not_a_file,
    _unknown_command,
    _unknown_class_option,
    _unknown_option,
    _required_argument,
    _class_not_importable,
    _wrong_value,
)


# Packages whose classes a config names and whose constructors raise for the user's set-up, not a bug of
# theirs: the missing package, the tracking store that needs an opt-in. A class of the user's own keeps
# its traceback, which shows where in their code it failed.
LIBRARIES = ("lightning", "pytorch_lightning", "lit_ddp", "torch", "torchvision", "torchmetrics")


def exception_chain(err: BaseException | None) -> list[BaseException]:
    """``err``, then what caused it (``__cause__``, else ``__context__``), down to the first exception."""
    chain, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def constructor_failure(err: BaseException) -> str | None:
    """One line for an exception that a library class named in the config (a logger, a callback, a plugin)
    raised while jsonargparse created it: the class, the exception's type and its own message. None for
    anything else, and for a class of the user's own (its traceback shows where it failed)."""
    chain = exception_chain(err)
    root = chain[-1]
    cls = _constructed_class(root)
    if len(chain) < 2 or cls is None:
        return None
    library = cls.__module__.split(".")[0] in LIBRARIES
    if not (library or isinstance(root, ImportError)):
        return None
    message = " ".join(str(root).split()) or "(no message)"
    return f"{cls.__name__} could not be created: {type(root).__name__}: {message}"


def _constructed_class(err: BaseException) -> type | None:
    """The class whose ``__init__`` the config's instantiation called when ``err`` was raised: the
    outermost constructor in the traceback outside jsonargparse."""
    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        module = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "__init__" and "self" in frame.f_locals:
            if not module.startswith("jsonargparse"):
                return type(frame.f_locals["self"])
        tb = tb.tb_next
    return None
