"""The package's layers depend one way, and only lit_ddp/compat.py touches private Lightning/torch names and
Lightning's loop internals.

    errors, utils, writes  ←  models, data  ←  callbacks  ←  runtime  ←  assembly, testing  ←  cli

Parsed from the source (every import, also inside functions), so a violation fails here before review.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "lit_ddp"
# Documented public names that start with an underscore (os._exit, namedtuple's API).
PUBLIC_UNDERSCORED = {"_exit", "_asdict", "_replace", "_fields", "_make"}
UPSTREAM = ("lightning", "pytorch_lightning", "lightning_fabric", "torch", "torchvision", "torchmetrics")

# What each part of the package may import from lit_ddp (itself included).
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "utils": {"errors"},
    # every private upstream name and loop-progress field, behind a function each (compat.py)
    "compat": set(),
    # files written whole or not at all, one line on a failed write (writes.py)
    "writes": {"errors"},
    "models": {"models", "errors", "utils", "compat"},
    "data": {"data", "errors", "utils", "writes"},
    "callbacks": {"callbacks", "models", "data", "errors", "utils", "compat", "writes"},
    # preflight: the launcher's world, read alike before the Trainer and against it (runtime/launch.py), and
    # the checkpoint reader every load goes through
    "runtime": {"runtime", "callbacks", "models", "data", "errors", "utils", "compat", "writes", "preflight"},
    "scaffold": {"scaffold", "errors", "writes"},
    # what a run is asked to be, checked before anything is built (preflight/); models: the checkpoint
    # allow-list of lit_ddp's hyperparameter types (models/weights.py)
    "preflight": {"preflight", "models", "errors", "utils", "writes"},
    # the Trainer's arguments from the config: the default callbacks, the flags for what is off, the logger
    "assembly": {"callbacks", "runtime", "errors", "utils", "compat", "writes"},
    "cli": {
        "cli",
        "assembly",
        "preflight",
        "compat",
        "runtime",
        "callbacks",
        "models",
        "data",
        "errors",
        "utils",
        "writes",
        "scaffold",
        "testing",
    },
    # The trust kit (and doctor): runs the user's model and data with the runtime's pieces; cli calls doctor.
    "testing": {"testing", "runtime", "callbacks", "models", "data", "errors", "utils", "compat", "writes"},
    # what a command line does while it starts (entry.py): nothing of lit_ddp, nothing heavy
    "entry": set(),
    "__main__": {"cli", "entry"},
    "__init__": set(),
}


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_template" not in p.parts)


def _imports(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, imported names) of every import statement."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
    return found


def _is_private(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("_") and not dunder and name not in PUBLIC_UNDERSCORED


def _layer_violations(path: Path) -> list[str]:
    part = _part(path)
    problems = []
    for line, module, names in _imports(ast.parse(path.read_text())):
        if module != "lit_ddp" and not module.startswith("lit_ddp."):
            continue
        targets = [module.split(".")[1]] if "." in module else names
        for target in targets:
            target = target if (PACKAGE / target).is_dir() or (PACKAGE / f"{target}.py").exists() else part
            if target not in ALLOWED[part]:
                problems.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line} ({part}) imports lit_ddp.{target}"
                )
    return problems


def _private_upstream_uses(path: Path) -> list[str]:
    """Private Lightning/torch names: imported, reached as an attribute, or named in getattr/hasattr.

    An attribute with a leading underscore counts unless this file itself defines it (``self._x = ...``,
    ``def _x``, or an assignment to ``obj._x``): those are the file's own names.
    """
    text = path.read_text()
    tree = ast.parse(text)
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
    rel = path.relative_to(PACKAGE.parent)
    problems = []
    for line, module, names in _imports(tree):
        if module.split(".")[0] not in UPSTREAM:
            continue
        private = [p for p in module.split(".") if _is_private(p)] + [n for n in names if _is_private(n)]
        problems += [f"{rel}:{line} imports {module}: {name}" for name in private]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr) and node.attr not in own:
            problems.append(f"{rel}:{node.lineno} reaches .{node.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
            and node.args[1].value not in own
        ):
            problems.append(f"{rel}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    return problems


def test_layers_depend_one_way() -> None:
    problems = [p for path in _modules() for p in _layer_violations(path)]
    assert not problems, (
        "imports against the layers (errors/utils ← models, data ← callbacks ← runtime ← cli):\n"
        + ("\n".join(problems))
    )


def test_private_upstream_names_only_in_compat() -> None:
    """Private Lightning/torch names live in lit_ddp/compat.py, listed there with the versions they
    were checked on; every other module uses compat's functions."""
    compat = PACKAGE / "compat.py"
    problems = [p for path in _modules() if path != compat for p in _private_upstream_uses(path)]
    assert not problems, "private Lightning/torch names outside lit_ddp/compat.py:\n" + "\n".join(problems)


