"""The command line and its config files, checked before jsonargparse reads them: the files' size and
shape, and an order or a setting that would drop what was asked without a word. ``argument_problems(argv)``
gives a line per problem; the CLI reports them and stops before parsing. ``classes_named(argv)`` says which of
the model and the data the command line picks a class for (the others get the command's default class).

- A YAML alias bomb (``a1: [*a0, *a0, ...]`` nine levels deep) is a few hundred bytes that expand to
  billions of nodes: jsonargparse walks the expansion and hangs with no output. The size a file expands to
  is counted on the composed node graph (each alias is counted as often as it is used, in linear time,
  without expanding anything) and refused past ``MAX_NODES``.
- jsonargparse keeps the last of a key given twice in one file without a word (``max_epochs: 1`` above
  ``max_epochs: 90`` ran 90 epochs), reports an empty file as ``Unexpected config: ``, and takes a
  ``trainer:`` that holds no mapping (its lines commented out, a value, a list) as the whole trainer group,
  dropping the trainer settings of the files before it (the run then failed with an AttributeError).
- jsonargparse applies arguments left to right, the later winning: ``--trainer.max_epochs=1 --config
  recipe.yaml`` runs the recipe's 12 epochs, and ``--config presets/debug.yaml --config recipe.yaml`` the
  recipe's 30. An option replaced by a later ``--config`` (``--trainer.callbacks+=X`` too: a file's
  ``trainer.callbacks`` list replaces the list it appended to), and a preset's setting replaced by a recipe
  given after it, are refused in one line that says which order does what was asked. A preset given after
  the recipe adjusts it, as designed.
- A ``--config`` before the command (``--config presets/debug.yaml fit``, which the root's usage shows) is
  the root parser's: it reads each command's settings under the command's name (``fit: {trainer: ...}``)
  and drops the settings at the file's top without a word (the debug preset's limits: the full run), or
  fails on the first class's arguments. Such a file is refused, with the order that reads it; and so is a
  file of settings under a command's name given after the command, whose parser has no key of that name
  (jsonargparse's ``Group 'fit' does not accept option 'trainer.max_epochs'``).
- ``test --data.predict_dir=DIR`` scored the test split without a word: an option only ``predict`` uses, on
  another command's line, is refused with the command that uses it.
"""

from pathlib import Path

import yaml

from lit_ddp.utils import NOT_SETTINGS, command_line, config_files, yaml_flow, yaml_key_line

# Far above any real config (a saved ResNet run's config.yaml is about 400 nodes), far below a hang.
MAX_NODES = 100_000
# The commands a config before the command holds settings for, under their names.
SUBCOMMANDS = ("fit", "validate", "test", "predict")
# Settings jsonargparse accepts that the run then replaces without a word.
UNUSED = {
    # cli.py links the data's num_classes to the model's, at instantiation, over any value given
    "model.num_classes": "the data decides the number of classes (its dataset or class folders), and the"
    " model gets the data's: leave it out",
}
# Options only predict uses, on the command line of another command (the user meant predict), and what that
# command reads instead. A recipe file that sets them serves every command: read as it is.
PREDICT_ONLY = {
    "data.predict_dir": "reads it (every image file under it, labelled into predictions.csv)",
    "predictions": "writes predictions.csv",
}
READS = {
    "fit": "fit trains on the data's train split and validates on its val split",
    "validate": "validate scores the data's val split",
    "test": "test scores the data's test split",
}


