"""A project's configs from its tests: the config ``fit`` would run, and the model and data it builds.

    from lit_ddp.testing import build, resolved_config
    from my_project.__main__ import main

    config = resolved_config(main, "--config", "configs/default.yaml")
    model, data = build(config)

Tests written this way read the user's classes through the config, never the template's argument names: a
new network or data module with other constructor arguments keeps them green.
"""

import contextlib
import importlib
import io
from collections.abc import Callable

import torch
import yaml
from jsonargparse import ArgumentParser
from lightning import LightningDataModule, LightningModule
from lightning.pytorch.callbacks import GradientAccumulationScheduler

from lit_ddp.errors import UserError
from lit_ddp.runtime.quiet import quiet_args_given
from lit_ddp.utils import draw_seed, imported


def resolved_config(main: Callable[[list[str]], object], *args: str) -> dict:
    """The config ``main(["fit", *args])`` would run (defaults filled in), as a dict.

    ``main``: the project's command line (``lit_ddp.cli.main`` with the project's defaults). A config that
    ``fit`` refuses raises ``UserError`` with the line ``fit`` prints."""
    out, err = io.StringIO(), io.StringIO()
    with quiet_args_given():  # main() is given its arguments while sys.argv holds pytest's
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(["fit", *args, "--print_config"])
                code = 0
            except SystemExit as exit_:  # --print_config exits once it has printed
                code = exit_.code
    if code not in (0, None):
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        line = lines[-1] if lines else f"fit {' '.join(args)} exited with status {code}"
        raise UserError(line.removeprefix("lit_ddp: error: "))
    return yaml.safe_load(out.getvalue())


def instantiate(section: dict, base: type = object):
    """The object a config section (``{"class_path": ..., "init_args": {...}}``) describes, nested class
    paths (a network in ``net:``) built too, as the CLI builds them."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--it", type=base)
    # jsonargparse 4.49 renamed instantiate_classes to instantiate (the old name warns)
    instantiate_ = getattr(parser, "instantiate", None) or parser.instantiate_classes
    return instantiate_(parser.parse_object({"it": section})).it


def _takes_num_classes(class_path: str) -> bool:
    """Whether the class takes ``num_classes`` as ``fit`` sees it: jsonargparse's parameters, which follow
    ``**kwargs`` into the parent's constructor (a system forwarding ImageClassifier's arguments), where
    Python's signature stops at ``**kwargs``."""
    module, _, name = class_path.rpartition(".")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(getattr(importlib.import_module(module), name), fail_untyped=False)
    return "num_classes" in parser.get_defaults()


def build(config: dict, num_classes: int | None = None) -> tuple[LightningModule, LightningDataModule]:
    """The model and data module of a resolved config, built as ``fit`` builds them: the data first, whose
    ``num_classes`` the model gets (when its constructor takes one); ``num_classes`` given: that many."""
    data = instantiate(config["data"], LightningDataModule)
    model_config = {**config["model"], "init_args": dict(config["model"].get("init_args") or {})}
    num_classes = num_classes if num_classes is not None else getattr(data, "num_classes", None)
    if num_classes is not None and _takes_num_classes(model_config["class_path"]):
        model_config["init_args"]["num_classes"] = num_classes
    return instantiate(model_config, LightningModule), data


def _device_count(devices, num_nodes, accelerator="auto") -> int | None:
    """Processes a config's ``trainer.devices`` × ``num_nodes`` start: a count or a list as given; auto and -1
    as Lightning counts them on this machine (every CUDA GPU for a GPU run, 1 process for auto on a CPU);
    None where this machine cannot tell (a GPU run on a machine without one, another accelerator)."""
    if isinstance(devices, list | tuple):
        return len(devices) * num_nodes
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return devices * num_nodes
    if devices not in ("auto", -1):
        return None
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and gpus):
        return gpus * num_nodes or None
    return num_nodes if devices == "auto" and accelerator in ("cpu", "auto") else None  # CPU: -1 is refused


def _scheduling(callbacks) -> dict[int, int] | None:
    """The ``scheduling`` ({epoch: batches}) of a GradientAccumulationScheduler (or a subclass) among a
    config's ``trainer.callbacks`` (a section, or a list of them), else None."""
    for section in callbacks if isinstance(callbacks, list | tuple) else [callbacks]:
        if not hasattr(section, "get"):
            continue
        named = imported(str(section.get("class_path") or ""))
        if isinstance(named, type) and issubclass(named, GradientAccumulationScheduler):
            scheduling = (section.get("init_args") or {}).get("scheduling") or {}
            return {int(epoch): int(batches) for epoch, batches in dict(scheduling).items()}
    return None


def kit_settings(config) -> dict:
    """The ``check_ddp_invariants`` arguments a resolved config fixes, as ``doctor`` passes them: its seed
    (``true``: one drawn, as ``fit`` and ``doctor`` draw it, which the report names), and the settings the
    real run trains with (SyncBatchNorm, gradient accumulation, a GradientAccumulationScheduler's scheduling
    in its place, clipping, a DDP that looks for unused parameters, and the device count it starts
    on this machine, left out where this machine cannot count them: devices=auto for a GPU run on a machine
    without one), so that a test of the config checks what ``doctor`` does.

        check_ddp_invariants(model, data, **kit_settings(config))
    """
    trainer = config.get("trainer") or {}
    seed = config.get("seed_everything")
    seed = draw_seed() if seed is True else seed  # a printed config keeps `true`, which fit draws at each run
    settings = {
        "seed": seed if isinstance(seed, int) and not isinstance(seed, bool) else 0,
        "sync_batchnorm": bool(trainer.get("sync_batchnorm")),
        "accumulate_grad_batches": _scheduling(trainer.get("callbacks"))
        or int(trainer.get("accumulate_grad_batches") or 1),
        "gradient_clip_val": trainer.get("gradient_clip_val"),
    }
    if _finds_unused_parameters(trainer.get("strategy")):  # named in the doctor's header only when set
        settings["find_unused_parameters"] = True
    nodes, accelerator = int(trainer.get("num_nodes") or 1), str(trainer.get("accelerator") or "auto")
    devices = _device_count(trainer.get("devices", "auto"), nodes, accelerator)
    return {**settings, **({"devices": devices} if devices is not None else {})}


def _finds_unused_parameters(strategy) -> bool:
    """Whether the run's DDP looks for parameters the loss does not reach: by name
    (``ddp_find_unused_parameters_true``) or ``{class_path: DDPStrategy, init_args: {find_unused_parameters:
    true}}``."""
    if isinstance(strategy, str):
        return strategy.endswith("_find_unused_parameters_true")
    init_args = strategy.get("init_args") if hasattr(strategy, "get") else None
    return bool(init_args and init_args.get("find_unused_parameters"))
