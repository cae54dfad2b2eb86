"""``python -m lit_ddp new DEST [--no-input] [--overwrite] [key=value ...]``: a new project on lit_ddp from
the template shipped inside this package (works offline, from a wheel, with no git URL).

The project holds the user's code only (a network, a data module, configs, tests) and depends on lit_ddp;
its ``.cruft.json`` records the template's source and commit, for ``cruft update``. It is generated into a
temporary directory and copied to DEST only when complete, so a bad answer or a failed hook writes
nothing. --overwrite writes the template's files over those at the same paths in DEST and touches nothing
else: it never deletes a file.
"""

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from lit_ddp.errors import UserError
from lit_ddp.scaffold.template import (
    FAMILY_CHOICES,
    cruft_state,
    jinja_in,
    lit_ddp_requirement,
    template_source,
    validate,
)
from lit_ddp.writes import write_file

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
        if problem := jinja_in(key, value):  # before cookiecutter evaluates it
            raise UserError(problem)
        choices = variables[key]
        if isinstance(choices, list) and value not in choices:  # else cookiecutter's 20-line ValueError
            raise UserError(
                f"{key} must be one of {', '.join(choices)}, not {value!r}: e.g. {key}={choices[0]}"
            )
        context[key] = value
    # DEST names the project unless the user says otherwise.
    context.setdefault("project_slug", dest.name)
    context.setdefault("project_name", dest.name.replace("-", " ").replace("_", " ").title())
    context.setdefault("lit_ddp_requirement", lit_ddp_requirement())
    return context


def _resolved(context: dict, variables: dict) -> dict:
    """The answers --no-input would give, to validate before generating anything."""
    resolved = dict(context)
    resolved.setdefault("package_name", resolved["project_slug"].replace("-", "_"))
    for key, default in variables.items():
        if not key.startswith("_"):
            resolved.setdefault(key, default[0] if isinstance(default, list) else default)
    return resolved


def _prompted(root: Path, context: dict) -> dict:
    """Every answer, asked here as cookiecutter asks (the given ones as defaults), so that they are checked
    like --no-input's before anything is generated: a bad answer at a prompt is then one line, not the
    template hook's refusal under cookiecutter's logged traceback."""
    from cookiecutter.generate import generate_context
    from cookiecutter.prompt import prompt_for_config

    full = generate_context(context_file=str(root / "cookiecutter.json"), extra_context=context)
    try:
        answers = prompt_for_config(full)
    except EOFError:  # stdin closed or not a terminal (a CI job, a pipe): input() has nothing to read
        print()  # ends the question's line, which input() left open
        raise UserError(
            "the template's questions got no answer (stdin is closed): pass --no-input, with key=value for"
            " the answers that are not the defaults"
        ) from None
    return {key: value for key, value in answers.items() if not key.startswith("_")}


def _check_destination(dest: Path, overwrite: bool) -> None:
    if dest.exists() and not dest.is_dir():
        raise UserError(f"{dest} is a file: choose a directory for the new project")
    if dest.is_dir() and any(dest.iterdir()) and not overwrite:
        raise UserError(f"{dest} exists and is not empty: choose a new directory or pass --overwrite")


def _in_the_way(dest: Path, rel: Path) -> Path | None:
    """What in DEST the template's file ``rel`` would replace or write through, other than a file: a link,
    a folder where it writes a file, a file where it needs a folder. Those are the user's, never replaced."""
    target = dest / rel
    if target.is_symlink() or target.is_dir():
        return target
    folders = [dest / parent for parent in rel.parents[:-1]]  # below DEST, outermost last
    return next((f for f in folders if f.is_symlink() or (f.exists() and not f.is_dir())), None)


def _copy_over(generated: Path, dest: Path) -> None:
    """Write the generated files into ``dest``, replacing only files at the same paths; delete nothing."""
    files = [p.relative_to(generated) for p in sorted(generated.rglob("*")) if not p.is_dir()]
    for rel in files:  # all checked before anything is written
        if (path := _in_the_way(dest, rel)) is not None:
            raise UserError(f"{path} is in the way of the template's {rel}: move it or choose another DEST")
    for rel in files:  # each file whole or not at all; a failed write is one line (writes.py)
        write_file(dest / rel, (generated / rel).read_bytes(), "the new project's file", "another DEST")
        shutil.copymode(generated / rel, dest / rel)


