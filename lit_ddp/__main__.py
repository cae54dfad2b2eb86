"""``python -m lit_ddp`` (and the ``lit-ddp`` script). Importing the command line takes seconds (torch,
Lightning): a Ctrl-C meanwhile is one line and exit 130 (128 + SIGINT), not the traceback of the import it
stopped. A Ctrl-C once the command runs is the command's (docs/faults.md)."""

import sys

try:
    from lit_ddp.cli import main
except KeyboardInterrupt:
    print("lit_ddp: stopped by Ctrl-C while starting: nothing was run", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    main()
