"""Scaffolding: cookiecutter on this repository and `python -m lit_ddp new` generate a thin project of the
user's own code on lit_ddp (a network, a data module, configs, tests), which installs, passes its own CI,
names nothing private, and takes later template changes through cruft."""

import ast
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import cli_env, ctrl_c_while_importing, run_cli, run_python
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

from lit_ddp.errors import UserError
from lit_ddp.scaffold import template
from lit_ddp.scaffold.new import new
from lit_ddp.scaffold.template import FAMILIES, FAMILY_CHOICES

REPO = Path(__file__).resolve().parents[1]
TEXT = {".py", ".yaml", ".toml", ".md", ".txt", ".cfg", ".sh", ".json", ""}
LICENSES = json.loads((REPO / "cookiecutter.json").read_text())["license"]
LONG_NAME = "Very Long Project Name For Testing The Line Length Limits"
MAX_PROJECT_LINES = 1000
# A private name of Lightning or torch: an underscore module or attribute reached from either package.
PRIVATE = re.compile(
    r"\b(lightning|torch|pytorch_lightning)(\.\w+)*\._\w"  # lightning.pytorch._x, torch._dynamo
    r"|from (lightning|torch|pytorch_lightning)[\w.]* import .*\b_\w"  # from torch.x import _y
    r"|\b(trainer|strategy|torch|lightning)\._[a-z]\w*"  # trainer._accelerator_connector
)


def bake(tmp: Path, **context) -> Path:
    return Path(cookiecutter(str(REPO), no_input=True, extra_context=context, output_dir=str(tmp)))


def text_files(root: Path):
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in TEXT and "__pycache__" not in path.parts:
            yield path


def run(
    cmd: list[str], cwd: Path, timeout: float = 300, stdin: str | None = None, **env
) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )


