"""Callback hooks called only on the callbacks that define them.

Lightning calls every callback hook on every callback, ``Callback``'s empty defaults included, and wraps
each call in a profiler context named after the callback's ``state_key`` (for a ``ModelCheckpoint``, the
repr of its settings). With lit_ddp's 20 default callbacks a training step makes 120 such calls, of which
10 run any code; where a GPU makes the step itself fast, the rest is a share of the step that no callback
can make cheaper (docs/benchmarks.md, "Host overhead per training step").

``OverriddenHooksOnly`` (config key ``hook_dispatch``; ``--hook_dispatch=null`` gives Lightning's own
dispatch back) calls a hook only on the callbacks whose class, or the instance itself, defines it, in
Lightning's order and with Lightning's arguments. The module's current hook name is set around the calls as
Lightning sets it, and a profiler given to the Trainer still times every call it would have timed. The
choice of callbacks is made once per hook and made again whenever ``trainer.callbacks`` changes (a hook
assigned to a callback instance while a run is under way is seen from the next change or run on).

The dispatch is Lightning's module-level function, replaced (runtime/compat.py) while a trainer that has
this callback runs its ``fit``/``validate``/``test``/``predict``, and put back when the last such run ends;
other trainers in the same process keep Lightning's dispatch throughout. It is installed in ``setup``, which
runs in every process, so ranks that ``ddp_spawn`` starts (and that do not inherit the parent's module
state) have it too.
"""

import operator
import weakref

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, EarlyStopping

from lit_ddp.runtime import compat


def defines_hook(callback: Callback, hook_name: str) -> bool:
    """Whether calling ``hook_name`` on ``callback`` could run anything but ``Callback``'s empty default."""
    default = getattr(Callback, hook_name, None)
    if default is None or hook_name in vars(callback):
        return True
    return getattr(type(callback), hook_name, None) is not default


class _HookTable:
    """For one trainer: which of its callbacks each hook is called on, worked out on first use."""

    def __init__(self) -> None:
        self.callbacks: list[Callback] = []
        self.chosen: dict[tuple[str, bool | None], list[Callback]] = {}

    def callbacks_for(self, callbacks: list[Callback], hook_name: str, monitoring: bool | None) -> list:
        if len(callbacks) != len(self.callbacks) or not all(map(operator.is_, callbacks, self.callbacks)):
            self.callbacks, self.chosen = list(callbacks), {}
        key = (hook_name, monitoring)
        chosen = self.chosen.get(key)
        if chosen is None:
            # Lightning's "monitoring callbacks" split (on_validation_end, on_train_epoch_end), then the hook.
            chosen = [
                cb
                for cb in callbacks
                if (monitoring is None or monitoring == isinstance(cb, EarlyStopping | Checkpoint))
                and defines_hook(cb, hook_name)
            ]
            self.chosen[key] = chosen
        return chosen


_tables: "weakref.WeakKeyDictionary[Trainer, _HookTable]" = weakref.WeakKeyDictionary()


def _select(trainer: Trainer, hook_name: str, monitoring: bool | None) -> list[Callback] | None:
    table = _tables.get(trainer)
    return None if table is None else table.callbacks_for(trainer.callbacks, hook_name, monitoring)


def _release(trainer: Trainer) -> None:
    _tables.pop(trainer, None)
    if not _tables:
        compat.restore_callback_hooks()


class OverriddenHooksOnly(Callback):
    """Lightning calls each callback hook only on the callbacks that define it (module docstring)."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        _tables[trainer] = _HookTable()
        compat.route_callback_hooks(_select)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        _release(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        _release(trainer)  # Lightning calls no teardown hook after an exception
