"""Every file lit_ddp writes goes through writes.py: whole or not at all, and one line on a full or read-only
disk naming the file and the fix (docs/faults.md lists the writers).

A full disk is made without privileges by a file size limit (RLIMIT_FSIZE, in a subprocess: the kernel's
EFBIG); a read-only one by the writer's own ``open`` failing with EROFS (a hook: CI runs as root, which
writes through a chmod, and mounting needs privileges the CI container lacks)."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_RUN, cli_env

from lit_ddp import writes
from lit_ddp.callbacks.predictions import PredictionWriter
from lit_ddp.callbacks.sinks import FileSink
from lit_ddp.runtime.checkpoint_io import AtomicCheckpointIO
from lit_ddp.writes import WriteError, write_file

FULL_DISK = """
import resource, sys
from lit_ddp.writes import WriteError, write_file

write_file(sys.argv[1], b"old", "the test file")
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # Python ignores SIGXFSZ: the write fails (EFBIG)
try:
    write_file(sys.argv[1], b"x" * 100_000, "the test file")
except WriteError as err:
    print(err)
"""


def test_a_full_disk_is_one_line_and_the_previous_file_stays_whole(tmp_path: Path) -> None:
    path = tmp_path / "out" / "file.bin"
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(path)],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert result.stdout.splitlines() == [
        f"could not write the test file {path} ({os.strerror(errno.EFBIG)}): raise the file size limit"
        " (ulimit -f), then run it again"
    ]
    assert path.read_bytes() == b"old" and [p.name for p in path.parent.iterdir()] == ["file.bin"]


@pytest.fixture
def read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file the shared writer opens is on a read-only file system."""

    def refuse(file, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))

    monkeypatch.setattr(writes, "open", refuse, raising=False)


def test_a_read_only_disk_is_one_line_naming_the_file(tmp_path: Path, read_only) -> None:
    with pytest.raises(WriteError) as err:
        write_file(tmp_path / "a.txt", "text", "the test file")
    assert str(err.value) == (
        f"could not write the test file {tmp_path / 'a.txt'} ({os.strerror(errno.EROFS)}): remount it"
        " writable or pass --trainer.default_root_dir on a writable disk, then run it again"
    )
    assert list(tmp_path.iterdir()) == []


def test_predictions_and_dashboard_files_go_through_the_shared_writer(tmp_path: Path, read_only) -> None:
    """predictions.csv and the dashboard's files were OSError tracebacks on a read-only or full disk."""
    rows = {key: torch.zeros(2, dtype=torch.long) for key in ("index", "classes", "target")}
    rows["probs"] = torch.ones(2)
    rows["classes"], rows["probs"] = rows["classes"][:, None], rows["probs"][:, None]
    with pytest.raises(WriteError, match=r"could not write predictions .*predictions\.csv \(Read-only"):
        PredictionWriter()._write(tmp_path / "predictions.csv", rows, None)
    sink = FileSink(logger=None, directory=tmp_path)
    with pytest.raises(
        WriteError, match=r"could not write the dashboard file .*dashboard/val/t/step_0000003\.md"
    ):
        sink.text("val/t", "| a |", 3)
    with pytest.raises(WriteError, match=r"\.png \(Read-only"):
        sink.image("train/batch", torch.zeros(3, 4, 4, dtype=torch.uint8), 3)
    assert not list(tmp_path.rglob("*.*"))


def test_a_checkpoint_goes_through_the_shared_writer(tmp_path: Path, read_only) -> None:
    with pytest.raises(Exception, match=r"could not write checkpoint .*last\.ckpt \(Read-only") as err:
        AtomicCheckpointIO().save_checkpoint({"state_dict": {}}, tmp_path / "checkpoints" / "last.ckpt")
    assert "run it again" in str(err.value)


def test_the_runs_config_goes_through_the_shared_writer(tmp_path: Path, read_only, capsys) -> None:
    """config.yaml, the first file a run writes: an OSError traceback from jsonargparse's writer."""
    from lit_ddp.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY_RUN, "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("lit_ddp: error: could not write the run's config ") and "config.yaml" in err
