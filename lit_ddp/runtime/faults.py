"""A lost rank stops the whole job quickly, and the message says which rank was lost.

What happens when one process of a DDP job dies (SIGKILL, out-of-memory killer, a node going down):

* torchrun and ``srun --kill-on-bad-exit=1`` see the dead worker and kill the others; they name the rank.
* Lightning's own launcher (``python -m lit_ddp fit --trainer.devices=N``): rank 0 is the parent of ranks
  1..N-1. Their next collective fails at once on gloo ("Connection reset by peer"), while NCCL may wait
  for the process-group timeout. Lightning's observer thread in rank 0 kills everything when a child dies,
  but says so only at INFO level; nothing watches the parent from the children; and a child that is stuck
  (alive) outlives rank 0. ``FaultMonitor`` closes these gaps: children exit within seconds of losing rank 0,
  rank 0 kills the children left when it fails, and the failing rank names the lost one.
* Every collective gets a finite timeout (``--dist_timeout``, default ``DEFAULT_DIST_TIMEOUT_S``, ten
  minutes, instead of torch's 30 min), the backstop for a rank that hangs without dying.
* A finished run must also exit cleanly: the process group is destroyed at exit (``atexit``), not left
  to the interpreter's finalisation, where a gloo group can abort a process that trained fine.
"""

import atexit
import errno
import os
import re
import signal
import sys
import threading
import time

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.fabric.plugins.environments import LightningEnvironment
from torch.distributed import DistBackendError, DistNetworkError, DistStoreError

from lit_ddp.compat import collective_timeout, launched_children, replace_child_observer_kill
from lit_ddp.errors import exception_chain
from lit_ddp.runtime.position import run_position

DEFAULT_DIST_TIMEOUT_S = 600.0

# gloo raises a plain RuntimeError for a failed collective whose only structure is its text (a typed error is
# pytorch/pytorch#14433; these two go when gloo raises DistBackendError/DistNetworkError as NCCL does);
# pinned, one test each, against the installed torch's gloo (tests/test_faults.py, torch 2.14.1).
GLOO_TIMED_OUT = re.compile(r"Timed out waiting \d+ms for (send|recv) operation")
GLOO_PEER_CLOSED = re.compile(r"Connection (closed|reset) by peer")
PEER_ERRNOS = {errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.EPIPE}


class LostRankReport:
    """What FaultMonitor found out about a lost rank, for the CLI's main() to print: the run context both
    see (main() makes it and hands it to the CLI, which hands it to the FaultMonitor it builds). The line is
    printed once, by whoever gets there first (the main thread, or Lightning's child-observer thread)."""

    def __init__(self) -> None:
        self.message: str | None = None
        self._reported = False
        self._lock = threading.Lock()

    def reset(self) -> None:
        self.message, self._reported = None, False

    def print_once(self) -> None:
        """Prints ``lit_ddp: error: <message>`` to stderr, once, if there is a message."""
        with self._lock:
            if self.message is None or self._reported:
                return
            self._reported = True
            print(f"lit_ddp: error: {self.message}", file=sys.stderr, flush=True)

    def __getstate__(self) -> dict:  # ddp_spawn pickles the callbacks: the lock stays behind
        return {"message": self.message, "_reported": self._reported}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def destroy_process_group_at_exit() -> None:
    """Destroy the default process group (and every other) when the process exits normally.

    Lightning does this for NCCL only. A gloo group left to the interpreter's finalisation can abort a
    process that has finished its work ("terminate called without an active exception", SIGABRT): its worker
    threads may still hold work objects whose tensors need the GIL while it is being torn down (pytorch
    issues 190489 and PR 179291); seen here at the end of a two-process ddp_spawn run. Registered once.
    """
    atexit.unregister(_destroy_process_group)  # no duplicates when several runs share a process
    atexit.register(_destroy_process_group)


def _lost_children(children: list, wait_s: float = 3.0) -> list[tuple[int, int, int]]:
    """(local rank, pid, return code) of the launcher's children that have exited with an error."""
    deadline = time.monotonic() + wait_s
    while True:
        lost = [(i + 1, p.pid, p.poll()) for i, p in enumerate(children)]
        lost = [(r, pid, code) for r, pid, code in lost if code not in (None, 0)]
        if lost or time.monotonic() > deadline:
            return lost
        time.sleep(0.1)  # the peer's socket closed a moment before the kernel reaped it


