"""``Recorder``: a callback that keeps, on every rank, what a run did, and saves it at teardown.

Used by the trust kit (checks.py) and by lit_ddp's own DDP tests (tests/helpers/ddp_semantics_probe.py adds a
few fields): the system's weights and buffers at set-up, after each of the first optimizer steps and after
every epoch; the first step's gradients as the optimizer applies them (after DDP's all-reduce); the indices
the training sampler yields each epoch; each epoch's first training batch as the step saw it, with its
samples' indices; the indices each evaluation loader reads; the epoch-level metrics (a validate run's: every
one it logged, whatever its name); the BatchNorm classes trained with; the optimizer's settings at each of
the first steps (learning rate, betas, ...); the steps whose forward and loss drew from torch's global RNG,
and the validation batches whose step did; the dropout and BatchNorm layers a validation ran in training
mode; and the module attributes outside ``state_dict`` (plain numbers, tensors not registered, buffers
registered with ``persistent=False``) before and after training.
Saved as ``<out_dir>/<stage>_rank<r>.pt`` (``load`` reads every rank's).
"""

import hashlib
from pathlib import Path

import numpy as np
import torch
from lightning import Callback, LightningModule, Trainer
from torch import Tensor, nn
from torchmetrics import Metric

from lit_ddp.runtime.sync_batchnorm import BATCH_NORMS

STEP_STATES = 8  # the weights after each of the first optimizer steps are kept
DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
# Layers whose training mode changes what evaluation computes: masks drawn, or the batch's own statistics.
MODE_LAYERS = (*DROPOUT, *BATCH_NORMS)


def snapshot(module: torch.nn.Module) -> dict[str, Tensor]:
    """Parameters and buffers (running statistics included), copied to CPU."""
    return {k: v.detach().clone().cpu() for k, v in module.state_dict().items()}


def network(pl_module: LightningModule) -> torch.nn.Module:
    """The plain network of a lit_ddp system (``.net``), else the LightningModule itself."""
    net = getattr(pl_module, "net", None)
    return net if isinstance(net, torch.nn.Module) else pl_module


def _in_metric(module: torch.nn.Module, prefix: str) -> bool:
    """Whether submodule ``prefix`` of ``module`` is a torchmetrics Metric or inside one."""
    return any(isinstance(module.get_submodule(p), Metric) for p in [*_parents(prefix), prefix])


def unsaved_buffers(module: torch.nn.Module) -> list[str]:
    """The buffers of ``module`` that ``state_dict`` leaves out (registered with ``persistent=False``), by
    name: a checkpoint does not carry them. Metrics' own are left out, as in ``loose_state``."""
    saved = module.state_dict().keys()
    return [
        name
        for name, _ in module.named_buffers()
        if name not in saved and not _in_metric(module, name.rpartition(".")[0])
    ]


def loose_state(module: torch.nn.Module) -> dict[str, object]:
    """``module.sub.attr`` → value of each public number or unregistered tensor attribute of ``module`` and
    its submodules, and of each buffer ``state_dict`` leaves out (``unsaved_buffers``): state a checkpoint
    does not carry. torchmetrics' metrics keep their states so by design (reduced over the ranks, reset each
    epoch): left out."""
    found = {name: module.get_buffer(name).detach().clone().cpu() for name in unsaved_buffers(module)}
    for prefix, sub in module.named_modules():
        if _in_metric(module, prefix):
            continue
        for name, value in vars(sub).items():
            if name.startswith("_") or name == "training":
                continue
            key = f"{prefix}.{name}" if prefix else name
            if isinstance(value, bool | int | float):
                found[key] = value
            elif isinstance(value, Tensor) and not isinstance(value, torch.nn.Parameter):
                found[key] = value.detach().clone().cpu()
    return found


