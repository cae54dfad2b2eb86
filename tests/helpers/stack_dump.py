"""A run that is stuck prints where every thread is, then exits: faulthandler's timer, armed at setup.

Added with ``--trainer.callbacks+=stack_dump.DumpIfStuck --trainer.callbacks.seconds=S`` (tests/helpers/ on
PYTHONPATH): a GPU test whose run hangs leaves the stacks in its output instead of a bare timeout.
"""

import faulthandler
import sys

from lightning import Callback


class DumpIfStuck(Callback):
    def __init__(self, seconds: float = 240.0) -> None:
        self.seconds = seconds

    def setup(self, trainer, pl_module, stage: str) -> None:
        faulthandler.dump_traceback_later(self.seconds, exit=True, file=sys.stderr)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        faulthandler.cancel_dump_traceback_later()
