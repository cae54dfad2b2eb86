"""One rank of tests/test_ddp_semantics.py: runs a list of ``lit_ddp`` commands in this process.

The test starts one process per rank with LOCAL_RANK, NODE_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set,
exactly as Lightning's own ddp launcher starts its child ranks (and as torchrun does), so each command is a
real ``--trainer.strategy=ddp`` run. Running several commands per process pays the ~5 s import of torch and
Lightning once instead of once per run; the gloo group, once created, is reused by the later runs.

    python tests/helpers/ddp_semantics_worker.py jobs.json   # jobs.json: a list of argument lists
"""

import json
import sys
from pathlib import Path

from lit_ddp.cli import build_cli

if __name__ == "__main__":
    for args in json.loads(Path(sys.argv[1]).read_text()):
        build_cli(args)
