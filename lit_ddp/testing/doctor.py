"""``python -m lit_ddp doctor``: the trust kit (lit_ddp.testing) on the model and data a config describes.

    python -m lit_ddp doctor --config configs/lenet_shapes.yaml
    python -m lit_ddp doctor --config configs/lenet_cifar.yaml --data.data_dir=data/
    python -m lit_ddp doctor --config configs/resnet_imagenet.yaml --data.data_dir=data/imagenet --steps 2

Reads the config and overrides as ``fit`` would, then runs the checks on CPU with 2 gloo processes and 1,
with the config's sync_batchnorm, accumulate_grad_batches (a GradientAccumulationScheduler's largest),
gradient_clip_val, a strategy that finds unused parameters and seed (in float32, whatever the config's
precision), and prints check | holds? | measured | what to change. Exit status 0 when every check holds
(warnings are printed, not failures), 1 when one does not, or when a rank failed before any check (its
last output is printed).
``--batch-size`` is the per-device batch of the check runs (default: the config's, at most 8, or 4 for
images over 64 px, which keeps ResNet-50 at 224 px within about two minutes on 2 cores: the checks need a
few steps, not a full batch); the BatchNorm warning judges that batch (its gradient figure is measured
there) and names the config's own beside it. The config's own batch
is judged as ``fit`` judges it, for the run's device count, which the header names with its global batch:
``devices=auto`` (or -1) counted as ``fit`` counts it on this machine (every GPU for a GPU run, 1 process on
a CPU), or judged as 1 where this machine cannot count them (a GPU config on a laptop: pass
``--trainer.devices=N``), with SyncBatchNorm taken to span several (a batch of one is not refused on a guess).

The ranks run in this folder, as ``fit``'s would: a relative ``data_dir`` means the same to both.
"""

import argparse
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lit_ddp.runtime.quiet import quiet_args_given
from lit_ddp.testing.checks import CHECKS, DDPInvariantWarning, check_ddp_invariants
from lit_ddp.testing.config import kit_settings
from lit_ddp.testing.launch import LaunchError

PROG = "python -m lit_ddp doctor"
DEFAULT_BATCH = 8
LARGE_IMAGE_BATCH, LARGE_IMAGE = 4, 64  # per-device batch of the check runs for images over 64 px


def _description(prog: str) -> str:
    """The module docstring for lit_ddp's own command; for a project's, its usage with the configs it has."""
    if prog == PROG:
        return __doc__
    configs = sorted(str(p) for p in Path("configs").glob("*.yaml")) or ["CONFIG.yaml"]
    usage = "\n".join(f"    {prog} --config {c}" for c in configs)
    return usage + "\n" + __doc__[__doc__.index("\nReads the config") :]


def _options(argv: list[str], prog: str = PROG) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=_description(prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every other argument (--config, --model.*, --data.*, --trainer.*) is read as fit reads it.",
    )
    parser.add_argument("--batch-size", type=int, default=None, help="per-device batch of the check runs")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps of the 2-process fit (≥ 2)")
    parser.add_argument(
        "--checks",
        default=",".join(CHECKS),
        help=f"comma-separated subset of {','.join(CHECKS)} (fewer runs)",
    )
    parser.add_argument("--workdir", default=None, help="keep the runs' records and logs in this folder")
    return parser.parse_known_args(argv)


