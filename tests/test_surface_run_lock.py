"""One run at a time in a run directory (TensorBoard's, an MLflow or W&B run's): a second
`fit --ckpt_path=last` on it refuses in one line."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY_RUN, WITH_PROBES, cli_env, python
from test_mistakes import one_error_line
from test_wandb import OFFLINE, offline_files, offline_wandb  # noqa: F401 (a fixture)

from lit_ddp.cli import build_cli, main
from lit_ddp.errors import UserError
from lit_ddp.runtime.run_lock import RunLock, lock_path

HOLD = (
    "import sys, time; from lit_ddp.runtime.run_lock import RunLock;"
    " RunLock(sys.argv[1]).acquire(); time.sleep(300)"
)


def _holder(run_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = python(["-c", HOLD, str(run_dir)], env=env)  # forked (conftest.python): no import of torch
    deadline = time.monotonic() + 120
    while not lock_path(run_dir).exists():
        assert holder.poll() is None and time.monotonic() < deadline, "the holder did not take the lock"
        time.sleep(0.2)
    return holder


def test_a_second_run_on_a_held_run_directory_refuses_and_a_dead_holder_does_not_block(
    tmp_path: Path, capsys
) -> None:
    """Two `fit --ckpt_path=last` on one root both resumed version_0: one run's final state was lost, and
    the folder held two event files."""
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", *TINY_RUN, "--trainer.limit_val_batches=1", root])
    run_dir = tmp_path / "lightning_logs" / "version_0"
    assert not lock_path(run_dir).exists()  # released when the run ends
    holder = _holder(run_dir)  # another process, running on version_0
    try:
        argv = [
            "fit",
            *TINY_RUN,
            "--trainer.max_epochs=2",
            "--trainer.limit_val_batches=1",
            "--ckpt_path=last",
            root,
        ]
        line = one_error_line(capsys, argv)
        assert line == (
            f"{run_dir} is in use by another run (pid {holder.pid}): wait for it to finish, or give this run"
            " another --trainer.default_root_dir"
        )
        assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding the lock: a stale lock is left behind
        holder.wait()
    assert lock_path(run_dir).exists()
    cli = build_cli(argv)
    assert cli.trainer.current_epoch == 2 and Path(cli.trainer.log_dir) == run_dir
    assert not lock_path(run_dir).exists()


def test_a_run_refused_after_its_logger_was_made_leaves_no_folder_it_made(tmp_path: Path, capsys) -> None:
    """A run refused once its logger was made (here by its data module's setup: a batch larger than the
    training set) removed its run folder and the logger's, but left the folders above them that it had made
    (the root, logs/, empty). A folder that was there before stays, empty as it was."""
    kept = tmp_path / "kept"
    kept.mkdir()
    for root in (tmp_path / "new" / "logs", kept):
        argv = ["fit", *TINY_RUN, "--data.batch_size=100", f"--trainer.default_root_dir={root}"]
        assert one_error_line(capsys, argv).startswith("--data.batch_size=100 is more than the 64 training")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    assert not any(kept.iterdir())


def test_a_run_without_a_logger_refused_at_its_first_step_leaves_no_config_or_folder_it_made(
    tmp_path: Path, capsys
) -> None:
    """Without a logger a fit writes its config.yaml into its root folder once its training loader is built:
    refused after that (a non-finite loss at its first step, before any update), it left the config and the
    folders it had made for it (new/logs/), where a run with a logger leaves nothing. A root that was there
    before stays, without the config."""
    kept = tmp_path / "kept"
    kept.mkdir()
    nan = [
        "--trainer.callbacks+=fault_probe.Fault",
        "--trainer.callbacks.action=nan",
        "--trainer.callbacks.at_step=0",
    ]
    for root in (tmp_path / "new" / "logs", kept):
        argv = ["fit", *TINY_RUN, *nan, "--trainer.logger=false", f"--trainer.default_root_dir={root}"]
        assert one_error_line(capsys, argv).startswith("non-finite loss or gradients at step 0")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    assert not any(kept.iterdir())


def test_a_run_without_a_logger_refused_at_its_first_step_puts_back_the_config_it_wrote_over(
    tmp_path: Path, capsys
) -> None:
    """Runs without a logger share their root folder's config.yaml: one refused at its first step (before
    any update) wrote its own config over the earlier run's and left it there, so the root's config no longer
    named the run whose checkpoints lie beside it."""
    root = tmp_path / "logs"
    earlier = ["fit", *TINY_RUN, "--trainer.logger=false", f"--trainer.default_root_dir={root}"]
    main([*earlier, "--trainer.max_steps=1"])
    config = root / "config.yaml"
    before = config.read_bytes()
    nan = [
        "--trainer.callbacks+=fault_probe.Fault",
        "--trainer.callbacks.action=nan",
        "--trainer.callbacks.at_step=0",
    ]
    refused = [*earlier, *nan, "--seed_everything=123", "--data.batch_size=4"]
    assert one_error_line(capsys, refused).startswith("non-finite loss or gradients at step 0")
    assert config.read_bytes() == before


def test_a_lock_from_another_host_names_the_file_to_delete(tmp_path: Path) -> None:
    run_dir = tmp_path / "version_0"
    lock_path(run_dir).write_text('{"pid": 1, "host": "another-node"}')
    with pytest.raises(
        UserError, match=r"in use by another run \(pid 1 on another-node\) \(if no run is going"
    ):
        RunLock(run_dir).acquire()


def _fit(argv: list[str], cwd: Path, name: str) -> tuple[subprocess.Popen, Path]:
    """``python -m lit_ddp fit ARGV`` started in the background; its stderr goes to ``cwd/<name>.err``."""
    err = cwd / f"{name}.err"
    with open(err, "w") as f:
        proc = python(  # forked (conftest.python): it starts without importing torch again
            ["-m", "lit_ddp", "fit", *argv],
            cwd=cwd,
            env=cli_env(WITH_PROBES),
            stdout=subprocess.DEVNULL,
            stderr=f,
        )
    return proc, err


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_real_resumes_on_one_root_at_once_one_refuses_and_the_other_finishes(tmp_path: Path) -> None:
    """Two `fit --ckpt_path=last` processes started together on one root: before the lock both resumed
    version_0 and wrote into it (two event files, one run's final state gone). Now exactly one refuses in one
    line, the other trains on; each is held at the start of training (gate_probe) until the test has seen
    the refusal, so they overlap whatever the machine's load."""
    root = tmp_path / "runs"
    base = [*TINY_RUN, "--trainer.limit_val_batches=1", f"--trainer.default_root_dir={root}"]
    build_cli(["fit", *base])  # version_0: one epoch, last.ckpt
    run_dir = root / "lightning_logs" / "version_0"
    events = set(run_dir.glob("events.out.tfevents.*"))
    gate = tmp_path / "open"
    argv = [
        *base,
        "--trainer.max_epochs=3",
        "--ckpt_path=last",
        "--trainer.callbacks+=gate_probe.Gate",
        f"--trainer.callbacks.open_when={gate}",
        "--trainer.callbacks.timeout_s=500",  # past the wait below: a run that did not refuse is reported so
    ]
    procs = [_fit(argv, tmp_path, name) for name in ("a", "b")]
    try:
        deadline = time.monotonic() + 400
        while all(p.poll() is None for p, _ in procs):
            assert time.monotonic() < deadline, "neither run refused: both are training on version_0"
            time.sleep(0.2)
        (refused, refused_err), (winner, winner_err) = sorted(procs, key=lambda p: p[0].poll() is None)
        assert winner.poll() is None, "both runs ended before the gate opened"
        gate.touch()
        assert winner.wait(timeout=400) == 0, winner_err.read_text()[-3000:]
    finally:
        gate.touch()
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    err = refused_err.read_text()
    assert refused.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"lit_ddp: error: {run_dir} is in use by another run (pid {winner.pid}): wait for it to finish, or"
        " give this run another --trainer.default_root_dir"
    )
    assert sorted(p.name for p in (root / "lightning_logs").iterdir()) == ["version_0"]
    assert len(set(run_dir.glob("events.out.tfevents.*")) - events) == 1  # the winner's, and no other
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["epoch"] == 2 and state["global_step"] == 6  # the winner's final state: 3 epochs × 2 steps
    assert not lock_path(run_dir).exists()


