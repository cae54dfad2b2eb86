"""Refuse bad answers before anything is generated (cookiecutter then removes the half-made project)."""

import json
import sys
from pathlib import Path

CONTEXT = json.loads(r"""{{ cookiecutter | jsonify }}""")
# The checkout's lit_ddp when generating from one (cookiecutter sets _repo_dir), else the installed one.
SOURCE = Path(CONTEXT.get("_repo_dir", "."))
if (SOURCE / "lit_ddp").is_dir():
    sys.path[0] = str(SOURCE)  # in place of the hook's own temp dir, whose stray files would pass for modules

from lit_ddp.scaffold.template import validate  # noqa: E402

# An installed project of this template under this name is what cruft diff and update generate again
# (`lit_ddp new` refuses the name before this hook runs).
problems = validate(CONTEXT, own_project_ok=True)
if problems:
    print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
    sys.exit(1)
