"""Scaffolding: cookiecutter on this repository and `python -m lit_ddp new` generate projects that are
the live package renamed (never a drifting copy), prune model families cleanly, and pass their own tests."""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

from lit_ddp.errors import UserError
from lit_ddp.scaffold.new import new
from lit_ddp.scaffold.populate import FAMILIES, FAMILY_CHOICES, IGNORED, MARKER, SCAFFOLD_ONLY, TREE_ITEMS

REPO = Path(__file__).resolve().parents[1]
TEXT = {".py", ".yaml", ".toml", ".md", ".txt", ".cfg", ".sh", ""}
LICENSES = json.loads((REPO / "cookiecutter.json").read_text())["license"]
LONG_NAME = "Very Long Project Name For Testing The Line Length Limits"


def bake(tmp: Path, **context) -> Path:
    return Path(cookiecutter(str(REPO), no_input=True, extra_context=context, output_dir=str(tmp)))


def text_files(root: Path):
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in TEXT and "__pycache__" not in path.parts:
            yield path


def family_files(family: str, package: str) -> list[str]:
    return [rel.format(pkg=package) for rel in FAMILIES[family]]


def run(cmd: list[str], cwd: Path, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )


def new_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH: this checkout's lit_ddp, whatever is installed.
    return run([sys.executable, "-m", "lit_ddp", "new", *args], cwd=cwd, timeout=120, PYTHONPATH=str(REPO))


