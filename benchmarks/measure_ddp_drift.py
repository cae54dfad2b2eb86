"""How far 2 × b drifts from 1 × 2b over epochs, beside the drift one process gets from splitting its batch.

Three runs of the same recipe (Shapes, LeNet, augmentation on), the same global batch of 2b:
  1 × 2b           the reference: one process, one batch
  2 × b            two CPU processes under DDP (gloo)
  1 × b, accum 2   one process, the global batch as two accumulated micro-batches: DDP's arithmetic
                   (the mean of two half-batch means) without a second process
run for both AdamW (the recipes' optimizer) and plain SGD. Prints, per epoch, the largest weight difference
from the reference and each run's val/acc: the figures README's "What 'the same model' means" quotes
(docs/benchmarks.md records them).

    python benchmarks/measure_ddp_drift.py --epochs 10 --train-size 2048 --batch 32
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from lightning import Callback

HERE = Path(__file__).resolve().parent


class Record(Callback):
    """Rank 0 keeps the network's weights after every epoch's training and the val/acc of every epoch."""

    def __init__(self, out: str) -> None:
        self.out, self.weights, self.acc = out, [], []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.weights.append(
            {k: v.detach().double().cpu().clone() for k, v in pl_module.net.state_dict().items()}
        )

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.acc.append(float(trainer.callback_metrics["val/acc"]))

    def teardown(self, trainer, pl_module, stage) -> None:
        if trainer.is_global_zero:
            torch.save({"weights": self.weights, "acc": self.acc}, self.out)


def fit(tmp: Path, name: str, args: list[str]) -> dict:
    out = tmp / f"{name}.pt"
    spec = {"class_path": "measure_ddp_drift.Record", "init_args": {"out": str(out)}}
    cmd = [sys.executable, "-m", "lit_ddp", "fit", *args, f"--trainer.callbacks={json.dumps(spec)}"]
    cmd += [f"--trainer.default_root_dir={tmp / name}", "--trainer.enable_progress_bar=false"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
    if proc.returncode:
        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
    return torch.load(out, weights_only=False)


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a if a[k].is_floating_point())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--train-size", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=32, help="b: the per-device batch of the 2-process run")
    args = parser.parse_args()
    b = args.batch
    common = ["--trainer.accelerator=cpu", f"--trainer.max_epochs={args.epochs}", "--data.val_size=1000"]
    common += [f"--data.train_size={args.train_size}", "--trainer.enable_model_summary=false"]
    optimizers = {
        "adamw": ["--model.optim.name=adamw", "--model.optim.lr=0.003", "--model.optim.weight_decay=0.0005"],
        "sgd": ["--model.optim.name=sgd", "--model.optim.lr=0.05"],
    }
    runs = {
        "1 × 2b": ["--trainer.devices=1", f"--data.batch_size={2 * b}"],
        "2 × b": ["--trainer.devices=2", "--trainer.strategy=ddp", f"--data.batch_size={b}"],
        "1 × b, accum 2": [
            "--trainer.devices=1",
            f"--data.batch_size={b}",
            "--trainer.accumulate_grad_batches=2",
        ],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for opt, opt_args in optimizers.items():
            got = {
                name: fit(Path(tmp), f"{opt}_{i}", [*common, *opt_args, *run])
                for i, (name, run) in enumerate(runs.items())
            }
            ref = got["1 × 2b"]
            print(f"\n{opt}, b = {b}, {args.train_size} training images")
            print(
                "| epoch | max abs Δweight, 2 × b vs 1 × 2b | 1 × b accum 2 vs 1 × 2b | val/acc: "
                + " | ".join(runs)
                + " |"
            )
            print("|---|---|---|---|---|---|")
            for e in range(args.epochs):
                d = [max_diff(got[n]["weights"][e], ref["weights"][e]) for n in ("2 × b", "1 × b, accum 2")]
                acc = [got[n]["acc"][e] for n in runs]
                print(f"| {e + 1} | {d[0]:.1e} | {d[1]:.1e} | " + " | ".join(f"{a:.4f}" for a in acc) + " |")


if __name__ == "__main__":
    main()
