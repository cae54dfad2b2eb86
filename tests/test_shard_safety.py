"""`python -m lit_ddp shard SRC DEST` loses nothing and writes nothing half (issue 50): DEST and SRC apart,
a user's files in DEST kept, one writer per DEST, Ctrl-C, a full or read-only DEST, links across classes,
and option values at their extremes. Each refusal is one line, exit 2, before DEST is written."""

import errno
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import cli_env
from helpers import s3
from imagenet_tree import make_tree

from lit_ddp import writes
from lit_ddp.cli import main

s3_server = s3.s3_server  # the fixture: a moto server on 127.0.0.1
slow_s3 = s3.slow_s3  # the fixture: that server behind a proxy that answers late


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def shard(capsys, *args: str | Path) -> Ran:
    """``python -m lit_ddp shard ARGS`` in this process (the command line's own main: its exit code and
    its one line on stderr), cheaper than a subprocess where no signal or second process is involved."""
    capsys.readouterr()
    try:
        main(["shard", *map(str, args)])
        code = 0
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return Ran(code, out, err)


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(proc, *parts: str) -> None:
    """Exit 2 and one line on stderr holding ``parts``."""
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith("lit_ddp: error: ") and all(p in proc.stderr for p in parts), proc.stderr


@pytest.mark.parametrize(
    ("dest", "where"), [("link", "is SRC"), ("tree/train/shards", "lies inside SRC"), (".", "holds SRC")]
)
def test_a_dest_that_is_src_inside_it_or_holding_it_is_refused_and_no_image_is_lost(
    tmp_path: Path, capsys, dest: str, where: str
) -> None:
    """`shard src src` replaced src/train and src/val by shards: every image gone, exit 0."""
    data = tmp_path / "data"
    make_tree(data / "tree")
    (data / "link").symlink_to(data / "tree")  # the same folder under another name: caught too
    before = files(data)
    proc = shard(capsys, data / "tree", data / dest)
    refused(proc, where, "pass a DEST outside SRC")
    assert files(data) == before


@pytest.mark.parametrize("mine", ["train/my_cat/photo.txt", "val/notes.txt", "test/shard.00000.mds/a.txt"])
def test_a_users_file_under_a_split_folder_of_dest_is_refused_and_kept(
    tmp_path: Path, capsys, mine: str
) -> None:
    """DEST/train/ was taken for an interrupted run's and replaced whole: the user's file in it was gone."""
    make_tree(tmp_path / "tree")
    (tmp_path / "dest" / mine).parent.mkdir(parents=True)
    (tmp_path / "dest" / mine).write_text("mine")
    refused(shard(capsys, tmp_path / "tree", tmp_path / "dest"), f"holds other files ({mine})", "empty DEST")
    assert files(tmp_path / "dest") == {mine: b"mine"}


def test_the_split_folders_an_interrupted_publish_left_are_replaced(tmp_path: Path, capsys) -> None:
    make_tree(tmp_path / "tree")
    assert shard(capsys, tmp_path / "tree", tmp_path / "ref", "--shard-mb=0.05").returncode == 0
    dest = tmp_path / "dest"
    (dest / "train").mkdir(parents=True)  # moved into place, the manifest not yet written
    for name in ("index.json", "shard.00000.mds", "shard.00007.mds"):
        (dest / "train" / name).write_bytes(b"half")
    assert shard(capsys, tmp_path / "tree", dest, "--shard-mb=0.05").returncode == 0
    assert files(dest) == files(tmp_path / "ref")


