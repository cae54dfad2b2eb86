"""Fill the rendered project with the live lit_ddp tree, renamed (see lit_ddp/scaffold/populate.py)."""

import json
import sys
from pathlib import Path

CONTEXT = json.loads(r"""{{ cookiecutter | jsonify }}""")
SOURCE = Path(CONTEXT["_repo_dir"])
# In place of the hook's own temp dir, whose stray files would pass for installed modules.
sys.path[0] = str(SOURCE if (SOURCE / "lit_ddp").is_dir() else SOURCE.parent.parent)

from lit_ddp.scaffold.populate import populate  # noqa: E402

populate(Path.cwd(), SOURCE, CONTEXT)
