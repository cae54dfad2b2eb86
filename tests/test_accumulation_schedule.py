"""A GradientAccumulationScheduler (``--trainer.callbacks+=GradientAccumulationScheduler
--trainer.callbacks.scheduling='{0: 2, 1: 4}'``): the Trainer's ``accumulate_grad_batches`` says 1 until the
scheduler sets each epoch's as it starts, so what is read before (the global batch printed and logged, the lr
scaled for it, the schedule's length, a resume's place on it) reads the scheduling.

    python -m pytest tests/test_accumulation_schedule.py -n 0 -q
"""

from pathlib import Path

from conftest import TINY_RUN
from test_dashboard import hparams, read_run, texts

from lit_ddp.cli import build_cli

SCHEDULE = ["--trainer.callbacks+=GradientAccumulationScheduler", "--trainer.callbacks.scheduling={0: 2, 1: 4}"]


def test_the_global_batch_printed_and_logged_is_the_scheduled_one(tmp_path: Path, caplog) -> None:
    """128 images in batches of 32, 2 then 4 accumulated: the console and the dashboard said 1 accumulated
    (a global batch of 32)."""
    args = [*TINY_RUN, "--data.train_size=128", "--trainer.max_epochs=2", *SCHEDULE]
    with caplog.at_level("INFO"):
        build_cli(["fit", *args, f"--trainer.default_root_dir={tmp_path}"])
    line = "global batch = 32 per device × 1 devices × 2 accumulation = 64 images per optimizer step"
    assert f"{line}; 128 (4 accumulated) from epoch 2" in caplog.messages
    (events,) = {path.parent for path in tmp_path.rglob("events.out.tfevents.*")}
    run = read_run(events)
    params, _ = hparams(run)
    assert (params["global_batch_size"], params["trainer/accumulate_grad_batches"]) == (64, 2)
    assert params["trainer/accumulation_scheduling"] == "{0: 2, 1: 4}"
    assert "| global batch | 64; 128 (4 accumulated) from epoch 2 |" in texts(run, "environment")[0]