LOOP_INTERNALS = ("fit_loop", "epoch_loop", "batch_progress", "epoch_progress")


def _loop_internals(path: Path) -> list[str]:
    """Lightning's loops and their progress counters, reached as attributes or as checkpoint keys."""
    rel = path.relative_to(PACKAGE.parent)
    problems = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in LOOP_INTERNALS:
            problems.append(f"{rel}:{node.lineno} reaches .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in LOOP_INTERNALS:
            problems.append(f"{rel}:{node.lineno} names {node.value!r}")
    return problems


def test_lightning_loop_internals_only_in_compat() -> None:
    """Lightning's loop objects and their progress fields change between releases with no deprecation:
    read only through compat.py's functions, which tests/test_compat.py checks on the installed version."""
    compat = PACKAGE / "compat.py"
    problems = [p for path in _modules() if path != compat for p in _loop_internals(path)]
    assert not problems, "Lightning loop internals outside lit_ddp/compat.py:\n" + "\n".join(problems)


def test_the_checks_catch_what_they_guard(tmp_path: Path) -> None:
    """Both checks flag a planted violation (a check that never fires would pass forever)."""
    models = PACKAGE / "models"
    planted = models / "_planted_for_test.py"
    planted.write_text(
        "from lit_ddp.runtime.preemption import PreemptionCheckpoint\n"
        "from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher\n"
        "def f(trainer):\n    return trainer._signal_connector, getattr(trainer, '_results')\n"
        "def g(trainer):\n    return trainer.fit_loop.epoch_loop\n"
    )
    try:
        assert _layer_violations(planted) == [
            "lit_ddp/models/_planted_for_test.py:1 (models) imports lit_ddp.runtime"
        ]
        found = _private_upstream_uses(planted)
        assert any("_SubprocessScriptLauncher" in p for p in found)
        assert any("._signal_connector" in p for p in found)
        assert any("'_results'" in p for p in found)
        assert [p.split(" ", 1)[1] for p in _loop_internals(planted)] == [
            "reaches .epoch_loop",
            "reaches .fit_loop",
        ]
    finally:
        planted.unlink()


@pytest.mark.parametrize("part", ["models", "data"])
def test_models_and_data_know_nothing_above_them(part: str) -> None:
    """The core a template user edits first imports no callback, runtime or CLI code, not even lazily."""
    for path in sorted((PACKAGE / part).rglob("*.py")):
        for _, module, _ in _imports(ast.parse(path.read_text())):
            assert not module.startswith(("lit_ddp.callbacks", "lit_ddp.runtime", "lit_ddp.cli")), path


MODEL_TREE = ("modules", "named_modules", "children", "named_children", "parameters", "named_parameters")


def _model_tree_walks(path: Path) -> list[str]:
    """Calls that walk a module's layers or parameters (``model.modules()`` and its kin)."""
    rel = path.relative_to(PACKAGE.parent)
    return [
        f"{rel}:{node.lineno} calls .{node.func.attr}()"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in MODEL_TREE
    ]


def test_the_data_modules_read_what_the_model_declares_not_its_layers(tmp_path: Path) -> None:
    """A data module does not walk the model's layers: what a network needs of its batches is the model's to
    say, and the model hands it over (``batch_of_one_fails``). The check flags a planted walk."""
    problems = [p for path in sorted((PACKAGE / "data").rglob("*.py")) for p in _model_tree_walks(path)]
    assert not problems, "the data modules walk the model's layers:\n" + "\n".join(problems)
    planted = PACKAGE / "data" / "_planted_for_test.py"
    planted.write_text("def f(trainer):\n    return list(trainer.lightning_module.modules())\n")
    try:
        assert _model_tree_walks(planted) == ["lit_ddp/data/_planted_for_test.py:2 calls .modules()"]
    finally:
        planted.unlink()


# What the data modules must not reach: the model a trainer holds, and what a model declares of itself.
MODEL_READS = ("lightning_module", "batch_norm_per_device")


def _model_reads(path: Path) -> list[str]:
    """Attributes (``trainer.lightning_module``) and getattr names that reach the model."""
    rel = path.relative_to(PACKAGE.parent)
    return [
        f"{rel}:{node.lineno} reads {name}"
        for node in ast.walk(ast.parse(path.read_text()))
        for name in [node.attr if isinstance(node, ast.Attribute) else getattr(node, "value", None)]
        if isinstance(node, ast.Attribute | ast.Constant) and name in MODEL_READS
    ]


def test_the_data_modules_read_no_model() -> None:
    """The data modules asked the model (``batch_norm_per_device``) for its BatchNorm: the model hands them
    what they need (``batch_of_one_fails``) and preflight tells the rest from the config. The check flags a
    planted read."""
    problems = [p for path in sorted((PACKAGE / "data").rglob("*.py")) for p in _model_reads(path)]
    assert not problems, "the data modules read the model:\n" + "\n".join(problems)
    planted = PACKAGE / "data" / "_planted_for_test.py"
    planted.write_text(
        "def f(trainer):\n    return getattr(trainer.lightning_module, 'batch_norm_per_device', False)\n"
    )
    try:
        assert _model_reads(planted) == [
            "lit_ddp/data/_planted_for_test.py:2 reads lightning_module",
            "lit_ddp/data/_planted_for_test.py:2 reads batch_norm_per_device",
        ]
    finally:
        planted.unlink()


def test_importing_the_cli_changes_no_process_wide_state() -> None:
    """Warning and logger filters are set by main() (runtime/quiet.py), torch's weights-only allow-list by
    build_cli, not by importing lit_ddp.cli."""
    import subprocess
    import sys

    code = (
        "import logging, warnings, torch\n"
        "safe = lambda: [g for g in torch.serialization.get_safe_globals() if 'lit_ddp' in str(g)]\n"
        "import lit_ddp.cli as cli\n"
        "assert not safe(), safe()\n"
        "logger = logging.getLogger('lightning.pytorch.utilities.rank_zero')\n"
        "from lit_ddp.runtime import quiet\n"
        "patterns = [q.pattern for q in quiet.EVERY_FILTER]\n"
        "ours = lambda: [f for f in warnings.filters if f[1] and f[1].pattern in patterns]\n"
        "assert not ours() and not logger.filters, (ours(), logger.filters)\n"
        "quiet.quiet_console(); quiet.quiet_console()\n"
        "warns = [q for q in quiet.CONSOLE if q.kind == 'warning']\n"
        "assert len(ours()) == len(warns)\n"
        "assert logger.filters == [quiet._info_allowed, quiet.SEED_LINE.release], logger.filters\n"
        "cli.build_cli(['--data.train_size=64'], run=False)\n"
        "assert safe(), 'the CLI allow-lists OptimConfig for older checkpoints'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def _table_keys(text: str, heading: str) -> list[tuple[str, str]]:
    """(config key, reason) of each row of the first table after ``heading`` in docs/architecture.md."""
    rows, started = [], False
    for line in text[text.index(heading) :].splitlines():
        if line.startswith("|"):
            started = True
            cells = [c.strip() for c in line.strip("|").split("|")]
            key = next((c.strip("`") for c in cells if re.fullmatch(r"`\w+`", c)), None)
            if key:
                rows.append((key, cells[cells.index(f"`{key}`") + 1]))
        elif started:
            break
    return rows


def test_the_default_and_opt_in_callbacks_are_the_ones_docs_architecture_lists_with_a_reason() -> None:
    from lit_ddp.assembly import CALLBACKS, OPT_IN_CALLBACKS

    text = (ROOT / "docs" / "architecture.md").read_text()
    defaults = _table_keys(text, "## What `python -m lit_ddp fit` runs")
    assert [key for key, _ in defaults] == list(CALLBACKS)
    opt_in = _table_keys(text, "Opt-in callbacks")
    assert [key for key, _ in opt_in] == list(OPT_IN_CALLBACKS)
    assert all(len(reason) > 20 for _, reason in defaults + opt_in)
    assert not set(CALLBACKS) & set(OPT_IN_CALLBACKS)


# Upstream classes made to be subclassed: a subclass of one is lit_ddp's own part, not a fork.
EXTENSION_BASES = ("Callback", "LightningModule", "LightningDataModule", "LightningCLI", "Metric")
FORK_LINE = re.compile(r"Fork of ``([\w.]+)(?:\([^)]*\))?``: \S.*; goes when \S")


def _package_classes() -> list[type]:
    import importlib
    import inspect

    found = []
    for path in _modules():
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        if name.startswith("lit_ddp.scaffold"):
            continue  # the project generator: no upstream part
        module = importlib.import_module(name)
        found += [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == name]
    return found


def test_every_fork_of_an_upstream_part_says_what_it_lacks_and_when_the_fork_goes() -> None:
    forks, unsaid = {}, []
    for cls in _package_classes():
        said = FORK_LINE.search(" ".join((cls.__dict__.get("__doc__") or "").split()))
        parts = [
            base
            for base in cls.__bases__
            if base.__module__.split(".")[0] in ("lightning", "pytorch_lightning", "torchmetrics")
            and base.__name__ not in EXTENSION_BASES
        ]
        if parts and said is None:
            unsaid.append(f"{cls.__module__}.{cls.__qualname__} ({', '.join(b.__name__ for b in parts)})")
        if said is not None:
            forks[cls.__name__] = said.group(1)
    assert unsaid == [], "add `Fork of ``UPSTREAM``: what it lacks; goes when ...` to each docstring"
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = {name: upstream.strip("`") for name, upstream in _table_keys(text, "## Forks of upstream parts")}
    assert listed == forks