def _snapshot(folder: Path) -> dict:
    """Each file under ``folder``, by its path there, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _wandb_runs(wandb_dir: Path) -> dict:
    """Each W&B run folder under ``wandb_dir`` with its files, but for W&B's own debug logs (``logs/``, and
    the links to them beside the runs), which its background process may append to after a run finished."""
    runs = sorted(p for p in wandb_dir.iterdir() if p.is_dir() and not p.is_symlink())
    return {
        run.name: {name: data for name, data in _snapshot(run).items() if Path(name).parts[0] != "logs"}
        for run in runs
    }


@pytest.mark.timeout(300)
def test_a_resume_of_an_mlflow_run_held_by_another_process_refuses_and_leaves_the_run_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Two `fit --ckpt_path=last` of one MLflow run both went on in it, unlocked: the same checkpoints/ and
    the same MLflow run, one run's final state lost. Its folder (on a file store MLflow's own run folder) is
    held as a TensorBoard run's is, and MLflow still lists the experiment's runs beside the lock."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in to a file store
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    logger = ["--trainer.logger=MLFlowLogger", f"--trainer.logger.init_args.tracking_uri={store.as_uri()}"]
    base = [
        "fit",
        *TINY_RUN,
        "--trainer.limit_val_batches=1",
        *logger,
        f"--trainer.default_root_dir={tmp_path}",
    ]
    run_dir = Path(build_cli(base).trainer.checkpoint_callback.dirpath).parent
    assert run_dir.parent.parent == store and not lock_path(run_dir).exists()  # released when the run ends
    client = MlflowClient(store.as_uri())
    experiment = run_dir.parent.name

    def tracker_run() -> tuple:
        (run,) = client.search_runs([experiment])  # one MLflow run: taking the lock started no other
        history = client.get_metric_history(run.info.run_id, "val/acc")
        return run.info.run_id, run.info.status, run.info.end_time, run.data.params, history

    before = tracker_run(), _snapshot(run_dir)
    assert before[0][0] == run_dir.name
    holder = _holder(run_dir)
    resume = [*base, "--trainer.max_epochs=2", "--ckpt_path=last"]
    try:
        assert (tracker_run(), _snapshot(run_dir)) == before  # the lock disturbs no listing of the store
        line = one_error_line(capsys, resume)
        assert line == (
            f"{run_dir} is in use by another run (pid {holder.pid}): wait for it to finish, or start a new"
            f" MLflow run: both would log into run {run_dir.name}"
        )
        assert (tracker_run(), _snapshot(run_dir)) == before
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding the lock: a stale lock is left behind
        holder.wait()
    assert lock_path(run_dir).exists()
    resumed = build_cli(resume)
    assert resumed.trainer.current_epoch == 2 and resumed.trainer.logger.run_id == run_dir.name
    assert not lock_path(run_dir).exists()
    assert [m.step for m in tracker_run()[-1]] == [1, 3]  # both epochs in the one MLflow run


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("offline_wandb")
def test_a_resume_of_a_wandb_run_held_by_another_process_refuses_and_leaves_the_run_as_it_was(
    tmp_path: Path, capsys
) -> None:
    """As with MLflow: a resumed W&B run goes on in the same run id and the same checkpoints/."""
    import wandb

    logs = tmp_path / "logs"
    base = ["fit", *TINY_RUN, "--trainer.limit_val_batches=1", *OFFLINE, f"--trainer.default_root_dir={logs}"]
    first = build_cli(base)
    # W&B's service goes on writing the run's .wandb file after finish() returns: its exit is when it is done.
    wandb.finish()
    wandb.teardown()
    os.environ.pop("WANDB_SERVICE", None)  # its address: the resume below starts a service of its own
    capsys.readouterr()  # what W&B printed of that run
    run_id = first.trainer.logger.version
    run_dir = logs / "lightning_logs" / run_id
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and not lock_path(run_dir).exists()
    before = _snapshot(run_dir), _wandb_runs(logs / "wandb")
    holder = _holder(run_dir)
    resume = [*base, "--trainer.max_epochs=2", "--ckpt_path=last"]
    try:
        line = one_error_line(capsys, resume)
        assert line == (
            f"{run_dir} is in use by another run (pid {holder.pid}): wait for it to finish, or start a new"
            f" W&B run: both would log into run {run_id}"
        )
        assert (_snapshot(run_dir), _wandb_runs(logs / "wandb")) == before  # no W&B run was started
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    resumed = build_cli(resume)
    wandb.finish()
    assert resumed.trainer.current_epoch == 2 and resumed.trainer.logger.version == run_id
    assert not lock_path(run_dir).exists() and len(offline_files(logs, run_id)) == 2
