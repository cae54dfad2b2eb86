"""Start one process per rank on this machine, as Lightning's ddp launcher or torchrun start them.

Each rank gets LOCAL_RANK, NODE_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, so ``Trainer(devices=N,
strategy="ddp")`` (or a ``--trainer.strategy=ddp`` CLI run) inside it joins a real gloo group without
launching processes of its own. The parent's ``sys.path`` goes along, so classes defined in the caller's
modules (a pytest file's model) unpickle in the ranks.
"""

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path


class LaunchError(RuntimeError):
    """A rank failed or the ranks timed out; the message ends with each rank's last output."""


class LaunchStopped(LaunchError):
    """The caller's ``stop`` event ended the ranks: another launch running beside this one failed."""


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: each socket stays bound until all are chosen, so launches started side by
    side cannot be handed the same one."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def launch(
    world_size: int,
    command: Sequence[str],
    cwd: Path,
    timeout: float,
    log_name: str = "rank",
    logs_dir: Path | None = None,
    port: int | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Runs ``python COMMAND`` as ``world_size`` ranks in ``cwd``; raises LaunchError, with each rank's last
    output, if one fails or the ranks outlive ``timeout`` seconds. Logs: ``<log_name><r>.log`` in
    ``logs_dir`` (default: ``cwd``). ``port``: the rendezvous port (default: a free one); ``stop``: set by
    the caller to end the ranks early (LaunchStopped)."""
    paths = [p for p in sys.path if p and Path(p).is_dir()]  # the caller's modules, lit_ddp, the rest
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port or free_port()),
        "NODE_RANK": "0",
        "WORLD_SIZE": str(world_size),
        "PYTHONUNBUFFERED": "1",
    }
    logs = [Path(logs_dir or cwd) / f"{log_name}{r}.log" for r in range(world_size)]
    procs = []
    for r, log in enumerate(logs):
        with open(log, "w") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, *command],
                    env={**env, "LOCAL_RANK": str(r)},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                )
            )
    # Stop at the first failure: the other rank would otherwise wait in a collective until the timeout.
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs) or (stop is not None and stop.is_set()):
            break
        time.sleep(0.1)
    codes = [p.poll() for p in procs]  # None: still running (timed out or left behind by a failed rank)
    elapsed = time.monotonic() - start
    for p in procs:
        p.kill()
        p.wait()
    stopped = stop is not None and stop.is_set() and None in codes
    if stopped and all(c in (None, 0) for c in codes):
        what = f"{world_size}-process run ended after {elapsed:.0f} s"
        raise LaunchStopped(f"{what}: the launch beside it failed")
    if codes != [0] * world_size:
        failed = [f"rank {r} exited with {c}" for r, c in enumerate(codes) if c not in (None, 0)]
        what = f"failed ({', '.join(failed)})" if failed else f"timed out ({timeout:.0f} s limit)"
        tails = "\n".join(f"--- rank {r} ---\n{log.read_text()[-3000:]}" for r, log in enumerate(logs))
        raise LaunchError(f"{world_size}-process run {what} after {elapsed:.0f} s:\n{tails}")
