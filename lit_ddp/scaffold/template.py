"""What the project template needs from Python: checks of the answers, the files of each model family,
where the new project gets lit_ddp from, and the record that lets ``cruft update`` find the template again.

Stdlib only: the cookiecutter hooks import it from a bare template checkout.
"""

import importlib.metadata
import importlib.util
import json
import keyword
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

try:  # the parsers generated_problems uses, where this Python has them (the hooks run stdlib-only)
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None
try:
    import yaml
except ImportError:
    yaml = None

# lit_ddp's own requires-python floor (pyproject.toml; tests/test_scaffold.py keeps them equal).
MIN_PYTHON = "3.10"
# Files of each optional model family, relative to the generated project ({pkg}: its package).
FAMILIES: dict[str, tuple[str, ...]] = {
    "lenet_cifar": ("configs/lenet_cifar.yaml",),
    "resnet_imagenet": ("configs/resnet_imagenet.yaml", "tests/test_resnet_imagenet.py"),
}
FAMILY_CHOICES = {"both": tuple(FAMILIES), **{name: (name,) for name in FAMILIES}}
# Files a project shares with lit_ddp: generated from lit_ddp's own copy (one source, next to the template),
# with the project's command and default config in place of lit_ddp's.
SHARED = (
    "configs/presets/cpu_ddp.yaml",
    "configs/presets/ddp.yaml",
    "configs/presets/debug.yaml",
    "configs/resnet_imagenet.yaml",
    "scripts/sbatch_single_node.sh",
    "scripts/sbatch_multi_node.sh",
)
# The project's own top-level folders: a package of the same name would be generated into one of them.
PROJECT_FOLDERS = frozenset(
    rel.split("/")[0] for rel in (*SHARED, *(f for fs in FAMILIES.values() for f in fs))
)
# cookiecutter renders every answer as a Jinja template: "{{ 7 * 7 }}" would become "49".
JINJA_SYNTAX = re.compile(r"\{\{|\{%|\{#")


def _shadowed(package: str, own_project_ok: bool = False) -> str | None:
    """What a top-level package of this name would hide: a standard library or installed module.
    ``own_project_ok``: a project generated under this name and installed (``pip install -e .``) is no
    clash, as ``cruft diff`` and ``cruft update`` generate that project again."""
    if package in sys.stdlib_module_names:
        return f"the standard library module {package}"
    spec = importlib.util.find_spec(package)
    # Any plain directory on sys.path (in the cwd, say) is a namespace package to find_spec, with no
    # origin: only a real module or package counts as installed.
    if spec is None or spec.origin is None:
        return None
    if own_project_ok and _generated_as(Path(spec.origin), package):
        return None
    return f"the installed module {package} ({spec.origin})"


