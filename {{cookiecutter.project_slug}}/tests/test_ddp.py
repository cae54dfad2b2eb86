"""Your model and data under real DDP: 2 CPU processes (gloo), the way a multi-GPU run starts them.

Evaluation must report the metric of the whole split, whatever the number of processes: the same
checkpoint validated on 1 and on 2 processes gives the same loss and accuracy.
"""

import math
from pathlib import Path

import pytest
from lit_ddp.cli import build_cli

from {{ cookiecutter.package_name }}.__main__ import MODEL
from {{ cookiecutter.package_name }}.data import MyDataModule

# Small splits, odd-sized so that the 2 ranks' evaluation shards are uneven.
DATA = ["--data.train_size=1024", "--data.val_size=101", "--data.batch_size=64"]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def run(*args: str):
    return build_cli([*args, *DATA, *QUIET], model=MODEL, data=MyDataModule, prog="test").trainer


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_two_processes_train_and_report_the_whole_validation_set(in_tmp: Path) -> None:
    ddp = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    trainer = run("fit", *ddp, "--trainer.max_epochs=2")
    checkpoint = next(in_tmp.glob("logs/lightning_logs/version_*/checkpoints/last.ckpt"))
    # Below the loss of a uniform guess, ln(num_classes): the gradients averaged over the ranks train it.
    assert trainer.callback_metrics["train/loss_epoch"] < math.log(MyDataModule.num_classes)

    on_two = run("validate", *ddp, f"--ckpt_path={checkpoint}").callback_metrics
    on_one = run("validate", "--trainer.accelerator=cpu", "--trainer.devices=1", f"--ckpt_path={checkpoint}")
    on_one = on_one.callback_metrics
    for key in ("val/loss", "val/acc"):
        assert on_two[key].item() == pytest.approx(on_one[key].item(), abs=1e-6), key
