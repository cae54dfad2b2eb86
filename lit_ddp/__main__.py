"""``python -m lit_ddp`` (and the ``lit-ddp`` script)."""

from lit_ddp.entry import starting

with starting():  # a Ctrl-C during the seconds of import: one line, exit 130
    from lit_ddp.cli import main

if __name__ == "__main__":
    main()