def expanded_size(path: Path, limit: int = MAX_NODES) -> int | None:
    """The number of nodes ``path`` expands to (aliases counted once per use), stopping past ``limit``; None
    where the file is not valid YAML (jsonargparse reports that itself)."""
    try:
        root = yaml.compose(path.read_text(), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return None
    sizes: dict[int, int] = {}

    def size(node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = limit + 1  # a cycle (an alias inside its own anchor) expands without end
        children = node.value if isinstance(node.value, list) else []
        total = 1
        for child in children:
            for part in child if isinstance(child, tuple) else (child,):  # mapping entries: (key, value)
                total += size(part)
                if total > limit:
                    break
            if total > limit:
                break
        sizes[id(node)] = min(total, limit + 1)
        return sizes[id(node)]

    return 0 if root is None else size(root)


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _DuplicateKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                problem = f"{key!r} is given already on line {seen[key]}"
                raise _DuplicateKey(None, None, problem, key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


INVALID = object()  # a file that is not YAML: jsonargparse reports it, and settings.py words the line


def _read(path: Path) -> tuple[object, str | None]:
    """A config file's content, read once for every check, and the line for a key it gives twice (its
    content is then INVALID, as a file's that is not YAML)."""
    try:
        return yaml.load(path.read_text(), Loader=_DuplicateKeyLoader), None  # noqa: S506 (a SafeLoader)
    except _DuplicateKey as err:
        return INVALID, f"{path}, line {err.problem_mark.line + 1}: {err.problem}: keep one of them"
    except yaml.YAMLError:
        return INVALID, None


def _shape(path: Path, content: object, command: str) -> str | None:
    """The line for a config file that holds no settings, or a ``trainer:`` that holds none, or None."""
    if content is None:
        return (
            f"{path} holds no settings (it is empty or only comments): put settings in it, or leave out"
            f" --config {path}"
        )
    if not isinstance(content, dict):  # a list or a bare value: jsonargparse's "Unexpected config: - a"
        kind = "a list" if isinstance(content, list) else f"the value {yaml_flow(content)}"
        return (
            f"{path} holds {kind}, not settings: a config maps keys to values (trainer:, model:, data:),"
            " one per line"
        )
    # A config for the root parser holds each subcommand's settings under its name.
    keys = (command,) if isinstance(content, dict) and isinstance(content.get(command), dict) else ()
    tree = content[command] if keys else content
    if not isinstance(tree, dict) or "trainer" not in tree:
        return None
    trainer = tree["trainer"]
    if isinstance(trainer, dict) and trainer:
        return None
    line = yaml_key_line(path, (*keys, "trainer"))
    where = f"{path}, line {line}" if line else str(path)
    shown = "" if trainer is None else f" {yaml_flow(trainer)}"
    return (
        f"{where}: trainer:{shown} holds no Trainer settings: write them on the lines below it, indented"
        " (`  max_epochs: 3`), or remove the line"
    )


def _before(path: Path, content: object, command: str) -> str | None:
    """The line for a config given before the command whose top holds settings, not commands, or None."""
    top = [str(key) for key in content if key not in SUBCOMMANDS] if isinstance(content, dict) else []
    if not top:
        return None
    return (
        f"--config {path} before {command} holds {', '.join(top)} at its top: a config given before the"
        f" command is read for each command's settings under its name ({command}:), and these would not be"
        f" used: give it after the command ({command} --config {path})"
    )


def _after(path: Path, content: object, command: str) -> str | None:
    """The line for a config given after the command that holds settings under a command's name, or None."""
    under = [str(key) for key in content if key in SUBCOMMANDS] if isinstance(content, dict) else []
    if not under:
        return None
    return (
        f"--config {path} after {command} holds {', '.join(under)} at its top, as a config given before the"
        f" command does: give it before the command (--config {path} {command}), or write its settings at"
        f" its top, not under {under[0]}:"
    )


def _settings(tree, prefix: str = "") -> set[str]:
    """The option keys a config tree sets, as the command line spells them: ``init_args`` left out, and a
    ``class_path`` is its option's own key (``model.class_path`` is ``--model``)."""
    if not isinstance(tree, dict):
        return {prefix} if prefix else set()
    keys = set()
    for key, value in tree.items():
        if key == "init_args":
            keys |= _settings(value, prefix)
        elif key == "class_path":
            keys.add(prefix)
        else:
            keys |= _settings(value, f"{prefix}.{key}" if prefix else str(key))
    return keys


def _lists(tree, prefix: str = "") -> set[str]:
    """The keys of ``_settings(tree)`` whose value is a list (``trainer.callbacks``): a file replaces the
    whole list, so also every option that set an entry of it (``--trainer.callbacks.decay``)."""
    if isinstance(tree, list):
        return {prefix} if prefix else set()
    if not isinstance(tree, dict):
        return set()
    keys = set()
    for key, value in tree.items():
        keys |= _lists(value, prefix if key == "init_args" else f"{prefix}.{key}" if prefix else str(key))
    return keys


def _replaced(key: str, settings: set[str], lists: set[str]) -> str | None:
    """The setting of a file that replaces the option ``key`` given before it, or None."""
    if key in settings:
        return key
    return next((s for s in sorted(lists) if key.startswith(f"{s}.")), None)


def _flag_key(option: str | None) -> str | None:
    if not option or not option.startswith("--") or option in NOT_SETTINGS:
        return None
    # `--trainer.callbacks+=X` appends to trainer.callbacks: the same setting, for a later file to replace.
    return option[2:].removesuffix("+").replace(".init_args.", ".")


def _predict_only(argv: list[str], words: list, command: str) -> list[str]:
    """A line for each option of ``PREDICT_ONLY`` that ``argv`` gives a value (not null) to, where its command
    is another one of ``READS``."""
    lines = []
    for i, option, value in words if command in READS else ():
        key = _flag_key(option) or ""
        meant = next((k for k in PREDICT_ONLY if key == k or key.startswith(f"{k}.")), None)
        if meant is None or value is None or _null(value):
            continue  # a bare option is jsonargparse's to report
        shown = argv[i] if "=" in argv[i] else f"{argv[i]} {value}"
        lines.append(
            f"{shown} would not be used: {READS[command]}; only predict {PREDICT_ONLY[meant]}: run predict"
            " with it, or leave it out"
        )
    return lines


def _null(value: str) -> bool:
    try:
        return yaml.safe_load(value) is None
    except yaml.YAMLError:
        return False


def argument_problems(argv: list[str]) -> list[str]:
    """One line for each ``--config`` file that expands past ``MAX_NODES`` (nothing else is read then), else
    for each file that gives a key twice or has no settings where it needs some, for the first setting
    that a later file replaces (see the module's docstring), and for each setting that would be accepted
    and not used (by any command, or by the command given: ``PREDICT_ONLY``)."""
    files = config_files(argv)
    too_large = [
        f"{path} expands to more than {MAX_NODES:,} YAML nodes (anchors and aliases repeated inside each"
        " other): it is not read; write the settings out plainly"
        for _, path in files
        if (expanded_size(path) or 0) > MAX_NODES
    ]
    if too_large:
        return too_large
    words = command_line(argv)
    command = next((word for _, option, word in words if option is None), "fit")
    at = next((i for i, option, _ in words if option is None), None)  # the command's position
    lines, contents = [], {}
    for i, path in files:
        content, line = _read(path)
        line = line or (None if content is INVALID else _shape(path, content, command))
        if content is not INVALID and at is not None:
            line = line or (_before if i < at else _after)(path, content, command)
        lines += [line] if line else []
        contents[i] = (path, content)
    given, replaced = _order(argv, words, contents)
    lines += [replaced] if replaced else []
    lines += _predict_only(argv, words, command) if at is not None else []  # doctor's: no command
    for key, why in UNUSED.items():
        if key in given:  # the option as given, or the file that sets it
            setting = given[key] if given[key].startswith("--") else f"{given[key]}: {key}"
            lines.append(f"{setting} would not be used: {why}")
    return lines


def _order(argv: list[str], words: list, contents: dict) -> tuple[dict[str, str], str | None]:
    """Each setting given -> the option or file that gives it last, and the line for the first place where
    a later file replaces an option, or a recipe a preset (None if none does). ``words``: ``argv`` read by
    ``command_line``; ``contents``: each config file's position → (its path, its content)."""
    given: dict[str, str] = {}  # in command-line order
    recipes: set[str] = set()
    for i, option, value in words:
        if i in contents:
            path, content = contents[i]
            if content is INVALID:
                continue  # said already, or jsonargparse's to report
            # A preset after the recipe adjusts it (stacked presets are the design); a recipe, which chooses
            # the model or data class, after a preset replaces the preset's settings instead. A file that
            # only sets the model's or the data's arguments (`data: {init_args: ...}`) is a preset.
            settings, lists = _settings(content), _lists(content)
            recipe = bool({"model", "data"} & settings)
            for given_key in sorted(given):
                key = _replaced(given_key, settings, lists)
                if key is None:
                    continue
                earlier = given[given_key]
                if not (recipe or earlier.startswith("--")):
                    continue
                if earlier.startswith("--"):
                    fix = f"put {earlier} after --config {path}"
                elif earlier in recipes:  # either order replaces one recipe's settings with the other's
                    fix = (
                        f"{earlier} and {path} are both recipes (each chooses the model or the data): give"
                        " one of them, and the settings to change after it (--KEY=VALUE or a preset file)"
                    )
                else:
                    fix = f"give --config {earlier} after --config {path}"
                return given, (
                    f"--config {path} sets {key} after {earlier} did, and the later one wins: {fix}"
                    " (later arguments override earlier ones)"
                )
            given.update({key: str(path) for key in settings})
            if recipe:
                recipes.add(str(path))
        elif (key := _flag_key(option)) is not None:
            given[key] = argv[i] if "=" in argv[i] or value is None else f"{argv[i]} {value}"
    return given, None


def _picks_a_class(value: object) -> bool:
    """Whether a ``--model`` / ``--data`` value, or a config file's ``model:`` / ``data:``, picks the class: a
    class name, ``{class_path: ...}``, null, or a file holding one; init_args alone keep the default class."""
    if isinstance(value, str):
        try:
            path = Path(value)
            value = yaml.safe_load(path.read_text() if path.suffix in (".yaml", ".yml", ".json") else value)
        except (OSError, yaml.YAMLError):
            return True  # a class name (or a bad value, which jsonargparse then reports)
        if isinstance(value, str):
            return True
    return value is None or (isinstance(value, dict) and "class_path" in value)


def _config_sections(args: list[str] | dict) -> list[dict]:
    """The settings of each config the command line gives (a dict of them in place of a command line), and
    each command's section of a file for the root parser."""
    configs: list[object] = [args] if isinstance(args, dict) else []
    for _, option, value in [] if isinstance(args, dict) else command_line(args):
        if option in ("-c", "--config"):
            try:
                path = Path(value or "")
                configs.append(yaml.safe_load(path.read_text() if path.is_file() else value or ""))
            except (OSError, yaml.YAMLError):
                pass  # jsonargparse reports it
    sections = []
    for config in configs:
        if isinstance(config, dict):
            # a config for the root parser holds each subcommand's settings under its name
            sections += [config, *(v for v in config.values() if isinstance(v, dict))]
    return sections


def classes_named(args: list[str] | dict) -> set[str]:
    """Which of "model" and "data" the command line (or its config files) picks a class for.

    The default class is set only for the others: given as a default, jsonargparse would keep its init_args
    that the picked class also takes (ShapesDataModule's augmentation in ImageNetDataModule) in place of the
    picked class's own defaults (jsonargparse issue 460)."""
    named = set()
    for _, option, value in [] if isinstance(args, dict) else command_line(args):
        for key in ("model", "data"):
            if option == f"--{key}.class_path" or (option == f"--{key}" and _picks_a_class(value or "")):
                named.add(key)
    for section in _config_sections(args):
        named |= {key for key in ("model", "data") if key in section and _picks_a_class(section[key])}
    return named


def without_classes_named(default: dict, key: str, args: list[str] | dict) -> dict:
    """``default`` (the command's default ``{class_path, init_args}`` for ``key``) without the arguments
    holding a class (a project's ``net``) that the command line or its config files pick another class for:
    as for the default class itself (``classes_named``), jsonargparse would keep the default network's
    arguments that the picked one also takes (``width``) in place of its own defaults."""
    init_args = default.get("init_args") or {}
    held = {name for name, value in init_args.items() if isinstance(value, dict) and "class_path" in value}
    picked = set()
    for _, option, value in [] if isinstance(args, dict) else command_line(args):
        for name in held:
            spelt = (f"--{key}.{name}", f"--{key}.init_args.{name}")
            if (
                option in spelt
                and _picks_a_class(value or "")
                or option in {f"{o}.class_path" for o in spelt}
            ):
                picked.add(name)
    for section in _config_sections(args):
        given = section.get(key)
        if isinstance(given, dict):
            inner = given.get("init_args") if isinstance(given.get("init_args"), dict) else given
            picked |= {name for name in held if name in inner and _picks_a_class(inner[name])}
    if not picked:
        return default
    return {**default, "init_args": {k: v for k, v in init_args.items() if k not in picked}}
