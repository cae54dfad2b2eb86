"""``python import_gate.py MODULE [ARG ...]``: ``python -m MODULE ARG ...`` that prints "importing torch" when
it starts to import torch and waits there for a signal (the tests' Ctrl-C lands inside the import)."""

import runpy
import signal
import sys


class Gate:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            print("importing torch", flush=True)
            signal.pause()


if __name__ == "__main__":
    sys.meta_path.insert(0, Gate())
    module, *args = sys.argv[1:]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
