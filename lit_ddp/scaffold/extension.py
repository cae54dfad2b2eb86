"""The template's Jinja extension (cookiecutter.json ``_extensions``): a filter that writes any answer as a
TOML string, and the default of the lit_ddp requirement."""

import json

from jinja2.ext import Extension

from lit_ddp.scaffold.template import lit_ddp_requirement


def toml_string(value: object) -> str:
    """``value`` as a TOML basic string, quotes included: an author named ``Ada "A" \\`` stays valid TOML.

    JSON's escapes are TOML's, except that JSON writes characters outside the BMP as surrogate pairs,
    which TOML refuses (those are written as themselves: TOML files are UTF-8), and leaves DEL bare."""
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def docstring_text(value: object) -> str:
    """``value`` to go inside a Python docstring: backslashes and quotes escaped, so that a name holding
    ``\"\"\"`` or ending in ``\\`` neither ends the docstring nor escapes its closing quotes."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"')


class ProjectExtension(Extension):
    def __init__(self, environment) -> None:
        super().__init__(environment)
        environment.filters["toml"] = toml_string
        environment.filters["docstring"] = docstring_text
        environment.globals["lit_ddp_requirement"] = lit_ddp_requirement
