"""A callback that injects one fault into a CLI run, for tests/test_faults.py and tests/test_launchers.py.

Added with ``--trainer.callbacks+=fault_probe.Fault --trainer.callbacks.init_args.action=sigkill ...``
(tests/helpers/ on PYTHONPATH). The fault fires on one rank at a chosen point, so a test knows exactly
what was lost:

* ``at_step=k``: at the start of training batch k of the run (global batch index, mid-epoch);
* ``at_epoch_end=e``: at the end of training epoch e, after its validation and checkpoint;
* ``in_setup=True``: at ``on_fit_start``, after every set-up hook and before Lightning's signal handlers;
* ``in_sanity_check=True``: at the first batch of the sanity check, before any training step;
* ``at_eval_batch=k``: at the start of batch k of a ``validate``, ``test`` or ``predict`` command;
* ``at_eval_end=True``: at the end of such a command's epoch, after its last batch.

A signal that reaches the firing rank through another process (``sigterm_parent``: handed back by ddp_spawn's
main process; ``sigint_group``: the whole group's) holds that rank until it has arrived there, so the rank
records it during the batch a test expects however loaded the machine: the run cannot train on, or end,
before it lands.

With ``out_dir``, each rank records the labels of every training batch (``batches_rank<r>.txt``: epoch,
step, labels) and appends ``<rank> <pid>`` to ``<out_dir>/pids`` at set-up, so a test can check that no
process is left behind.
"""

import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Timer, timer

ACTIONS = (
    "sigkill",
    "sigterm",
    "sigterm_parent",  # SIGTERM to this rank's parent: ddp_spawn's main process, as a scheduler sends it
    "sigusr1",
    "sigint",
    "sigint_twice",
    "sigint_group",  # Ctrl-C as a terminal sends it: to every process of the job's group (start it alone)
    "nan",
    "raise",
    "hang",
    "should_stop",
    "max_time",  # Lightning's Timer (--trainer.max_time) finds its time spent at the end of this batch
)


class Fault(Callback):
    def __init__(
        self,
        action: str,
        rank: int = 0,
        at_step: int = -1,
        at_epoch_end: int = -1,
        out_dir: str = "",
        in_sanity_check: bool = False,
        step_s: float = 0.0,
        at_eval_batch: int = -1,
        at_eval_end: bool = False,
        in_setup: bool = False,
    ) -> None:
        assert action in ACTIONS, action
        self.step_s = step_s  # extra seconds of work in every training batch, on every rank
        self.action, self.rank, self.at_step, self.at_epoch_end = action, rank, at_step, at_epoch_end
        self.in_sanity_check, self.at_eval_batch = in_sanity_check, at_eval_batch
        self.at_eval_end, self.in_setup = at_eval_end, in_setup
        self.out_dir = Path(out_dir) if out_dir else None
        self._batches = 0

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(self.out_dir / "pids", "a") as f:
                f.write(f"{trainer.global_rank} {os.getpid()}\n")

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.in_setup:
            self._fire(trainer, pl_module)

    def _fire(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_rank != self.rank:
            return
        if self.out_dir is not None:
            (self.out_dir / "fired").write_text(f"{time.time()} {trainer.global_step}")
        if self.action == "nan":
            # Every rank must see it (as a real divergence would): poison this rank's weights, and DDP's
            # gradient all-reduce spreads the NaN to the others at this step.
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))
        elif self.action == "hang":  # alive but stuck (a deadlock, a dead filesystem): never returns
            while True:
                time.sleep(1)
        elif self.action == "sigint_twice":  # Ctrl-C pressed twice in a row
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        elif self.action == "sigint_group":
            _until_received(signal.SIGINT, lambda: os.killpg(os.getpgid(0), signal.SIGINT))
        elif self.action == "should_stop":  # a stop decided as EarlyStopping or max_time decide theirs
            trainer.should_stop = True
        elif self.action == "max_time":
            _spend_max_time(trainer)
        elif self.action == "sigterm_parent":
            _until_received(signal.SIGTERM, lambda: os.kill(os.getppid(), signal.SIGTERM))
        elif self.action == "raise":
            raise RuntimeError("fault_probe: injected error")
        else:
            signals = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigusr1": signal.SIGUSR1}
            sig = {**signals, "sigint": signal.SIGINT}[self.action]
            os.kill(os.getpid(), sig)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        if self.out_dir is not None:
            # Which data this step trains on: the labels identify a batch of the seeded shuffle.
            with open(self.out_dir / f"batches_rank{trainer.global_rank}.txt", "a") as f:
                f.write(f"{trainer.current_epoch} {trainer.global_step} {batch[1].tolist()}\n")
        if self.step_s > 0:
            time.sleep(self.step_s)  # the workload of a slower step, not a wait for an event
        # Count batches seen in this process, not trainer.global_step, so a resumed run does not fire again.
        if self._batches == self.at_step:
            self._fire(trainer, pl_module)
        self._batches += 1

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.in_sanity_check and trainer.sanity_checking and batch_idx == 0:
            self._fire(trainer, pl_module)
        elif trainer.state.fn != "fit" and batch_idx == self.at_eval_batch:
            self._fire(trainer, pl_module)

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if batch_idx == self.at_eval_batch:
            self._fire(trainer, pl_module)

    on_predict_batch_start = on_test_batch_start

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.at_eval_end and trainer.state.fn != "fit":
            self._fire(trainer, pl_module)

    on_validation_epoch_end = on_predict_epoch_end = on_test_epoch_end

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.current_epoch == self.at_epoch_end:
            self._fire(trainer, pl_module)


def _spend_max_time(trainer: Trainer) -> None:
    """Moves the Timer's clock past ``--trainer.max_time``: the real Timer then stops the fit at this batch's
    end (its check, broadcast from rank 0, and its saved time), at a known batch however loaded the
    machine."""
    (timing,) = [c for c in trainer.callbacks if isinstance(c, Timer)]
    ahead, clock = timing.time_remaining() + 1.0, timer.time
    timer.time = SimpleNamespace(monotonic=lambda: clock.monotonic() + ahead)


def _until_received(signum: int, send, timeout_s: float = 300.0) -> None:
    """``send()`` a signal that comes back to this process, and return once this process's own handler of it
    has run (and with it whatever that handler raises, as a KeyboardInterrupt)."""
    arrived = threading.Event()
    handler = signal.getsignal(signum)

    def noting(signum: int, frame) -> None:
        signal.signal(signum, handler)
        arrived.set()
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), signum)  # as it would have acted: the default action, now restored

    signal.signal(signum, noting)
    send()
    deadline = time.monotonic() + timeout_s
    while not arrived.wait(0.01):  # handlers run in this (the main) thread, between these waits
        if time.monotonic() > deadline:
            name = signal.Signals(signum).name
            raise RuntimeError(f"fault_probe: {name} did not arrive in {timeout_s:.0f} s")


def listening_addresses() -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of the TCP sockets this process listens on (Linux)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own fd)
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # state 0A = LISTEN
                found.append(fields[1].split(":")[0])
    return found


class Listening(Callback):
    """Writes ``<out_dir>/listen_rank<r>.txt``: the addresses this rank listens on, once training started."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"listen_rank{trainer.global_rank}.txt").write_text(" ".join(listening_addresses()))