def _temporary_folder_error(err: OSError) -> UserError:
    """The project is generated in a temporary folder first: one line where that folder cannot take it."""
    return UserError(
        f"could not generate the project in a temporary folder ({err.strerror or type(err).__name__}): free"
        " space there, or point TMPDIR at a writable disk with room; nothing was written to DEST"
    )


def new(argv: list[str]) -> Path:
    parser = argparse.ArgumentParser(prog="python -m lit_ddp new", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", nargs="?", help="directory to create; its name is the default project slug")
    parser.add_argument("context", nargs="*", help="template answers as key=value")
    parser.add_argument("--no-input", action="store_true", help="do not prompt; use defaults and key=value")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="generate into a non-empty DEST: the template's files replace those at the same paths, every"
        " other file stays (nothing is deleted); refused where a folder or link of yours is in the way",
    )
    parser.add_argument(
        "--template",
        type=Path,
        help="generate from another copy of the template (a fork, a checkout at another commit)",
    )
    # After "--" every word is a positional (a folder named "-rf"): split there by hand, since Python's
    # parse_intermixed_args then asks for DEST even when it was given.
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_intermixed_args(argv[:cut])
    words = [*([args.dest] if args.dest is not None else []), *args.context, *argv[cut + 1 :]]
    if not words:
        raise UserError("DEST is missing: name the project's folder, e.g. python -m lit_ddp new my_project")
    args.dest, args.context = words[0], words[1:]

    root = args.template.expanduser().resolve() if args.template else template_root()
    if not (root / "cookiecutter.json").is_file():
        raise UserError(
            f"{root} holds no cookiecutter.json: pass the root of a lit_ddp checkout as --template"
        )
    variables = json.loads((root / "cookiecutter.json").read_text())
    if not args.dest.strip():  # `new "$NAME"` with NAME unset: it would have filled the working folder
        raise UserError("DEST is empty: name the project's folder, e.g. python -m lit_ddp new my_project")
    dest = Path(args.dest).expanduser().resolve()
    context = _parse_context(args.context, variables, dest)
    _check_destination(dest, args.overwrite)
    if not args.no_input:
        context = _prompted(root, context)
    problems = validate(_resolved(context, variables))
    if problems:
        raise UserError("; ".join(problems))

    from cookiecutter.exceptions import CookiecutterException, FailedHookException
    from cookiecutter.main import cookiecutter

    try:
        folder = tempfile.TemporaryDirectory(prefix="lit_ddp_new_")
    except OSError as err:  # tempfile finds no folder it can write a file in: full, read-only
        raise _temporary_folder_error(err) from None
    with folder as tmp:
        # The answers, prompted ones included, come back in cookiecutter's replay file: kept in tmp, not
        # in the user's ~/.cookiecutter_replay.
        replay = Path(tmp) / "replay"
        try:
            generated = Path(
                cookiecutter(
                    str(root),
                    no_input=True,  # every answer is in the context: given, default, or prompted above
                    extra_context=context,
                    output_dir=str(Path(tmp) / "out"),
                    default_config={"replay_dir": str(replay)},
                )
            )
        except FailedHookException as err:
            raise UserError(f"the template refused the answers ({err}); nothing was written") from None
        except CookiecutterException as err:
            raise UserError(f"could not generate the project: {err}") from None
        except OSError as err:  # cookiecutter writes the project into the temporary folder
            raise _temporary_folder_error(err) from None
        answers = json.loads(next(replay.glob("*.json")).read_text())["cookiecutter"]
        source, commit = template_source(root)
        state = cruft_state(source, commit, answers)
        write_file(generated / ".cruft.json", json.dumps(state, indent=2) + "\n", "the template record", None)
        package = next((p.parent.name for p in generated.glob("*/__main__.py")), "<package>")
        _copy_over(generated, dest)
    # Quoted for the shell: the line is meant to be pasted, and a folder name may hold spaces or quotes.
    print(f"created {dest}\n  cd {shlex.quote(str(dest))} && pip install -e . && python -m {package} fit")
    if commit is None:
        print(
            f"note: {source} is not a git checkout, so .cruft.json records no commit: `cruft update` needs"
            " one (generate from a lit_ddp git checkout with --template to have it)",
            file=sys.stderr,
        )
    return dest


def main(argv: list[str] | None = None) -> None:
    try:
        new(sys.argv[2:] if argv is None else argv)
    except UserError as err:
        print(f"lit_ddp new: error: {err}", file=sys.stderr)
        sys.exit(2)


__all__ = ["FAMILY_CHOICES", "main", "new"]
