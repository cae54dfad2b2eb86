"""Faults on CPU with 2 real processes: a killed rank, preemption and resume, a crash mid-checkpoint, NaN,
bad checkpoints, bad launch arguments. Each injects its fault with tests/helpers/fault_probe.py; asserts
outcomes."""

import ast
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY_SHAPES, cli_env, ctrl_c_while_importing, read_scalars, run_cli, run_python
from forked_cli import FRESH_RANKS

from lit_ddp.cli import build_cli
from lit_ddp.errors import UserError
from lit_ddp.runtime.checkpoint_io import AtomicCheckpointIO

# 256 training images, 32 per device on 2 ranks: 4 steps per epoch, 8 in all.
DDP_FIT = [
    "fit",
    *TINY_SHAPES,
    "--trainer.max_epochs=2",
    "--trainer.accelerator=cpu",
    "--trainer.devices=2",
    "--trainer.strategy=ddp",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]
STEPS_PER_EPOCH = 4
ENV = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"}


def fault(
    out: Path, action: str = "sigterm", rank: int = 0, at_step: int = -1, at_epoch_end: int = -1
) -> list[str]:
    return [
        "--trainer.callbacks+=fault_probe.Fault",
        f"--trainer.callbacks.action={action}",
        f"--trainer.callbacks.rank={rank}",
        f"--trainer.callbacks.at_step={at_step}",
        f"--trainer.callbacks.at_epoch_end={at_epoch_end}",
        f"--trainer.callbacks.out_dir={out}",
    ]


# Timeouts are for hangs: a 2-process run takes seconds alone and minutes on a 2-core machine that other jobs
# load, which a test must survive.
RUN_TIMEOUT = 480


