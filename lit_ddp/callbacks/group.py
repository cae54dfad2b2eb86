"""Several callbacks under one config key, as one entry of ``trainer.callbacks``.

A default run's callbacks are a handful of groups, each named for what a user sees or is protected from
(the console, the dashboard, resilience): one switch and one place to look for each, instead of a list of
parts whose order matters. Lightning calls every hook of every callback on every batch; a group is called
once per hook and calls only the members that define it, so parts that do nothing on a hook cost nothing.
"""

from collections.abc import Iterable

from lightning import Callback

from lit_ddp.compat import BATCH_HOOKS, skip_batch_hooks

# Every hook Lightning calls on a callback (setup, teardown, on_*), read from its Callback class.
HOOKS = tuple(
    name
    for name, value in vars(Callback).items()
    if callable(value) and (name.startswith("on_") or name in ("setup", "teardown"))
)


def _forward(name: str):
    def hook(self, *args, **kwargs) -> None:
        for method in self._hooks[name]:
            method(*args, **kwargs)

    hook.__name__ = name
    hook.__doc__ = f"Calls ``{name}`` of each member that defines it, in order."
    return hook


class CallbackGroup(Callback):
    """Calls each hook of ``members`` in their order; their states are saved and restored under each one's
    own ``state_key``, inside the group's."""

    def __init__(self, members: Iterable[Callback] = ()) -> None:
        self.members: list[Callback] = list(members)
        self.index_hooks()

    def index_hooks(self) -> None:
        """Which members each hook calls: those whose class defines it (again after a member is changed)."""
        defines = lambda m, name: getattr(type(m), name) is not getattr(Callback, name)  # noqa: E731
        self._hooks = {name: [getattr(m, name) for m in self.members if defines(m, name)] for name in HOOKS}
        skip_unused_batch_hooks(self)

    def member(self, kind: type) -> Callback | None:
        """The first member of type ``kind``, else None."""
        return next((m for m in self.members if isinstance(m, kind)), None)

    def drop(self, kind: type) -> None:
        """Leaves out the members of type ``kind`` (a callback of the user's does their part)."""
        self.members = [m for m in self.members if not isinstance(m, kind)]
        self.index_hooks()

    def state_dict(self) -> dict:
        states = {m.state_key: m.state_dict() for m in self.members}
        return {key: state for key, state in states.items() if state}

    def load_state_dict(self, state_dict: dict) -> None:
        for m in self.members:
            if m.state_key in state_dict:
                m.load_state_dict(state_dict[m.state_key])


def skip_unused_batch_hooks(callback: Callback) -> Callback:
    """Lightning passes over the per-batch hooks ``callback`` leaves empty: those its class does not
    override, those its settings leave nothing to do (its ``idle_batch_hooks``, if it has any), or for a
    group, those no member defines. Each would otherwise be called on every batch."""
    if isinstance(callback, CallbackGroup):
        unused = [name for name in BATCH_HOOKS if not callback._hooks[name]]
    else:
        unused = [name for name in BATCH_HOOKS if getattr(type(callback), name) is getattr(Callback, name)]
        unused += getattr(callback, "idle_batch_hooks", ())
    skip_batch_hooks(callback, unused)
    return callback


def find_callback(callbacks: Iterable[Callback], kind: type) -> Callback | None:
    """The first callback of type ``kind`` among ``callbacks`` and the members of their groups."""
    for callback in callbacks:
        if isinstance(callback, kind):
            return callback
        if isinstance(callback, CallbackGroup) and callback.member(kind) is not None:
            return callback.member(kind)
    return None


for _name in HOOKS:
    setattr(CallbackGroup, _name, _forward(_name))
