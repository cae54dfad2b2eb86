"""A 2-process fit resumed inside an epoch saves inside it again, and ends as the uninterrupted run; so does
one resumed inside the epoch on one process with the whole global batch, then on 2 processes again.

One fit, stopped and resumed with ``--ckpt_path=last`` five times inside its second epoch: each resumed run
saves inside that epoch at least once more, at each point where lit_ddp saves inside an epoch (``max_steps``,
``max_time``, a validation inside the epoch with its ModelCheckpoint and last.ckpt, SIGTERM and SIGUSR1), and
the last one trains to the end. A save inside a resumed epoch sums the epoch's training metric states over the
ranks, a collective that rank 0 alone joined, and the job hung there; a run's timeouts catch such a hang. The
fit then holds the uninterrupted run's batches, weights and metrics. One chain, not a fit per save point:
each run costs seconds of start-up. A second chain changes the process count at each resume and shares the
uninterrupted run.
"""

import ast
import os
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import CPU, DDP2, REPO, run_cli
from test_resume_dashboard import tensorboard

pytestmark = [pytest.mark.ddp, pytest.mark.slow, pytest.mark.timeout(900)]

# 288 training images, 16 per device on 2 ranks: 9 steps per epoch, 18 in all, a validation after every 3
# (steps 3, 6, 9, 12, 15 and 18). A constant learning rate: a larger max_steps changes nothing but where a run
# stops.
RUN = [
    "fit",
    *CPU,
    *DDP2,
    "--data.train_size=288",
    "--data.val_size=16",
    "--data.test_size=16",
    "--data.batch_size=16",
    "--trainer.max_epochs=2",
    "--trainer.val_check_interval=3",
    "--model.optim.schedule=constant",
    "--resilience.check_every_n_batches=1",
    "--dist_timeout=120",  # a hang fails the run in 2 minutes, naming the rank and the step
]
END = 18
ENV = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"}  # fault_probe
# A run takes seconds; minutes on a loaded 2-core machine. Past this, the ranks hang.
RUN_TIMEOUT = 300


