"""``python -m lit_ddp new DEST [--no-input] [--overwrite] [key=value ...]``: a new project from the
template shipped inside this package (works offline, from a wheel, with no git URL).

The project is generated into a temporary directory and moved to DEST only when complete, so a bad
answer or a failed hook writes nothing.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from lit_ddp.errors import UserError
from lit_ddp.scaffold.populate import FAMILY_CHOICES, validate

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def template_root() -> Path:
    """The repository root in a source checkout; the copy that setup.py packs into wheels otherwise."""
    checkout = PACKAGE_DIR.parent
    if (checkout / "cookiecutter.json").is_file() and (checkout / "hooks").is_dir():
        return checkout
    packed = PACKAGE_DIR / "_template"
    if (packed / "cookiecutter.json").is_file():
        return packed
    raise UserError(f"the project template is missing from {PACKAGE_DIR}: reinstall lit_ddp")


def _parse_context(pairs: list[str], variables: dict, dest: Path) -> dict:
    context = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UserError(f"{pair!r} is not key=value: e.g. project_name='Cat Dog Classifier'")
        if key not in variables or key.startswith("_"):
            known = ", ".join(k for k in variables if not k.startswith("_"))
            raise UserError(f"unknown template variable {key!r}: the variables are {known}")
        context[key] = value
    # DEST names the project unless the user says otherwise.
    context.setdefault("project_slug", dest.name)
    context.setdefault("project_name", dest.name.replace("-", " ").replace("_", " ").title())
    return context


def _resolved(context: dict, variables: dict) -> dict:
    """The answers --no-input would give, to validate before generating anything."""
    resolved = dict(context)
    resolved.setdefault("package_name", resolved["project_slug"].replace("-", "_"))
    for key, default in variables.items():
        if not key.startswith("_"):
            resolved.setdefault(key, default[0] if isinstance(default, list) else default)
    return resolved


def new(argv: list[str]) -> Path:
    parser = argparse.ArgumentParser(prog="python -m lit_ddp new", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="directory to create; its name is the default project slug")
    parser.add_argument("context", nargs="*", help="template answers as key=value")
    parser.add_argument("--no-input", action="store_true", help="do not prompt; use defaults and key=value")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty DEST")
    args = parser.parse_intermixed_args(argv)

    root = template_root()
    variables = json.loads((root / "cookiecutter.json").read_text())
    dest = args.dest.expanduser().resolve()
    context = _parse_context(args.context, variables, dest)
    if args.no_input:
        problems = validate(_resolved(context, variables))
        if problems:
            raise UserError("; ".join(problems))
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())) and not args.overwrite:
        raise UserError(f"{dest} exists and is not empty: choose a new directory or pass --overwrite")

    from cookiecutter.exceptions import CookiecutterException, FailedHookException
    from cookiecutter.main import cookiecutter

    with tempfile.TemporaryDirectory(prefix="lit_ddp_new_") as tmp:
        try:
            generated = Path(
                cookiecutter(str(root), no_input=args.no_input, extra_context=context, output_dir=tmp)
            )
        except FailedHookException as err:
            raise UserError(f"the template refused the answers ({err}); nothing was written") from None
        except CookiecutterException as err:
            raise UserError(f"could not generate the project: {err}") from None
        if dest.exists():
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(generated), str(dest))
    print(f"created {dest}\n  cd {dest} && pip install -e . && python -m {_package(dest)} fit")
    return dest


def _package(dest: Path) -> str:
    return next((p.parent.name for p in dest.glob("*/__main__.py")), "<package>")


def main(argv: list[str] | None = None) -> None:
    try:
        new(sys.argv[2:] if argv is None else argv)
    except UserError as err:
        print(f"lit_ddp new: error: {err}", file=sys.stderr)
        sys.exit(2)


__all__ = ["FAMILY_CHOICES", "main", "new"]
