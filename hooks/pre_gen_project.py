"""Refuse bad answers before anything is generated (cookiecutter then removes the half-made project)."""

import json
import sys
from pathlib import Path

CONTEXT = json.loads(r"""{{ cookiecutter | jsonify }}""")
SOURCE = Path(CONTEXT["_repo_dir"])
# In place of the hook's own temp dir, whose stray files would pass for installed modules.
sys.path[0] = str(SOURCE if (SOURCE / "lit_ddp").is_dir() else SOURCE.parent.parent)

from lit_ddp.scaffold.populate import validate  # noqa: E402

problems = validate(CONTEXT)
if problems:
    print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
    sys.exit(1)