def fit(cwd: Path, probe: str, *args: str, action: str = "should_stop", at_batch: int = -1, rank: int = 0):
    """A run of ``RUN`` in ``cwd`` whose probe records every batch it trains in ``cwd/probe`` and does
    ``action`` on ``rank`` as this process's batch ``at_batch`` starts (never with -1)."""
    probe_args = ["--trainer.callbacks+=fault_probe.Fault", f"--trainer.callbacks.action={action}"]
    probe_args += [f"--trainer.callbacks.rank={rank}", f"--trainer.callbacks.at_step={at_batch}"]
    probe_args += [f"--trainer.callbacks.out_dir={cwd / probe}"]
    try:
        result = run_cli([*RUN, *probe_args, *args], cwd=cwd, env=ENV, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(
            f"the run hung ({RUN_TIMEOUT} s): {(expired.stdout or '')[-1500:]}{expired.stderr[-3000:]}"
        )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def last_ckpt(cwd: Path) -> dict:
    (path,) = cwd.glob("logs/lightning_logs/version_*/checkpoints/last.ckpt")
    return torch.load(path, map_location="cpu", weights_only=True)


def batches(probe: Path, rank: int) -> list[tuple[int, int, list[int]]]:
    """(epoch, global step, labels) of every training batch a rank ran, in order."""
    rows = (line.split(" ", 2) for line in (probe / f"batches_rank{rank}.txt").read_text().splitlines())
    return [(int(e), int(s), ast.literal_eval(labels)) for e, s, labels in rows]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("uninterrupted")
    fit(cwd, "probe")
    return cwd


def assert_the_uninterrupted_run(cwd: Path, probes: list[str], reference: Path) -> None:
    """Each rank trained the uninterrupted run's batches once each, in its order, and the run ends with its
    weights and every metric point of it."""
    for rank in (0, 1):
        trained = [row for probe in probes for row in batches(cwd / probe, rank)]
        assert trained == batches(reference / "probe", rank)
    assert_the_uninterrupted_weights_and_metrics(cwd, reference)


def assert_the_uninterrupted_weights_and_metrics(cwd: Path, reference: Path, atol: float = 0.0) -> None:
    """The run ends at the uninterrupted run's step with its weights and every metric point of it (a stop's
    own validation adds points at other steps), within ``atol`` (the losses within 1e-6 at least)."""
    final, expected = last_ckpt(cwd), last_ckpt(reference)
    assert final["global_step"] == expected["global_step"] == END
    for key, value in expected["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][key], value, rtol=0, atol=atol, msg=key)
    (run,) = cwd.glob("logs/lightning_logs/version_*")
    (want_run,) = reference.glob("logs/lightning_logs/version_*")
    got, want = tensorboard(run)[0], tensorboard(want_run)[0]
    for tag in ("train/acc", "train/loss_epoch", "val/acc", "val/loss"):
        last_at = dict(got[tag])  # a step's last point: a resume rewrites the points after the checkpoint
        steps, values = zip(*want[tag], strict=True)
        assert [last_at.get(step) for step in steps] == pytest.approx(list(values), abs=max(atol, 1e-6)), tag


# Each run of the stopped fit: its options, what stops it (a probe's action as a batch of that run starts,
# counted from its first) and the step its last.ckpt holds. Every run but the first resumes inside epoch 2
# (steps 10 to 18) and saves inside it again. Lightning's Timer counts max_time over the runs: each run's is
# ample but where the probe moves the Timer's clock past it, on rank 0, and the Timer stops every rank after
# that batch. A signal to one rank as a batch starts, checked after every batch, stops every rank after the
# next one.
HOUR, DAY = "--trainer.max_time=00:01:00:00", "--trainer.max_time=01:00:00:00"
TWO_HOURS = "--trainer.max_time=00:02:00:00"
CHAIN = [
    ("max_time", [HOUR], {"action": "max_time", "at_batch": 9}, 10),
    ("max_steps", [TWO_HOURS, "--trainer.max_steps=11"], {}, 11),
    ("a validation, then SIGTERM", [TWO_HOURS], {"action": "sigterm", "rank": 1, "at_batch": 0}, 13),
    ("max_time", [TWO_HOURS], {"action": "max_time", "at_batch": 0}, 14),
    ("a validation, then SIGUSR1", [DAY], {"action": "sigusr1", "rank": 0, "at_batch": 0}, 16),
    ("a validation, then the end", [DAY], {}, END),
]


def test_a_two_rank_fit_resumed_inside_an_epoch_saves_inside_it_again_and_ends_as_uninterrupted(
    tmp_path: Path, reference: Path
) -> None:
    probes = []
    for number, (stop, args, probe, step) in enumerate(CHAIN):
        probes.append(f"probe{number}")
        fit(tmp_path, probes[-1], *args, *(["--ckpt_path=last"] if number else []), **probe)
        assert last_ckpt(tmp_path)["global_step"] == step, f"run {number + 1}, stopped by {stop}"
    assert_the_uninterrupted_run(tmp_path, probes, reference)


# ---- the same epoch on other process counts: 2 × 16 → 1 × 32 → 2 × 16 → 1 × 32 -----------------------------
# One process with the whole global batch trains each step on the samples both ranks train at that step (rank
# r takes every 2nd sample of the same (seed, epoch) permutation), so the weights agree to the rounding of a
# sum split over two processes: README's "What 'the same model' means", the tolerance of the other resumes
# across process counts (tests/test_streaming.py).
ONE_PROCESS = ["--trainer.devices=1", "--trainer.strategy=auto", "--data.batch_size=32"]
ACROSS_COUNTS = 1e-5
# Stopped by max_time inside epoch 2 on 2 ranks; resumed on one process and stopped by max_steps at step 12,
# a batch that a validation follows (which saves too, before the stop); resumed on 2 ranks and stopped by
# SIGTERM at step 15, the next such batch (sent as the run's second batch starts, agreed after its third);
# resumed on one process to the end. A stop saved after its batch's validation resumes without running that
# validation again, and the resumed run logs at the uninterrupted run's steps.
WORLD_CHAIN = [
    (2, [HOUR], {"action": "max_time", "at_batch": 9}, 10),
    (1, [TWO_HOURS, "--trainer.max_steps=12"], {}, 12),
    (2, [TWO_HOURS], {"action": "sigterm", "rank": 1, "at_batch": 1}, 15),
    (1, [DAY], {}, END),
]


def global_steps(probes: list[Path]) -> dict[int, tuple[int, list[int]]]:
    """{global step: (epoch, the sorted labels it trained on over all ranks)}, over the runs ``probes``."""
    found: dict[int, tuple[int, list[int]]] = {}
    for probe in probes:
        for rank in (0, 1):
            if (probe / f"batches_rank{rank}.txt").exists():
                for epoch, step, labels in batches(probe, rank):
                    found.setdefault(step, (epoch, []))[1].extend(labels)
    return {step: (epoch, sorted(labels)) for step, (epoch, labels) in sorted(found.items())}


def test_a_fit_resumed_inside_an_epoch_on_one_process_then_on_two_ends_as_the_uninterrupted_run(
    tmp_path: Path, reference: Path
) -> None:
    probes = []
    for number, (processes, args, probe, step) in enumerate(WORLD_CHAIN):
        probes.append(tmp_path / f"probe{number}")
        world = ONE_PROCESS if processes == 1 else []  # after RUN's 2 processes × 16: the later option counts
        fit(tmp_path, probes[-1].name, *args, *world, *(["--ckpt_path=last"] if number else []), **probe)
        assert last_ckpt(tmp_path)["global_step"] == step, f"run {number + 1}, on {processes} process(es)"
    assert global_steps(probes) == global_steps([reference / "probe"])
    assert_the_uninterrupted_weights_and_metrics(tmp_path, reference, atol=ACROSS_COUNTS)