class HeldRun:
    """``convert(SRC, DEST)`` on a thread of this process, held at its first file read until ``go()``:
    a run mid-way, for as long as the test needs it (the test waits for the read, not for a time)."""

    def __init__(self, monkeypatch, src: Path, dest: str) -> None:
        from lit_ddp.data import convert as module

        self.reading, self.released, read = threading.Event(), threading.Event(), module._read_file

        first = threading.Lock()

        def held(path: str) -> bytes:
            if first.acquire(blocking=False):  # the run's first read waits; the run waits for it
                self.reading.set()
                self.released.wait(timeout=120)
            return read(path)

        monkeypatch.setattr(module, "_read_file", held)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(module.convert, src, dest), daemon=True)
        self.thread.start()
        assert self.reading.wait(timeout=120), "the held run never read a file"

    def _run(self, convert, src: Path, dest: str) -> None:
        try:
            convert(str(src), dest, shard_mb=0.05)
        except BaseException as err:  # noqa: BLE001 (handed to the test)
            self.error = err

    def go(self) -> None:
        self.released.set()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive() and self.error is None, self.error


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_a_second_shard_run_into_a_dest_being_written_is_refused_and_the_first_completes(
    tmp_path: Path, capsys, monkeypatch, request, where: str
) -> None:
    """Locally the second run died on FileExistsError (or started the first's work over); into one S3 prefix
    both reported success while the bucket held one of them."""
    make_tree(tmp_path / "tree")
    assert shard(capsys, tmp_path / "tree", tmp_path / "ref", "--shard-mb=0.05").returncode == 0
    if where == "s3":
        server = request.getfixturevalue("s3_server")
        dest = f"s3://{server.bucket}/{tmp_path.name}"  # moto keeps its buckets between servers
    else:
        dest = str(tmp_path / "dest")
    first = HeldRun(monkeypatch, tmp_path / "tree", dest)
    second = shard(capsys, tmp_path / "tree", dest, "--shard-mb=0.05")
    refused(second, f"another shard run is writing into {dest} (pid {os.getpid()} on ", "wait for it to end")
    first.go()
    if where == "s3":
        client = server.client()
        prefix = f"{tmp_path.name}/"
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=server.bucket, Prefix=prefix)["Contents"]]
        got = {k[len(prefix) :]: client.get_object(Bucket=server.bucket, Key=k)["Body"].read() for k in keys}
        assert got == files(tmp_path / "ref")  # the first run's shards, whole; its lock gone
    else:
        assert files(tmp_path / "dest") == files(tmp_path / "ref")
    again = shard(capsys, tmp_path / "tree", dest)
    refused(again, "already holds shards")  # the lock is gone: the next run looks at DEST itself


@pytest.mark.parametrize(("signum", "where"), [(signal.SIGINT, "folder"), (signal.SIGTERM, "s3")])
def test_ctrl_c_or_sigterm_mid_shard_is_one_line_leaves_nothing_and_a_rerun_completes(
    tmp_path: Path, capsys, monkeypatch, request, signum: int, where: str
) -> None:
    """Ctrl-C printed a KeyboardInterrupt traceback; SIGTERM into S3 would leave the prefix's lock behind.
    The signal is real, sent to this process while the run (on the main thread, as the command's) waits
    at its first file read."""
    from lit_ddp.data import convert as module

    make_tree(tmp_path / "tree")
    assert shard(capsys, tmp_path / "tree", tmp_path / "ref", "--shard-mb=0.05").returncode == 0
    if where == "s3":
        server = request.getfixturevalue("s3_server")
        dest = f"s3://{server.bucket}/{tmp_path.name}"  # moto keeps its buckets between servers

        def left() -> list[str]:
            listed = server.client().list_objects_v2(Bucket=server.bucket, Prefix=f"{tmp_path.name}/")
            return [o["Key"] for o in listed.get("Contents", [])]
    else:
        dest = str(tmp_path / "dest")

        def left() -> list[str]:
            return os.listdir(dest) if os.path.exists(dest) else []

    reading, released, read, first = threading.Event(), threading.Event(), module._read_file, threading.Lock()

    def held(path: str) -> bytes:
        if first.acquire(blocking=False):
            reading.set()
            released.wait(timeout=120)
        return read(path)

    def stop() -> None:
        assert reading.wait(timeout=120)
        os.kill(os.getpid(), signum)  # handled on the main thread once it runs Python again
        released.set()

    def unhandled(*_) -> None:
        raise AssertionError("shard's main left SIGTERM to the default action (which ends the process)")

    monkeypatch.setattr(module, "_read_file", held)
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        stopper = threading.Thread(target=stop, daemon=True)
        stopper.start()
        proc = shard(capsys, tmp_path / "tree", dest, "--shard-mb=0.05")
        stopper.join(timeout=120)
    finally:
        signal.signal(signal.SIGTERM, previous)
    name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert proc.returncode == 128 + signum and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith(f"lit_ddp: shard stopped by {name}: nothing is published in {dest}")
    assert left() == []  # no partial shards, no lock, no DEST folder this run made
    monkeypatch.setattr(module, "_read_file", read)
    assert shard(capsys, tmp_path / "tree", dest, "--shard-mb=0.05").returncode == 0