@pytest.mark.parametrize("families", sorted(FAMILY_CHOICES))
def test_bake_each_family_choice_leaves_no_trace_of_the_template(tmp_path: Path, families: str) -> None:
    project = bake(tmp_path, project_name="Cat Dog Classifier", model_families=families)
    assert project.name == "cat-dog-classifier"
    package = project / "cat_dog_classifier"
    assert (package / "__main__.py").is_file() and (project / ".ci" / "run").is_file()
    assert not (package / "scaffold").exists() and not (project / "tests" / "test_scaffold.py").exists()
    for path in text_files(project):
        text = path.read_text()
        assert "lit_ddp" not in text and "lit-ddp" not in text, path
        assert SCAFFOLD_ONLY not in text, path
    kept = FAMILY_CHOICES[families]
    for family in FAMILIES:
        for rel in family_files(family, "cat_dog_classifier"):
            if (REPO / rel.replace("cat_dog_classifier", "lit_ddp")).exists():
                assert (project / rel).exists() == (family in kept), rel
    # Nothing left pointing at a removed module: every module of the new package imports.
    modules = [
        ".".join(p.relative_to(project).with_suffix("").parts)
        for p in package.rglob("*.py")
        if p.name != "__main__.py"
    ]
    result = run(
        [sys.executable, "-c", f"import importlib; [importlib.import_module(m) for m in {modules!r}]"],
        cwd=project,
        PYTHONPATH=str(project),
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_readme_and_pyproject_are_rendered_for_the_project(tmp_path: Path) -> None:
    project = bake(
        tmp_path,
        project_name="Cat Dog Classifier",
        author="Ada",
        email="ada@example.org",
        description="Cats versus dogs",
        python_version="3.11",
        license="MIT",
    )
    readme = (project / "README.md").read_text()
    assert readme.startswith("# Cat Dog Classifier\n\nCats versus dogs")
    # The same two set-up commands as this repository's README, for the new package.
    ours = re.findall(r"(?m)^pip install .*$", (REPO / "README.md").read_text())[:2]
    theirs = re.findall(r"(?m)^pip install .*$", readme)[:2]
    assert [c.replace("lit_ddp", "cat_dog_classifier") for c in ours] == theirs
    pyproject = (project / "pyproject.toml").read_text()
    assert 'name = "cat-dog-classifier"' in pyproject and 'requires-python = ">=3.11"' in pyproject
    assert 'description = "Cats versus dogs"' in pyproject and 'email = "ada@example.org"' in pyproject
    assert 'cat-dog-classifier = "cat_dog_classifier.cli:main"' in pyproject
    assert (project / "LICENSE").read_text().startswith("MIT License")


def test_generated_project_is_the_live_package_renamed(tmp_path: Path) -> None:
    """The template cannot drift: every generated file is a live file with only the name changed.

    The name is as long as lit_ddp's, so no line moves across the line limit and nothing is re-wrapped."""
    project = bake(tmp_path, project_name="Same Ab", model_families="both")
    for item in ("lit_ddp", *TREE_ITEMS):
        src = REPO / item
        files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
        for path in files:
            rel = path.relative_to(REPO)
            if any(part in ("__pycache__", "scaffold", "_template") for part in rel.parts) or any(
                rel.match(pattern) for pattern in IGNORED
            ):
                continue
            generated = project / str(rel).replace("lit_ddp", "same_ab", 1)
            assert generated.is_file(), f"{rel} is not in the generated project"
            if path.suffix in TEXT and rel.name != "pyproject.toml":
                expected = "".join(
                    line for line in path.read_text().splitlines(keepends=True) if SCAFFOLD_ONLY not in line
                )
                expected = expected.replace("lit_ddp", "same_ab").replace("lit-ddp", "same-ab")
                assert generated.read_text() == expected, rel


def test_every_import_of_a_family_module_is_marked() -> None:
    """An import of an optional family's module must say so, or leaving the family out breaks the project."""
    owned = {rel.format(pkg="lit_ddp"): family for family in FAMILIES for rel in FAMILIES[family]}
    modules = {
        rel[:-3].replace("/", "."): family for rel, family in owned.items() if rel.startswith("lit_ddp/")
    }
    for path in [*REPO.glob("lit_ddp/**/*.py"), *REPO.glob("tests/*.py"), *REPO.glob("benchmarks/*.py")]:
        rel = str(path.relative_to(REPO))
        if rel in owned or "scaffold" in rel:
            continue
        for line in path.read_text().splitlines():
            for module, family in modules.items():
                if re.search(rf"\b{re.escape(module)}\b", line) and ("import" in line):
                    marker = MARKER.search(line)
                    assert marker and marker.group(1) == family, (
                        f"{rel}: {line.strip()!r} needs '# family: {family}'"
                    )


def test_family_manifest_names_existing_files() -> None:
    for family in FAMILIES:
        for rel in family_files(family, "lit_ddp"):
            assert (REPO / rel).is_file(), f"FAMILIES[{family!r}] lists {rel}, which does not exist"


def test_cookiecutter_json_offers_what_populate_understands() -> None:
    variables = json.loads((REPO / "cookiecutter.json").read_text())
    assert set(variables["model_families"]) == set(FAMILY_CHOICES)
    for key in (
        "project_name",
        "project_slug",
        "package_name",
        "author",
        "email",
        "description",
        "python_version",
        "license",
    ):
        assert key in variables


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-input", "package_name=1bad-name"], "not a valid Python identifier"),
        (["--no-input", "colour=red"], "unknown template variable 'colour'"),
        (["--no-input", "model_families=vgg"], "model_families must be one of"),
        (["--no-input", "project_name"], "is not key=value"),
    ],
)
def test_bad_answers_are_one_clear_error_and_write_nothing(tmp_path: Path, args, message) -> None:
    dest = tmp_path / "proj"
    with pytest.raises(UserError, match=message):
        new([str(dest), *args])
    assert not dest.exists() and list(tmp_path.iterdir()) == []


def test_non_empty_destination_is_refused_unless_overwrite_which_deletes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "proj"
    (dest / "proj").mkdir(parents=True)
    (dest / "notes.txt").write_text("mine")
    (dest / "proj" / "cli.py").write_text("stale")  # a file the template writes
    (dest / "proj" / "mine.py").write_text("mine")
    with pytest.raises(UserError, match="exists and is not empty"):
        new([str(dest), "--no-input"])
    assert sorted(p.name for p in dest.rglob("*")) == ["cli.py", "mine.py", "notes.txt", "proj"]
    new([str(dest), "--no-input", "--overwrite"])
    assert "def main" in (dest / "proj" / "cli.py").read_text() and (dest / "configs").is_dir()
    assert (dest / "notes.txt").read_text() == "mine" and (dest / "proj" / "mine.py").read_text() == "mine"
    assert os.access(dest / ".ci" / "run", os.X_OK)