def new_cli(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``python -m lit_ddp new ARGS`` (this checkout's lit_ddp, whatever is installed); ``stdin``: the text
    typed at its prompts (EOF after it)."""
    return run_cli(["new", *args], cwd=cwd, timeout=120, input=stdin)


def python_lines(project: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in project.rglob("*.py"))


@pytest.mark.parametrize("families", sorted(FAMILY_CHOICES))
def test_each_family_choice_is_a_thin_project_of_the_users_code(tmp_path: Path, families: str) -> None:
    project = bake(tmp_path, project_name="Cat Dog Classifier", model_families=families)
    assert project.name == "cat-dog-classifier"
    package = project / "cat_dog_classifier"
    for rel in ("__main__.py", "models/net.py", "data/datamodule.py"):
        assert (package / rel).is_file(), rel
    for rel in (
        "pyproject.toml",
        "README.md",
        "LICENSE",
        ".ci/run",
        "configs/default.yaml",
        "tests/test_ddp.py",
    ):
        assert (project / rel).is_file(), rel
    # No copy of the machinery: the runtime, the callbacks, the CLI and the benchmarks stay in lit_ddp.
    for rel in ("runtime", "callbacks", "cli.py", "scaffold"):
        assert not (package / rel).exists(), rel
    assert not (project / "benchmarks").exists()
    assert python_lines(project) <= MAX_PROJECT_LINES
    kept = FAMILY_CHOICES[families]
    for family, files in FAMILIES.items():
        for rel in files:
            assert (project / rel).exists() == (family in kept), rel
    for path in text_files(project):
        text = path.read_text()
        assert "{{" not in text and "{%" not in text, f"{path}: left unrendered"
        assert "# family:" not in text and "scaffold-only" not in text, path
    # Every module of the new package imports, against this checkout's lit_ddp.
    modules = [".".join(p.relative_to(project).with_suffix("").parts) for p in package.rglob("*.py")]
    result = run(
        [sys.executable, "-c", f"import importlib; [importlib.import_module(m) for m in {modules!r}]"],
        cwd=project,
        PYTHONPATH=f"{project}{os.pathsep}{REPO}",
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_generated_project_names_no_private_lightning_or_torch_name(tmp_path: Path) -> None:
    project = bake(tmp_path, project_name="Cat Dog", model_families="both")
    for path in project.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not PRIVATE.search(line), f"{path.relative_to(project)}:{number}: {line.strip()}"


def test_the_private_name_check_catches_what_it_is_for() -> None:
    for line in (
        "from lightning.pytorch.trainer.connectors._x import y",
        "from torch.utils.data import _utils",
        "torch._dynamo.config.x = 1",
        "trainer._accelerator_connector",
        "strategy._launcher",
    ):
        assert PRIVATE.search(line), line
    for line in (
        "from lightning import Trainer",
        "x = trainer.world_size",
        "import torch.nn.functional as F",
    ):
        assert not PRIVATE.search(line), line


def test_lit_ddps_own_code_carries_no_generator_markers() -> None:
    for path in [*REPO.glob("lit_ddp/**/*.py"), *REPO.glob("scripts/*"), *REPO.glob("configs/**/*.yaml")]:
        text = path.read_text()
        assert "# family:" not in text and "scaffold-only" not in text, path


@pytest.mark.parametrize("families", ["lenet_cifar", "resnet_imagenet"])
def test_presets_and_cluster_scripts_come_from_lit_ddps_own(tmp_path: Path, families: str) -> None:
    """One source: the template holds no copy; the project's are lit_ddp's with the project's command."""
    assert not (REPO / "{{cookiecutter.project_slug}}" / "configs" / "presets").exists()
    assert not (REPO / "{{cookiecutter.project_slug}}" / "scripts").exists()
    project = bake(tmp_path, project_name="Cat Dog", model_families=families)
    for rel in template.SHARED:
        if rel == "configs/resnet_imagenet.yaml" and families != "resnet_imagenet":
            assert not (project / rel).exists()
            continue
        ours, theirs = (REPO / rel).read_text(), (project / rel).read_text()
        assert theirs == template.shared_text(ours, "cat_dog") and "python -m lit_ddp " not in theirs, rel
        settings = lambda text: [line for line in text.splitlines() if not line.lstrip().startswith("#")]  # noqa: E731
        assert settings(theirs) == settings(ours) or rel.startswith("scripts/"), rel
        assert os.access(project / rel, os.X_OK) == os.access(REPO / rel, os.X_OK), rel


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
    assert [c.split("#")[0].replace("lit_ddp", "cat_dog_classifier") for c in ours] == [
        c.split("#")[0] for c in theirs
    ]
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert pyproject["name"] == "cat-dog-classifier" and pyproject["requires-python"] == ">=3.11"
    assert pyproject["description"] == "Cats versus dogs"
    assert pyproject["authors"] == [{"name": "Ada", "email": "ada@example.org"}]
    assert pyproject["scripts"] == {"cat-dog-classifier": "cat_dog_classifier.__main__:main"}
    assert pyproject["dependencies"] == [template.lit_ddp_requirement()]
    assert (project / "LICENSE").read_text().startswith("MIT License")


def test_quotes_and_backslashes_in_answers_stay_valid_toml(tmp_path: Path) -> None:
    answers = {"author": 'Ada "The Countess" \\ L', "description": 'say "hi" \\n 😀', "email": "a\\b@x.org"}
    new([str(tmp_path / "proj"), "--no-input", *(f"{k}={v}" for k, v in answers.items())])
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((tmp_path / "proj" / "pyproject.toml").read_text())["project"]
    assert pyproject["description"] == answers["description"]
    assert pyproject["authors"] == [{"name": answers["author"], "email": answers["email"]}]


@pytest.mark.parametrize(
    ("direct_url", "requirement"),
    [
        ({"url": "file:///src/lit_ddp", "dir_info": {"editable": True}}, "lit_ddp @ file:///src/lit_ddp"),
        (
            {"url": "https://example.org/lit_ddp.git", "vcs_info": {"vcs": "git", "commit_id": "abc123"}},
            "lit_ddp @ git+https://example.org/lit_ddp.git@abc123",
        ),
        ({"url": "file:///tmp/lit_ddp-0.2.0.whl", "archive_info": {}}, "lit_ddp~=0.2.0"),
        (None, "lit_ddp~=0.2.0"),
    ],
)
def test_the_project_depends_on_lit_ddp_where_it_was_installed_from(monkeypatch, direct_url, requirement):
    monkeypatch.setattr(template, "_direct_url", lambda: direct_url)
    monkeypatch.setattr(template, "_version", lambda: "0.2.0")
    assert template.lit_ddp_requirement() == requirement


def test_new_records_the_template_source_and_commit_for_cruft(tmp_path: Path) -> None:
    new([str(tmp_path / "proj"), "--no-input", "model_families=lenet_cifar"])
    state = json.loads((tmp_path / "proj" / ".cruft.json").read_text())
    head = run(["git", "rev-parse", "HEAD"], cwd=REPO).stdout.strip()
    assert state["template"] == str(REPO) and state["commit"] == head
    answers = state["context"]["cookiecutter"]
    assert answers["package_name"] == "proj" and answers["model_families"] == "lenet_cifar"
    assert answers["_commit"] == head and "_output_dir" not in answers


def test_cookiecutter_json_offers_what_the_template_understands() -> None:
    variables = json.loads((REPO / "cookiecutter.json").read_text())
    assert set(variables["model_families"]) == set(FAMILY_CHOICES)
    for key in ("project_name", "package_name", "author", "description", "license", "lit_ddp_requirement"):
        assert key in variables


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-input", "package_name=1bad-name"], "not a valid Python identifier"),
        # a keyword was told to use letters, digits and underscores, which it does
        (
            ["--no-input", "package_name=class"],
            r"'class' is a Python keyword: `import class` cannot be written",
        ),
        (["--no-input", "colour=red"], "unknown template variable 'colour'"),
        (["--no-input", "model_families=vgg"], "model_families must be one of"),
        (["--no-input", "project_name"], "is not key=value"),
        (["--no-input", "author={{ 7 * 7 }}"], r"author='\{\{ 7 \* 7 \}\}' contains template syntax"),
        (["--no-input", "description={% if 1 %}x{% endif %}"], "description=.* contains template syntax"),
    ],
)
def test_bad_answers_are_one_clear_error_and_write_nothing(tmp_path: Path, args, message) -> None:
    dest = tmp_path / "proj"
    with pytest.raises(UserError, match=message):
        new([str(dest), *args])
    assert not dest.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dest", ["", " "])