def test_the_staging_folder_of_an_s3_shard_run_killed_outright_is_removed_by_the_next_run(
    tmp_path: Path, capsys, monkeypatch, s3_server, slow_s3
) -> None:
    """An s3:// DEST's shards are staged whole in TMPDIR before they are uploaded: a run killed outright
    (SIGKILL, the OOM killer, a node lost) left that folder, a dataset's size, for good, and every rerun
    that was killed left one more. Killed here as its upload begins (every answer of the server late)."""
    make_tree(tmp_path / "tree")
    tmpdir, dest = tmp_path / "tmp", f"s3://{s3_server.bucket}/{tmp_path.name}"
    tmpdir.mkdir()
    slow_s3.delay = 2.0  # the upload waits on the server: the run is killed holding its whole staging folder
    env = cli_env({**s3_server.env, "AWS_ENDPOINT_URL": slow_s3.url, "TMPDIR": str(tmpdir)})
    command = [sys.executable, "-m", "lit_ddp", "shard", str(tmp_path / "tree"), dest, "--shard-mb=0.05"]
    run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list(tmpdir.glob("lit_ddp-shard-*/val/index.json")):  # staged whole, not yet uploaded
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.01)
    finally:
        run.kill()
        run.communicate()
    assert run.returncode == -signal.SIGKILL
    s3_server.client().delete_object(Bucket=s3_server.bucket, Key=f"{tmp_path.name}/.lit_ddp-lock")  # as told
    monkeypatch.setenv("TMPDIR", str(tmpdir))  # the rerun, in this process, on the same TMPDIR
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert shard(capsys, tmp_path / "tree", dest, "--shard-mb=0.05").returncode == 0
    assert list(tmpdir.glob("lit_ddp-shard-*")) == []


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("--shard-mb=-1", "--shard-mb=-1.0 cannot be negative"),
        ("--shard-mb=nan", "--shard-mb=nan cannot be negative or nan"),
        ("--shard-mb=inf", "--shard-mb=inf is 4096 MiB or more"),
        ("--shard-mb=4096", "--shard-mb=4096.0 is 4096 MiB or more"),
        ("--shard-mb=1e-9", "--shard-mb=1e-09 is under one byte"),
        ("--workers=-3", "--workers=-3 cannot be negative"),
    ],
)
def test_a_shard_option_at_an_extreme_is_one_line_naming_it_alone(
    tmp_path: Path, capsys, option: str, says: str
) -> None:
    """--shard-mb=-1 named --workers too; nan, inf and 4096 were tracebacks (MDS's uint32 offsets); a size
    under a byte was taken as 0, no limit, with exit 0."""
    make_tree(tmp_path / "tree")
    proc = shard(capsys, tmp_path / "tree", tmp_path / "dest", option)
    refused(proc, says)
    other = "--shard-mb" if option.startswith("--workers") else "--workers"
    assert other not in proc.stderr and not (tmp_path / "dest").exists()


@pytest.mark.parametrize("url", ["s3://", "s3:///imagenet"])
def test_a_data_url_of_s3_with_no_bucket_says_so(tmp_path: Path, monkeypatch, url: str) -> None:
    """--data.url=s3:// read as a local folder 's3:' (no readable lit_ddp.json at s3:/lit_ddp.json)."""
    from lit_ddp.data.streaming import StreamingDataModule
    from lit_ddp.errors import UserError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        StreamingDataModule(url=url)
    assert str(err.value) == f"--data.url={url} names no bucket: pass --data.url=s3://bucket/prefix"


@pytest.mark.parametrize("dest", ["S3://bucket/tree", "s3:/bucket/tree", "gs://bucket/tree"])
def test_a_dest_url_that_is_not_s3s_form_is_refused_not_written_as_a_local_folder(
    tmp_path: Path, capsys, monkeypatch, dest: str
) -> None:
    """`shard SRC S3://bucket/tree` (or s3:/, gs://) wrote a local folder `S3:/bucket/tree` and printed
    `→ S3://bucket/tree`, exit 0: the user took the shards for uploaded."""
    make_tree(tmp_path / "tree")
    monkeypatch.chdir(tmp_path)
    refused(shard(capsys, tmp_path / "tree", dest), f"DEST {dest} is not an s3:// URL", "s3://bucket/prefix")
    assert sorted(os.listdir(tmp_path)) == ["tree"]


