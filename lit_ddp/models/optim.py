"""Optimizer and learning-rate schedule, configured from YAML as ``model.optim.*``.

Names go through small registries, so ``--model.optim.name=sgd`` or ``--model.optim.schedule=step``
need no code, and a new optimizer or schedule is one entry.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.optim import Optimizer

from lit_ddp.errors import UserError
from lit_ddp.models.step_graph import replayed_optimizer

OPTIMIZERS: dict[str, Callable[..., Optimizer]] = {
    "sgd": lambda params, c, fused: torch.optim.SGD(
        params, lr=c.lr, momentum=c.momentum, nesterov=c.nesterov, weight_decay=c.weight_decay, fused=fused
    ),
    "adam": lambda params, c, fused: torch.optim.Adam(
        params, lr=c.lr, weight_decay=c.weight_decay, fused=fused
    ),
    "adamw": lambda params, c, fused: torch.optim.AdamW(
        params, lr=c.lr, weight_decay=c.weight_decay, fused=fused
    ),
}


def _constant(progress: float) -> float:
    return 1.0


def _cosine(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def _step(progress: float) -> float:
    # The ResNet paper's ImageNet schedule: ÷10 at 1/3 and 2/3 of training (epochs 30 and 60 of 90).
    return 0.1 ** math.floor(3 * progress)


SCHEDULES: dict[str, Callable[[float], float]] = {"constant": _constant, "cosine": _cosine, "step": _step}


@dataclass(frozen=True)
class OptimConfig:
    """What to optimise with. ``lr`` is for a global batch of ``base_batch_size`` when ``scale_lr``."""

    name: Literal["sgd", "adam", "adamw"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9  # sgd only
    nesterov: bool = False  # sgd only
    schedule: Literal["constant", "cosine", "step"] = "cosine"
    warmup_epochs: float = 0.0  # linear warmup from ~0, then the schedule over the remaining steps
    scale_lr: bool = False  # lr × global_batch / base_batch_size (Goyal et al., 2017)
    base_batch_size: int = 256
    no_decay_norm_and_bias: bool = True  # no weight decay on BN/LN parameters and biases
    # One fused kernel for the whole update instead of ~10 ops per tensor. None: fused wherever torch has
    # the kernel for the parameters' device (CUDA; CPU since torch 2.4) and the run can take it (not when
    # clipping under mixed precision, nor channels-last weights under FSDP), else torch's default. A resumed
    # run keeps its own choice, whatever the checkpoint's run chose.
    fused: bool | None = None

    def __post_init__(self) -> None:
        # torch would raise its own ValueError deep in the first optimizer build ("Invalid learning rate").
        for name in ("lr", "weight_decay", "momentum", "warmup_epochs"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:  # NaN too
                raise UserError(
                    f"--model.optim.{name}={value} must be a finite number ≥ 0"
                    + (" (try 0.1 for sgd, 1e-3 for adam/adamw)" if name == "lr" else "")
                )
        if self.base_batch_size < 1:
            raise UserError(f"--model.optim.base_batch_size={self.base_batch_size} must be at least 1")
        # sgd's velocity is momentum × itself + the gradient: at 1 or more it never decays and the run
        # diverges, which torch accepts without a word.
        if self.momentum >= 1:
            raise UserError(
                f"--model.optim.momentum={self.momentum} must be below 1 (0.9 is usual): at 1 or more every"
                " earlier gradient keeps its full weight in each step, and training diverges"
            )
        if self.nesterov and self.name != "sgd":
            raise UserError(
                f"--model.optim.nesterov=true would not be used: {self.name} has no Nesterov momentum; pass"
                " --model.optim.name=sgd, or leave nesterov out"
            )
        # adam and adamw take no momentum (their first beta, 0.9, plays its part): another value does nothing.
        if self.momentum != OptimConfig.momentum and self.name != "sgd":
            raise UserError(
                f"--model.optim.momentum={self.momentum} would not be used: {self.name} has no momentum"
                " setting (its first beta, 0.9, plays that part); pass --model.optim.name=sgd, or leave"
                " momentum out"
            )
        if self.nesterov and self.momentum == 0:  # torch's ValueError, from inside the first optimizer build
            raise UserError(
                "--model.optim.nesterov=true needs a momentum above 0: pass --model.optim.momentum=0.9, or"
                " nesterov=false"
            )


# torch (2.4 and later) has fused SGD, Adam and AdamW kernels for floating-point parameters on these devices.
FUSED_DEVICES = ("cpu", "cuda")


def fused_available(model: nn.Module, trained_as: nn.Module | None = None) -> bool:
    """Whether torch's fused kernels take every parameter of ``model`` and the gradient it will be given.

    ``trained_as``: the module the strategy runs (``trainer.model``: ``model`` itself, or wrapped by DDP or
    FSDP). Fused only where all of these hold:

    - each parameter is a plain tensor: a subclass (FSDP2's and tensor parallelism's ``DTensor``) goes to
      torch's own default, as ``torch.optim`` does when left to choose;
    - on a device with the kernels, floating point. Mixed devices or dtypes are fine: the kernels group the
      parameters by (device, dtype);
    - each gradient has its parameter's strides, which CUDA's fused kernels require (they have no slow
      path). Autograd and DDP lay a gradient out like its parameter; FSDP gives every parameter a contiguous
      gradient (a view of its flat gradient), so under FSDP a channels-last weight would crash the first step.
    """
    fsdp = under_fsdp(trained_as)
    return all(
        type(p) in (torch.Tensor, nn.Parameter)
        and p.device.type in FUSED_DEVICES
        and p.is_floating_point()
        and (p.is_contiguous() or not fsdp)
        for p in model.parameters()
        if p.requires_grad
    )


def under_fsdp(trained_as: nn.Module | None) -> bool:
    """Whether FSDP (torch.distributed.fsdp.FullyShardedDataParallel) manages ``trained_as``'s parameters."""
    if trained_as is None or not torch.distributed.is_available():  # some builds have no torch.distributed
        return False
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(m, FullyShardedDataParallel) for m in trained_as.modules())


