"""``hook_dispatch``: Lightning calls each callback hook only on the callbacks that define it, and nothing a
callback sees changes (runtime/hook_dispatch.py)."""

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.profilers import SimpleProfiler
from lightning.pytorch.trainer import call

from lit_ddp.data import ShapesDataModule
from lit_ddp.models import LeNetCIFAR
from lit_ddp.runtime import compat
from lit_ddp.runtime.hook_dispatch import OverriddenHooksOnly, defines_hook

HOOKS = sorted(name for name in vars(L.Callback) if name.startswith("on_") or name in ("setup", "teardown"))


class EveryHook(L.Callback):
    """Records each hook it gets, the module's current hook name then, and the types of the arguments."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []


def _recorder(hook_name: str):
    def record(self, trainer, pl_module, *args, **kwargs):
        fx_name = pl_module._current_fx_name if pl_module is not None else None
        kinds = tuple(type(a).__name__ for a in args) + tuple(sorted(kwargs))
        self.seen.append((hook_name, fx_name, kinds))

    return record


for _hook in HOOKS:
    setattr(EveryHook, _hook, _recorder(_hook))


class Asked(L.Callback):
    """Defines no hook; counts how often a hook is looked up on it."""

    def __init__(self) -> None:
        self.asked = 0

    def __getattribute__(self, name: str):
        if name.startswith("on_") or name in ("setup", "teardown"):
            object.__setattr__(self, "asked", object.__getattribute__(self, "asked") + 1)
        return object.__getattribute__(self, name)


def _trainer(tmp_path: Path, callbacks: list, **kwargs) -> L.Trainer:
    settings = dict(max_epochs=2, limit_train_batches=3, limit_val_batches=2, limit_test_batches=2)
    return L.Trainer(
        accelerator="cpu",
        limit_predict_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=callbacks,
        **(settings | kwargs),
    )


def _data() -> ShapesDataModule:
    return ShapesDataModule(train_size=48, val_size=32, batch_size=16)


def _every_stage(tmp_path: Path, dispatch: list) -> tuple[list, int]:
    recorder, asked = EveryHook(), Asked()
    trainer = _trainer(tmp_path, [*dispatch, recorder, asked])
    model = LeNetCIFAR()
    trainer.fit(model, datamodule=_data())
    assert call._call_callback_hooks is compat._lightning_call_callback_hooks  # given back after each run
    trainer.validate(model, datamodule=_data())
    trainer.test(model, datamodule=_data())
    trainer.predict(model, datamodule=_data())
    assert call._call_callback_hooks is compat._lightning_call_callback_hooks
    return recorder.seen, asked.asked


def test_callbacks_get_the_same_hooks_in_the_same_order_with_the_same_arguments(tmp_path: Path) -> None:
    lightning_seen, lightning_asked = _every_stage(tmp_path / "lightning", [])
    seen, asked = _every_stage(tmp_path / "routed", [OverriddenHooksOnly()])
    assert seen == lightning_seen
    assert {"on_train_batch_end", "on_validation_batch_end", "on_test_batch_end", "on_predict_batch_end"} <= {
        hook for hook, _, _ in seen
    }
    # Lightning asks a callback that defines nothing for every hook; routed, only for each stage's setup
    # (called before the routing callback's own setup installs it) and by checkpoint saving's own loop.
    assert lightning_asked > 100
    assert asked == 4 + 2


def test_a_callback_added_during_the_run_or_a_hook_set_on_an_instance_is_called(tmp_path: Path) -> None:
    late, on_instance = EveryHook(), L.Callback()
    batches: list[int] = []
    on_instance.on_train_batch_end = lambda trainer, pl_module, outputs, batch, batch_idx: batches.append(
        batch_idx
    )

    class AddLate(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module) -> None:
            if late not in trainer.callbacks:
                trainer.callbacks.append(late)

    trainer = _trainer(tmp_path, [OverriddenHooksOnly(), AddLate(), on_instance], limit_val_batches=0)
    trainer.fit(LeNetCIFAR(), datamodule=_data())
    assert batches == [0, 1, 2, 0, 1, 2]
    assert [hook for hook, _, _ in late.seen].count("on_train_batch_end") == 3  # the second epoch's


def test_a_profiler_given_to_the_trainer_still_times_each_callback_hook(tmp_path: Path) -> None:
    profiler = SimpleProfiler()
    trainer = _trainer(tmp_path, [OverriddenHooksOnly(), EveryHook()], profiler=profiler)
    trainer.fit(LeNetCIFAR(), datamodule=_data())
    names = set(profiler.recorded_durations)
    assert "[Callback]EveryHook.on_train_batch_end" in names
    assert not any(name.startswith("[Callback]OverriddenHooksOnly.on_train_batch") for name in names)


def test_an_exception_in_fit_gives_lightnings_dispatch_back(tmp_path: Path) -> None:
    class Fails(L.Callback):
        def on_train_batch_end(self, *args) -> None:
            raise RuntimeError("boom")

    trainer = _trainer(tmp_path, [OverriddenHooksOnly(), Fails()])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(LeNetCIFAR(), datamodule=_data())
    assert call._call_callback_hooks is compat._lightning_call_callback_hooks


def test_a_trainer_without_the_callback_keeps_lightnings_dispatch_while_another_is_routed(
    tmp_path: Path,
) -> None:
    """A fit run from inside a routed fit (as a tuner or a test harness may): the inner trainer's callbacks
    get every hook Lightning's dispatch would give them, an undefined one included."""

    def inner_fit(asked: Asked, root: Path) -> None:
        inner = _trainer(root, [asked], max_epochs=1, limit_val_batches=0, enable_checkpointing=False)
        inner.fit(LeNetCIFAR(), datamodule=_data())

    alone, inside = Asked(), Asked()
    inner_fit(alone, tmp_path / "alone")

    class FitsAnother(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module) -> None:
            if trainer.current_epoch == 0:
                inner_fit(inside, tmp_path / "inside")

    _trainer(tmp_path, [OverriddenHooksOnly(), FitsAnother()]).fit(LeNetCIFAR(), datamodule=_data())
    assert inside.asked == alone.asked > 20


def test_defines_hook_tells_an_override_from_callbacks_empty_default() -> None:
    class Base(L.Callback):
        def on_train_batch_end(self, *args) -> None:
            pass

    class Child(Base):
        pass

    assert defines_hook(Child(), "on_train_batch_end")
    assert not defines_hook(Child(), "on_train_batch_start")
    instance = L.Callback()
    instance.on_fit_start = lambda trainer, pl_module: None
    assert defines_hook(instance, "on_fit_start")
    assert defines_hook(L.Callback(), "on_a_hook_lightning_adds_later")  # unknown: called, as Lightning would


class RankRouted(L.Callback):
    """Writes, on each rank, whether the routed dispatch was in place during training."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        routed = call._call_callback_hooks is not compat._lightning_call_callback_hooks
        (self.out / f"rank{trainer.global_rank}").write_text(str(routed))


@pytest.mark.timeout(240)
def test_every_spawned_rank_routes_its_own_hooks(tmp_path: Path) -> None:
    """ddp_spawn's ranks start without the parent's module state: the routing is installed in each."""
    trainer = _trainer(
        tmp_path, [OverriddenHooksOnly(), RankRouted(tmp_path)], devices=2, strategy="ddp_spawn", max_epochs=1
    )
    torch.manual_seed(0)
    trainer.fit(LeNetCIFAR(), datamodule=_data())
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["True", "True"]
