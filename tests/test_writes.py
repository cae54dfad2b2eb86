"""Every file lit_ddp writes goes through writes.py: whole or not at all, and one line on a full or read-only
disk naming the file and the fix (docs/faults.md lists the writers).

A full disk is made without privileges by a file size limit (RLIMIT_FSIZE: the kernel's EFBIG, in a
subprocess or, lowered for one call, in this process: Python ignores SIGXFSZ); a read-only one by the
writer's own ``open`` failing with EROFS (a hook: CI runs as root, which writes through a chmod, and
mounting needs privileges the CI container lacks)."""

import contextlib
import errno
import json
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_RUN, cli_env

from lit_ddp import writes
from lit_ddp.callbacks.predictions import PredictionWriter
from lit_ddp.callbacks.sinks import FileSink
from lit_ddp.errors import UserError
from lit_ddp.runtime.checkpoint_io import AtomicCheckpointIO
from lit_ddp.writes import WriteError, write_file

TOO_LARGE = rf"\({os.strerror(errno.EFBIG)}\)"  # as a regex


@contextlib.contextmanager
def full_disk():
    """In this process, while inside, no file grows past 0 bytes: a write fails with EFBIG as on a full
    disk, whoever makes it (the soft limit alone is lowered, so it can be raised back without root)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


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


def test_a_write_removes_only_this_hosts_temporary_files_whose_writer_is_gone(tmp_path: Path) -> None:
    """A shared folder: another node's writer may have the same pid and a live writer here the same name. The
    temporary file is named by host and pid; a write removes this host's left by a killed writer, nothing
    else (it removed every ``.<name>.tmp-*``, another writer's half-written file included)."""
    path, host = tmp_path / "file.bin", socket.gethostname()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        killed = tmp_path / f".file.bin.tmp-{host}-{gone.stdout.strip()}"
        writing_here = tmp_path / f".file.bin.tmp-{host}-{live.pid}"
        other_node = tmp_path / f".file.bin.tmp-node7-{gone.stdout.strip()}"  # a pid of another machine
        for temporary in (killed, writing_here, other_node):
            temporary.write_bytes(b"half")
        with writes.atomic_file(path, "the test file") as f:
            f.write(b"new")
            assert (tmp_path / f".file.bin.tmp-{host}-{os.getpid()}").is_file()
        assert path.read_bytes() == b"new" and not killed.exists()
        assert writing_here.read_bytes() == b"half" and other_node.read_bytes() == b"half"
    finally:
        live.communicate(b"")


def test_a_read_only_disk_is_one_line_naming_the_file(tmp_path: Path, read_only) -> None:
    with pytest.raises(WriteError) as err:
        write_file(tmp_path / "a.txt", "text", "the test file")
    assert str(err.value) == (
        f"could not write the test file {tmp_path / 'a.txt'} ({os.strerror(errno.EROFS)}): remount it"
        " writable, or pass --trainer.default_root_dir on a writable disk, then run it again"
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


@pytest.mark.parametrize("name", [".version_0.lock", "config.yaml"])
def test_the_first_files_of_a_run_go_through_the_shared_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, name: str
) -> None:
    """The run lock and config.yaml, the first files a run writes, on a disk that refuses them: an OSError
    traceback from jsonargparse's writer; the lock, which the preflight's probe of the folder did not
    catch on a disk that fills, the same."""
    from lit_ddp.cli import main

    def refuse(file, *args, **kwargs):
        if Path(file).name.startswith((name, f".{name}")):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))
        return open(file, *args, **kwargs)

    monkeypatch.setattr(writes, "open", refuse, raising=False)

    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY_RUN, "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    what = "the run lock" if name.endswith(".lock") else "the run's config"
    assert err.startswith(f"lit_ddp: error: could not write {what} ") and f"{name} (Read-only" in err