def test_an_empty_destination_is_refused_not_the_working_folder(tmp_path: Path, monkeypatch, dest) -> None:
    """`new "$NAME"` with NAME unset generated the project into the working folder."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="DEST is empty: name the project's folder"):
        new([dest, "--no-input"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-input", "--", "-rf"], "project_slug '-rf' must be a directory name like my-project"),
        (["--no-input", "--", "-rf", "author=me"], "project_slug '-rf' must be a directory name"),
        (["--no-input"], "DEST is missing: name the project's folder"),
    ],
)
def test_words_after_a_double_dash_are_dest_and_answers(tmp_path: Path, monkeypatch, argv, message) -> None:
    """`new -- -rf` said "the following arguments are required: dest, context" (Python's intermixed parse
    drops what follows "--")."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=message):
        new(argv)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "answer",
    ['project_name=My """ Net', "project_name=Ends in \\", 'author=A """ B', 'description=x """ \\'],
)
def test_quotes_in_any_answer_give_a_package_that_imports(tmp_path: Path, answer: str) -> None:
    new([str(tmp_path / "proj"), "--no-input", answer])
    init = tmp_path / "proj" / "proj" / "__init__.py"
    key, _, value = answer.partition("=")
    docstring = ast.get_docstring(ast.parse(init.read_text()))  # parses: the package imports
    if key == "project_name":
        assert docstring.startswith(f"{value}.\n")
    assert template.generated_problems(tmp_path / "proj") == []


@pytest.mark.timeout(120)
def test_ctrl_c_while_the_projects_command_line_imports_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """A Ctrl-C in the seconds ``python -m PKG`` takes to import torch printed a KeyboardInterrupt traceback
    of the import it stopped."""
    new([str(tmp_path / "proj"), "--no-input"])
    paths = (str(tmp_path / "proj"), str(REPO), os.environ.get("PYTHONPATH"))
    pythonpath = os.pathsep.join(p for p in paths if p)
    env = {**os.environ, "PYTHONPATH": pythonpath}
    result = ctrl_c_while_importing("proj", "fit", cwd=tmp_path / "proj", env=env)
    assert (result.returncode, result.stdout) == (130, ""), result.stderr
    assert result.stderr == "python -m proj: stopped by Ctrl-C while starting: nothing was run\n"


def test_a_line_break_in_an_answer_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"project_name=.* contains a line break .*: write it on one line"):
        new([str(tmp_path / "proj"), "--no-input", "project_name=Two\nLines"])
    assert list(tmp_path.iterdir()) == []


