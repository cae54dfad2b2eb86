"""The training step replayed as CUDA graphs (``--model.cuda_graph``).

A small network's step on a GPU is ~100 kernels of a few microseconds each, so the host's launches, not the
device, set its pace (LeNet-CIFAR on an H100: docs/gpu.md). Captured once, the forward, loss and backward
replay as one graph and the optimizer's update as a second one in the same memory pool (after torch's CUDA
Graphs notes, "whole network capture"): the host launches two graphs a step. The update stays a step of
Lightning's optimizer: ``LightningOptimizer.step`` counts the global step and runs the callbacks'
``on_before_optimizer_step`` between the two graphs, with that step's gradients. A batch of another shape
(the epoch's last, partial one) runs eagerly on the same tensors. Off CUDA the same code runs eagerly:
what the CPU tests check.
"""

import contextlib
from collections.abc import Callable
from typing import Literal

import torch
from lightning import Trainer
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import Tensor, nn

from lit_ddp.utils import scheduled_accumulation

# true: replay the step, or refuse in one line where it cannot be; auto: replay where it can (one CUDA
# device), else the usual eager step; false: never.
CUDAGraphMode = bool | Literal["auto"]

WARMUP_STEPS = 3  # torch's notes warm up 3 iterations on a side stream before capturing


class ReplayedStep:
    """A capturable torch optimizer whose update, once ``capture_update`` recorded it, ``step`` replays after
    calling the closure it is given (Lightning's: the ``on_before_optimizer_step`` hooks)."""

    update: torch.cuda.CUDAGraph | None = None

    @property
    def torch_name(self) -> str:
        """The torch optimizer it replays (``AdamW``): what the learning-rate monitor's tags name."""
        optimizers = (c for c in type(self).__mro__ if issubclass(c, torch.optim.Optimizer))
        return next(c for c in optimizers if not issubclass(c, ReplayedStep)).__name__

    def step(self, closure: Callable[[], object] | None = None) -> object:
        if self.update is None:
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.update.replay()
        return loss

    def capture_update(self, pool: tuple[int, int]) -> None:
        """The update captured into ``pool``: the forward and backward graph's, whose gradients it reads."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            super().step()
        self.update = graph


class ReplayedAdam(ReplayedStep, torch.optim.Adam):
    pass


class ReplayedAdamW(ReplayedStep, torch.optim.AdamW):
    pass


# torch's optimizers whose update can be captured (capturable=True). SGD has no capturable update.
REPLAYED_OPTIMIZERS: dict[str, type[ReplayedStep]] = {"adam": ReplayedAdam, "adamw": ReplayedAdamW}


def replayed_optimizer(name: str, groups: list[dict], lr: float, weight_decay: float, device: torch.device):
    """The optimizer ``name`` able to replay its update: its lr a tensor on ``device`` (a graph reads it at
    each replay; ``LambdaLR`` fills it in place), capturable on CUDA. Elsewhere torch's per-tensor update,
    the one implementation that takes a tensor lr without capturing."""
    capture = device.type == "cuda"
    lr_tensor = torch.tensor(lr, device=device)
    cls = REPLAYED_OPTIMIZERS[name]
    return cls(groups, lr=lr_tensor, weight_decay=weight_decay, foreach=capture, capturable=capture)


def replay_blocker(trainer: Trainer, optim_name: str, compiled: bool) -> str | None:
    """Why this run's training step cannot be replayed as graphs, whatever its device; None if it can."""
    if not isinstance(trainer.strategy, SingleDeviceStrategy):
        return (
            f"it replays one device's step, and this run's strategy is {type(trainer.strategy).__name__}"
            " (DDP and FSDP communicate during the backward, outside a graph)"
        )
    if trainer.accumulate_grad_batches != 1:
        accumulate = trainer.accumulate_grad_batches
        return f"it updates at every batch, and --trainer.accumulate_grad_batches={accumulate}"
    scheduled = scheduled_accumulation(trainer)  # the Trainer's says 1 until the scheduler sets an epoch's
    if scheduled is not None and scheduled != 1:
        return (
            f"it updates at every batch, and the GradientAccumulationScheduler accumulates up to {scheduled}"
        )
    if trainer.gradient_clip_val:
        return f"--trainer.gradient_clip_val={trainer.gradient_clip_val} clips outside the replayed update"
    if getattr(trainer.precision_plugin, "scaler", None) is not None:
        return f"--trainer.precision={trainer.precision} skips steps by a check on the host (its loss scaler)"
    if optim_name not in REPLAYED_OPTIMIZERS:
        names = " or ".join(REPLAYED_OPTIMIZERS)
        return f"--model.optim.name={optim_name} has no update torch can capture: use {names}"
    if compiled:
        return "--model.compile already compiles the network (reduce-overhead: as CUDA graphs): pick one"
    return None