@pytest.mark.parametrize("url", ["S3://bucket/tree", "gs://bucket/tree"])
def test_a_data_url_that_is_not_s3s_form_says_so(tmp_path: Path, monkeypatch, url: str) -> None:
    """--data.url=S3://bucket/tree was read as a local folder 'S3:' (no readable lit_ddp.json there)."""
    from lit_ddp.data.streaming import StreamingDataModule
    from lit_ddp.errors import UserError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=rf"^--data.url={url} is not an s3:// URL .*s3://bucket/prefix"):
        StreamingDataModule(url=url)


def test_a_split_without_its_index_is_one_line_saying_to_re_shard_not_to_resume(
    tmp_path: Path, cifar_shards: Path
) -> None:
    """At setup, before any step: the line called the index a shard and said to resume with
    --ckpt_path=last, a run that never started."""
    from lit_ddp.data.shards import ShardError
    from lit_ddp.data.streaming import StreamingDataModule

    root = shutil.copytree(cifar_shards, tmp_path / "shards")
    (root / "train" / "index.json").unlink()
    dm = StreamingDataModule(url=str(root), batch_size=4, num_workers=0, val_size=8)
    with pytest.raises(ShardError) as err:
        dm.setup("fit")
    assert str(err.value).startswith(f"cannot read {root / 'train' / 'index.json'}, the train split's index")
    assert "re-shard" in str(err.value) and "--ckpt_path" not in str(err.value)


def test_a_dest_that_is_a_link_to_nothing_is_one_line_naming_the_link(tmp_path: Path, capsys) -> None:
    """mkdir on a dangling link fails with "File exists", which was reported as a disk fault ("fix the disk,
    or pass a DEST on another disk")."""
    make_tree(tmp_path / "tree")
    (tmp_path / "dest").symlink_to(tmp_path / "gone")
    ran = shard(capsys, tmp_path / "tree", tmp_path / "dest")
    refused(ran, f"is a link to {tmp_path / 'gone'}, which does not exist")
    assert not (tmp_path / "gone").exists()


def test_a_full_dest_is_one_line_naming_it_and_leaves_nothing_half_written(tmp_path: Path, capsys) -> None:
    """A full disk, made without privileges: RLIMIT_FSIZE (for this call only) stops any file at 40 kB with
    EFBIG, as ENOSPC would stop it at the disk's end. The shards of 52 kB cannot be written."""
    make_tree(tmp_path / "tree")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, hard))
    try:
        proc = shard(capsys, tmp_path / "tree", tmp_path / "dest", "--shard-mb=0.05")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    refused(proc, "(File too large): nothing is published in", "raise the file size limit (ulimit -f)")
    assert not (tmp_path / "dest").exists()  # made by the run, left with nothing in it: removed


