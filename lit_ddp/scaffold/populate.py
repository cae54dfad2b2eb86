"""Fill a freshly rendered project with the live lit_ddp tree, renamed.

One source of truth: the template renders only what is project-specific (README, LICENSE); the package,
configs, tests, benchmarks and CI script are copied from the very tree that this repository tests, then
renamed, and the model families the user left out are removed; ruff, where installed, re-wraps the lines
that the new name moved across the line limit. Called by hooks/post_gen_project.py.
"""

import importlib.util
import keyword
import re
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = "lit_ddp"
COMMAND = "lit-ddp"

# What the new project gets from the live tree, besides the package itself.
TREE_ITEMS = ("configs", "tests", "benchmarks", "scripts", ".ci", ".gitignore", "pyproject.toml")
# Never copied: the scaffolding itself, build helpers that exist only to ship the template in a wheel.
IGNORED = ("__pycache__", "*.pyc", "scaffold", "_template", "test_scaffold.py", "*.egg-info")

# Files of each optional model family, relative to the project ({pkg} = the package directory).
# Lines elsewhere that import these carry a trailing ``# family: <name>`` marker and go with them;
# tests/test_scaffold.py fails if an import of a family module lacks the marker.
FAMILIES: dict[str, tuple[str, ...]] = {
    "lenet_cifar": (
        "{pkg}/data/cifar10.py",
        "configs/lenet_cifar.yaml",
        "tests/test_cifar10.py",
        "benchmarks/bench_lenet_gpu.py",
    ),
    "resnet_imagenet": (
        "{pkg}/models/resnet.py",
        "{pkg}/models/resnet_imagenet.py",
        "{pkg}/data/imagenet.py",
        "configs/resnet_imagenet.yaml",
        "configs/resnet50_imagenet_modern.yaml",
        "configs/finetune_imagefolder.yaml",
        "tests/test_imagenet.py",
        "tests/test_finetune.py",
        "tests/test_augment_imagefolder.py",
        "tests/imagenet_tree.py",
        "tests/test_cuda_resnet.py",
        "benchmarks/bench_input_pipeline.py",
        "benchmarks/bench_resnet_gpu.py",
        "benchmarks/bench_jpeg_gpu.py",
    ),
}
FAMILY_CHOICES = {"both": tuple(FAMILIES), **{name: (name,) for name in FAMILIES}}
MARKER = re.compile(r"#\s*family:\s*(\w+)\s*$")
SCAFFOLD_ONLY = "# scaffold-only"
TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".md", ".txt", ".cfg", ".ini", ".sh", ""}


def _shadowed(package: str) -> str | None:
    """What a top-level package of this name would hide: a standard library or installed module."""
    if package in sys.stdlib_module_names:
        return f"the standard library module {package}"
    spec = importlib.util.find_spec(package)
    # Any plain directory on sys.path (in the cwd, say) is a namespace package to find_spec, with no
    # origin: only a real module or package counts as installed.
    if spec is not None and spec.origin is not None:
        return f"the installed module {package} ({spec.origin})"
    return None


def validate(context: dict) -> list[str]:
    """Problems with the user's answers, as one-sentence messages (empty when all is well)."""
    problems = []
    package = context.get("package_name", "")
    if not package.isidentifier() or keyword.iskeyword(package):
        problems.append(
            f"package_name {package!r} is not a valid Python identifier: use letters, digits and"
            " underscores, not starting with a digit (e.g. package_name=my_project)"
        )
    elif clash := _shadowed(package):
        problems.append(
            f"package_name {package!r} would shadow {clash}: pass another name,"
            f" e.g. package_name={package}_classifier"
        )
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", context.get("project_slug", "")):
        problems.append(
            f"project_slug {context.get('project_slug')!r} must be a directory name like my-project"
        )
    if not re.fullmatch(r"3\.\d+", context.get("python_version", "")):
        problems.append(f"python_version {context.get('python_version')!r} must look like 3.10")
    if context.get("model_families") not in FAMILY_CHOICES:
        problems.append(f"model_families must be one of {', '.join(FAMILY_CHOICES)}")
    return problems


