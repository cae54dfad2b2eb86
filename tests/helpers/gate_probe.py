"""A callback that holds a CLI run at the start of training until a file exists, for the tests that need two
runs to overlap (tests/test_surface_run_lock.py): the overlap then lasts as long as the test wants, whatever
the machine's load, instead of as long as a sleep happens to.

Added with ``--trainer.callbacks+=gate_probe.Gate --trainer.callbacks.open_when=PATH`` (tests/helpers/ on
PYTHONPATH).
"""

import time
from pathlib import Path

from lightning import Callback, LightningModule, Trainer


class Gate(Callback):
    def __init__(self, open_when: str, timeout_s: float = 300.0) -> None:
        self.open_when, self.timeout_s = Path(open_when), timeout_s

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.open_when.exists():
            if time.monotonic() > deadline:  # the test gave up: fail, rather than train unsupervised
                raise RuntimeError(f"gate_probe: {self.open_when} did not appear in {self.timeout_s:.0f} s")
            time.sleep(0.1)
