"""One run at a time in a run directory: a second `fit --ckpt_path=last` on it refuses in one line."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, TINY_RUN
from test_mistakes import one_error_line

from lit_ddp.cli import build_cli
from lit_ddp.errors import UserError
from lit_ddp.runtime.run_lock import RunLock, lock_path

HOLD = (
    "import sys, time; from lit_ddp.runtime.run_lock import RunLock;"
    " RunLock(sys.argv[1]).acquire(); time.sleep(300)"
)


def _holder(run_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], env=env)
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


def test_a_lock_from_another_host_names_the_file_to_delete(tmp_path: Path) -> None:
    run_dir = tmp_path / "version_0"
    lock_path(run_dir).write_text('{"pid": 1, "host": "another-node"}')
    with pytest.raises(
        UserError, match=r"in use by another run \(pid 1 on another-node\) \(if no run is going"
    ):
        RunLock(run_dir).acquire()