@pytest.mark.parametrize("in_the_way", ["folder", "link"])
def test_overwrite_refuses_a_folder_or_link_in_the_way(tmp_path: Path, in_the_way) -> None:
    dest = tmp_path / "proj"
    dest.mkdir()
    (tmp_path / "elsewhere.md").write_text("not in DEST")
    if in_the_way == "folder":
        (dest / "README.md").mkdir()
    else:
        (dest / "README.md").symlink_to(tmp_path / "elsewhere.md")
    with pytest.raises(UserError, match="README.md is in the way of the template's README.md"):
        new([str(dest), "--no-input", "--overwrite"])
    assert [p.name for p in dest.iterdir()] == ["README.md"]
    assert (tmp_path / "elsewhere.md").read_text() == "not in DEST"


def test_destination_that_is_a_file_is_refused_even_with_overwrite(tmp_path: Path) -> None:
    dest = tmp_path / "proj"
    dest.write_text("mine")
    with pytest.raises(UserError, match="is a file: choose a directory"):
        new([str(dest), "--no-input", "--overwrite"])
    assert dest.read_text() == "mine"


@pytest.mark.parametrize(
    ("name", "clash"),
    [("json", "the standard library module json"), ("torch", "the installed module torch")],
)
def test_package_names_that_shadow_a_module_are_refused(tmp_path: Path, capfd, name, clash) -> None:
    with pytest.raises(UserError, match=f"package_name '{name}' would shadow {clash}.*package_name={name}_"):
        new([str(tmp_path / name), "--no-input"])
    assert list(tmp_path.iterdir()) == []
    # The cookiecutter command refuses it too, in the pre-generation hook.
    with pytest.raises(FailedHookException):
        bake(tmp_path, project_name="x", package_name=name)
    assert f"would shadow {clash}" in capfd.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_invalid_choice_is_one_line_listing_the_choices_and_writes_nothing(tmp_path: Path) -> None:
    result = new_cli(str(tmp_path / "proj"), "--no-input", "license=GPL", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "lit_ddp new: error: license must be one of Apache-2.0, MIT, BSD-3-Clause, Proprietary, not 'GPL':"
        " e.g. license=Apache-2.0"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("families", "license", "name"),
    [(f, lic, "Cat Dog Classifier") for f in sorted(FAMILY_CHOICES) for lic in LICENSES]
    + [("both", "MIT", LONG_NAME)],
)
def test_generated_project_passes_its_own_lint(tmp_path: Path, families, license, name) -> None:
    """The lint half of the project's .ci/run, whatever the name's length moved across the line limit."""
    project = bake(tmp_path, project_name=name, model_families=families, license=license)
    ci = (project / ".ci" / "run").read_text()
    assert "ruff check . && ruff format --check .\n" in ci
    for command in (["check", "."], ["format", "--check", "."]):
        result = run([sys.executable, "-m", "ruff", *command, "--no-cache"], cwd=project)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


@pytest.mark.parametrize("families", sorted(FAMILY_CHOICES))
@pytest.mark.parametrize("script", ["sbatch_single_node.sh", "sbatch_multi_node.sh"])
def test_sbatch_scripts_default_to_a_config_the_project_has(tmp_path: Path, families, script) -> None:
    project = bake(tmp_path, project_name="Cat Dog", model_families=families)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\necho "$@"\n')  # prints the command it would run
    (bin_dir / "srun").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    result = run(
        ["bash", f"scripts/{script}"], cwd=project, PATH=path, SLURM_NNODES="1", SLURM_NTASKS_PER_NODE="1"
    )
    assert result.returncode == 0, result.stderr
    config = re.search(r"--config (\S+)", result.stdout).group(1)
    assert (project / config).is_file(), f"{script} defaults to {config}, which {families} does not have"
    last_family = FAMILY_CHOICES[families][-1]  # the biggest recipe the project has
    assert config == f"configs/{last_family}.yaml"


