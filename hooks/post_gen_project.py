"""Write the presets and cluster scripts from lit_ddp's, leave out the model families the user did not
choose, and refuse answers that made a file invalid."""

import json
import sys
from pathlib import Path

CONTEXT = json.loads(r"""{{ cookiecutter | jsonify }}""")
SOURCE = Path(CONTEXT.get("_repo_dir", "."))
if (SOURCE / "lit_ddp").is_dir():
    sys.path[0] = str(SOURCE)

from lit_ddp.scaffold.template import generated_problems, prune_families, write_shared  # noqa: E402

# The presets and cluster scripts are lit_ddp's own, beside the template (one source, not a copy in it).
if not (SOURCE / "configs" / "presets").is_dir():
    # cruft update runs this hook with no _repo_dir: the installed lit_ddp's (the same for both sides of
    # its merge, so they differ only where the template did)
    from lit_ddp.scaffold.new import template_root

    SOURCE = template_root()
write_shared(SOURCE, Path.cwd(), CONTEXT["package_name"])
prune_families(Path.cwd(), CONTEXT["model_families"])
if problems := generated_problems(Path.cwd()):
    print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
    sys.exit(1)
