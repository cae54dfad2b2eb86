"""What every command line on lit_ddp (``python -m lit_ddp``, a generated project's ``python -m PKG``) does
while it starts. Importing torch and Lightning takes seconds: a Ctrl-C meanwhile is one line and exit 130
(128 + SIGINT), not the traceback of the import it stopped. A Ctrl-C once the command runs is the
command's (docs/faults.md). This module imports nothing heavy, so it is in place before that import begins.

    from lit_ddp.entry import starting

    with starting("python -m mypkg"):
        from lit_ddp.cli import main
"""

import contextlib
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def starting(prog: str = "lit_ddp") -> Iterator[None]:
    """Inside: the command's imports. A Ctrl-C there ends the process with one line naming ``prog``."""
    try:
        yield
    except KeyboardInterrupt:
        print(f"{prog}: stopped by Ctrl-C while starting: nothing was run", file=sys.stderr)
        sys.exit(130)
