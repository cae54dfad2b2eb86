"""Leave out the model families the user did not choose; refuse answers that made a file invalid."""

import json
import sys
from pathlib import Path

CONTEXT = json.loads(r"""{{ cookiecutter | jsonify }}""")
SOURCE = Path(CONTEXT.get("_repo_dir", "."))
if (SOURCE / "lit_ddp").is_dir():
    sys.path[0] = str(SOURCE)

from lit_ddp.scaffold.template import generated_problems, prune_families  # noqa: E402

prune_families(Path.cwd(), CONTEXT["model_families"])
if problems := generated_problems(Path.cwd()):
    print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
    sys.exit(1)