def test_a_read_only_dest_is_one_line_naming_it_and_the_fix(tmp_path: Path, capsys, monkeypatch) -> None:
    """A read-only DEST, made by a hook: a chmod does not stop root (CI), and a read-only mount needs
    privileges. DEST refuses every file created in it with EROFS, as a read-only mount does."""
    make_tree(tmp_path / "tree")
    dest = tmp_path / "dest"
    dest.mkdir()
    create = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(dest)) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return create(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    proc = shard(capsys, tmp_path / "tree", dest)
    refused(proc, f"cannot write {dest}/.lit_ddp-lock (Read-only file system)", "remount it writable")
    assert os.listdir(dest) == []


def test_the_manifest_is_written_whole_and_its_failure_names_it_in_dest(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """lit_ddp.json, written last, publishes the shards: written through the shared writer (writes.py), a
    disk that refuses it is one line naming DEST's lit_ddp.json (it named the work folder's copy), and
    nothing is published."""
    make_tree(tmp_path / "tree")
    dest = tmp_path / "dest"

    def refuse_the_manifest(file, *args, **kwargs):
        if Path(file).name.startswith(".lit_ddp.json.tmp-"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))
        return open(file, *args, **kwargs)

    monkeypatch.setattr(writes, "open", refuse_the_manifest, raising=False)
    proc = shard(capsys, tmp_path / "tree", dest)
    *progress, line = proc.stderr.splitlines()  # the splits were written: their progress lines come first
    assert proc.returncode == 2 and all(p.startswith("shard: ") for p in progress), proc.stderr
    assert line == (
        f"lit_ddp: error: cannot write {dest}/lit_ddp.json (Read-only file system): nothing is published in"
        f" {dest} and the partial shards are removed; remount it writable, or pass a DEST on a writable"
        " disk, then run the command again"
    )
    assert not (dest / "lit_ddp.json").exists()


def test_an_unreadable_file_in_src_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    """A file that cannot be read (here a link whose target is gone: chmod does not stop root) was a
    traceback from the reading thread."""
    make_tree(tmp_path / "tree")
    gone = tmp_path / "tree" / "train" / "n01440764" / "gone.JPEG"
    gone.symlink_to(tmp_path / "nowhere.JPEG")
    proc = shard(capsys, tmp_path / "tree", tmp_path / "dest")
    refused(proc, f"cannot read {gone} (No such file or directory): make it readable or move it out of SRC")
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("link", ["file", "folder", "class folder"])
def test_a_link_into_another_classs_folder_is_refused_naming_it(tmp_path: Path, capsys, link: str) -> None:
    """A link in class A's folder to an image (or a folder) of class B was sharded with label A, no word."""
    make_tree(tmp_path / "tree")
    train = tmp_path / "tree" / "train"
    a, b = sorted(os.listdir(train))[:2]
    if link == "file":
        path = train / a / "borrowed.JPEG"
        path.symlink_to(train / b / f"{b}_0.JPEG")
    elif link == "folder":
        path = train / a / "more"
        path.symlink_to(train / b)
    else:
        path = train / "n09999999"
        path.symlink_to(train / b)
    proc = shard(capsys, tmp_path / "tree", tmp_path / "dest")
    owner = os.path.realpath(train / b)
    refused(proc, f"{path} is a link into {owner}, the folder of class {b}", "remove it")
    assert not (tmp_path / "dest").exists()


def test_links_to_files_outside_the_tree_or_of_the_same_class_are_followed(tmp_path: Path, capsys) -> None:
    make_tree(tmp_path / "tree")
    train = tmp_path / "tree" / "train"
    a = sorted(os.listdir(train))[0]
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "x.JPEG").write_bytes((train / a / f"{a}_0.JPEG").read_bytes())
    (train / a / "pooled.JPEG").symlink_to(tmp_path / "pool" / "x.JPEG")
    (train / a / "again.JPEG").symlink_to(train / a / f"{a}_1.JPEG")
    assert shard(capsys, tmp_path / "tree", tmp_path / "dest").returncode == 0


@pytest.mark.parametrize("shape", ["empty class folder", "val is a file", "val has no image", "empty test"])
def test_a_tree_of_an_odd_shape_is_one_line_naming_the_path(tmp_path: Path, capsys, shape: str) -> None:
    """An empty class folder in train/ became a class with no sample (ImageNetDataModule refuses it), and a
    file named val/ left the val split out; both with exit 0 and no word. A val/ (or test/) with no image
    became a split of 0 samples: fit on those shards validated nothing, checkpointed on no val/acc, exit 0."""
    make_tree(tmp_path / "tree")
    if shape == "empty class folder":
        (tmp_path / "tree" / "train" / "n09999999").mkdir()
        says = "train has class folders with no image file ('n09999999'): add images or remove the folders"
    elif shape == "val has no image":
        for image in (tmp_path / "tree" / "val").rglob("*.JPEG"):
            image.unlink()  # the class folders stay
        says = "val holds no image file: add images or remove the folder"
    elif shape == "empty test":
        (tmp_path / "tree" / "test").mkdir()
        says = "test holds no image file: add images or remove the folder"
    else:
        shutil.rmtree(tmp_path / "tree" / "val")
        (tmp_path / "tree" / "val").write_text("not a folder")
        says = "val is a file, not a folder of class folders: move it out of SRC"
    refused(shard(capsys, tmp_path / "tree", tmp_path / "dest"), says)
    assert not (tmp_path / "dest").exists()