def _how(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class FaultMonitor(Callback):
    """Names the lost rank when a collective fails; makes children of Lightning's launcher follow rank 0."""

    def __init__(self, poll_s: float = 1.0) -> None:
        self.poll_s = poll_s
        self.report = LostRankReport()  # the CLI hands in the one its main() reads
        self._trainer: Trainer | None = None
        self._parent: int | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.report.reset()  # a new run in this process (in-process CLI calls, tests)
        self._trainer = trainer
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            destroy_process_group_at_exit()
        children = launched_children(trainer.strategy)
        if _launched_by_node_rank0(trainer) and self._parent is None:
            self._parent = os.getppid()
            threading.Thread(target=self._follow_parent, name="lit_ddp-parent-watch", daemon=True).start()
        if children:
            # Lightning's child-process observer (a thread of rank 0) ends the whole job within one poll of
            # its loop (``sleep_period``) after a child dies, possibly before on_exception runs, and also
            # after on_exception killed a stuck child: name the lost rank first (unless the main thread
            # already did) and end the job as the main thread would (_end_job).
            replace_child_observer_kill(children, lambda: self._end_job(children))

    def _lost_message(self, lost: list[tuple[int, int, int]]) -> str:
        t = self._trainer
        names = ", ".join(f"rank {self._node_rank0() + r} (pid {pid}, {_how(code)})" for r, pid, code in lost)
        where = f" {run_position(t)}" if t is not None else ""
        return f"lost {names}{where}; the job stops"

    def _end_job(self, children: list) -> None:
        """What Lightning's observer does once a child died, but with the lost rank named and exit code 1: a
        shell reads its SIGKILL of rank 0 as 137, an out-of-memory kill's mark, though the job said why."""
        lost = [(i + 1, proc.pid, proc.returncode) for i, proc in enumerate(children) if proc.returncode]
        if self.report.message is None and lost:
            self.report.message = self._lost_message(lost)
        self.report.print_once()
        for proc in children:
            proc.kill()  # a rank stuck in a collective ignores a gentler signal
        os._exit(1)  # the main thread may be blocked in a collective

    def _node_rank0(self) -> int:
        t = self._trainer
        return t.node_rank * t.num_devices if t is not None else 0

    def _parent_lost(self, where: str = "") -> str:
        rank = self._trainer.global_rank if self._trainer else "?"
        lost = f"lost rank {self._node_rank0()} (pid {self._parent}, the launcher of this node)"
        return f"{lost}{where}; rank {rank} stops too"

    def _follow_parent(self) -> None:
        while os.getppid() == self._parent:
            time.sleep(self.poll_s)
        time.sleep(self.poll_s)  # a failing collective may report it first, through on_exception and the CLI
        if self.report.message is None:
            print(f"lit_ddp: error: {self._parent_lost()}", file=sys.stderr, flush=True)
        else:
            time.sleep(5 * self.poll_s)  # the main thread is on its way out
        os._exit(1)  # the main thread may be blocked in a collective that would wait for the timeout

    def _await_launcher(self) -> None:
        """Leave a start-up timeout to this node's rank 0, which launched this rank: it waits in the same
        rendezvous, from before this rank started, so it gives up first, names the start-up and kills the
        ranks it launched, and the job says it once rather than once a rank. Returns only if the launcher
        has not done so within ``30 * poll_s`` or has ended without doing so: this rank then says it."""
        launcher, deadline = os.getppid(), time.monotonic() + 30 * self.poll_s
        while os.getppid() == launcher and time.monotonic() < deadline:
            time.sleep(0.1)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if trainer.world_size < 2 or not isinstance(exception, RuntimeError | OSError):
            return
        where = run_position(trainer)
        if self._parent is not None:
            deadline = time.monotonic() + 2 * self.poll_s
            while os.getppid() == self._parent and time.monotonic() < deadline:
                time.sleep(0.1)
            if os.getppid() != self._parent:
                self.report.message = self._parent_lost(f" {where}")
                return
        children = launched_children(trainer.strategy) or []
        lost = _lost_children(children) if children else []
        if lost:
            self.report.message = self._lost_message(lost)
        elif is_timeout(exception):
            timeout = collective_timeout(trainer.strategy)
            waited = f"--dist_timeout={timeout.total_seconds():g} s" if timeout else "the collective timeout"
            if torch.distributed.is_initialized():
                what, verdict = where, "one of them is stuck; the job stops"
            else:
                # No process group yet: the rendezvous, which torch bounds by the same timeout, gave up on
                # ranks that had not joined: still starting (imports on a slow or busy node) or never started.
                if _launched_by_node_rank0(trainer):
                    self._await_launcher()  # which kills this rank, in the usual case
                what = "to join at start-up"
                verdict = (
                    "the start-up shares that timeout; raise --dist_timeout above the time the ranks take to"
                    " start, or see their output for one that failed"
                )
            self.report.message = (
                f"rank {trainer.global_rank} waited {waited} for the other ranks {what}"
                f" ({_first_line(exception)}): {verdict}"
            )
        elif is_peer_failure(exception):
            self.report.message = (
                f"rank {trainer.global_rank} lost contact with another rank {where}"
                f" ({_first_line(exception)}); the launcher's log names the rank that died"
            )
        if self.report.message and children:
            # The ranks this process launched would otherwise outlive it (a stuck one forever).
            for proc in children:
                if proc.poll() is None:
                    proc.kill()


def _launched_by_node_rank0(trainer: Trainer) -> bool:
    """A rank started by Lightning's launcher (not by torchrun or SLURM): its parent is this node's rank 0."""
    env = getattr(trainer.strategy, "cluster_environment", None)
    return (
        launched_children(trainer.strategy) is not None
        and isinstance(env, LightningEnvironment)
        and trainer.local_rank > 0
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].split(". ")[0] if text else type(exc).__name__


def is_timeout(exc: BaseException) -> bool:
    """A collective or the rendezvous store waited past its timeout: Python's and torch's store types, else
    gloo's own RuntimeError (GLOO_TIMED_OUT)."""
    return any(
        isinstance(e, TimeoutError | DistStoreError)
        or (type(e) is RuntimeError and GLOO_TIMED_OUT.search(str(e)) is not None)
        for e in exception_chain(exc)
    )


def is_peer_failure(exc: BaseException) -> bool:
    """Another rank went away: a reset or broken connection (its errno), torch's network and backend error
    types, else gloo's own RuntimeError (GLOO_PEER_CLOSED)."""
    return any(
        isinstance(e, ConnectionError | DistNetworkError | DistBackendError)
        or (isinstance(e, OSError) and e.errno in PEER_ERRNOS)
        or (type(e) is RuntimeError and GLOO_PEER_CLOSED.search(str(e)) is not None)
        for e in exception_chain(exc)
    )