def prepare_for_replay(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """The optimizer as a replay needs it, also after a checkpoint's restore (torch's ``load_state_dict``
    takes the saved groups' lr; its implementation flags are put back by ``optim.keep_implementation``):
    each lr a tensor on ``device``, the state there."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        if not (torch.is_tensor(lr) and lr.device == device):
            group["lr"] = torch.tensor(float(lr), device=device)
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and value.device != device:
                state[key] = value.to(device)


def portable_optimizer_states(checkpoint: dict) -> None:
    """A replaying run's checkpoint made loadable by any run (another device count, no graphs): each lr a
    number, not the device tensor the graph reads, and torch's default implementation flags. A run that
    replays sets its own again before capturing (``prepare_for_replay``)."""
    for state in checkpoint.get("optimizer_states", []):
        for group in state["param_groups"]:
            for key in ("lr", "initial_lr"):
                if torch.is_tensor(group.get(key)):
                    group[key] = group[key].item()
            group.update(capturable=False, foreach=None, fused=None)
    for scheduler in checkpoint.get("lr_schedulers", []):
        for key in ("base_lrs", "_last_lr"):
            if key in scheduler:
                scheduler[key] = [v.item() if torch.is_tensor(v) else v for v in scheduler[key]]


def _autocast_without_cache(device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast in force (Lightning's precision context around the training step) without its cast
    cache: a graph must cast the weights at each replay, not reuse the casts cached while it was captured."""
    kind = device.type
    if not torch.is_autocast_enabled(kind):
        return contextlib.nullcontext()
    return torch.autocast(kind, dtype=torch.get_autocast_dtype(kind), cache_enabled=False)


class StepGraph:
    """One batch shape's forward, loss and backward as a graph, and ``optimizer``'s update as another,
    captured on a CUDA device; elsewhere the same steps run eagerly.

    ``loss_of(x, y)`` returns ``(logits, loss)``; ``batch`` is the first batch to train, whose shape and
    dtypes the graph takes. Its parameters' gradients stay the same tensors from then on (the update graph
    reads them): never set them to None while the graph lives.
    """

    def __init__(
        self,
        module: nn.Module,
        loss_of: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
        optimizer: ReplayedStep,
        batch: tuple[Tensor, Tensor],
    ) -> None:
        x, y = batch
        self.module, self.loss_of, self.optimizer = module, loss_of, optimizer
        self.device = x.device
        # The graph's static input: each batch is copied in. empty_like keeps x's memory format.
        self.x, self.y = torch.empty_like(x).copy_(x), torch.empty_like(y).copy_(y)
        self.autocast = _autocast_without_cache(self.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self._warm_up()
        if self.device.type == "cuda":
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._forward_backward()
            optimizer.capture_update(self.graph.pool())

    def _forward_backward(self) -> None:
        with self.autocast:
            self.logits, self.loss = self.loss_of(self.x, self.y)
        self.loss.backward()

    def _warm_up(self) -> None:
        """A few real steps before the capture (cuDNN's algorithm choices, the optimizer's state, lazily made
        constants), on a side stream as torch's notes ask; then the parameters, buffers, optimizer state and
        random state put back as they were: the warm-up must not train."""
        tensors = [*self.module.parameters(), *self.module.buffers()]
        saved = [t.detach().clone() for t in tensors]
        state = self.optimizer.state
        saved_state = {
            p: {k: v.clone() for k, v in s.items() if torch.is_tensor(v)} for p, s in state.items()
        }
        cpu_rng = torch.get_rng_state()
        on_cuda = self.device.type == "cuda"
        cuda_rng = torch.cuda.get_rng_state(self.device) if on_cuda else None
        stream = contextlib.nullcontext()
        if on_cuda:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            stream = torch.cuda.stream(side)
        with stream:
            for _ in range(WARMUP_STEPS):
                self.optimizer.zero_grad(set_to_none=True)
                self._forward_backward()
                self.optimizer.step()
        if on_cuda:
            torch.cuda.current_stream(self.device).wait_stream(side)
        with torch.no_grad():
            for tensor, value in zip(tensors, saved, strict=True):
                tensor.copy_(value)
            for p, state in self.optimizer.state.items():
                before = saved_state.get(p)
                for key, value in state.items():
                    if not torch.is_tensor(value):
                        continue
                    if before is not None:
                        value.copy_(before[key])
                    else:  # Adam's state starts at zero (moments and step count): what a fresh one gets back
                        value.zero_()
        self.optimizer.zero_grad(set_to_none=True)  # the captured backward makes the gradients anew
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, self.device)

    def fits(self, batch: tuple[Tensor, Tensor]) -> bool:
        """Whether ``batch`` has the captured shapes and dtypes."""
        x, y = batch
        static = (self.x.shape, self.x.dtype, self.y.shape, self.y.dtype)
        return (x.shape, x.dtype, y.shape, y.dtype) == static

    def run(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """``batch``'s logits and loss, its gradients left in the parameters' ``.grad`` (the graph's static
        outputs: read them before the next run)."""
        self.x.copy_(batch[0])
        self.y.copy_(batch[1])
        if self.graph is not None:
            self.graph.replay()
        else:
            self.optimizer.zero_grad(set_to_none=False)
            self._forward_backward()
        return self.logits, self.loss

    def release(self) -> None:
        """Frees both graphs; the optimizer steps eagerly again."""
        self.graph = None
        self.optimizer.update = None