def test_a_failed_write_mid_run_names_the_fix_on_that_disk_and_one_other_place(tmp_path: Path) -> None:
    """With a last.ckpt to resume from, another --trainer.default_root_dir is no fix (the resume finds
    last.ckpt in this one); the MLflow store's line offered two other places at once."""
    from lit_ddp.preflight.mlflow import _problem
    from lit_ddp.runtime.write_errors import write_error

    read_only = OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "x"))
    (tmp_path / "last.ckpt").write_bytes(b"")
    assert str(write_error(read_only, "checkpoint", tmp_path / "b.ckpt", tmp_path)) == (
        f"could not write checkpoint {tmp_path / 'b.ckpt'} (Read-only file system): the run stops; its"
        f" previous {tmp_path / 'last.ckpt'} is intact; remount it writable, then resume with"
        " --ckpt_path=last"
    )
    assert _problem(read_only, "file:/runs") == (
        f"could not write the MLflow store {tmp_path / 'x'} (Read-only file system): remount it writable,"
        " or pass --trainer.logger.init_args.tracking_uri on a writable disk"
    )


def test_the_wandb_run_files_go_through_the_shared_writer(tmp_path: Path) -> None:
    """config.yaml and environment.md in a W&B run's files folder: an OSError traceback on a full disk."""
    from lit_ddp.callbacks.sinks import WandbSink

    saved = []

    class Run:
        dir = str(tmp_path)

        def save(self, path, base_path, policy):
            saved.append(path)

    class Logger:
        experiment = Run()

        def log_hyperparams(self, params):
            pass

    with (
        full_disk(),
        pytest.raises(WriteError, match=rf"the W&B run file .*lit_ddp/config\.yaml {TOO_LARGE}"),
    ):
        WandbSink(Logger()).run_info({}, [], "a: 1\n", "# environment", 0)
    assert saved == [] and not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_the_run_lock_is_one_line_on_a_full_disk_and_leaves_no_empty_lock(tmp_path: Path) -> None:
    """The lock's O_EXCL create succeeded and its write failed: an OSError traceback, and an empty lock
    left that every later run on that folder waited for, then refused ("could not take its lock")."""
    from lit_ddp.runtime.run_lock import RunLock

    lock = RunLock(tmp_path / "version_0")
    with full_disk(), pytest.raises(WriteError, match=rf"the run lock .*\.version_0\.lock {TOO_LARGE}"):
        lock.acquire()
    assert list(tmp_path.iterdir()) == [] and not lock.held
    assert json.loads(RunLock(tmp_path / "version_0").acquire().path.read_text())["pid"] == os.getpid()


def test_a_ranks_error_survives_a_temporary_folder_it_cannot_hand_it_over_in(tmp_path: Path) -> None:
    """A ddp_spawn rank writes its UserError for the main process; on a full temporary folder the OSError
    of that write replaced the rank's own error."""
    from lit_ddp.runtime.preemption import _run_rank

    def refuse():
        raise UserError("the rank's own line")

    with full_disk(), pytest.raises(UserError, match="^the rank's own line$"):
        _run_rank(str(tmp_path / "error"), refuse)
    assert list(tmp_path.iterdir()) == []


def test_the_image_folders_file_list_goes_through_the_shared_writer(tmp_path: Path) -> None:
    """--data.index_cache on a full disk: the listing is used and the warning names the file that could
    not be written (it was an OSError's repr, naming a temporary file)."""
    from lit_ddp.data.folder_index import cache_file, load_or_scan

    (tmp_path / "tree" / "cat").mkdir(parents=True)
    (tmp_path / "tree" / "cat" / "a.jpg").write_bytes(b"x")
    with full_disk():
        listing, not_saved = load_or_scan(tmp_path / "tree", tmp_path / "cache")
    assert len(listing) == 1
    target = cache_file(tmp_path / "cache", str(tmp_path / "tree"))
    assert not_saved == f"{os.strerror(errno.EFBIG)}: {target}" and list((tmp_path / "cache").iterdir()) == []


def test_an_mds_shard_goes_through_the_shared_writer(tmp_path: Path) -> None:
    """A shard cut short by a full disk was left in the split folder as shard.00000.mds."""
    from lit_ddp.data.mds import MDSWriter
    from lit_ddp.data.shards import COLUMNS

    with (
        full_disk(),
        pytest.raises(WriteError, match=rf"could not write shard .*shard\.00000\.mds {TOO_LARGE}"),
    ):
        with MDSWriter(tmp_path / "train", COLUMNS, None) as writer:
            writer.write({"image": b"x" * 100, "index": 0, "label": 1})
    assert list((tmp_path / "train").iterdir()) == []