def _generated_as(origin: Path, package: str) -> bool:
    """Whether the package at ``origin`` (its ``__init__.py``) is that of a project generated under this
    package name: the ``.cruft.json`` beside its folder records the answer."""
    try:
        answers = json.loads((origin.parent.parent / ".cruft.json").read_text())["context"]["cookiecutter"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(answers, dict) and answers.get("package_name") == package


def jinja_in(key: str, value: object) -> str | None:
    """A one-line refusal for an answer cookiecutter would evaluate as a template, else None."""
    if isinstance(value, str) and JINJA_SYNTAX.search(value):
        return (
            f"{key}={value!r} contains template syntax ({{{{, {{% or {{#), which the template would evaluate:"
            " write it without braces"
        )
    return None


def validate(context: dict, own_project_ok: bool = False) -> list[str]:
    """Problems with the user's answers, as one-sentence messages (empty when all is well).
    ``own_project_ok``: the template's hook, which cruft runs to generate an existing project again."""
    problems = []
    package = context.get("package_name", "")
    if keyword.iskeyword(package):  # an identifier, so the advice below would name nothing to change
        problems.append(
            f"package_name {package!r} is a Python keyword: `import {package}` cannot be written; pass"
            f" another name, e.g. package_name={package}_project"
        )
    elif not package.isidentifier():
        problems.append(
            f"package_name {package!r} is not a valid Python identifier: use letters, digits and"
            " underscores, not starting with a digit (e.g. package_name=my_project)"
        )
    elif package in PROJECT_FOLDERS:  # else cookiecutter's "directory already exists", in a temp path
        problems.append(
            f"package_name {package!r} is the name of the project's {package}/ folder: pass another name,"
            f" e.g. package_name={package}_classifier"
        )
    elif clash := _shadowed(package, own_project_ok):
        problems.append(
            f"package_name {package!r} would shadow {clash}: pass another name,"
            f" e.g. package_name={package}_classifier"
        )
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", context.get("project_slug", "")):
        problems.append(
            f"project_slug {context.get('project_slug')!r} must be a directory name like my-project"
        )
    version = context.get("python_version", "")
    if not re.fullmatch(r"\d+\.\d+", version):
        problems.append(f"python_version {version!r} must be a Python version such as {MIN_PYTHON}")
    elif tuple(map(int, version.split("."))) < tuple(map(int, MIN_PYTHON.split("."))):
        # The project's requires-python: pip on an older Python would fail to find lit_ddp for it.
        problems.append(
            f"python_version {version!r} is older than lit_ddp needs ({MIN_PYTHON}): pass"
            f" python_version={MIN_PYTHON} or later"
        )
    if context.get("model_families") not in FAMILY_CHOICES:
        problems.append(f"model_families must be one of {', '.join(FAMILY_CHOICES)}")
    for key, value in context.items():
        if not key.startswith("_") and (problem := jinja_in(key, value) or control_character_in(key, value)):
            problems.append(problem)
    return problems


def control_character_in(key: str, value: object) -> str | None:
    """A one-line refusal for an answer holding a line break or another control character (it would end a
    Markdown heading, a Python docstring line or a TOML string), else None."""
    if isinstance(value, str) and any(unicodedata.category(c) == "Cc" for c in value):
        return f"{key}={value!r} contains a line break or another control character: write it on one line"
    return None


def generated_problems(project: Path) -> list[str]:
    """Generated files that do not parse (Python, TOML, YAML where a parser is at hand): checked after
    generation, so that no answer yields a project that installs and does not import."""
    parsers = {".py": lambda text, rel: compile(text, rel, "exec")}
    if tomllib is not None:
        parsers[".toml"] = lambda text, rel: tomllib.loads(text)
    if yaml is not None:
        parsers[".yaml"] = lambda text, rel: yaml.safe_load(text)
    problems = []
    for path in sorted(p for p in project.rglob("*") if p.suffix in parsers and p.is_file()):
        rel = str(path.relative_to(project))
        try:
            parsers[path.suffix](path.read_text(encoding="utf-8"), rel)
        except Exception as err:  # noqa: BLE001 - each parser's own error type
            problems.append(f"the answers make {rel} invalid ({type(err).__name__}: {err})")
    return problems


def shared_text(text: str, package: str) -> str:
    """lit_ddp's preset or cluster script, for the project: its command, its job name, its default run."""
    for old, new in (
        ("python -m lit_ddp ", f"python -m {package} "),
        ("--job-name=lit_ddp\n", f"--job-name={package}\n"),
        ("# lit_ddp on ", f"# {package} on "),
        ("configs/lenet_cifar.yaml", "configs/default.yaml"),
    ):
        text = text.replace(old, new)
    return text


def write_shared(source: Path, project: Path, package: str) -> None:
    """The SHARED files, from lit_ddp's (``source``: the template's root, a checkout or the wheel's copy)."""
    for rel in SHARED:
        target = project / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(shared_text((source / rel).read_text(encoding="utf-8"), package), encoding="utf-8")
        shutil.copymode(source / rel, target)  # the scripts stay executable


def prune_families(project: Path, families: str) -> None:
    """Remove the files of the model families the user left out."""
    for family in set(FAMILIES) - set(FAMILY_CHOICES[families]):
        for rel in FAMILIES[family]:
            (project / rel).unlink(missing_ok=True)


def _direct_url() -> dict | None:
    """PEP 610's record of where the installed lit_ddp came from (a folder, a VCS URL), if any."""
    # Every lit_ddp metadata on sys.path: a source checkout's own lit_ddp.egg-info (no record) may come
    # before the installed one.
    for dist in importlib.metadata.distributions(name="lit_ddp"):
        if text := dist.read_text("direct_url.json"):
            return json.loads(text)
    return None


def _version() -> str:
    try:
        return importlib.metadata.version("lit_ddp")
    except importlib.metadata.PackageNotFoundError:
        from lit_ddp import __version__

        return __version__


def lit_ddp_requirement() -> str:
    """The new project's dependency on lit_ddp: the folder or VCS commit this lit_ddp was installed from,
    so the project installs on this machine with no package index holding lit_ddp; else a compatible
    release range of this version (0.2.x for 0.2.1)."""
    direct = _direct_url()
    if direct and "vcs_info" in direct:
        vcs = direct["vcs_info"]
        return f"lit_ddp @ {vcs['vcs']}+{direct['url']}@{vcs['commit_id']}"
    if direct and "dir_info" in direct:
        return f"lit_ddp @ {direct['url']}"
    return f"lit_ddp~={'.'.join(_version().split('.')[:3])}"


def _git_head(folder: Path) -> str | None:
    """The commit of the git checkout whose root is ``folder``, else None."""
    git = shutil.which("git")
    if git is None:
        return None
    run = lambda *args: subprocess.run([git, "-C", str(folder), *args], capture_output=True, text=True)  # noqa: E731
    head = run("rev-parse", "--verify", "HEAD")
    if head.returncode != 0 or run("rev-parse", "--show-toplevel").stdout.strip() != str(folder.resolve()):
        return None
    return head.stdout.strip()


def template_source(template_root: Path) -> tuple[str, str | None]:
    """Where ``cruft update`` can fetch the template again, and at which commit: the checkout it was
    generated from, or the VCS URL and commit this lit_ddp was installed from; (path, None) if neither."""
    commit = _git_head(template_root)
    if commit is not None:
        return str(template_root), commit
    direct = _direct_url()
    if direct and "vcs_info" in direct:
        return direct["url"], direct["vcs_info"]["commit_id"]
    if direct and "dir_info" in direct:
        folder = Path(direct["url"].removeprefix("file://"))
        if (commit := _git_head(folder)) is not None:
            return str(folder), commit
    return str(template_root), None


def cruft_state(template: str, commit: str | None, context: dict) -> dict:
    """The content of ``.cruft.json`` (cruft's own format), for ``cruft diff`` and ``cruft update``."""
    answers = {k: v for k, v in context.items() if k != "_output_dir" and k != "_repo_dir"}
    answers["_template"] = template
    if commit is not None:
        answers["_commit"] = commit
    return {
        "template": template,
        "commit": commit,
        "checkout": None,
        "context": {"cookiecutter": answers},
        "directory": None,
    }
