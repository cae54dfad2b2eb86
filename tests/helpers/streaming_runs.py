"""Training runs from shards, for the tests that compare them (tests/test_streaming.py, test_launchers.py):
the CIFAR shards and the uninterrupted reference runs are session fixtures in tests/conftest.py, made once.

200 CIFAR training images, 40 held out: 160 train = 3 steps of a global batch of 64 (64, 64, 32), 2 epochs.
"""

import os
from pathlib import Path

import torch
from conftest import CPU, DDP2, HELPERS, ONE, REPO, run_cli

ENV = {"PYTHONPATH": f"{REPO}{os.pathsep}{HELPERS}"}  # the probes (fault_probe) for --trainer.callbacks
CONFIG = REPO / "configs" / "lenet_cifar_streaming.yaml"
# Everything but the command and the config: a launcher script (sbatch's) names those itself.
ARGS = [
    "--data.val_size=40",
    "--model.optim.name=sgd",
    "--model.optim.lr=0.05",
    "--model.optim.warmup_epochs=0",
    "--trainer.max_epochs=2",
    "--trainer.default_root_dir=logs",
    *CPU,
]
FIT = ["fit", f"--config={CONFIG}", *ARGS]
# The same global batch of 64 on 1, 2 and 4 processes.
PROCESSES = {
    1: [*ONE, "--data.batch_size=64"],
    2: [*DDP2, "--data.batch_size=32"],
    4: ["--trainer.devices=4", "--trainer.strategy=ddp", "--data.batch_size=16"],
}


def shard(src: Path, dest: str, *args: str, env: dict | None = None):
    return run_cli(["shard", str(src), dest, *args], cwd=src.parent, env={**ENV, **(env or {})})


def make_cifar_shards(root: Path) -> Path:
    """A small CIFAR-10 folder (root/src) as shards of ~16 samples (root/shards), so an epoch spans many
    shards and windows."""
    from test_cifar10 import write_cifar10

    write_cifar10(root / "src", per_batch=40, test_size=30)
    proc = shard(root / "src", str(root / "shards"), "--shard-mb=0.05")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "shards"


def fit(cwd: Path, url: Path | str, *args: str, env: dict | None = None):
    cwd.mkdir(parents=True, exist_ok=True)
    return run_cli([*FIT, f"--data.url={url}", *args], cwd=cwd, env={**ENV, **(env or {})}, timeout=400)


def last_ckpt(cwd: Path) -> Path:
    (path,) = cwd.glob("logs/**/last.ckpt")
    return path


def weights(cwd: Path) -> dict[str, torch.Tensor]:
    return torch.load(last_ckpt(cwd), weights_only=True)["state_dict"]


def assert_same_weights(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=atol, msg=key)


def stop_mid_epoch(at_step: int, out: Path) -> list[str]:
    """SIGTERM at ``at_step`` (fault_probe.Fault): the run saves last.ckpt mid-epoch and exits 0."""
    return [
        "--resilience.check_every_n_batches=1",
        "--trainer.callbacks+=fault_probe.Fault",
        "--trainer.callbacks.action=sigterm",
        f"--trainer.callbacks.at_step={at_step}",
        f"--trainer.callbacks.out_dir={out}",
    ]