def _parents(prefix: str) -> list[str]:
    """``a.b.c`` → ``a``, ``a.b``: the modules above a submodule."""
    parts = prefix.split(".") if prefix else []
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _digest_into(h, item) -> None:
    if isinstance(item, Tensor):
        item = item.detach().cpu().contiguous()
        h.update(f"{item.dtype}{tuple(item.shape)}".encode())
        h.update(item.view(-1).view(torch.uint8).numpy().tobytes() if item.numel() else b"")
    elif isinstance(item, np.ndarray):
        h.update(f"{item.dtype}{item.shape}".encode() + np.ascontiguousarray(item).tobytes())
    elif isinstance(item, tuple | list):
        for part in item:
            _digest_into(h, part)
    else:
        h.update(repr(item).encode())


def sample_digest(dataset, key: int | tuple[int, int]) -> str:
    """A hash of ``dataset[key]``, image bytes and label together: an int key reads the sample before the
    training augmentation; an (index, seed) pair, as a ``SeededSampleSampler`` yields them, reads it with
    its in-worker random draws (crop, flip) seeded."""
    try:
        sample = dataset[key]
    except (NotImplementedError, TypeError, KeyError):  # a dataset that serves whole batches only
        sample = dataset.__getitems__([key])
    h = hashlib.sha1()
    _digest_into(h, sample)
    return h.hexdigest()


def content(dataset, seed: int | None = None) -> dict:
    """Each sample's ``sample_digest``, read twice: ``digests`` (the first read) and ``unstable``, the
    indices whose second read differed (a random draw in ``__getitem__`` that no key seeds). ``seed``: read
    (index, seed) pairs, for a dataset whose training sampler keys each sample's draws by such a seed."""
    keys = [i if seed is None else (i, seed) for i in range(len(dataset))]
    first = [sample_digest(dataset, k) for k in keys]
    second = [sample_digest(dataset, k) for k in keys]
    unstable = [i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b]
    return {"digests": first, "unstable": unstable}


def metrics(trainer: Trainer, prefix: str) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(prefix)}


def sample_index(item) -> int:
    """A sampler's item as a dataset index: ints as they are, (index, seed) pairs by their index."""
    return int(item[0]) if isinstance(item, tuple) else int(item)


def sampler_indices(loader) -> list[int]:
    """The indices a loader's sampler yields, in order (for a seeded or sequential sampler)."""
    sampler = loader.batch_sampler.sampler if loader.batch_sampler is not None else loader.sampler
    return [sample_index(i) for i in sampler]