def test_a_new_projects_files_go_through_the_shared_writer(tmp_path: Path) -> None:
    """`new DEST` on a full disk: an OSError traceback from the copy, and a file of the project cut short."""
    from lit_ddp.scaffold.new import _copy_over

    (tmp_path / "gen" / "pkg").mkdir(parents=True)
    (tmp_path / "gen" / "pkg" / "train.py").write_text("print('hi')\n")
    with full_disk(), pytest.raises(WriteError, match=rf"the new project's file .*train\.py {TOO_LARGE}"):
        _copy_over(tmp_path / "gen", tmp_path / "dest")
    assert not [p for p in (tmp_path / "dest").rglob("*") if p.is_file()]


def test_new_on_a_full_temporary_folder_is_one_line(tmp_path: Path) -> None:
    """`new` generates in a temporary folder first: a full one was tempfile's FileNotFoundError traceback
    ("No usable temporary directory found")."""
    from lit_ddp.scaffold.new import new

    with full_disk(), pytest.raises(UserError) as err:
        new([str(tmp_path / "project"), "--no-input"])
    assert str(err.value).startswith("could not generate the project in a temporary folder (")
    assert str(err.value).endswith("point TMPDIR at a writable disk with room; nothing was written to DEST")
    assert not (tmp_path / "project").exists()


# ---- every writer is the shared one, or says why not ---------------------------------------------------

PACKAGE = Path(__file__).resolve().parents[1] / "lit_ddp"
# Writes that are not writes.py's, each with why: (file, call) -> reason.
OWN_WRITES = {
    ("data/convert.py", "os.replace"): "moves a split folder, whose files writes.py wrote, into DEST",
    ("data/dest_lock.py", "os.open"): "shard's DEST lock (flock, O_EXCL): its failure is shard's one line",
    ("runtime/resume.py", "os.replace"): "a resumed CSV run's metrics.csv, moved aside and back: not written",
    ("data/shards.py", "open"): "an empty lock file per shard (flock)",
    ("data/cifar10.py", "open"): "an empty lock file for the download (flock)",
    ("scaffold/template.py", "write_text"): "inside cookiecutter's generation, in a temporary folder",
}
WRITE_CALLS = {
    "write_text",
    "write_bytes",
    "os.replace",
    "os.rename",
    "os.open",
    "os.fdopen",
    "tempfile.mkstemp",
}
WRITE_CALLS |= {"shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.move"}


def _writes_of_its_own(path: Path) -> set[str]:
    """The calls in ``path`` that write a file without writes.py: pathlib's writers, renames, copies,
    low-level opens, and ``open`` with a mode that writes."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        dotted = ast.unparse(node.func)
        name = dotted if dotted.startswith(("os.", "shutil.", "tempfile.")) else dotted.rpartition(".")[2]
        mode = node.args[1] if len(node.args) > 1 else None
        mode = next((k.value for k in node.keywords if k.arg == "mode"), mode)
        writing = isinstance(mode, ast.Constant) and bool(set(str(mode.value)) & set("wax+"))
        if name in WRITE_CALLS or (name == "open" and writing):
            found.add(name)
    return found


def test_every_writer_is_the_shared_one_or_says_why_not_and_is_listed_in_the_docs() -> None:
    """A new file lit_ddp writes goes through writes.py (whole or not at all, one line when the disk
    refuses it) and is listed in docs/faults.md; the doctor's internal files (testing/) are its own."""
    own, users = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("testing/") or rel == "writes.py":
            continue
        own += [(rel, call) for call in _writes_of_its_own(path) if (rel, call) not in OWN_WRITES]
        if "lit_ddp.writes import" in path.read_text():
            users.append(rel)
    assert own == [], "write through lit_ddp.writes, or add to OWN_WRITES with the reason"
    faults = (PACKAGE.parent / "docs" / "faults.md").read_text()
    table = faults[faults.index("### Every file lit_ddp writes") : faults.index("### Mistakes and what")]
    assert [rel for rel in users if f"`{rel}" not in table] == []
    assert [rel for rel, _ in OWN_WRITES if f"`{rel}" not in table] == []