def test_new_cli_exits_non_zero_and_names_the_problem(tmp_path: Path) -> None:
    result = new_cli(str(tmp_path / "bad"), "--no-input", "package_name=1bad-name", cwd=tmp_path)
    assert result.returncode == 2 and "1bad-name" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_cookiecutter_command_project_installs_runs_and_passes_its_tests(tmp_path: Path) -> None:
    """`cookiecutter <repo>`, then the new project's own README commands, in a fresh virtualenv."""
    result = run(
        [
            "cookiecutter",
            str(REPO),
            "--no-input",
            "project_name=Cat Dog Classifier",
            "model_families=lenet_cifar",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    project = tmp_path / "cat-dog-classifier"
    venv = tmp_path / "venv"
    # The running environment supplies torch & co. (no network); the project itself installs with pip -e.
    # --without-pip: the venv then runs this environment's pip and setuptools (the bundled ones are too old
    # to build).
    made = run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    # Run from inside a virtualenv, --system-site-packages gives the base interpreter's site-packages (no
    # torch, an old setuptools), not this environment's: a .pth file adds this one's, as site dirs, so that
    # the .pth files in them (editable installs) work too.
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path)
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    lines = "".join(f"import site; site.addsitedir({path!r})\n" for path in ours)
    (Path(site.stdout.strip()) / "outer_environment.pth").write_text(lines)
    install = run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."], cwd=project
    )
    assert install.returncode == 0, install.stderr[-2000:]
    fit = run([python, "-m", "cat_dog_classifier", "fit", "--trainer.fast_dev_run=true"], cwd=project)
    assert fit.returncode == 0, fit.stderr[-3000:]
    tests = run(
        [python, "-m", "pytest", "-x", "-q", "-m", "not slow", "-p", "no:cacheprovider"],
        cwd=project,
        # The quick tier takes ~4 min on 2 cores; CI machines are slower and share their cores.
        timeout=1200,
    )
    assert tests.returncode == 0, (tests.stdout + tests.stderr)[-4000:]
    assert re.search(r"\d+ passed", tests.stdout)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_new_from_an_installed_wheel(tmp_path: Path) -> None:
    """Build a wheel, install it on its own, and generate a project from the template inside it."""
    src = tmp_path / "src"
    # Only what a checkout holds: outputs at the top level (logs/, data/, build/) are not part of it.
    top_level_outputs = {".git", "build", "dist", "logs", "data", "lightning_logs"}
    shutil.copytree(
        REPO,
        src,
        ignore=lambda folder, names: [
            n
            for n in names
            if (Path(folder) == REPO and n in top_level_outputs)
            or n in ("__pycache__", ".pytest_cache", ".ruff_cache")
            or n.endswith(".egg-info")
        ],
    )
    built = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("lit_ddp-*.whl"))
    site = tmp_path / "site"
    installed = run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {"PYTHONPATH": str(site)}
    where = run([sys.executable, "-c", "import lit_ddp; print(lit_ddp.__file__)"], cwd=tmp_path, **env)
    assert where.stdout.strip().startswith(str(site))  # the wheel, not this checkout
    made = run(
        [sys.executable, "-m", "lit_ddp", "new", str(tmp_path / "x" / "my-proj"), "--no-input"],
        cwd=tmp_path,
        **env,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    project = tmp_path / "x" / "my-proj"
    assert (project / "my_proj" / "cli.py").is_file() and (
        project / "configs" / "lenet_shapes.yaml"
    ).is_file()
    assert not any("lit_ddp" in p.read_text() for p in text_files(project))
    fit = run(
        [sys.executable, "-m", "my_proj", "fit", "--trainer.fast_dev_run=true"],
        cwd=project,
        PYTHONPATH=str(project),
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