def ddp_fit(cwd: Path, *args: str, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return run_cli([*DDP_FIT, *args], cwd=cwd, env=ENV, timeout=timeout)


def job(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python -m lit_ddp ARGS`` as a job of its own (a new session, as a terminal starts one): a probe's
    ``sigint_group`` reaches all of it and nothing else, and past the timeout the whole job is killed, not its
    main process alone (ddp_spawn's ranks would be left waiting for it)."""
    try:
        return run_cli(args, cwd=cwd, env=ENV, timeout=RUN_TIMEOUT, new_session=True)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the job did not end in {RUN_TIMEOUT} s: {(expired.output + expired.stderr)[-3000:]}")


def batches(probe: Path, rank: int = 0) -> list[tuple[int, int, list[int]]]:
    """(epoch, global step, labels) of every training batch a rank ran, in order."""
    rows = (line.split(" ", 2) for line in (probe / f"batches_rank{rank}.txt").read_text().splitlines())
    return [(int(e), int(s), ast.literal_eval(labels)) for e, s, labels in rows]


def last_ckpt(cwd: Path) -> Path:
    (path,) = cwd.glob("logs/lightning_logs/version_*/checkpoints/last.ckpt")
    return path


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 2-process run, recording its batches (the probe never fires)."""
    cwd = tmp_path_factory.mktemp("reference")
    result = ddp_fit(cwd, *fault(cwd / "probe"))
    assert result.returncode == 0, result.stderr[-3000:]
    return cwd


# ---- a: a rank killed mid-epoch ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
@pytest.mark.parametrize("killed", [1, 0])
def test_a_killed_rank_stops_the_whole_job_and_is_named(tmp_path: Path, killed: int) -> None:
    result = ddp_fit(tmp_path, *fault(tmp_path / "probe", "sigkill", rank=killed, at_step=2))
    assert result.returncode != 0
    fired_at = float((tmp_path / "probe" / "fired").read_text().split()[0])
    pids = [int(line.split()[1]) for line in (tmp_path / "probe" / "pids").read_text().splitlines()]
    assert len(pids) == 2
    deadline = time.time() + 180
    while any(alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.5)
    assert not any(alive(pid) for pid in pids), "a rank was left running"
    assert time.time() - fired_at < 180  # not the 600 s --dist_timeout: the loss was seen, however loaded
    if killed == 1:  # rank 0 (the launcher) names the child it lost, as the job's last line
        assert "lit_ddp: error: lost rank 1 (pid" in result.stderr and "killed by SIGKILL" in result.stderr
        assert result.stderr.rstrip().splitlines()[-1].startswith("lit_ddp: error: lost rank 1")
    else:  # rank 0 itself died (the shell sees SIGKILL); the orphaned rank 1 says so and exits
        assert result.returncode == -9
        assert "lit_ddp: error: lost rank 0 (pid" in result.stderr


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
@pytest.mark.parametrize("target", ["main_process", "rank_1"])
def test_b_sigterm_under_ddp_spawn_stops_every_rank_with_last_ckpt(tmp_path: Path, target: str) -> None:
    """ddp_spawn: SIGTERM to the main process (as a scheduler sends it) or to one rank stops every rank at
    the agreed step with last.ckpt there, exit 0, naming the signal and the rank that got it (it was
    "Ctrl-C" and exit 143 or a last.ckpt of the epoch before; a rank's SIGTERM hung the job)."""
    action, rank = ("sigterm_parent", 0) if target == "main_process" else ("sigterm", 1)
    args = ["--trainer.strategy=ddp_spawn", "--resilience.check_every_n_batches=1"]
    result = job([*DDP_FIT, *args, *fault(tmp_path / "probe", action, rank=rank, at_step=5)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    err = result.stderr
    assert "Ctrl-C" not in err and "Traceback" not in err
    received = [line for line in err.splitlines() if "received SIGTERM" in line]
    if target == "rank_1":
        assert received == [
            "lit_ddp: rank 1 received SIGTERM: every rank stops at the next check, with last.ckpt"
        ]
    else:  # the main process hands it to both ranks
        assert sorted(received)[0].startswith("lit_ddp: rank 0 received SIGTERM") and len(received) == 2
    # The signal is sent as the 6th batch starts (global step 5, epoch 2's second). Sent by a rank to itself,
    # it is recorded during that batch, agreed at its end and read at the end of the next: 7 steps done.
    # Handed on by the main process, it reaches rank 0 before rank 0 trains on (the probe waits for it, so
    # the stop cannot land late on a loaded machine), and rank 1 when the main process gets to it: a rank 1
    # still finishing the 5th batch records it there, and every rank stops one batch earlier. Either way all
    # ranks stop at the one agreed step, within check_every_n_batches + 1 batches of the signal, and
    # last.ckpt holds that step.
    stops = [7] if target == "rank_1" else [6, 7]
    stopped = [
        step
        for step in stops
        if f"stopped by SIGTERM at epoch 2, step {step} (mid-epoch, after {step - 4} of 4 batches)"
        in result.stdout + err
    ]
    assert len(stopped) == 1, (result.stdout + err)[-3000:]
    (last,) = tmp_path.glob("logs/lightning_logs/version_*/checkpoints/last.ckpt")
    assert torch.load(last, weights_only=False, map_location="cpu")["global_step"] == stopped[0]
    ran = [[step for _, step, _ in batches(tmp_path / "probe", r)] for r in (0, 1)]
    assert ran[0] == ran[1] == list(range(stopped[0]))  # every rank trained the same steps, then stopped


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
@pytest.mark.parametrize("when", ["training", "sanity_check"])
def test_b_ctrl_c_under_ddp_spawn_stops_every_rank_as_one_process_stops(tmp_path: Path, when: str) -> None:
    """A terminal's Ctrl-C reaches every process of the job. Under ddp_spawn the main process, waiting for
    its ranks, stopped on it at once ("Detected KeyboardInterrupt", exit 1) while the ranks saved last.ckpt;
    it now leaves the stop to them: the run folder keeps its files and the job exits 0. Before training
    (the sanity check) the ranks abort, as one process does: exit 1, the empty run folder gone (the main
    process, no longer stopped by the Ctrl-C itself, waited forever for a result that never came)."""
    args = [*DDP_FIT, "--trainer.strategy=ddp_spawn", "--resilience.check_every_n_batches=1"]
    if when == "training":
        args += fault(tmp_path / "probe", "sigint_group", rank=0, at_step=5)
    else:
        args += [*fault(tmp_path / "probe", "sigint_group"), "--trainer.callbacks.in_sanity_check=true"]
    result = job(args, tmp_path)  # a session of its own: the probe signals all of it, as a terminal does
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out[-3000:]
    if when == "sanity_check":
        assert result.returncode == 1, out[-3000:]
        assert "lit_ddp: stopped by Ctrl-C before the first training step: nothing to keep" in out
        assert not list(tmp_path.glob("logs/**/version_*"))
        return
    assert result.returncode == 0, out[-3000:]
    assert "Detected KeyboardInterrupt" not in out and "lit_ddp: stopped by SIGINT at epoch 2" in out, out
    (run,) = tmp_path.glob("logs/lightning_logs/version_*")
    assert {"config.yaml", "hparams.yaml", "checkpoints"} <= {p.name for p in run.iterdir()}
    assert list(run.glob("events.out.tfevents.*")) and (run / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_a_a_stuck_rank_fails_the_job_after_dist_timeout(tmp_path: Path) -> None:
    """Rank 1 stays alive but never reaches the next all-reduce: rank 0 gives up after --dist_timeout."""
    # The timeout also bounds the ranks' start-up rendezvous (the test below). Rank 1 is a fork of the
    # command, imports done (helpers/forked_cli.py), so it joins within seconds even on a loaded 2-core
    # machine (30 s leaves it room); a new interpreter's imports once took over 20 s there.
    result = ddp_fit(tmp_path, "--dist_timeout=30", *fault(tmp_path / "probe", "hang", rank=1, at_step=2))
    ended = time.time()
    assert (tmp_path / "probe" / "fired").exists(), result.stderr[-3000:]
    fired_at = float((tmp_path / "probe" / "fired").read_text().split()[0])
    assert result.returncode == 1
    assert "lit_ddp: error: rank 0 waited --dist_timeout=30 s for the other ranks at epoch 1, step 2" in (
        result.stderr
    )
    assert 30 <= ended - fired_at < 30 + 240  # gave up at the timeout, then ended (slowly, if loaded)
    pids = [int(line.split()[1]) for line in (tmp_path / "probe" / "pids").read_text().splitlines()]
    deadline = time.time() + 60  # it follows its parent within a few of its polls, later if loaded
    while any(alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids), "the stuck rank was left running"


@pytest.mark.ddp
@pytest.mark.timeout(200)
def test_a_rank_still_starting_when_the_rendezvous_times_out_is_named_as_a_start_up_not_a_stuck_rank(
    tmp_path: Path,
) -> None:
    """No rank imports torch and Lightning within 1 s, so rank 0's rendezvous gives up on rank 1 while it is
    still starting: the line says that start-up shares --dist_timeout and how to fix it, not that a rank is
    stuck, and the rank that was starting does not outlive the job."""
    # A new interpreter for rank 1 (the test runner's fork of one would have imported torch already)
    env = {**ENV, FRESH_RANKS: "1"}
    result = run_cli([*DDP_FIT, "--dist_timeout=1"], cwd=tmp_path, env=env, timeout=RUN_TIMEOUT)
    assert result.returncode == 1
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("lit_ddp: error:")]
    assert line.startswith(
        "lit_ddp: error: rank 0 waited --dist_timeout=1 s for the other ranks to join at start-up ("
    ), result.stderr[-3000:]
    assert line.endswith(
        "the start-up shares that timeout; raise --dist_timeout above the time the ranks take to start, or"
        " see their output for one that failed"
    )
    assert "stuck" not in result.stderr and "Traceback" not in result.stderr
    deadline = time.time() + 60  # rank 0 killed the rank it had launched; the kernel may take a moment
    while (left := _in_dir(tmp_path)) and time.time() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left running in the run's directory: {left}"


# A rank as Lightning's launcher starts it (local rank 1 of 2), whose rendezvous timed out at start-up.
STARTED_RANK = """
import os
from lightning import Trainer
from torch.distributed import DistStoreError
from lit_ddp.runtime.faults import FaultMonitor

trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False)
monitor, launcher = FaultMonitor(), os.getppid()
print("timed out", flush=True)
monitor.on_exception(trainer, None, DistStoreError("wait timeout after 1000ms, keys: /default_pg/0//cpu//0"))
print("launcher ended:", os.getppid() != launcher, flush=True)
monitor.report.print_once()
"""

# Its launcher: starts it (its output on this process's), then ends without a word, as a launcher that died
# would, when its own stdin closes (or with the started rank, should that fail first).
LAUNCHER = """
import os, subprocess, sys, threading

def end_when_told():
    sys.stdin.read()
    os._exit(0)

started = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stderr=subprocess.STDOUT)
threading.Thread(target=end_when_told, daemon=True).start()
started.wait()
"""


def test_a_rank_the_launcher_started_leaves_a_start_up_timeout_to_it_and_speaks_only_if_it_ends_silently(
    tmp_path: Path,
) -> None:
    """Both ranks' rendezvous time out at start-up, the launched rank's too when it was slow to start: it
    waits for its launcher, which names the start-up once for the job and kills it (the test above), rather
    than adding a line of its own. A launcher that ends without doing so leaves it to say it."""
    env = cli_env({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"})
    with subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, STARTED_RANK],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    ) as launcher:
        said = []
        for line in launcher.stdout:  # to the timeout; an import's warning may come first
            if line == "timed out\n":
                break
            said.append(line)
        else:  # the started rank failed before its timeout, and the launcher ended with it
            pytest.fail("".join(said))
        launcher.stdin.close()  # the launcher ends; the started rank's output still comes through the pipe
        out = launcher.stdout.read()  # to its end: the started rank's exit
    lines = [line for line in out.splitlines() if line.startswith(("launcher ended:", "lit_ddp: error:"))]
    assert lines[0] == "launcher ended: True", out  # it did not return while the launcher lived
    assert len(lines) == 2 and lines[1].startswith("lit_ddp: error: rank 1 waited --dist_timeout="), out
    assert "for the other ranks to join at start-up" in lines[1], out


def _in_dir(path: Path) -> list[str]:
    """The pids of live processes whose working directory is ``path`` (Linux /proc)."""
    return [pid for pid in os.listdir("/proc") if pid.isdigit() and _cwd(pid) == path.resolve()]


def _cwd(pid: str) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:  # gone meanwhile, or not ours to read
        return None


# ---- b: preemption ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(900)  # with the reference run, if this test makes it
def test_b_preemption_mid_epoch_checkpoints_exits_cleanly_and_resume_is_exact(
    tmp_path: Path, reference: Path
) -> None:
    """SIGTERM during epoch 1's second batch; then `fit --ckpt_path=last` continues at the next batch of the
    same order and ends with the uninterrupted run's weights and metrics."""
    # Checks every 2nd batch (after batches 1 and 3 of an epoch): a check is started after batch 1, which
    # saw the signal, and read after batch 2, a batch without a check of its own.
    every = "--resilience.check_every_n_batches=2"
    stopped = ddp_fit(tmp_path, every, *fault(tmp_path / "probe", "sigterm", rank=0, at_step=5))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    out = stopped.stdout + stopped.stderr
    # The ranks agree without blocking: a signal during batch k, checked after it, stops them after k + 1.
    assert "stopped by SIGTERM at epoch 2, step 7 (mid-epoch, after 3 of 4 batches)" in out
    assert torch.load(last_ckpt(tmp_path), weights_only=True)["global_step"] == 7

    resumed = ddp_fit(tmp_path, "--ckpt_path=last", *fault(tmp_path / "probe2"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {last_ckpt(tmp_path).relative_to(tmp_path)}" in resumed.stdout + resumed.stderr
    for rank in (0, 1):
        full, before, after = (
            batches(d, rank) for d in (reference / "probe", tmp_path / "probe", tmp_path / "probe2")
        )
        assert before == full[:7] and after == full[7:]  # the same batches, in the same order, once each
    assert_same_run(tmp_path, reference)


def assert_same_run(run: Path, reference: Path) -> None:
    """The final weights (max |Δw| ≤ 1e-6) and every epoch's train/val metrics of the uninterrupted run."""
    final, expected = (torch.load(last_ckpt(d), weights_only=True) for d in (run, reference))
    assert final["global_step"] == expected["global_step"]
    for key, value in expected["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][key], value, rtol=0, atol=1e-6, msg=key)
    got, want = (read_scalars(last_ckpt(d).parent.parent) for d in (run, reference))
    for key in ("train/acc", "train/loss_epoch", "val/acc", "val/loss"):
        assert got[key] == pytest.approx(want[key], abs=1e-6), key


ONE_DEVICE = [
    "fit",
    *TINY_SHAPES,
    "--trainer.max_epochs=2",
    "--trainer.accelerator=cpu",
    "--trainer.devices=1",
]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def one_device_fit(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    result = run_cli([*ONE_DEVICE, *QUIET, *args], cwd=cwd, env=ENV, timeout=RUN_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def one_device_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted one-process run, recording its batches (the probe never fires)."""
    reference = tmp_path_factory.mktemp("one_device_reference")
    one_device_fit(reference, *fault(reference / "probe"))
    return reference


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("where", ["mid_epoch", "epoch_end"])
def test_b_one_device_resume_is_exact_mid_epoch_and_at_an_epoch_boundary(
    tmp_path: Path, where: str, one_device_reference: Path
) -> None:
    """One process, stopped by SIGTERM in epoch 1 or at the end of epoch 0, then resumed:
    the same batches as the uninterrupted run, its final weights and its metrics."""
    # One process takes 8 batches of 32 per epoch: batch 9 is epoch 1's second.
    stop = {"mid_epoch": {"at_step": 9}, "epoch_end": {"at_epoch_end": 0}}[where]
    run = tmp_path / "run"
    stopped = one_device_fit(run, *fault(run / "probe", "sigterm", **stop))
    expected = {
        "mid_epoch": "at epoch 2, step 10 (mid-epoch, after 2 of 8 batches)",
        "epoch_end": "at the end of epoch 1, step 8: saved",
    }[where]
    assert f"stopped by SIGTERM {expected}" in stopped.stdout + stopped.stderr
    one_device_fit(run, "--ckpt_path=last", *fault(run / "probe2"))
    # Resumed again once finished (a job requeued after its end): it trains no batch, and the weights and
    # metrics below stay the uninterrupted run's.
    one_device_fit(run, "--ckpt_path=last", *fault(run / "probe2"))
    reference = one_device_reference
    full, before, after = (batches(d) for d in (reference / "probe", run / "probe", run / "probe2"))
    assert before + after == full
    assert_same_run(run, reference)


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_b_ctrl_c_saves_last_ckpt_at_the_current_step_and_a_second_one_aborts_at_once(tmp_path: Path) -> None:
    """Ctrl-C stops every rank at the same batch with last.ckpt, like SIGTERM (checked every batch here);
    pressed twice, the run aborts at once without a checkpoint."""
    every = "--resilience.check_every_n_batches=1"
    stopped = ddp_fit(
        tmp_path / "once", every, *fault(tmp_path / "once" / "probe", "sigint", rank=0, at_step=5)
    )
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    out = stopped.stdout + stopped.stderr
    assert "Ctrl-C again aborts now" in out
    # Signalled during batch 5; its check, started after it, is read after the next batch.
    assert "stopped by SIGINT at epoch 2, step 7 (mid-epoch, after 3 of 4 batches)" in out
    assert torch.load(last_ckpt(tmp_path / "once"), weights_only=True)["global_step"] == 7

    twice = run_cli(
        ["fit", *TINY_SHAPES, "--trainer.max_epochs=2", "--trainer.enable_progress_bar=false",
         "--last_checkpoint=null", "--checkpoint=null",
         *fault(tmp_path / "twice" / "probe", "sigint_twice", rank=0, at_step=2)],
        cwd=tmp_path, env=ENV, timeout=RUN_TIMEOUT,
    )  # fmt: skip
    assert twice.returncode == 1, twice.stderr[-3000:]
    assert "Detected KeyboardInterrupt" in twice.stdout + twice.stderr
    assert "stopped by SIGINT" not in twice.stdout + twice.stderr
    assert not list(tmp_path.glob("logs/**/*.ckpt"))


@pytest.mark.timeout(600)
def test_b_ctrl_c_during_the_sanity_check_leaves_no_run_folder_and_says_why(tmp_path: Path) -> None:
    """Ctrl-C before the first training step has nothing to save: Lightning stopped (exit 1) and left the
    run's version_0 (config.yaml, an event file) holding nothing, so the next run became version_1 and
    `--ckpt_path=last` had a run without a checkpoint to skip. The folder goes, with one line saying so."""
    args = ["fit", *TINY_SHAPES, "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false"]
    args += [*fault(tmp_path / "probe", "sigint"), "--trainer.callbacks.in_sanity_check=true"]
    stopped = run_cli(args, cwd=tmp_path, env=ENV, timeout=RUN_TIMEOUT)
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert (tmp_path / "probe" / "fired").is_file()
    assert "Traceback" not in stopped.stderr
    run = Path("logs") / "lightning_logs" / "version_0"
    assert f"lit_ddp: stopped by Ctrl-C before the first training step: nothing to keep, {run} removed" in (
        stopped.stderr
    )
    assert not list(tmp_path.glob("logs/**/version_*")) and not list(tmp_path.glob("logs/**/.*.lock"))


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_b_sigterm_to_one_rank_during_the_sanity_check_stops_every_rank_before_the_first_step(
    tmp_path: Path, strategy: str
) -> None:
    """Lightning's SIGTERM handler, still in place during the sanity check, broadcast from inside itself:
    rank 1 signalled alone waited there for rank 0, which waited for it in the check, and the job hung until
    --dist_timeout. The ranks now agree as training starts and stop before its first step, with last.ckpt."""
    args = [f"--trainer.strategy={strategy}", "--dist_timeout=60"]  # a hang ends in 60 s, not 600
    args += [*fault(tmp_path / "probe", "sigterm", rank=1), "--trainer.callbacks.in_sanity_check=true"]
    result = job([*DDP_FIT, *args], tmp_path)
    out = result.stdout + result.stderr
    assert (tmp_path / "probe" / "fired").is_file(), out[-3000:]
    assert result.returncode == 0, out[-3000:]
    assert "lit_ddp: rank 1 received SIGTERM" in out and "Traceback" not in out
    assert "lit_ddp: stopped by SIGTERM at the start of epoch 1, step 0: saved" in out, out[-3000:]
    assert torch.load(last_ckpt(tmp_path), weights_only=True)["global_step"] == 0
    assert not (tmp_path / "probe" / "batches_rank0.txt").exists()  # no training batch ran


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("when", ["in_setup", "in_sanity_check"])
def test_b_sigusr1_during_set_up_or_the_sanity_check_stops_with_last_ckpt_and_resumes_exactly(
    tmp_path: Path, one_device_reference: Path, when: str
) -> None:
    """Outside SLURM nothing handled SIGUSR1 before training: it killed the process (exit 138), leaving a run
    folder without a checkpoint (in set-up, before the sanity check, too). It now stops as SIGTERM does,
    and the resume ends as the uninterrupted run."""
    stopped = one_device_fit(
        tmp_path, *fault(tmp_path / "probe", "sigusr1"), f"--trainer.callbacks.{when}=true"
    )
    assert "lit_ddp: stopped by SIGUSR1 at the start of epoch 1, step 0: saved" in stopped.stderr
    one_device_fit(tmp_path, "--ckpt_path=last", *fault(tmp_path / "probe2"))
    assert batches(tmp_path / "probe2") == batches(one_device_reference / "probe")
    assert_same_run(tmp_path, one_device_reference)


def assert_evaluation_stopped(result: subprocess.CompletedProcess, cwd: Path, command: str, by: str) -> None:
    """Exit 1, no traceback, the last line saying what became of the run, and nothing left of it."""
    assert (cwd / "probe" / "fired").is_file(), result.stderr[-3000:]
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    run = Path("logs") / "lightning_logs" / "version_0"
    line = f"lit_ddp: stopped by {by} during {command}: nothing to keep, {run} removed"
    assert result.stderr.rstrip().splitlines()[-1] == line, result.stderr[-3000:]
    assert not list(cwd.glob("logs/**/version_*")) and not list(cwd.glob("logs/**/.*.lock"))
    assert not list(cwd.rglob("predictions.csv"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("command", "action"),
    [("validate", "sigterm"), ("test", "sigterm"), ("predict", "sigterm"), ("test", "sigusr1")],
)
def test_b_a_stop_signal_during_validate_test_or_predict_is_not_a_success(
    tmp_path: Path, command: str, action: str
) -> None:
    """SIGTERM stopped validate or test after the batch it came in, before any metric, with exit 0 and no
    word but Lightning's `Received SIGTERM`, leaving a run folder without results: a script or a scheduler
    took it for done. predict ignored it (exit 0, every row written: a scheduler's grace period then ran out),
    and SIGUSR1 killed the process (exit 138), leaving the run folder and its lock. Each now exits 1 with one
    line, the empty folder removed."""
    args = [command, *TINY_SHAPES, "--data.test_size=128", "--ckpt_path=untrained", *QUIET]
    args += [*fault(tmp_path / "probe", action), "--trainer.callbacks.at_eval_batch=1"]  # of 4 batches
    stopped = run_cli(args, cwd=tmp_path, env=ENV, timeout=RUN_TIMEOUT)
    assert_evaluation_stopped(stopped, tmp_path, command, action.upper())


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("command", "action"), [("validate", "sigterm"), ("test", "sigusr1"), ("predict", "sigterm")]
)
def test_b_a_stop_signal_to_one_rank_during_validate_test_or_predict_ends_every_rank(
    tmp_path: Path, command: str, action: str
) -> None:
    """SIGTERM to rank 1 alone hung the job until --dist_timeout (Lightning's handler broadcast from inside
    itself, and rank 0 never met it; in predict, rank 0's gather did: gloo aborted rank 1), and SIGUSR1 killed
    rank 1 ('lost rank 1'), leaving the run folder. Every rank now stops at the same batch, as one process
    does."""
    args = [command, *TINY_SHAPES, "--data.test_size=128", "--ckpt_path=untrained", *QUIET]
    args += ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]
    args += [*fault(tmp_path / "probe", action, rank=1), "--trainer.callbacks.at_eval_batch=0"]  # of 2
    stopped = job([*args, "--dist_timeout=60"], tmp_path)  # a hang ends in 60 s, not 600
    received = f"lit_ddp: rank 1 received {action.upper()}: every rank stops at the next check\n"
    assert received in stopped.stderr, stopped.stderr[-3000:]
    assert_evaluation_stopped(stopped, tmp_path, command, action.upper())


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("action", "rank"), [("sigterm", 1), ("sigterm_parent", 0)])
def test_b_under_ddp_spawn_a_stopped_test_fails_the_main_process_too(
    tmp_path: Path, action: str, rank: int
) -> None:
    """Under ddp_spawn, SIGTERM to one rank or to the main process (which hands it to every rank) during
    `test`: rank 0 said `nothing to keep, ... removed`, but the main process, whose status a script sees,
    exited 0 (where it had not hung or printed a traceback). It now exits 1."""
    args = ["test", *TINY_SHAPES, "--data.test_size=128", "--ckpt_path=untrained", *QUIET]
    args += ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    args += [*fault(tmp_path / "probe", action, rank=rank), "--trainer.callbacks.at_eval_batch=0"]  # of 2
    stopped = job([*args, "--dist_timeout=60"], tmp_path)
    assert_evaluation_stopped(stopped, tmp_path, "test", "SIGTERM")


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("command", "action", "ranks"),
    [
        ("validate", "sigterm", 1),
        ("test", "sigusr1", 1),
        ("predict", "sigterm", 1),
        pytest.param("test", "sigterm", 2, marks=[pytest.mark.slow, pytest.mark.ddp]),
    ],
)
def test_b_a_stop_signal_after_the_last_checked_batch_of_an_evaluation_lets_it_complete_and_says_so(
    tmp_path: Path, command: str, action: str, ranks: int
) -> None:
    """A signal after the last batch every rank runs (to rank 1 alone on 2 ranks) printed `every rank stops at
    the next check`, then the command ran to the end and exited 0, as it should: no check was left, and its
    results are whole. The line now says that it completes, and nothing says it stopped."""
    args = [command, *TINY_SHAPES, "--data.test_size=128", "--ckpt_path=untrained", *QUIET]
    if ranks > 1:
        args += ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]
    args += [*fault(tmp_path / "probe", action, rank=ranks - 1), "--trainer.callbacks.at_eval_end=true"]
    result = job([*args, "--dist_timeout=60"], tmp_path)
    assert (tmp_path / "probe" / "fired").is_file(), result.stderr[-3000:]
    assert result.returncode == 0, result.stderr[-3000:]
    line = f"lit_ddp: rank {ranks - 1} received {action.upper()} after the last batch every rank runs:"
    assert f"{line} the {command} completes, not stopped\n" in result.stderr, result.stderr[-3000:]
    assert "stops" not in result.stderr and "stopped" not in result.stderr.replace("not stopped", "")
    assert "Traceback" not in result.stderr
    assert list(tmp_path.glob("logs/lightning_logs/version_0"))  # the run folder stays
    if command == "predict":
        assert list(tmp_path.rglob("predictions.csv"))


@pytest.mark.timeout(120)
def test_b_ctrl_c_while_the_command_line_imports_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """A Ctrl-C in the seconds torch and Lightning take to import printed a KeyboardInterrupt traceback of
    the import it stopped."""
    result = ctrl_c_while_importing("lit_ddp", "fit", cwd=tmp_path, env=cli_env())
    assert (result.returncode, result.stdout) == (130, ""), result.stderr
    assert result.stderr == "lit_ddp: stopped by Ctrl-C while starting: nothing was run\n"


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(900)
def test_b_preemption_at_an_epoch_boundary_resumes_to_the_uninterrupted_model(
    tmp_path: Path, reference: Path
) -> None:
    """SIGUSR1 (SLURM's warning before the time limit) at the end of epoch 0; the resumed run = reference."""
    stopped = ddp_fit(tmp_path, *fault(tmp_path / "probe", "sigusr1", rank=0, at_epoch_end=0))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert "stopped by SIGUSR1 at the end of epoch 1, step 4" in stopped.stdout + stopped.stderr
    assert "mid-epoch" not in stopped.stdout + stopped.stderr
    resumed = ddp_fit(tmp_path, "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    final, expected = (torch.load(last_ckpt(d), weights_only=True) for d in (tmp_path, reference))
    assert final["global_step"] == expected["global_step"] == 2 * STEPS_PER_EPOCH
    for key, value in expected["state_dict"].items():
        assert torch.equal(final["state_dict"][key], value), key
    # One TensorBoard run: the resumed run logged into the interrupted run's directory.
    assert len(list(tmp_path.glob("logs/lightning_logs/version_*"))) == 1


# ---- c: a crash while a checkpoint is written ------------------------------------------------------

CRASH_MID_WRITE = """
import resource, signal, sys, torch
from lit_ddp.errors import UserError
from lit_ddp.runtime.checkpoint_io import AtomicCheckpointIO

plugin = AtomicCheckpointIO()
plugin.save_checkpoint({"state_dict": {"w": torch.ones(4)}, "epoch": 0}, sys.argv[1])
# The kernel kills this process (SIGXFSZ) once a file it writes passes 50 kB: mid-way through the next one.
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it by default (the write would just fail)
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
plugin.save_checkpoint({"state_dict": {"w": torch.zeros(100_000)}, "epoch": 1}, sys.argv[1])
"""


def test_c_a_crash_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints" / "last.ckpt"
    crash = run_python(["-c", CRASH_MID_WRITE, str(path)], timeout=120)  # forked: no import of torch
    assert crash.returncode == -signal.SIGXFSZ  # really killed in the middle of the second write
    checkpoint = AtomicCheckpointIO().load_checkpoint(path)
    assert checkpoint["epoch"] == 0 and torch.equal(checkpoint["state_dict"]["w"], torch.ones(4))
    leftover = sorted(p.name for p in path.parent.iterdir())
    assert len(leftover) == 2 and leftover[0].startswith(".last.ckpt.tmp-") and leftover[1] == "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {}, "epoch": 2}, path)  # the next write cleans up
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


def test_c_the_cli_writes_checkpoints_atomically(tmp_path: Path) -> None:
    cli = build_cli([*TINY_SHAPES, f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)


@pytest.mark.parametrize("fault", ["ENOSPC", "EROFS", "ENOSPC while logging"])
def test_c_a_full_or_read_only_disk_is_one_line_and_the_previous_last_ckpt_survives(
    tmp_path: Path, fault: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The disk fills (or is remounted read-only) after the first epoch's checkpoints: the next checkpoint
    write fails, and so does every TensorBoard write from then on, in its writer thread (or, "while
    logging", a TensorBoard write fails first). That ended in 78 (ENOSPC) and 171 (EROFS) lines of chained
    tracebacks, the writer thread's among them."""
    import errno

    from tensorboard.summary.writer.record_writer import RecordWriter

    from lit_ddp.cli import main

    code = getattr(errno, fault.split()[0])
    full = {"now": False, "saves": 0}
    save, write = torch.save, RecordWriter.write

    def disk_save(obj, f, *args, **kwargs):
        full["saves"] += 1
        full["now"] = full["now"] or full["saves"] > 2  # epoch 1 wrote the best and the last checkpoint
        if full["now"]:
            if code == errno.ENOSPC:
                f.write(b"\0" * 4096)  # a partial write first, as a filling disk does
            raise OSError(code, os.strerror(code))
        return save(obj, f, *args, **kwargs)

    def disk_write(self, data):
        full["now"] = full["now"] or (fault.endswith("logging") and full["saves"] == 2)
        if full["now"]:
            raise OSError(code, os.strerror(code))
        return write(self, data)

    monkeypatch.setattr(torch, "save", disk_save)
    monkeypatch.setattr(RecordWriter, "write", disk_write)
    args = ["fit", *TINY_SHAPES, "--trainer.max_epochs=3", "--trainer.log_every_n_steps=1"]
    with pytest.raises(SystemExit) as stop:
        main([*args, "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    what = "TensorBoard events in" if fault.endswith("logging") else "checkpoint"
    assert err.startswith(f"lit_ddp: error: could not write {what} ") and os.strerror(code) in err
    assert f"the run stops; its previous {last} is intact" in err and "--ckpt_path=last" in err
    assert torch.load(last, weights_only=True)["global_step"] == 8  # epoch 1's, whole
    assert not list(last.parent.glob(".*.tmp-*"))  # the partial file is gone


# ---- d: a non-finite loss --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_d_a_nan_loss_stops_every_rank_at_that_step_naming_the_checkpoint(tmp_path: Path) -> None:
    """Rank 1's weights turn NaN at step 5 (epoch 1): both ranks stop before applying that update."""
    result = ddp_fit(tmp_path, *fault(tmp_path / "probe", "nan", rank=1, at_step=5))
    assert result.returncode == 2
    last = last_ckpt(tmp_path)
    lines = [line for line in result.stderr.splitlines() if line.startswith("lit_ddp: error:")]
    assert lines and all(
        "non-finite loss or gradients at step 5 (epoch 2, batch 2)" in line for line in lines
    )
    assert f"--ckpt_path={last.relative_to(tmp_path)}" in lines[0]
    assert "Traceback" not in result.stderr
    for rank in (0, 1):
        assert batches(tmp_path / "probe", rank)[-1][1] == 5  # no step after the bad one
    checkpoint = torch.load(last, weights_only=True)  # epoch 0's: finite, and it resumes
    assert checkpoint["global_step"] == STEPS_PER_EPOCH
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values() if v.is_floating_point())


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_d_under_ddp_spawn_a_run_stopped_by_its_ranks_keeps_or_removes_its_folder_as_under_ddp(
    tmp_path: Path,
) -> None:
    """Under ddp_spawn a rank's refusal reached only the main process's callbacks, and the main process does
    not train: a NaN stop at step 2, before any checkpoint, removed the run's folder with the curves that show
    the divergence (under ddp they stay). A --trainer.val_check_interval past the epoch, refused in the ranks,
    was a ValueError traceback (exit 1) that left the new version_0 behind."""
    spawn = [a.replace("=ddp", "=ddp_spawn") if a.startswith("--trainer.strategy") else a for a in DDP_FIT]
    nan = [*fault(tmp_path / "probe", "nan", rank=1, at_step=2), "--trainer.log_every_n_steps=1"]
    root = "--trainer.default_root_dir=nan"
    stopped = run_cli([*spawn, *nan, root], tmp_path, env=ENV, timeout=RUN_TIMEOUT)
    assert stopped.returncode == 2 and "non-finite loss or gradients at step 2" in stopped.stderr
    run = tmp_path / "nan" / "lightning_logs" / "version_0"
    assert (run / "config.yaml").is_file() and len(read_scalars(run)["train/loss_step"]) == 2
    refused = run_cli(
        [*spawn, "--trainer.val_check_interval=9", "--trainer.default_root_dir=new/dir"],
        tmp_path,
        env=ENV,
        timeout=RUN_TIMEOUT,
    )
    errors = [line for line in refused.stderr.splitlines() if line.startswith("lit_ddp: error:")]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert len(errors) == 1 and "--trainer.val_check_interval=9 validates every 9 training" in errors[0]
    assert not (tmp_path / "new").exists()


# ---- e: a corrupt, mismatched or unsafe checkpoint -------------------------------------------------


@pytest.fixture(scope="module")
def good_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("good")
    args = ["fit", *TINY_SHAPES, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"]
    build_cli([*args, "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={root}"])
    return next(root.rglob("last.ckpt"))


def corrupt(good: Path, out: Path, kind: str) -> Path:
    path = out / f"{kind}.ckpt"
    if kind == "truncated":
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif kind == "not_torch":
        path.write_text("not a checkpoint\n")
    elif kind == "mismatched":  # saved by a 5-class model; the data (and so the model) has 10 classes
        checkpoint = torch.load(good, weights_only=True)
        checkpoint["hyper_parameters"]["num_classes"] = 5
        head = [k for k, v in checkpoint["state_dict"].items() if v.shape[:1] == (10,)]
        for key in head:
            checkpoint["state_dict"][key] = checkpoint["state_dict"][key][:5]
        torch.save(checkpoint, path)
    elif kind == "unsafe":  # an arbitrary object: unpickling it could run code
        checkpoint = torch.load(good, weights_only=True)
        checkpoint["extra"] = subprocess.CompletedProcess(args=["true"], returncode=0)
        torch.save(checkpoint, path)
    return path


@pytest.mark.ddp
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("truncated", "is corrupt or truncated"),
        ("not_torch", "is not a checkpoint (not a file torch.save writes)"),
        ("mismatched", "does not fit LeNetCIFAR: 2 tensors of another shape (first: net."),
        ("unsafe", "is not trusted: it holds pickled code or objects that lit_ddp does not load"),
        ("missing", "does not exist"),
        ("folder", "is a folder, not a checkpoint file: pass --ckpt_path="),
    ],
)
def test_e_a_bad_checkpoint_is_one_clear_error_before_any_process_starts(
    tmp_path: Path, good_ckpt: Path, kind: str, message: str
) -> None:
    if kind in ("missing", "folder"):  # a run's folder, where its checkpoint was meant
        path = good_ckpt.parent.parent if kind == "folder" else tmp_path / "missing.ckpt"
    else:
        path = corrupt(good_ckpt, tmp_path, kind)
    result = run_cli([*DDP_FIT, f"--ckpt_path={path}"], cwd=tmp_path, env=ENV, timeout=180)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("lit_ddp: error:")]
    assert len(errors) == 1 and f" {path} " in errors[0] and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr and "Initializing distributed" not in result.stderr
    assert not (tmp_path / "logs").exists()


def test_e_checkpoints_load_with_weights_only(good_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real_load = torch.load
    monkeypatch.setattr(
        torch, "load", lambda *a, **k: calls.append(k.get("weights_only")) or real_load(*a, **k)
    )
    AtomicCheckpointIO().load_checkpoint(good_ckpt)
    assert calls == [True]


def test_e_atomic_writes_are_for_local_paths_remote_ones_keep_lightnings_writer() -> None:
    from lit_ddp.runtime.checkpoint_io import is_local_path

    assert is_local_path("/tmp/run/last.ckpt") and is_local_path(Path("rel/last.ckpt"))
    assert not is_local_path("s3://bucket/last.ckpt")


def test_e_a_checkpoint_saved_to_a_file_url_is_where_the_url_names(tmp_path: Path, monkeypatch) -> None:
    """trainer.save_checkpoint("file:///abs/x.ckpt") went through a Path (`file:/abs/x.ckpt`): the local
    writer wrote it into a folder named `file:` in the current folder. A URL keeps Lightning's writer."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "saved" / "x.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 3}, target.as_uri())
    assert torch.load(target, weights_only=True) == {"step": 3} and not (tmp_path / "file:").exists()


def test_e_a_stopped_runs_last_ckpt_stays_in_a_remote_folder() -> None:
    """SIGTERM's last.ckpt for an s3:// run went through a Path, `s3:/bucket/...`: a local folder named s3:,
    written by the local writer, and named as if on S3."""
    from types import SimpleNamespace

    from lit_ddp.callbacks.last_checkpoint import LastCheckpoint
    from lit_ddp.runtime.preemption import last_checkpoint_path

    remote = "s3://bucket/runs/lightning_logs/version_0/checkpoints"
    last = LastCheckpoint()
    last.dirpath = remote  # as its setup resolves it under the run's folder (no s3fs needed here)
    trainer = SimpleNamespace(checkpoint_callbacks=[last], default_root_dir="s3://b")
    assert str(last_checkpoint_path(trainer)) == f"{remote}/last.ckpt"
    no_callback = SimpleNamespace(checkpoint_callbacks=[], default_root_dir="s3://b")
    assert str(last_checkpoint_path(no_callback)) == "s3://b/last.ckpt"


@pytest.mark.parametrize("mmap", [False, True])
def test_e_a_checkpoint_is_classified_by_its_format_and_exception_type(tmp_path: Path, mmap: bool) -> None:
    """Read from the file (zip or legacy, the globals its pickle names) and the exception's type, never
    torch's message text: a legacy file loads with mmap asked, an unsafe one names the class it holds."""
    from lit_ddp.preflight.checkpoint_file import load_checkpoint_file

    legacy = tmp_path / "legacy.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}}, legacy, _use_new_zipfile_serialization=False)
    assert load_checkpoint_file(legacy, mmap=mmap)["state_dict"]["w"].sum() == 2
    unsafe = tmp_path / "unsafe.ckpt"
    torch.save({"state_dict": {}, "extra": subprocess.CompletedProcess(args=["true"], returncode=0)}, unsafe)
    with pytest.raises(UserError, match=r"is not trusted: .* \(\S*CompletedProcess\)"):
        load_checkpoint_file(unsafe, mmap=mmap)
    for cut in (40, 0):  # a legacy pickle cut short, an empty file
        truncated = tmp_path / "truncated.ckpt"
        truncated.write_bytes(legacy.read_bytes()[:cut])
        with pytest.raises(UserError, match="is corrupt or truncated"):
            load_checkpoint_file(truncated, mmap=mmap)
    zipped = tmp_path / "zipped.ckpt"
    zipped.write_bytes(unsafe.read_bytes()[:100])  # a zip cut short
    with pytest.raises(UserError, match="is corrupt or truncated"):
        load_checkpoint_file(zipped, mmap=mmap)


class RunsACommand:
    """What a crafted checkpoint pickles: unpickling it calls os.system."""

    def __init__(self, witness: Path) -> None:
        self.witness = witness

    def __reduce__(self):
        return os.system, (f"touch {self.witness}",)


def test_e_a_checkpoint_that_pickles_code_is_not_trusted_and_never_told_to_allow_list_it(
    tmp_path: Path,
) -> None:
    """It said "allow-list them with torch.serialization.add_safe_globals([...])": impossible from the
    command line, and an invitation to allow-list posix.system."""
    from lit_ddp.preflight.checkpoint_file import load_checkpoint_file

    crafted, witness = tmp_path / "crafted.ckpt", tmp_path / "ran"
    torch.save({"state_dict": {}, "hyper_parameters": {"x": RunsACommand(witness)}}, crafted)
    with pytest.raises(UserError) as refused:
        load_checkpoint_file(crafted)
    assert str(refused.value) == (
        f"checkpoint {crafted} is not trusted: it holds pickled code or objects that lit_ddp does not load"
        f" ({os.system.__module__}.system), which no lit_ddp or Lightning run writes, and nothing in it was"
        " run: pass --ckpt_path=PATH to a checkpoint that a run wrote"
    )
    assert not witness.exists()


@pytest.mark.parametrize(
    "content",
    [b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(64), b"not a checkpoint\n", "zip"],
    ids=["jpeg", "text", "zip-of-other-files"],
)
def test_e_a_file_that_is_not_a_checkpoint_is_named_as_such(tmp_path: Path, content) -> None:
    """A JPEG passed as --ckpt_path was 'corrupt or truncated', as if a checkpoint had been damaged."""
    import zipfile

    from lit_ddp.preflight.checkpoint_file import load_checkpoint_file

    path = tmp_path / "photo.jpg"
    if content == "zip":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("images/cat.jpg", b"\xff\xd8\xff")
    else:
        path.write_bytes(content)
    with pytest.raises(UserError) as refused:
        load_checkpoint_file(path)
    assert str(refused.value) == (
        f"{path} is not a checkpoint (not a file torch.save writes): pass --ckpt_path=PATH to a .ckpt that a"
        " run wrote"
    )


# ---- f: impossible launch arguments ----------------------------------------------------------------


@pytest.mark.ddp
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--trainer.accelerator=gpu"],
            "lit_ddp: error: --trainer.accelerator=gpu, but this machine has no CUDA GPU",
        ),
        (["--data.batch_size=0"], "lit_ddp: error: batch_size=0 must be at least 1"),
        (
            ["--trainer.strategy=fsdp"],
            "lit_ddp: error: --trainer.strategy=fsdp shards the model across CUDA GPUs, and this machine has",
        ),
        (["--trainer.strategy=dpp"], "lit_ddp: error: You selected an invalid strategy name: `strategy='dp"),
        # Lightning's MisconfigurationException line did not name the option.
        (
            ["--trainer.gradient_clip_algorithm=nrom", "--trainer.gradient_clip_val=1"],
            "lit_ddp: error: --trainer.gradient_clip_algorithm=nrom is not a clipping algorithm: pass one of",
        ),
        (["--trainer.no_such_key=1"], "no_such_key"),
        (
            ["--resilience.check_every_n_batches=0"],
            "lit_ddp: error: --resilience.check_every_n_batches=0 must be 1 or more",
        ),
    ],
)
def test_f_impossible_arguments_fail_once_before_any_process_is_spawned(
    tmp_path: Path, args: list[str], message: str
) -> None:
    if ("gpu" in args[0] or "fsdp" in args[0]) and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = run_cli([*DDP_FIT, *args], cwd=tmp_path, env=ENV, timeout=120)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert "Initializing distributed" not in result.stdout + result.stderr
    assert not (tmp_path / "logs").exists()


def test_lightnings_per_batch_stop_broadcast_is_off_while_training_and_restored_after(tmp_path: Path) -> None:
    """PreemptionCheckpoint replaces Lightning's per-batch broadcast of rank 0's stop flag (a blocking
    collective that carries nothing once the callback owns the signals) only while training runs, and gives
    back the SIGUSR1 handler it records with from set-up on."""
    import lightning as L

    from lit_ddp.data import ShapesDataModule
    from lit_ddp.models import LeNetCIFAR
    from lit_ddp.runtime.preemption import PreemptionCheckpoint

    seen = []

    class Probe(L.Callback):
        def on_train_batch_start(self, trainer, *args) -> None:
            seen.append("_broadcast_sigterm_tensor" in vars(trainer.fit_loop.epoch_loop))

    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[PreemptionCheckpoint(), Probe()],
    )
    before = signal.getsignal(signal.SIGUSR1)
    trainer.fit(LeNetCIFAR(), datamodule=ShapesDataModule(train_size=64, val_size=16, batch_size=32))
    assert seen == [True, True]
    assert signal.getsignal(signal.SIGUSR1) == before
    assert "_broadcast_sigterm_tensor" not in vars(trainer.fit_loop.epoch_loop)


@pytest.mark.parametrize("stop", ["EarlyStopping", "max_epochs"])
def test_a_stop_signal_as_the_fit_ends_says_it_completes_and_does_not_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    """SIGUSR1 in the epoch whose end EarlyStopping stops the fit at: it said "stopped by SIGUSR1 ...; resume
    with --ckpt_path=last" and requeued a SLURM job, whose resume trained an epoch the uninterrupted run did
    not. The fit was ending anyway (should_stop set): it completes, as after the run's last epoch."""
    import lightning as L
    from lightning.pytorch.callbacks import EarlyStopping
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from lit_ddp.data import ShapesDataModule
    from lit_ddp.models import LeNetCIFAR
    from lit_ddp.runtime import preemption

    lines, requeued = [], []
    monkeypatch.setattr(preemption, "rank_zero_info", lines.append)
    monkeypatch.setattr(preemption, "_requeue_slurm_job", lambda: requeued.append(True))

    class SignalInLastBatch(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
            if trainer.current_epoch == 0 and batch_idx == trainer.num_training_batches - 1:
                os.kill(os.getpid(), signal.SIGUSR1)

    ends = {  # each ends the fit at epoch 0's end
        "EarlyStopping": [
            EarlyStopping("train/loss_epoch", stopping_threshold=1e9, check_on_train_epoch_end=True)
        ],
        "max_epochs": [],
    }[stop]
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=3 if stop == "EarlyStopping" else 1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[preemption.PreemptionCheckpoint(signal.SIGUSR1), SignalInLastBatch(), *ends],
    )
    with pytest.raises(SIGTERMException):
        trainer.fit(LeNetCIFAR(), datamodule=ShapesDataModule(train_size=64, val_size=16, batch_size=32))
    assert trainer.global_step == 2  # the whole first epoch
    assert lines == [
        f"lit_ddp: SIGUSR1 came after the run's last training step, step 2: the fit is complete, saved"
        f" {tmp_path / 'last.ckpt'}"
    ]
    assert not requeued


@pytest.mark.parametrize("at", ["on_fit_start", "on_train_batch_end"])
def test_a_failed_fit_gives_back_the_sigusr1_handler_of_before_its_set_up(tmp_path: Path, at: str) -> None:
    """A fit that failed (a refusal, a bug in a callback) left PreemptionCheckpoint's SIGUSR1 recorder
    installed in the process (a notebook, lit_ddp.testing): no callback teardown runs after a failure, and
    Lightning's own, after it, put back the recorder it had found. Failed before Lightning installs its
    handlers (on_fit_start) and after (in training), the handler of before the fit is back."""
    import lightning as L

    from lit_ddp.data import ShapesDataModule
    from lit_ddp.models import LeNetCIFAR
    from lit_ddp.runtime.preemption import PreemptionCheckpoint

    class Fails(L.Callback):
        def on_fit_start(self, *args) -> None:
            if at == "on_fit_start":
                raise UserError("refused")

        def on_train_batch_end(self, *args) -> None:
            if at == "on_train_batch_end":
                raise UserError("refused")

    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[PreemptionCheckpoint(), Fails()],
    )
    mine = lambda signum, frame: None  # noqa: E731
    before = signal.signal(signal.SIGUSR1, mine)
    try:
        with pytest.raises(UserError, match="refused"):
            trainer.fit(LeNetCIFAR(), datamodule=ShapesDataModule(train_size=64, val_size=16, batch_size=32))
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_the_process_group_is_destroyed_at_exit_once_per_process(atexit_handlers: list) -> None:
    from lit_ddp.runtime import faults

    for _ in range(3):  # e.g. fit then test in one process
        faults.destroy_process_group_at_exit()
    assert atexit_handlers == [faults._destroy_process_group]
    atexit_handlers[0]()  # nothing initialised in this process: a no-op, not an error


def test_lightnings_child_observer_names_the_lost_rank_before_it_kills_the_job(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Lightning's observer thread may find a dead child before the main thread fails: it still says so,
    and the job ends with exit 1, as when the main thread reports it, not by a SIGKILL of rank 0 itself
    (137 in a shell: an out-of-memory kill's mark). After rank 0 killed a stuck rank on purpose, the observer
    racing its exit made the job's code -9 or 1 depending on the machine's load."""
    import threading

    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    from lit_ddp.compat import replace_child_observer_kill
    from lit_ddp.runtime import faults

    dead = subprocess.Popen(["sh", "-c", "kill -9 $$"])
    dead.wait()
    launcher = type("Launcher", (), {"procs": [dead]})()
    observer = _ChildProcessObserver(main_pid=os.getpid(), child_processes=launcher.procs)
    killed = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append((pid, sig)))  # Lightning's SIGKILL of us
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.setattr(threading, "enumerate", lambda: [observer])
    monitor = faults.FaultMonitor()
    assert replace_child_observer_kill(launcher.procs, lambda: monitor._end_job(launcher.procs))
    observer._run()  # what the thread does every 5 s
    assert (exits, killed) == ([1], [])
    err = capsys.readouterr().err
    assert err == f"lit_ddp: error: lost rank 1 (pid {dead.pid}, killed by SIGKILL); the job stops\n"
    monitor.report.print_once()  # the main thread's own report (cli.main) does not repeat it
    assert capsys.readouterr().err == ""
    assert monitor.report.message == f"lost rank 1 (pid {dead.pid}, killed by SIGKILL); the job stops"


# What a 2-process gloo group raises on the surviving rank (torch 2.14.1): a plain RuntimeError, text only.
_GLOO_FAILURE = """
import datetime, os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, mode, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=2))
    dist.all_reduce(torch.ones(1))
    if rank == 1:
        os._exit(9) if mode == "peer_lost" else time.sleep(6)
        os._exit(0)
    try:
        dist.all_reduce(torch.ones(1000))
    except BaseException as e:
        print(type(e).__name__ + "|" + str(e).splitlines()[0], flush=True)
    os._exit(0)
ctx = mp.start_processes(run, args=(sys.argv[1], int(sys.argv[2])), nprocs=2, join=False, start_method="fork")
for p in ctx.processes:
    p.join(20)
"""


@pytest.mark.ddp
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["peer_lost", "timed_out"])
def test_gloos_own_failure_messages_are_classified(tmp_path: Path, mode: str) -> None:
    """gloo gives only text: each message lit_ddp reads (faults.GLOO_PEER_CLOSED, GLOO_TIMED_OUT) is produced
    here by the installed torch's gloo, so a reworded one fails this test."""
    import socket

    from lit_ddp.runtime import faults

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = run_python(["-c", _GLOO_FAILURE, mode, str(port)], capture_output=True, text=True, timeout=90)
    kind, _, text = out.stdout.strip().partition("|")
    assert kind == "RuntimeError", out.stdout + out.stderr[-2000:]
    error = RuntimeError(text)
    assert faults.is_peer_failure(error) == (mode == "peer_lost"), text
    assert faults.is_timeout(error) == (mode == "timed_out"), text


def test_failures_are_classified_by_type_and_errno_before_any_text() -> None:
    import errno

    from torch.distributed import DistNetworkError, DistStoreError

    from lit_ddp.runtime import faults

    for peer in (
        ConnectionResetError(errno.ECONNRESET, "reset"),
        BrokenPipeError(),
        OSError(errno.ECONNREFUSED, "refused"),
        DistNetworkError("x"),
    ):
        assert faults.is_peer_failure(peer) and not faults.is_timeout(peer), peer
    for timeout in (TimeoutError(), DistStoreError("x")):
        assert faults.is_timeout(timeout) and not faults.is_peer_failure(timeout), timeout
    wrapped = RuntimeError("Lightning's own words")
    wrapped.__cause__ = ConnectionResetError(errno.ECONNRESET, "reset")
    assert faults.is_peer_failure(wrapped)
    # Text is read from gloo's plain RuntimeError only: another library's words decide nothing.
    assert not faults.is_timeout(ValueError("timed out")) and not faults.is_peer_failure(OSError("peer"))
    assert not faults.is_timeout(RuntimeError("the batch timed out waiting for a timeout"))


def test_the_lost_rank_report_travels_with_a_pickled_monitor() -> None:
    """ddp_spawn pickles the callbacks into its ranks: the report (and its lock) survive the trip."""
    import pickle

    from lit_ddp.runtime import faults

    monitor = faults.FaultMonitor()
    monitor.report.message = "lost rank 1"
    copy = pickle.loads(pickle.dumps(monitor))
    assert copy.report.message == "lost rank 1" and copy.report is not monitor.report


class _Stub:
    """The few Trainer attributes NanGuard reads, for precision plugins a CPU cannot run (16-mixed)."""

    def __init__(self, scaler: object | None) -> None:
        from types import SimpleNamespace

        self.precision_plugin = SimpleNamespace(scaler=scaler)
        self.callback_metrics: dict = {}
        self.fit_loop = SimpleNamespace(
            epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(current=SimpleNamespace(ready=1)))
        )
        self.global_step, self.current_epoch = 0, 0
        self.checkpoint_callbacks: list = []
        self.default_root_dir = "."


def _optimizer_with_grads(*grads: torch.Tensor) -> torch.optim.Optimizer:
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    return torch.optim.SGD(params, lr=0.1)


def test_d_nan_guard_leaves_overflow_to_the_grad_scaler_until_it_persists() -> None:
    from lit_ddp.runtime.nan_guard import NanGuard, NonFiniteLossError

    guard = NanGuard(max_skipped_steps=3)
    overflow = _optimizer_with_grads(torch.tensor([1.0, float("inf")]))
    finite = _optimizer_with_grads(torch.tensor([1.0, 2.0]))
    scaled = _Stub(scaler=object())
    guard.on_before_optimizer_step(scaled, None, overflow)  # skipped by the scaler: not an error
    guard.on_before_optimizer_step(scaled, None, overflow)
    guard.on_before_optimizer_step(scaled, None, finite)  # a good step ends the streak
    guard.on_before_optimizer_step(scaled, None, overflow)
    guard.on_before_optimizer_step(scaled, None, overflow)
    with pytest.raises(NonFiniteLossError, match="for 3 steps in a row \\(the GradScaler skipped them\\)"):
        guard.on_before_optimizer_step(scaled, None, overflow)
    with pytest.raises(NonFiniteLossError, match="^non-finite loss or gradients at step 0"):
        NanGuard().on_before_optimizer_step(_Stub(scaler=None), None, overflow)  # no scaler: at once


def test_d_nan_guard_read_next_step_names_the_bad_step_one_step_later_and_before_any_checkpoint() -> None:
    """The CUDA mode (no device sync per step), run on CPU: the verdict of step 5 is read at step 6, or by a
    checkpoint write before that."""
    from lit_ddp.runtime.nan_guard import NanGuard, NonFiniteLossError

    overflow = _optimizer_with_grads(torch.tensor([1.0, float("nan")]))
    finite = _optimizer_with_grads(torch.tensor([1.0, 2.0]))
    trainer = _Stub(scaler=None)
    guard = NanGuard(read="next_step")
    guard.on_before_optimizer_step(trainer, None, finite)
    trainer.global_step = 5
    guard.on_before_optimizer_step(trainer, None, overflow)  # not read yet: no stall, no error
    trainer.global_step = 6
    late = "training stopped one step later, and no checkpoint holds that update"
    with pytest.raises(NonFiniteLossError, match=rf"^non-finite loss or gradients at step 5 .*{late}"):
        guard.on_before_optimizer_step(trainer, None, finite)
    guard.on_before_optimizer_step(trainer, None, overflow)
    with pytest.raises(NonFiniteLossError, match="at step 6"):
        guard.on_save_checkpoint(trainer, None, {})


@pytest.mark.timeout(300)
def test_d_nan_guard_read_next_step_at_an_epochs_last_batch_writes_no_checkpoint(tmp_path: Path) -> None:
    """NaN weights at the last step of epoch 0 (8 steps on one device): the epoch-end checkpoint would
    hold that update, and is not written."""
    from lit_ddp.runtime.nan_guard import NonFiniteLossError

    args = ["fit", *TINY_SHAPES, "--trainer.max_epochs=2", "--trainer.accelerator=cpu", "--trainer.devices=1"]
    args += ["--resilience.nan_read=next_step", f"--trainer.default_root_dir={tmp_path}"]
    with pytest.raises(NonFiniteLossError, match=r"at step 7 \(epoch 1, batch 8\).*no checkpoint was saved"):
        build_cli([*args, *fault(tmp_path / "probe", "nan", rank=0, at_step=7)])
    assert not list(tmp_path.rglob("*.ckpt"))
    assert batches(tmp_path / "probe")[-1][1] == 7  # no step after the bad one's next


def test_d_nan_guard_passes_large_finite_half_precision_gradients() -> None:
    """16-true: a norm of finite fp16 gradients can overflow (sqrt of a sum of squares > 65504); the
    guard's largest-magnitude check cannot."""
    from lit_ddp.runtime.nan_guard import NanGuard

    big = torch.full((1000,), 60000.0, dtype=torch.float16)
    assert not torch.isfinite(torch.nn.utils.get_total_norm([big]))  # what a 2-norm check would see
    NanGuard().on_before_optimizer_step(_Stub(scaler=None), None, _optimizer_with_grads(big))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_d_nan_guard_catches_any_non_finite_gradient_and_passes_large_finite_ones(dtype) -> None:
    """Each dtype's check (the 2-norm for fp32 and bf16, the inf-norm for fp16): a single NaN, inf or -inf
    among finite gradients stops; the largest finite gradients that leave the optimizer's squares finite
    do not."""
    from lit_ddp.runtime.nan_guard import NanGuard, NonFiniteLossError

    large = {torch.float32: 1e15, torch.bfloat16: 1e15, torch.float16: 60000.0}[dtype]
    finite = torch.full((4096,), large, dtype=dtype)
    NanGuard().on_before_optimizer_step(_Stub(scaler=None), None, _optimizer_with_grads(finite, -finite))
    for bad in (float("nan"), float("inf"), float("-inf")):
        grads = torch.ones(4096, dtype=dtype)
        grads[1234] = bad
        optimizer = _optimizer_with_grads(finite, grads)
        with pytest.raises(NonFiniteLossError, match="^non-finite loss or gradients"):
            NanGuard().on_before_optimizer_step(_Stub(scaler=None), None, optimizer)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_d_nan_guards_cpu_norm_is_torchs_total_norm(norm_type: float) -> None:
    """On a CPU the guard takes the norm of the gradients' norms itself, tensor by tensor: the value
    get_total_norm gives, for the shapes and dtypes of a model's gradients, and NaN where it gives NaN."""
    from lit_ddp.runtime.nan_guard import _total_norm

    g = torch.Generator().manual_seed(0)
    torchs = torch.nn.utils.get_total_norm
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        shapes = ((6, 3, 5, 5), (6,), (120, 400), (10,))  # LeNet's kinds of parameters
        grads = [torch.randn(shape, generator=g).to(dtype) for shape in shapes]
        torch.testing.assert_close(_total_norm(grads, norm_type), torchs(grads, norm_type))
        grads[2][7, 11] = float("nan")
        assert _total_norm(grads, norm_type).isnan() and torchs(grads, norm_type).isnan()


def test_d_clipping_under_mixed_precision_gets_an_unfused_optimizer() -> None:
    from lit_ddp.errors import UserError
    from lit_ddp.models import LeNet, OptimConfig
    from lit_ddp.models.optim import build_optimizer

    net = LeNet()
    assert build_optimizer(net, OptimConfig(), 64, 100, 10)[0].defaults["fused"]
    assert not build_optimizer(net, OptimConfig(), 64, 100, 10, clips_under_amp=True)[0].defaults["fused"]
    with pytest.raises(UserError, match="fused=true cannot be combined with --trainer.gradient_clip_val"):
        build_optimizer(net, OptimConfig(fused=True), 64, 100, 10, clips_under_amp=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_d_nan_guards_host_check_on_a_cpu_agrees_with_the_2_norm(dtype) -> None:
    """Read at once on a CPU, fp32 and fp64 gradients are judged by their sum of squares in numpy: finite
    where the 2-norm is, for a model's shapes, with a NaN, ±inf, or gradients whose 2-norm overflows; other
    dtypes and devices go to the 2-norm (None)."""
    from lit_ddp.runtime.nan_guard import _finite_on_cpu, _total_norm

    g = torch.Generator().manual_seed(0)
    shapes = ((6, 3, 5, 5), (6,), (120, 400), (10,))
    for bad in (None, float("nan"), float("inf"), float("-inf"), 1e18):
        grads = [torch.randn(shape, generator=g).to(dtype) for shape in shapes]
        if bad is not None:
            grads[2][7] = bad  # a row: 400 gradients of 1e18 overflow fp32's 2-norm, not fp64's
        assert _finite_on_cpu(grads) == math.isfinite(_total_norm(grads, 2.0).item()), bad
    with_graph = torch.full((3,), float("nan"), dtype=dtype, requires_grad=True)  # create_graph's gradients
    assert _finite_on_cpu([torch.ones(3, dtype=dtype), with_graph]) is False
    assert _finite_on_cpu([torch.ones(3, dtype=torch.bfloat16)]) is None
    assert _finite_on_cpu([torch.ones(3, dtype=torch.float16)]) is None
    assert _finite_on_cpu([torch.ones(3), torch.ones(3, dtype=torch.bfloat16)]) is None
