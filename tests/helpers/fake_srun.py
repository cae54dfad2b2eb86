"""A stand-in for ``srun`` on one machine, for tests/test_launchers.py: runs the command once per task.

It reads the allocation from the variables sbatch would have set (SLURM_NNODES, SLURM_NTASKS_PER_NODE),
sets what srun sets for each task (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS, ...), and, like
``srun --kill-on-bad-exit=1``, kills the other tasks when one fails. srun's own options are ignored.
"""

import os
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    while argv and argv[0].startswith("-"):  # srun options, e.g. --kill-on-bad-exit=1
        argv = argv[1:]
    if argv[:1] == ["python"]:  # the job's python is the tests' own: a forked srun's spares can take it
        argv = [sys.executable, *argv[1:]]
    nodes, per_node = int(os.environ["SLURM_NNODES"]), int(os.environ["SLURM_NTASKS_PER_NODE"])
    procs = []
    for rank in range(nodes * per_node):
        env = {
            **os.environ,
            "SLURM_NTASKS": str(nodes * per_node),
            "SLURM_PROCID": str(rank),
            "SLURM_NODEID": str(rank // per_node),
            "SLURM_LOCALID": str(rank % per_node),
            "SLURM_STEP_ID": "0",
        }
        procs.append(subprocess.Popen(argv, env=env))
    while any(p.poll() is None for p in procs):
        if any(p.returncode not in (None, 0) for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.2)
    return next((p.returncode for p in procs if p.returncode), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