def package_source(template_root: Path) -> Path:
    """The live package: beside the template in a source checkout, around it when shipped in a wheel."""
    checkout = template_root / PACKAGE
    return checkout if checkout.is_dir() else template_root.parent


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*IGNORED), dirs_exist_ok=True)
    elif src.is_file():
        shutil.copy2(src, dst)


def _rewrite_pyproject(text: str, context: dict) -> str:
    py = context["python_version"]
    replacements = {
        r'(?m)^description = ".*"$': f'description = "{context["description"]}"',
        r'(?m)^requires-python = ".*"$': f'requires-python = ">={py}"',
        r"(?m)^license = .*$": f'license = {{ text = "{context["license"]}" }}\n'
        f'authors = [{{ name = "{context["author"]}", email = "{context["email"]}" }}]',
        r'(?m)^name = ".*"$': f'name = "{context["project_slug"]}"',
        r'(?m)^version = ".*"$': 'version = "0.1.0"',
        r'(?m)^target-version = ".*"$': f'target-version = "py{py.replace(".", "")}"',
    }
    for pattern, value in replacements.items():
        text = re.sub(pattern, lambda _m, v=value: v, text, count=1)
    return text


def _removed(line: str, dropped: set[str]) -> bool:
    marker = MARKER.search(line)
    return SCAFFOLD_ONLY in line or bool(marker and marker.group(1) in dropped)


def _edit_lines(text: str, dropped: set[str]) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not _removed(line, dropped))


def _ruff() -> list[str] | None:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    return [found] if found else None


def _rewrap(project: Path) -> None:
    """Re-wrap the lines that the new name made longer or shorter, as the project's own CI lints them.

    The template is formatted for the 7 characters of ``lit_ddp``; any other name moves lines across the
    limit, and only a formatter can say how they wrap (imports, calls). Without ruff here the project
    still works and passes its tests; only its lint waits for the command that the note names.
    """
    ruff = _ruff()
    if ruff is None:
        print(
            "note: ruff is not installed here, so lines the new name moved past the line limit are not"
            " re-wrapped: run `ruff check --select I --fix . && ruff format .` in the project once",
            file=sys.stderr,
        )
        return
    for command in (["check", "--select", "I", "--fix-only"], ["format"]):  # I: imports wrap too
        subprocess.run([*ruff, *command, "--quiet", "--no-cache", "."], cwd=project, check=False)


def _allow_longer_lines(project: Path, names: tuple[str, ...]) -> None:
    """Comments and strings that name the package grow with its name, and no formatter wraps them: E501
    allows those lines their length, while the formatter still keeps the project's code at line-length."""
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    limit = int(re.search(r"(?m)^line-length = (\d+)$", text).group(1))
    lines = [line for path in project.rglob("*.py") for line in path.read_text(encoding="utf-8").splitlines()]
    longest = max((len(line) for line in lines if any(name in line for name in names)), default=0)
    if longest > limit:
        section = "[tool.ruff.lint.pycodestyle]\n# for the lines that name the package\n"
        pyproject.write_text(f"{text.rstrip()}\n\n{section}max-line-length = {longest}\n", encoding="utf-8")


def populate(project: Path, template_root: Path, context: dict) -> None:
    """Copy, prune and rename the live tree into ``project`` (already holding the rendered files)."""
    package = context["package_name"]
    slug = context["project_slug"]
    _copy(package_source(template_root), project / package)
    for item in TREE_ITEMS:
        _copy(template_root / item, project / item)

    dropped = set(FAMILIES) - set(FAMILY_CHOICES[context["model_families"]])
    for family in dropped:
        for rel in FAMILIES[family]:
            path = project / rel.format(pkg=package)
            if path.exists():
                path.unlink()

    for path in sorted(project.rglob("*")):
        if not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        text = path.read_text(encoding="utf-8")
        new = _edit_lines(text, dropped).replace(PACKAGE, package).replace(COMMAND, slug)
        if path.name == "pyproject.toml" and path.parent == project:
            new = _rewrite_pyproject(new, context)
        if new != text:
            path.write_text(new, encoding="utf-8")
    _rewrap(project)
    _allow_longer_lines(project, (package, slug))