@contextmanager
def _without_lightning_info() -> Iterator[None]:
    """Lightning's info lines (GPU available, Seed set) held back while the config is read: they describe the
    Trainer that ``parse`` builds only to read its settings, a run that never happens; the header says what
    runs. A mistake then reads as one line, as in ``fit``."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _world(trainer, settings: dict, batch: int) -> str:
    """The run the config's batch is judged for (fit's checks of it, the padding warning): its device count
    and global batch, or, where this machine cannot count its devices, that 1 was judged."""
    devices, accelerator = trainer.get("devices", "auto"), trainer.get("accelerator", "auto")
    world = settings.get("devices")
    if world is None:  # a batch of one per device is refused only where SyncBatchNorm spans one (checks.py)
        synced = ", SyncBatchNorm as spanning 2 or more" if settings["sync_batchnorm"] else ""
        return (
            f"the run's devices (devices={devices}, accelerator={accelerator}) cannot be counted on this"
            f" machine: judged as 1 device{synced}; pass --trainer.devices=N, the run's count"
        )
    here = " on this machine" if str(devices).strip() in ("auto", "-1") else ""
    nodes = int(trainer.get("num_nodes") or 1)
    here += f" × {nodes} nodes" if nodes > 1 else ""
    accumulate, scheduling = settings["accumulate_grad_batches"], ""
    if isinstance(accumulate, dict):
        accumulate, scheduling = max(accumulate.values(), default=1), " in its epochs that accumulate most"
    return (
        f"judged for the run's {world} device{'s' if world > 1 else ''} (devices={devices}{here}): a global"
        f" batch of {batch} × {world} × {accumulate} = {batch * world * accumulate}{scheduling}"
    )


def _setting(key: str, value) -> str:
    if key == "accumulate_grad_batches" and isinstance(value, dict):  # checked at its largest (checks.py)
        return (
            f"GradientAccumulationScheduler {value} checked at {max(value.values(), default=1)} accumulated"
        )
    return f"{key}={value}"


def main(argv: list[str], parse: Callable[[list[str]], object], prog: str = PROG) -> int:
    """``parse(args)``: the CLI's parser, returning a LightningCLI built with ``run=False`` (cli.py passes
    it, so this layer does not import the CLI); ``prog``: the command's name (a project's own). Returns the
    exit status."""
    options, rest = _options(argv, prog)
    # The checks run on CPU: a GPU config must still parse and build its model and data on a laptop.
    with quiet_args_given(), _without_lightning_info():  # args given while sys.argv holds the doctor's
        cli = parse([*rest, "--trainer.accelerator=cpu"])
        own = cli.parser.parse_args(rest)  # the config as fit reads it (parse only, nothing built)
    config = cli.config
    if config.get("ckpt_path") is not None:  # a resume's config (fit --print_config --ckpt_path=...)
        print(f"{prog}: note: ckpt_path={config['ckpt_path']} is not read: the checks train from the start")
    # The run's accelerator, not the checks' CPU: with devices=auto (or -1) it decides the world judged.
    config["trainer"]["accelerator"] = own.get("trainer", {}).get("accelerator", "auto")
    dm = cli.datamodule
    default = LARGE_IMAGE_BATCH if dm.image_size > LARGE_IMAGE else DEFAULT_BATCH
    # --batch-size=0 is the kit's one-line refusal, not the default batch in silence.
    batch = options.batch_size if options.batch_size is not None else min(dm.batch_size, default)
    settings = kit_settings(config)  # what a project's test passes too
    seed = settings.pop("seed")
    print(
        f"{prog}: {type(cli.model).__name__} on {type(dm).__name__}, 2 × {batch} vs 1 × {2 * batch} on CPU,"
        f" {options.steps} steps, seed {seed}; "
        + ", ".join(_setting(k, v) for k, v in settings.items() if k != "devices")
        + f"; {_world(config['trainer'], settings, dm.batch_size)}",
        flush=True,
    )
    start = time.monotonic()
    with warnings.catch_warnings():  # the table shows them
        warnings.simplefilter("ignore", DDPInvariantWarning)
        try:
            report = check_ddp_invariants(
                cli.model,
                dm,
                batch_size=batch,
                steps=options.steps,
                seed=seed,
                checks=tuple(c.strip() for c in options.checks.split(",") if c.strip()),
                workdir=options.workdir,
                **settings,
            )
        except LaunchError as err:  # a rank failed (your code, most often) or ran past its limit
            # The ranks' own output is the news, not this process's call stack; their logs are kept only
            # in a workdir.
            keep = "" if options.workdir else f"\n{prog}: --workdir=DIR keeps each rank's whole log"
            print(f"{prog}: no check ran: the {err}{keep}", file=sys.stderr)
            return 1
    print(report.table())
    verdict = "every check holds" if report.ok else "some checks do not hold"
    print(f"{verdict} ({len(report.warnings)} warning(s)), {time.monotonic() - start:.0f} s", file=sys.stderr)
    return 0 if report.ok else 1