def test_generated_problems_names_a_file_that_does_not_parse(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text('"""My """ Net."""\n')
    (tmp_path / "ok.py").write_text("x = 1\n")
    (problem,) = template.generated_problems(tmp_path)
    assert problem.startswith("the answers make pkg/__init__.py invalid (SyntaxError")


def test_the_next_step_hint_is_quoted_for_the_shell(tmp_path: Path, capsys) -> None:
    dest = tmp_path / "my projects" / "it's here" / "proj"
    new([str(dest), "--no-input"])
    hint = capsys.readouterr().out.splitlines()[1]
    words = shlex.split(hint)
    assert words[:3] == ["cd", str(dest), "&&"], hint


def test_a_composed_network_gets_the_defaults_of_the_built_in_recipe() -> None:
    """The generated project composes its Net into ImageClassifier; lit_ddp's default composes LeNet into
    LeNetCIFAR: the system's defaults (channels_last, compile, optimizer...) must not depend on which."""
    from lit_ddp.models import ImageClassifier, LeNetCIFAR

    composed = inspect.signature(ImageClassifier).parameters
    built_in = inspect.signature(LeNetCIFAR).parameters
    # LeNetCIFAR forwards the rest to ImageClassifier (**kwargs): what it does not list, it inherits.
    assert "kwargs" in built_in
    restated = (composed.keys() & built_in.keys()) - {"num_classes"}
    assert {"channels_last", "optim"} <= restated
    for name in restated:
        assert composed[name].default == built_in[name].default, name


def test_non_empty_destination_is_refused_unless_overwrite_which_deletes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "proj"
    (dest / "proj").mkdir(parents=True)
    (dest / "notes.txt").write_text("mine")
    (dest / "proj" / "__main__.py").write_text("stale")  # a file the template writes
    (dest / "proj" / "mine.py").write_text("mine")
    with pytest.raises(UserError, match="exists and is not empty"):
        new([str(dest), "--no-input"])
    assert sorted(p.name for p in dest.rglob("*")) == ["__main__.py", "mine.py", "notes.txt", "proj"]
    new([str(dest), "--no-input", "--overwrite"])
    assert "def main" in (dest / "proj" / "__main__.py").read_text() and (dest / "configs").is_dir()
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


@pytest.mark.parametrize("name", ["tests", "configs", "scripts"])
def test_a_package_named_like_a_folder_of_the_project_is_one_line(tmp_path: Path, name: str) -> None:
    # tests/ and configs/ failed in cookiecutter ("<temp dir>/out/tests/tests directory already exists");
    # scripts/ got the cluster scripts inside the package.
    result = new_cli(str(tmp_path / "proj"), "--no-input", f"package_name={name}", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [
        f"lit_ddp new: error: package_name '{name}' is the name of the project's {name}/ folder: pass another"
        f" name, e.g. package_name={name}_classifier"
    ]
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
    [(f, "MIT", "Cat Dog Classifier") for f in sorted(FAMILY_CHOICES)]
    + [("lenet_cifar", lic, "Cat Dog Classifier") for lic in LICENSES]
    + [("both", "MIT", LONG_NAME)],
)
def test_generated_project_passes_its_own_lint(tmp_path: Path, families, license, name) -> None:
    """The lint half of the project's .ci/run."""
    project = bake(tmp_path, project_name=name, model_families=families, license=license)
    ci = (project / ".ci" / "run").read_text()
    assert "ruff check . && ruff format --check .\n" in ci
    for command in (["check", "."], ["format", "--check", "."]):
        result = run([sys.executable, "-m", "ruff", *command, "--no-cache"], cwd=project)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


@pytest.mark.parametrize("script", ["sbatch_single_node.sh", "sbatch_multi_node.sh"])
def test_sbatch_scripts_run_the_project_on_a_config_it_has(tmp_path: Path, script) -> None:
    project = bake(tmp_path, project_name="Cat Dog", model_families="lenet_cifar")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\necho "$@"\n')  # prints the command it would run
    (bin_dir / "srun").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    result = run(
        ["bash", f"scripts/{script}"], cwd=project, PATH=path, SLURM_NNODES="1", SLURM_NTASKS_PER_NODE="1"
    )
    assert result.returncode == 0, result.stderr
    assert "python -m cat_dog fit --config configs/default.yaml" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_generated_project_switches_its_data_to_shards_by_config(tmp_path: Path) -> None:
    """Its README's two commands: the project's own command line shards an ImageFolder tree, then fits the
    project's network on those shards with configs/streaming.yaml."""
    import yaml
    from imagenet_tree import make_tree  # tests/helpers (on sys.path by conftest)

    project = bake(tmp_path, project_name="Cat Dog", model_families="lenet_cifar")
    make_tree(project / "data" / "my_images")
    readme = (project / "README.md").read_text()
    commands = ["shard data/my_images shards/my_images", "fit --config configs/streaming.yaml --data.url="]
    assert all(f"python -m cat_dog {c}" in readme for c in commands)
    shard = ["shard", "data/my_images", "shards/my_images", "--shard-mb=0.05"]
    sharded = run_cli(shard, cwd=project, module="cat_dog")
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    quick = [
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--trainer.max_epochs=1",
        "--trainer.accelerator=cpu",
    ]
    args = ["--config", "configs/streaming.yaml", "--data.url=shards/my_images", *quick]
    fit = run_cli(["fit", *args, "--trainer.enable_progress_bar=false"], cwd=project, module="cat_dog")
    assert fit.returncode == 0, fit.stderr[-3000:]
    (run_dir,) = project.glob("logs/streaming/version_*")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["data"]["class_path"] == "lit_ddp.data.StreamingDataModule"
    assert config["model"]["init_args"]["net"]["class_path"] == "cat_dog.models.Net"
    hparams = yaml.safe_load((run_dir / "hparams.yaml").read_text())
    assert hparams["num_classes"] == 3  # the tree's classes, which the data module read from the shards
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_new_cli_exits_non_zero_and_names_the_problem(tmp_path: Path) -> None:
    result = new_cli(str(tmp_path / "bad"), "--no-input", "package_name=1bad-name", cwd=tmp_path)
    assert result.returncode == 2 and "1bad-name" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    ("version", "line"),
    [
        # requires-python >=3.8 on a project whose lit_ddp needs 3.10: pip on 3.8 or 3.9 found no lit_ddp.
        ("3.8", "python_version '3.8' is older than lit_ddp needs (3.10): pass python_version=3.10 or later"),
        ("2.7", "python_version '2.7' is older than lit_ddp needs (3.10)"),
        ("three", "python_version 'three' must be a Python version such as 3.10"),
    ],
)
def test_a_python_version_lit_ddp_cannot_run_on_is_one_line(tmp_path: Path, version: str, line: str) -> None:
    result = new_cli(str(tmp_path / "proj"), "--no-input", f"python_version={version}", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (said,) = result.stderr.splitlines()
    assert said.startswith(f"lit_ddp new: error: {line}"), said
    assert list(tmp_path.iterdir()) == []


def test_the_templates_python_floor_is_lit_ddps_own() -> None:
    root = Path(__file__).parents[1]
    assert f'requires-python = ">={template.MIN_PYTHON}"' in (root / "pyproject.toml").read_text()
    assert json.loads((root / "cookiecutter.json").read_text())["python_version"] == template.MIN_PYTHON


def test_a_bad_answer_at_a_prompt_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    # Project name, slug, then package name "torch"; Enter (the default) for the other seven questions.
    result = new_cli(str(tmp_path / "torchy"), cwd=tmp_path, stdin="Torchy\ntorchy\ntorch\n" + "\n" * 7)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("lit_ddp new: error: package_name 'torch' would shadow the installed module torch")
    assert line.endswith("e.g. package_name=torch_classifier")
    assert list(tmp_path.iterdir()) == []


def test_prompts_without_a_reader_are_one_line_naming_no_input(tmp_path: Path) -> None:
    # A CI job or a pipe: stdin at its end before the first answer.
    result = new_cli(str(tmp_path / "proj"), cwd=tmp_path, stdin="")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [
        "lit_ddp new: error: the template's questions got no answer (stdin is closed): pass --no-input,"
        " with key=value for the answers that are not the defaults"
    ]
    assert list(tmp_path.iterdir()) == []


def test_answers_typed_at_the_prompts_make_the_project(tmp_path: Path) -> None:
    # Project name, then Enter for the slug and the package, the rest typed: lenet_cifar (2), MIT (2).
    typed = "Cat Dog\n\n\n\n\n\n\n2\n2\n\n"
    result = new_cli(str(tmp_path / "cat-dog"), cwd=tmp_path, stdin=typed)
    assert result.returncode == 0, result.stderr
    project = tmp_path / "cat-dog"
    answers = json.loads((project / ".cruft.json").read_text())["context"]["cookiecutter"]
    assert (answers["project_name"], answers["package_name"]) == ("Cat Dog", "cat_dog")
    assert (answers["model_families"], answers["license"]) == ("lenet_cifar", "MIT")
    assert (project / "configs" / "lenet_cifar.yaml").is_file()
    assert not (project / "configs" / "resnet_imagenet.yaml").exists()
    assert (project / "LICENSE").read_text().startswith("MIT License")


def venv_with_this_environment(tmp_path: Path) -> str:
    """A fresh virtualenv that sees this environment's packages (torch & co.: no network here), whose
    python is returned. --without-pip: it runs this environment's pip and setuptools."""
    venv = tmp_path / "venv"
    made = run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    # Run from inside a virtualenv, --system-site-packages gives the base interpreter's site-packages, not
    # this environment's: a .pth file adds this one's, as site dirs, so their .pth files (editable
    # installs) work too.
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path)
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    lines = "".join(f"import site; site.addsitedir({path!r})\n" for path in ours)
    (Path(site.stdout.strip()) / "outer_environment.pth").write_text(lines)
    return python


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cookiecutter_command_project_installs_runs_and_passes_its_tests(tmp_path: Path) -> None:
    """`cookiecutter <repo>`, then the new project's own README commands, in a fresh virtualenv."""
    result = run(
        ["cookiecutter", str(REPO), "--no-input", "project_name=Cat Dog Classifier"],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    project = tmp_path / "cat-dog-classifier"
    python = venv_with_this_environment(tmp_path)
    # --no-deps: lit_ddp is this checkout, already importable; pip would reinstall it from its folder.
    install = run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."], cwd=project
    )
    assert install.returncode == 0, install.stderr[-2000:]
    fit = run([python, "-m", "cat_dog_classifier", "fit", "--trainer.fast_dev_run=true"], cwd=project)
    assert fit.returncode == 0, fit.stderr[-3000:]
    tests = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project, timeout=600)
    assert tests.returncode == 0, (tests.stdout + tests.stderr)[-4000:]
    assert re.search(r"\b1[0-9] passed", tests.stdout), tests.stdout[-500:]


