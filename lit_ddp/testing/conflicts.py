"""Merge conflict markers left in a project's files (``cruft update`` writes git's and exits 0), and the
``.rej`` files it writes instead outside git or when git's 3-way apply fails.

python -m lit_ddp.testing.conflicts [ROOT]     # exit 1, naming each file and line, when any is found
"""

import re
import sys
from pathlib import Path

# git's markers: 7 of <, = or > alone at the start of a line (<<<<<<< and >>>>>>> followed by a label).
MARKER = re.compile(r"^(<{7}|>{7})( .*)?$|^={7}$")
SKIPPED = {".git", "__pycache__", ".venv", "venv"}  # anywhere
OUTPUTS = {"build", "dist", "logs", "data", "lightning_logs"}  # at the top: what runs write, not sources
TEXT = {".py", ".yaml", ".yml", ".toml", ".md", ".txt", ".cfg", ".sh", ".json", ".ini", ""}


def conflict_markers(root: str | Path) -> list[str]:
    """``path:line`` of every conflict marker in the text files under ``root``, and each ``path.rej`` of
    rejected changes (empty when none)."""
    root = Path(root)
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        skipped = SKIPPED & set(rel.parts) or rel.parts[0] in OUTPUTS
        if not skipped and path.suffix == ".rej" and path.is_file():
            found.append(f"{rel} (changes cruft could not apply)")
        if skipped or not path.is_file() or path.suffix not in TEXT:
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        found += [f"{rel}:{n}" for n, line in enumerate(lines, 1) if MARKER.match(line)]
    return found


if __name__ == "__main__":
    markers = conflict_markers(sys.argv[1] if len(sys.argv) > 1 else ".")
    for where in markers:
        print(f"{where}: merge conflict marker (left by cruft update or git): resolve it", file=sys.stderr)
    sys.exit(1 if markers else 0)