class Recorder(Callback):
    """Records what this rank did (module docstring); ``stop_at_step`` > 0: save ``<out_dir>/stop.ckpt``
    after that optimizer step and stop there, as a run interrupted mid-epoch would have saved."""

    def __init__(self, out_dir: str, stop_at_step: int = 0) -> None:
        self.out_dir = Path(out_dir)
        self.stop_at_step = stop_at_step
        self.record: dict = {
            "val": [],
            "test": [],
            "epoch_state": [],
            "step_state": [],
            "samples": [],
            "aug": [],
            "aug_index": [],
            "eval_indices": {},
            "optim": [],
            "forward_rng": [],
            "eval_rng": 0,
        }
        self._last_state: dict[str, Tensor] = {}
        self._rng_state: Tensor | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.record.update(
            rank=trainer.global_rank, world_size=trainer.world_size, strategy=type(trainer.strategy).__name__
        )
        if stage == "fit":
            # Before the strategy wraps the model in DDP (which would broadcast rank 0's weights).
            self.record["init"] = snapshot(pl_module)
            self.record["loose_init"] = loose_state(pl_module)
            self.record["unsaved_buffers"] = unsaved_buffers(pl_module)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        norms = [(name, m) for name, m in pl_module.named_modules() if isinstance(m, BATCH_NORMS)]
        self.record["bn_classes"] = sorted({type(m).__name__ for _, m in norms})
        self.record["param_names"] = [name for name, _ in pl_module.named_parameters()]
        self.record["bn_buffers"] = [
            f"{name}.{b}" if name else b for name, m in norms for b, _ in m.named_buffers(recurse=False)
        ]

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loader = trainer.train_dataloader  # Lightning has called set_epoch on its sampler by now
        sampler = loader.batch_sampler.sampler if loader.batch_sampler is not None else loader.sampler
        self.record["samples"].append((type(sampler).__name__, sampler_indices(loader)))

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        # The epoch's first batch as the step receives it (augmented, normalised), with its samples' indices:
        # the first batch_size of this rank's shard (a resumed epoch starts later: not recorded).
        if batch_idx == 0 and len(self.record["aug"]) < len(self.record["samples"]):
            order = self.record["samples"][-1][1]
            self.record["aug"].append(batch[0].detach().cpu())
            self.record["aug_index"].append(order[: len(batch[0])])
        self._rng_state = torch.random.get_rng_state()  # the batch is on the device: its draws are done

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Tensor) -> None:
        # Between the batch's start and here runs the user's training_step: forward and loss only.
        if self._rng_state is not None and not torch.equal(self._rng_state, torch.random.get_rng_state()):
            self.record["forward_rng"].append(trainer.global_step)
        self._rng_state = None

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer) -> None:
        # After backward, so after DDP's gradient all-reduce: what the optimizer applies.
        if "grads" not in self.record:
            self.record["grads"] = {
                k: p.grad.detach().clone().cpu()
                for k, p in network(pl_module).named_parameters()
                if p.grad is not None
            }
        if len(self.record["optim"]) < STEP_STATES:
            self.record["optim"].append(
                [
                    {k: v for k, v in group.items() if isinstance(v, bool | int | float | tuple | str)}
                    for group in optimizer.param_groups
                ]
            )

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        # The system's buffers too; taken before validation's DDP buffer broadcast.
        self._last_state = snapshot(pl_module)
        steps = self.record["step_state"]
        if len(steps) < min(trainer.global_step, STEP_STATES):  # an optimizer step ended (not accumulation)
            steps.append(self._last_state)
        if self.stop_at_step and trainer.global_step == self.stop_at_step:
            trainer.save_checkpoint(self.out_dir / "stop.ckpt")  # every rank calls it; rank 0 writes
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.record["epoch_state"].append(self._last_state)
        self.record["global_step"] = trainer.global_step  # optimizer steps so far

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.record["final"] = self._last_state
        self.record["global_step"] = trainer.global_step
        self.record["loose_final"] = loose_state(pl_module)

    def _eval_start(self, trainer: Trainer, split: str, loaders) -> None:
        if not trainer.sanity_checking and split not in self.record["eval_indices"]:
            loaders = loaders if isinstance(loaders, list) else [loaders]
            self.record["eval_indices"][split] = [sampler_indices(loader) for loader in loaders]

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_start(trainer, "val", trainer.val_dataloaders)

    def on_validation_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        # The batch is on the device: what draws from here to the batch's end is the model's step.
        self._rng_state = torch.random.get_rng_state()
        if "eval_train_mode" not in self.record:  # Lightning put the model in eval mode before this
            self.record["eval_train_mode"] = [
                f"{name} ({type(m).__name__})"
                for name, m in pl_module.named_modules()
                if m.training and isinstance(m, MODE_LAYERS)
            ]

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        if self._rng_state is not None and not torch.equal(self._rng_state, torch.random.get_rng_state()):
            self.record["eval_rng"] += 1
        self._rng_state = None

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_start(trainer, "test", trainer.test_dataloaders)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self.record["val"].append(metrics(trainer, "val/"))
            if trainer.state.fn == "validate":
                # A validate run's metrics are all its validation's, whatever their names: a user's model
                # may log "val_acc" or "valid/acc" (Lightning's examples do), not only lit_ddp's "val/*".
                self.record.setdefault("val_logged", []).append(metrics(trainer, ""))
            self.record.setdefault("val_batches", []).append(list(trainer.num_val_batches))

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.record["test"].append(metrics(trainer, "test/"))
        self.record.setdefault("test_batches", []).append(list(trainer.num_test_batches))

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stage = getattr(stage, "value", stage)  # Lightning passes a TrainerFn (a str enum)
        torch.save(self.record, self.out_dir / f"{stage}_rank{trainer.global_rank}.pt")


def load(out_dir: Path, stage: str, world_size: int) -> list[dict]:
    """Every rank's record of one run."""
    return [torch.load(Path(out_dir) / f"{stage}_rank{r}.pt", weights_only=False) for r in range(world_size)]
