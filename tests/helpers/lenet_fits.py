"""In-process LeNet fits on CIFAR-shaped tensors, with and without ``--model.cuda_graph``: the CPU tests
(test_step_graph.py) and the CUDA one (test_cuda.py) compare the two."""

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
from lightning import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

from lit_ddp.models import LeNetCIFAR, OptimConfig

# The benchmark's in-memory CIFAR data module: CIFAR10DataModule's statistics and crop-and-flip, no files.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_lenet_gpu import InMemoryCIFAR, cifar_shaped  # noqa: E402

# 100 images in batches of 32: 3 full batches and a partial one of 4 per epoch.
IMAGES, BATCH = 100, 32


def lenet(cuda_graph: bool | str, **kwargs) -> LeNetCIFAR:
    torch.manual_seed(0)
    optim = OptimConfig(name="adamw", lr=3e-3, weight_decay=5e-4, warmup_epochs=1.0)
    return LeNetCIFAR(optim=kwargs.pop("optim", optim), cuda_graph=cuda_graph, **kwargs)


def trainer(root: Path, accelerator: str = "cpu", epochs: int = 2, **kwargs) -> L.Trainer:
    """One device, validation off; a checkpoint at each epoch's end in ``root`` (``last.ckpt``)."""
    checkpoints = ModelCheckpoint(dirpath=root, save_last=True, save_top_k=-1)
    return L.Trainer(
        accelerator=accelerator,
        devices=1,
        max_epochs=epochs,
        logger=False,
        callbacks=[checkpoints, *kwargs.pop("callbacks", [])],
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=root,
        **kwargs,
    )


def fit(module: LeNetCIFAR, trainer: L.Trainer, ckpt_path: Path | None = None) -> dict[str, Tensor]:
    """The trained weights, on the CPU."""
    data = InMemoryCIFAR(*cifar_shaped(IMAGES), batch_size=BATCH, num_workers=0)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return {name: p.detach().cpu().clone() for name, p in module.named_parameters()}


def assert_close(a: dict[str, Tensor], b: dict[str, Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


@contextmanager
def full_fp32() -> Iterator[None]:
    """Convolutions and matmuls in full float32 (no TF32) while inside: a captured step and an eager one may
    run different kernels, and TF32's rounding of their gradients, through AdamW's division by each weight's
    own gradient scale, moves the weights whose gradients are near zero by up to a few steps' lr."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


class GradsBeforeUpdate(Callback):
    """Each optimizer step's global step, and whether every parameter had a gradient then."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad for p in pl_module.parameters()]
        self.seen.append((trainer.global_step, all(g is not None and g.abs().sum() > 0 for g in grads)))


class StopAfterFirstEpoch(Callback):
    """Stops a 2-epoch run after its first (its checkpoint written): its schedule is the 2-epoch run's."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        trainer.should_stop = True