def git(*args: str, cwd: Path) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    result = run(["git", *args], cwd=cwd, **env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def generated_at_template_commit_a(tmp_path: Path) -> tuple[str, Path, Path, Path]:
    """A template in a git repository (commit A), a project generated from it and committed, and a user's
    change to its net.py committed: (cruft, the template repository, the project, the project's net.py)."""
    cruft = shutil.which("cruft") or pytest.fail("cruft is a dev dependency: pip install -e '.[dev]'")
    template_repo = tmp_path / "template"
    template_repo.mkdir()
    shutil.copy2(REPO / "cookiecutter.json", template_repo)
    for folder in ("hooks", "{{cookiecutter.project_slug}}", "configs", "scripts"):
        shutil.copytree(REPO / folder, template_repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    git("init", "-q", "-b", "main", cwd=template_repo)
    git("add", ".", cwd=template_repo)
    git("commit", "-q", "-m", "A", cwd=template_repo)

    new([str(tmp_path / "proj"), "--no-input", "--template", str(template_repo)])
    project = tmp_path / "proj"
    state = json.loads((project / ".cruft.json").read_text())
    assert (
        state["template"] == str(template_repo)
        and state["commit"] == git("rev-parse", "HEAD", cwd=template_repo).strip()
    )
    git("init", "-q", "-b", "main", cwd=project)
    git("add", ".", cwd=project)
    git("commit", "-q", "-m", "generated", cwd=project)
    net = project / "proj" / "models" / "net.py"
    net.write_text(net.read_text().replace("LeNet-5 to start from.", "LeNet-5, widened by the user."))
    git("commit", "-q", "-am", "user change", cwd=project)
    return cruft, template_repo, project, net


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cruft_update_brings_a_template_change_and_keeps_the_users(tmp_path: Path) -> None:
    """Generate at template commit A, change the project, change the template at commit B: `cruft check`
    says the project is behind, and `cruft update` applies B's change without losing the user's. The project
    is importable, as after its README's `pip install -e .`: the template's hook refused to generate it
    again ("package_name 'proj' would shadow the installed module proj"), and cruft diff and update failed."""
    cruft, template_repo, project, net = generated_at_template_commit_a(tmp_path)
    gitignore = template_repo / "{{cookiecutter.project_slug}}" / ".gitignore"
    gitignore.write_text(gitignore.read_text() + "/checkpoints/\n")
    git("commit", "-q", "-am", "B: ignore checkpoints/", cwd=template_repo)
    installed = {"PYTHONPATH": os.pathsep.join(filter(None, [str(project), os.environ.get("PYTHONPATH")]))}

    # cruft diff: the project against its recorded template commit, i.e. the user's own changes.
    diff = run([cruft, "diff"], cwd=project, **installed)
    assert diff.returncode == 0 and "widened by the user" in diff.stdout, diff.stdout + diff.stderr
    assert run([cruft, "check"], cwd=project).returncode != 0  # B is newer than the recorded A
    update = run([cruft, "update", "-y"], cwd=project, **installed)
    assert update.returncode == 0, update.stdout + update.stderr
    assert (project / ".gitignore").read_text().endswith("/checkpoints/\n")
    assert "widened by the user" in net.read_text()
    state = json.loads((project / ".cruft.json").read_text())
    assert state["commit"] == git("rev-parse", "HEAD", cwd=template_repo).strip()
    assert run([cruft, "check"], cwd=project).returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cruft_update_on_a_line_both_changed_behaves_as_the_readmes_say(tmp_path: Path) -> None:
    """README and the generated README say what `cruft update` does when the template and the user changed
    the same line (they promised `.rej` files): git's conflict markers in the file, exit 0, `cruft check`
    passing. Real cruft here, so that a cruft which behaves otherwise fails this test; the user's line is
    kept, and the project's conflict check (its tests and .ci/run call it) names the file."""
    from lit_ddp.testing import conflict_markers

    cruft, template_repo, project, net = generated_at_template_commit_a(tmp_path)
    template_net = next(template_repo.rglob("models/net.py"))
    template_net.write_text(template_net.read_text().replace("LeNet-5 to start from.", "LeNet-5, as of B."))
    git("commit", "-q", "-am", "B: the same line", cwd=template_repo)

    update = run([cruft, "update", "-y"], cwd=project)
    assert update.returncode == 0, update.stdout + update.stderr
    text = net.read_text()
    assert "<<<<<<<" in text and "=======" in text and ">>>>>>>" in text, text[:800]
    assert "widened by the user" in text and "as of B." in text  # both sides kept: nothing lost
    assert "UU proj/models/net.py" in git("status", "--porcelain", cwd=project).splitlines()
    assert not list(project.rglob("*.rej"))
    assert run([cruft, "check"], cwd=project).returncode == 0
    found = conflict_markers(project)
    assert found and all(f.startswith("proj/models/net.py:") for f in found), found


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
    wheel_dir = tmp_path / "dist"
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
            str(wheel_dir),
            str(src),
        ],
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(wheel_dir.glob("lit_ddp-*.whl"))
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
    assert "records no commit" in made.stderr  # a wheel is no git checkout: said, not hidden
    project = tmp_path / "x" / "my-proj"
    assert (project / "my_proj" / "models" / "net.py").is_file()
    assert python_lines(project) <= MAX_PROJECT_LINES
    fit = run(
        [sys.executable, "-m", "my_proj", "fit", "--trainer.fast_dev_run=true"],
        cwd=project,
        PYTHONPATH=f"{project}{os.pathsep}{site}",
    )
    assert fit.returncode == 0, fit.stderr[-3000:]


# The user's own network and data, with constructor arguments the template's never had.
OTHER_NET = '''"""A small all-conv network: other arguments than the template's LeNet."""

from torch import Tensor, nn


class Net(nn.Module):
    def __init__(self, num_classes: int = 10, channels: int = 8, dropout: float = 0.0) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
            nn.Dropout(dropout), nn.Linear(16 * channels, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)
'''
OTHER_DATA = '''"""Four classes of 24-pixel images: other arguments than the template's data module."""

import torch
from lit_ddp.data import ImageDataModule, TensorImageDataset

SPLITS = ("train", "val", "test")


class MyDataModule(ImageDataModule):
    num_classes = 4
    class_names = ("north", "east", "south", "west")
    mean = (0.5, 0.5, 0.5)
    std = (0.25, 0.25, 0.25)

    def __init__(self, per_class: int = 30, batch_size: int = 16, seed: int = 0) -> None:
        super().__init__(batch_size=batch_size, seed=seed)
        self.save_hyperparameters()
        self.per_class = per_class

    def load_split(self, split: str):
        g = torch.Generator().manual_seed(100 * self.seed + SPLITS.index(split))
        labels = torch.arange(4).repeat(self.per_class)
        images = torch.randint(0, 128, (len(labels), 3, 24, 24), generator=g, dtype=torch.uint8)
        for k, rows in enumerate((slice(0, 6), slice(6, 12), slice(12, 18), slice(18, 24))):
            images[labels == k, :, rows, :] = 255  # a bright band where the class says
        return images, labels

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit":
            self.train_set = TensorImageDataset(*self.load_split("train"))
            self.val_set = TensorImageDataset(*self.load_split("val"))
        elif stage == "validate":
            self.val_set = TensorImageDataset(*self.load_split("val"))
        else:
            self.test_set = TensorImageDataset(*self.load_split("test"))
'''


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_projects_suite_stays_green_with_the_users_own_network_and_data(tmp_path: Path) -> None:
    """What the generated README says to edit, edited with other constructor arguments: the project's own
    tests and configs, untouched, still pass (they read the user's classes through the config)."""
    project = bake(tmp_path, project_name="My Own", model_families="lenet_cifar")
    (project / "my_own" / "models" / "net.py").write_text(OTHER_NET)
    (project / "my_own" / "data" / "datamodule.py").write_text(OTHER_DATA)
    # Forked (conftest.run_python) with the first two ranks its trust kit starts: no import of torch anew.
    tests = run_python(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        timeout=800,
        env={**os.environ, "PYTHONPATH": f"{project}{os.pathsep}{REPO}"},
        capture_output=True,
        text=True,
    )
    assert tests.returncode == 0, (tests.stdout + tests.stderr)[-4000:]
    assert re.search(r"\b\d+ passed", tests.stdout) and "failed" not in tests.stdout, tests.stdout[-500:]


def test_the_projects_help_lists_doctor_not_new_and_doctor_names_the_projects_configs(tmp_path: Path) -> None:
    project = bake(tmp_path, project_name="Cat Dog", model_families="lenet_cifar")
    main_help = run_cli(["--help"], cwd=project, module="cat_dog")
    assert main_help.returncode == 0, main_help.stderr
    assert "usage: python -m cat_dog" in main_help.stdout and "doctor --config" in main_help.stdout
    assert "new DEST" not in main_help.stdout  # lit_ddp's project generator is not the project's
    doctor_help = run_cli(["doctor", "--help"], cwd=project, module="cat_dog")
    assert doctor_help.returncode == 0, doctor_help.stderr
    text = doctor_help.stdout
    assert "usage: python -m cat_dog doctor" in text and "python -m lit_ddp" not in text
    assert "python -m cat_dog doctor --config configs/default.yaml" in text and "lenet_shapes" not in text


@pytest.mark.parametrize(
    ("stale", "hint"),
    [
        ("batch_nrm", ": did you mean model.init_args.net.init_args.batch_norm?"),
        ("zzz_gone", ": LeNet, the model.net class "),
    ],
)
def test_a_stale_network_argument_names_its_full_key(tmp_path: Path, stale: str, hint: str) -> None:
    """After the user replaces the network, an argument of the old one left in a config names the network's
    key (not model.<arg>) and suggests only the network's own arguments."""
    from lit_ddp.cli import build_cli

    config = tmp_path / "default.yaml"
    config.write_text(
        "model:\n  class_path: lit_ddp.models.ImageClassifier\n  init_args:\n    net:\n"
        f"      class_path: lit_ddp.models.lenet.LeNet\n      init_args:\n        {stale}: true\n"
    )
    with pytest.raises(UserError) as err:
        build_cli(["fit", "--config", str(config), "--print_config"], prog="python -m proj")
    assert str(err.value).startswith(
        f"{config}, line 7: unknown key model.init_args.net.init_args.{stale}{hint}"
    ), err.value


@pytest.mark.parametrize("given", ["config", "command line"])
def test_the_networks_num_classes_given_in_its_arguments_says_the_model_passes_it(
    tmp_path: Path, given: str
) -> None:
    """num_classes set under the network's init_args (the model passes it, from the data) was answered
    "unknown option --model.init_args.net.init_args.num_classes: did you mean
    --model.init_args.net.init_args.num_classes?"."""
    from lit_ddp.cli import build_cli

    config = tmp_path / "default.yaml"
    config.write_text(
        "model:\n  class_path: lit_ddp.models.ImageClassifier\n  init_args:\n    net:\n"
        "      class_path: lit_ddp.models.lenet.LeNet\n      init_args:\n        num_classes: 5\n"
    )
    flags = ["--model=ImageClassifier", "--model.net=LeNet", "--model.net.num_classes=5"]
    args = ["--config", str(config)] if given == "config" else flags
    with pytest.raises(UserError) as err:
        build_cli(["fit", *args, "--print_config"], prog="python -m proj")
    where = (
        f"{config}, line 7: unknown key model.init_args.net.init_args.num_classes"
        if given == "config"
        else "unknown option --model.net.num_classes"  # as the command line spells it
    )
    assert re.fullmatch(
        re.escape(f"{where}: num_classes is the first argument of ")
        + r"lit_ddp\.models(\.lenet)?\.LeNet"
        + re.escape(", which the model passes itself (the number of classes, from the data): leave it out"),
        str(err.value),
    ), err.value


def test_a_network_without_num_classes_is_told_to_take_it_not_to_drop_its_first_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A network whose first argument is not the number of classes (`def __init__(self, hidden=8)`, its head
    fixed) set in a config: the line said "leave it out", after which the model built Net(num_classes) and
    trained with hidden=num_classes, without a word."""
    from lit_ddp.cli import build_cli

    (tmp_path / "hidden_net.py").write_text(
        "from torch import nn\n\n\nclass HiddenNet(nn.Module):\n"
        "    def __init__(self, hidden: int = 8) -> None:\n        super().__init__()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "default.yaml"
    config.write_text(
        "model:\n  class_path: lit_ddp.models.ImageClassifier\n  init_args:\n    net:\n"
        "      class_path: hidden_net.HiddenNet\n      init_args:\n        hidden: 4\n"
    )
    with pytest.raises(UserError) as err:
        build_cli(["fit", "--config", str(config), "--print_config"], prog="python -m proj")
    assert str(err.value) == (
        f"{config}, line 7: unknown key model.init_args.net.init_args.hidden: hidden is the first argument of"
        " hidden_net.HiddenNet, which the model fills with the number of classes (from the data): make"
        " num_classes its first argument (def __init__(self, num_classes, hidden, ...)); if hidden is the"
        " number of classes, leave it out"
    )


def test_the_ci_conflict_check_runs_without_runpys_warning_or_torch(tmp_path: Path) -> None:
    """A project's .ci/run runs `python -m lit_ddp.testing.conflicts .`: lit_ddp.testing imported the module
    (and torch and Lightning, seconds) before runpy ran it, which printed "RuntimeWarning: 'lit_ddp.testing.
    conflicts' found in sys.modules ... this may result in unpredictable behaviour" on every CI run."""
    (tmp_path / "net.py").write_text("<<<<<<< ours\nx = 1\n=======\nx = 2\n>>>>>>> theirs\n")
    probe = (
        "import runpy, sys; sys.argv = ['conflicts', sys.argv[1]]\n"
        "try:\n    runpy.run_module('lit_ddp.testing.conflicts', run_name='__main__', alter_sys=True)\n"
        "finally:\n    print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr)\n"
    )
    for argv in (["-m", "lit_ddp.testing.conflicts", str(tmp_path)], ["-c", probe, str(tmp_path)]):
        result = subprocess.run(
            [sys.executable, "-W", "error::RuntimeWarning", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            env=cli_env(),
        )
        assert result.returncode == 1, result.stderr
        lines = result.stderr.splitlines()
        assert lines[:3] == [
            f"net.py:{n}: merge conflict marker (left by cruft update or git): resolve it" for n in (1, 3, 5)
        ], result.stderr
    assert lines[3:] == ["no torch"], result.stderr


def test_conflict_markers_fail_the_projects_own_checks_by_name(tmp_path: Path) -> None:
    """`cruft update` leaves git's markers where it could not merge, exits 0 and `cruft check` passes: the
    project's tests (and its .ci/run, through lit_ddp.testing.conflicts) stop on them, naming the file."""
    from lit_ddp.testing import conflict_markers

    project = bake(tmp_path, project_name="Cat Dog", model_families="lenet_cifar")
    assert conflict_markers(project) == []
    net = project / "cat_dog" / "models" / "net.py"
    lines = net.read_text().splitlines()
    lines[2:2] = ["<<<<<<< ours", "x = 1", "=======", "x = 2", ">>>>>>> theirs"]
    net.write_text("\n".join(lines) + "\n")
    assert conflict_markers(project) == [f"cat_dog/models/net.py:{n}" for n in (3, 5, 7)]
    (project / "README.md.rej").write_text("@@ -1 +1 @@\n")  # what cruft writes outside git
    assert conflict_markers(project)[0] == "README.md.rej (changes cruft could not apply)"
    assert "python -m lit_ddp.testing.conflicts ." in (project / ".ci" / "run").read_text()
    tests = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        PYTHONPATH=f"{project}{os.pathsep}{REPO}",
    )
    assert tests.returncode != 0
    said = tests.stdout + tests.stderr
    assert "merge conflict markers left by `cruft update` in README.md.rej" in said, said[-2000:]
    assert "cat_dog/models/net.py:3, cat_dog/models/net.py:5" in said