def param_groups(model: nn.Module, weight_decay: float, exclude_norm_and_bias: bool) -> list[dict]:
    """Two groups: weights that decay, and norm parameters and biases (1-d tensors) that don't."""
    if not exclude_norm_and_bias or weight_decay == 0.0:
        return [{"params": [p for p in model.parameters() if p.requires_grad]}]
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]


def lr_lambda(schedule: str, total_steps: float, warmup_steps: int) -> Callable[[int], float]:
    """Multiplier of the base lr at optimizer step ``step`` (LambdaLR stepped every optimizer step)."""
    shape = SCHEDULES[schedule]
    total_steps = max(total_steps, 1)
    warmup_steps = min(warmup_steps, total_steps)  # a warmup as long as the run peaks at its last step

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return shape(min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0))

    return factor


# Schedules that decay over the run's length, which an open-ended run (max_epochs=-1) does not have.
NEEDS_LENGTH = ("cosine", "step")


class RunSchedule(torch.optim.lr_scheduler.LambdaLR):
    """``lr_lambda``'s curve, which keeps in its state (and so in a checkpoint) the run length it was built
    for, and says in one line when a resumed run rebuilt it for another.

    A resume continues at the step reached on the curve of the run's own budget (``--trainer.max_epochs``,
    ``max_steps``): the same budget is the uninterrupted run, step for step; a larger one moves the lr to the
    new curve's value there, so the run ends with other weights than one given that budget from the start.
    A resume at an epoch's end with another global batch takes other steps an epoch: ``resumed_at`` (called
    after the restore) gives the step of this run's curve a run of this batch would stand at there, and the
    curve goes on from it, at this run's base lr (``scale_lr``'s, for this batch).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        schedule: str,
        total_steps: float,
        warmup_steps: int,
        resumed_at: Callable[[], int | None] | None = None,
    ) -> None:
        # What the curve depends on: its length (a decaying schedule's) and its warmup, as lr_lambda cuts it.
        self.built_for = {
            "steps": total_steps if schedule in NEEDS_LENGTH else None,
            "warmup_steps": min(warmup_steps, max(total_steps, 1)),
        }
        # Steps taken minus the step of this run's curve they stand for: not 0 once an epoch-end resume
        # changed the steps an epoch takes (another global batch).
        self.step_offset = 0
        self._resumed_at = resumed_at
        super().__init__(optimizer, lr_lambda(schedule, total_steps, warmup_steps))

    def state_dict(self) -> dict:
        return {k: v for k, v in super().state_dict().items() if k != "_resumed_at"}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("built_for")  # absent from checkpoints written before it was recorded
        ours = list(self.base_lrs)  # this run's --model.optim.lr (scaled to its global batch: scale_lr)
        dropped = ("built_for", "step_offset", "_resumed_at")
        super().load_state_dict({k: v for k, v in state_dict.items() if k not in dropped})
        notes = []
        # A resume at an epoch's end may take another global batch, so other steps an epoch: the curve, built
        # for this run's steps, goes on from where an uninterrupted run of this batch stands at that epoch.
        at = self._resumed_at() if self._resumed_at is not None else None
        offset = self.last_epoch - at if at is not None else state_dict.get("step_offset", 0)
        if offset != state_dict.get("step_offset", 0):
            notes.append(
                f"the checkpoint is at step {self.last_epoch}, where a run of this global batch from the"
                f" start would be at step {at} (another number of optimizer steps an epoch): the"
                f" learning-rate schedule goes on from its step {at}, so the run ends with other weights than"
                " one trained with this global batch from the start"
            )
        elif saved is not None and saved != self.built_for:
            notes.append(
                f"the checkpoint's learning-rate schedule spans {_curve(saved)}, this run's"
                f" {_curve(self.built_for)} (its budget, --trainer.max_epochs or --trainer.max_steps, decides"
                f" the length): the lr continues from step {self.last_epoch} on this run's schedule, so the"
                " run ends with other weights than one trained with this budget from the start"
            )
        # rel_tol: a replayed run's (cuda_graph) lr went through a float32 tensor, rounded there
        if not all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(ours, self.base_lrs, strict=True)):
            notes.append(
                f"the checkpoint's run trained at a base lr of {self.base_lrs[0]:.4g}, this run's is"
                f" {ours[0]:.4g} (--model.optim.lr, × global batch / base_batch_size with"
                " --model.optim.scale_lr): it trains on at this run's"
            )
        self.step_offset, self.base_lrs = offset, ours
        if offset:
            self.lr_lambdas = [_shifted(curve, offset) for curve in self.lr_lambdas]
        if not notes:
            return
        for group, base in zip(self.optimizer.param_groups, ours, strict=True):
            group["initial_lr"] = base
        # The optimizer's lr, restored just before (Lightning loads the optimizers, then the schedulers), is
        # the old curve's at this step: the first step of the resumed run would train at it.
        curves = zip(self.base_lrs, self.lr_lambdas, strict=True)
        lrs = [base * curve(self.last_epoch) for base, curve in curves]
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            if torch.is_tensor(group["lr"]):  # a replayed step's graph reads this tensor: filled in place
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        for note in notes:
            rank_zero_info(f"lit_ddp: note: {note}")


def _shifted(curve: Callable[[int], float], offset: int) -> Callable[[int], float]:
    return lambda step: curve(step - offset)


def _curve(built_for: dict) -> str:
    steps, warmup = built_for.get("steps"), built_for.get("warmup_steps")
    length = "any length (constant)" if steps is None else f"{int(steps)} steps"  # an open end is refused
    return f"{length} with {warmup} warmup steps" if warmup else length


# A param group's flags that say how torch computes the update, not what the update is.
IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable")
# What the schedule sets in a group (RunSchedule's restore): every other entry is this run's --model.optim.
SCHEDULED = ("params", "lr", "initial_lr")


def _plain(value):
    return list(value) if isinstance(value, tuple) else value  # betas: a tuple built, a list once saved


def keep_implementation(optimizer: Optimizer) -> None:
    """Keeps this run's optimizer settings across a checkpoint's restore: its implementation and its
    hyperparameters (weight decay, momentum, betas, eps, ...), which torch's ``load_state_dict`` takes
    from the file.

    The implementation flags describe the saving run's hardware: a run that chose a fused update under DDP,
    resumed under FSDP with channels-last weights, got the fused step that crashes there, and a 16-mixed run
    built fused (its loss scaler then hands the step its scale) that resumed unfused flags failed its first
    step. The hyperparameters are the saving run's --model.optim: a resume that changes one trains with it,
    as its config.yaml records, and says so in a note. After each load both are put back, and each step
    counter where torch keeps it for the flags (its load placed it for the file's): on the parameter's
    device as float32 for a fused or capturable update, which reads it there, else on the CPU.
    """
    chosen = [{k: v for k, v in group.items() if k not in SCHEDULED} for group in optimizer.param_groups]

    def restore(loaded: Optimizer) -> None:
        changed = {}
        for group, settings in zip(loaded.param_groups, chosen, strict=True):
            for key, value in settings.items():
                if key not in IMPLEMENTATION_FLAGS and key in group and _plain(group[key]) != _plain(value):
                    changed.setdefault(key, (group[key], value))
            group.update(settings)
            on_device = bool(group.get("fused") or group.get("capturable"))
            for param in group["params"]:
                state = loaded.state.get(param, {})
                if torch.is_tensor(state.get("step")):
                    step = state["step"]
                    state["step"] = step.to(param.device, torch.float32) if on_device else step.cpu()
        if changed:
            said = ", ".join(
                f"{k} {_plain(new)} (the checkpoint's: {_plain(old)})" for k, (old, new) in changed.items()
            )
            rank_zero_info(f"lit_ddp: note: the optimizer trains on with this run's {said}")

    optimizer.register_load_state_dict_post_hook(restore)


def build_optimizer(
    model: nn.Module,
    cfg: OptimConfig,
    global_batch: int,
    total_steps: float,
    steps_per_epoch: float,
    clips_under_amp: bool = False,
    trained_as: nn.Module | None = None,
    replayed_on: torch.device | None = None,
    resumed_at: Callable[[], int | None] | None = None,
) -> tuple[Optimizer, RunSchedule]:
    """``total_steps``: optimizer steps of the whole run (``math.inf`` when open-ended);
    ``steps_per_epoch``: optimizer steps per epoch, which ``warmup_epochs`` counts in;
    ``clips_under_amp``: gradients are clipped under Lightning's mixed precision (16-mixed or bf16-mixed),
    which refuses to clip for an optimizer that unscales inside its step (a fused one), with or without a
    loss scaler, so the automatic choice is then not fused;
    ``trained_as``: the module the strategy runs (``trainer.model``), see :func:`fused_available`;
    ``replayed_on``: the device whose CUDA graphs replay the update (``--model.cuda_graph``), see
    :func:`lit_ddp.models.step_graph.replayed_optimizer`;
    ``resumed_at``: on a resume, the step of this run's curve where it continues, see :class:`RunSchedule`."""
    if not math.isfinite(total_steps) and cfg.schedule in NEEDS_LENGTH:
        raise UserError(
            f"--model.optim.schedule={cfg.schedule} decays over the run's length, which is open-ended: set"
            " --trainer.max_epochs or --trainer.max_steps, or pass --model.optim.schedule=constant"
        )
    groups = param_groups(model, cfg.weight_decay, cfg.no_decay_norm_and_bias)
    if cfg.fused and clips_under_amp:
        raise UserError(
            "--model.optim.fused=true cannot be combined with --trainer.gradient_clip_val under mixed"
            " precision (Lightning refuses to clip for a fused optimizer): drop one of them"
        )
    if cfg.fused and under_fsdp(trained_as) and not all(p.is_contiguous() for p in model.parameters()):
        raise UserError(
            "--model.optim.fused=true cannot train non-contiguous (channels-last) weights under FSDP, which"
            " hands them contiguous gradients: pass --model.channels_last=false or drop --model.optim.fused"
        )
    if replayed_on is not None:
        optimizer = replayed_optimizer(cfg.name, groups, cfg.lr, cfg.weight_decay, replayed_on)
    else:
        fused = cfg.fused
        if fused is None:
            fused = fused_available(model, trained_as) and not clips_under_amp
        optimizer = OPTIMIZERS[cfg.name](groups, cfg, fused or None)  # None, not False: torch's own default
    keep_implementation(optimizer)
    if cfg.scale_lr:
        for group in optimizer.param_groups:
            group["lr"] *= global_batch / cfg.base_batch_size
    warmup_steps = round(cfg.warmup_epochs * steps_per_epoch)
    cut = min(warmup_steps, max(total_steps, 1))  # what lr_lambda keeps
    if cut < warmup_steps:
        rank_zero_info(
            f"lit_ddp: note: --model.optim.warmup_epochs={cfg.warmup_epochs} is {warmup_steps} steps, more"
            f" than the run's {int(total_steps)}: the warmup is cut to {int(cut)} steps, so the lr reaches"
            " its peak only at the last step"
        )
    return optimizer, RunSchedule(optimizer, cfg.schedule, total_steps, warmup_steps, resumed_at)
