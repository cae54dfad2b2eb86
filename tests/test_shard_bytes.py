"""Every byte lit_ddp reads from shards (issue 50): the manifest and the index must parse and hold what
`shard` writes, the columns must be lit_ddp's own (a pkl column is refused, never unpickled), samples must
fit the manifest's shape and classes, and a shard's bytes must match the SHA-1 its index records, locally
and in the S3 node cache; a node cache that cannot be written is one line naming it and the option."""

import bisect
import contextlib
import errno
import hashlib
import json
import os
import pickle
import resource
import shutil
from pathlib import Path

import pytest
from helpers import s3
from test_cifar10 import write_cifar10

from lit_ddp.data import shards
from lit_ddp.data.convert import convert
from lit_ddp.data.mds import MDSWriter
from lit_ddp.data.shards import COLUMNS, ChunkCache, LocalStore, ShardedSamples, ShardError
from lit_ddp.data.streaming import StreamingDataModule

s3_server = s3.s3_server  # the fixture: a moto server on 127.0.0.1


@pytest.fixture
def cifar(tmp_path: Path) -> Path:
    """CIFAR-10 shards of 48 samples, a few per shard, and a node cache of the test's own."""
    write_cifar10(tmp_path / "src", per_batch=8, test_size=8)
    convert(str(tmp_path / "src"), str(tmp_path / "shards"), shard_mb=0.01)
    return tmp_path / "shards"


def module(url: Path, tmp_path: Path) -> StreamingDataModule:
    dm = StreamingDataModule(url=str(url), val_size=8, batch_size=8, cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    return dm


def one_line(err: pytest.ExceptionInfo, starts: str) -> str:
    message = str(err.value)
    assert message.startswith(starts) and "\n" not in message, message
    assert "re-shard: run `python -m lit_ddp shard` again into an empty DEST" in message, message
    return message


def flip(path: Path, offset: int) -> None:
    """One bit of ``path`` flipped, as a disk or a copy flips it: same size, same layout."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(data)


# ---- the manifest, the index, the columns ------------------------------------------------------------


@pytest.mark.parametrize("name", ["lit_ddp.json", "train/index.json"])
@pytest.mark.parametrize(
    "text", [b"\x00{not json", b'{"shards": 3}', b"[]"], ids=["garbage", "shape", "list"]
)
def test_a_manifest_or_index_that_does_not_parse_names_the_file_and_re_shard(
    cifar: Path, tmp_path: Path, name: str, text: bytes
) -> None:
    (cifar / name).write_bytes(text)
    with pytest.raises(ShardError) as err:
        module(cifar, tmp_path)
    one_line(err, str(cifar / name))


def test_shard_names_that_leave_the_split_folder_are_refused(cifar: Path, tmp_path: Path) -> None:
    """A basename is joined to the split's folder (and to the node cache's): ../ would read, or write,
    elsewhere."""
    index = json.loads((cifar / "train" / "index.json").read_text())
    index["shards"][0]["raw_data"]["basename"] = "../../outside.mds"
    (cifar / "train" / "index.json").write_text(json.dumps(index))
    with pytest.raises(ShardError) as err:
        module(cifar, tmp_path)
    one_line(err, f"{cifar / 'train' / 'index.json'} names shards or sizes")


class Planted:
    """Unpickling this creates a file: the proof that a pkl column was run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


@pytest.mark.parametrize("encodings", [["pkl", "int", "int"], ["bytes", "str", "int"]], ids=["pkl", "str"])
def test_a_column_of_another_encoding_is_refused_before_a_shard_is_read_and_never_unpickled(
    tmp_path: Path, encodings: list[str]
) -> None:
    """The index named the columns only by name: a pkl image column was read as image bytes (and a str
    index column shifted every field after it)."""
    planted = tmp_path / "unpickled"
    with MDSWriter(tmp_path / "s" / "train", COLUMNS, size_limit=None) as writer:
        for i in range(4):
            writer.write({"image": pickle.dumps(Planted(planted)), "index": i, "label": 0})
    index_path = tmp_path / "s" / "train" / "index.json"
    index = json.loads(index_path.read_text())
    for shard in index["shards"]:
        shard["column_encodings"] = encodings
        shard["column_sizes"] = [None if e in ("pkl", "bytes", "str") else 8 for e in encodings]
    index_path.write_text(json.dumps(index))
    with pytest.raises(ShardError) as err:
        ShardedSamples(str(tmp_path / "s"), "train", tmp_path / "cache")
    message = one_line(err, f"{index_path} holds columns lit_ddp does not read (image: {encodings[0]}, ")
    assert "it reads image: bytes, index: int, label: int and path: str" in message
    assert not planted.exists()


# ---- samples that do not fit the manifest ------------------------------------------------------------


def test_raw_images_of_another_size_than_the_manifests_shape_name_the_shard(
    cifar: Path, tmp_path: Path
) -> None:
    """They ended in torch's reshape error (a traceback, from a DataLoader worker too)."""
    manifest = json.loads((cifar / "lit_ddp.json").read_text())
    manifest["image_shape"] = [3, 16, 16]
    (cifar / "lit_ddp.json").write_text(json.dumps(manifest))
    dm = module(cifar, tmp_path)
    samples, first = dm.train_set.samples, int(dm.train_set.positions[0])
    s = bisect.bisect_right(samples.starts, first) - 1
    shard, j = cifar / "train" / samples.shards[s][0], first - samples.starts[s]
    with pytest.raises(ShardError) as err:
        dm.train_set.__getitems__([0, 1])
    message = one_line(err, f"shard {shard} is corrupt (its sample {j} holds 3072 bytes")
    assert "not the 3×16×16 of lit_ddp.json's image_shape" in message


def test_a_label_outside_the_manifests_classes_names_the_shard_not_load_split(tmp_path: Path) -> None:
    """The base's label check told a shard user to map labels in load_split; the fix is to re-shard."""
    write_cifar10(tmp_path / "src", per_batch=8, test_size=8)
    convert(str(tmp_path / "src"), str(tmp_path / "s"), shard_mb=0.01)
    test = ShardedSamples(str(tmp_path / "s"), "test", tmp_path / "cache")
    rows = [{"image": bytes(test[i].image), "index": i, "label": test[i].label} for i in range(len(test))]
    rows[5]["label"] = 12
    shutil.rmtree(tmp_path / "s" / "test")
    with MDSWriter(tmp_path / "s" / "test", COLUMNS, size_limit=int(0.01 * (1 << 20))) as writer:
        for row in rows:
            writer.write(row)
    dm = module(tmp_path / "s", tmp_path)
    dm.setup("test")
    with pytest.raises(ShardError) as err:
        dm.test_set.__getitems__(list(range(len(rows))))
    message = one_line(err, f"shard {tmp_path / 's' / 'test' / 'shard.0000'}")
    assert "has label 12, outside 0..9: lit_ddp.json names 10 classes" in message
    assert "load_split" not in message


# ---- the SHA-1 each index records ----------------------------------------------------------------------


def test_a_local_shard_whose_bytes_changed_is_refused_and_an_intact_one_is_hashed_once_per_node(
    cifar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bit flipped in a shard's pixels kept its layout: it trained with exit 0."""
    real, hashed = hashlib.sha1, []

    def counting(data=b""):
        hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(shards.hashlib, "sha1", counting)
    samples = ShardedSamples(str(cifar), "train", tmp_path / "cache")
    assert bytes(samples[0].image) and bytes(samples[1].image)
    assert [n for n in hashed if n > 1000] == [samples.shards[0][1]]  # shard 0, hashed once
    hashed.clear()
    again = ShardedSamples(str(cifar), "train", tmp_path / "cache")  # another process of the node
    assert bytes(again[0].image) == bytes(samples[0].image) and not [n for n in hashed if n > 1000]
    second = cifar / "train" / samples.shards[1][0]
    flip(second, second.stat().st_size // 2)
    damaged = ShardedSamples(str(cifar), "train", tmp_path / "cache")
    with pytest.raises(ShardError) as err:
        damaged[samples.starts[1]]
    one_line(err, f"shard {second} does not match the SHA-1 its index.json records")


def upload(s3_server, cifar: Path, flipped: str | None = None) -> str:
    client = s3_server.client()
    for p in sorted((cifar / "train").iterdir()):
        body = bytearray(p.read_bytes())
        if p.name == flipped:
            body[len(body) // 2] ^= 0x10
        client.put_object(Bucket=s3_server.bucket, Key=f"flips/train/{p.name}", Body=bytes(body))
    return f"s3://{s3_server.bucket}/flips"


def test_s3_shards_are_verified_into_the_node_cache_and_a_damaged_copy_is_fetched_again(
    cifar: Path, tmp_path: Path, s3_server
) -> None:
    """The store's bytes flipped: refused after the retries, nothing cached. The cached copy's bytes flipped
    on the node's disk: fetched again, then read as written. Both flipped: refused."""
    first = sorted((cifar / "train").glob("*.mds"))[0]
    url = upload(s3_server, cifar, flipped=first.name)
    with pytest.raises(ShardError) as err:
        ShardedSamples(url, "train", tmp_path / "cache", retries=2)[0]
    one_line(err, f"shard {url}/train/{first.name} does not match the SHA-1 its index.json records (2 ")
    assert not list((tmp_path / "cache").rglob("*.mds"))

    url = upload(s3_server, cifar)
    original = ShardedSamples(url, "train", tmp_path / "cache", retries=1)[0]
    expected = bytes(original.image)
    (copy,) = (tmp_path / "cache").rglob(f"*.{first.name}")
    flip(copy, copy.stat().st_size // 2)
    again = ShardedSamples(url, "train", tmp_path / "cache", retries=1)
    assert bytes(again[0].image) == expected and copy.read_bytes() == first.read_bytes()

    flip(copy, copy.stat().st_size // 2)
    upload(s3_server, cifar, flipped=first.name)
    with pytest.raises(ShardError) as err:
        ShardedSamples(url, "train", tmp_path / "cache", retries=1)[0]
    one_line(err, f"shard {url}/train/{first.name} does not match the SHA-1")


# ---- the node cache on a disk that cannot take it ------------------------------------------------------


@contextlib.contextmanager
def file_size_limit(limit: int):
    """In this process, while inside, a write past ``limit`` bytes of any file fails with EFBIG, as at a
    full disk's end (only the soft limit is lowered: it is raised back without root)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.mark.parametrize("fault", ["EFBIG", "EROFS"])
def test_a_node_cache_that_cannot_be_written_is_one_line_naming_it_and_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """A full cache disk (the copy stopped at 500 of its 1000 bytes) or a read-only one (its folder cannot
    be made) ended in an OSError traceback."""
    (tmp_path / "store" / "train").mkdir(parents=True)
    (tmp_path / "store" / "train" / "a.mds").write_bytes(b"a" * 1000)
    digest = hashlib.sha1(b"a" * 1000).hexdigest()
    code = getattr(errno, fault)
    cache_root = tmp_path / "cache"
    mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if cache_root in self.parents or self == cache_root:
            raise OSError(code, os.strerror(code))
        return mkdir(self, *args, **kwargs)

    if fault == "EROFS":
        monkeypatch.setattr(Path, "mkdir", read_only)
    cache = ChunkCache(cache_root, "s3://b/p", limit_bytes=10_000)
    with pytest.raises(ShardError) as err, file_size_limit(500 if fault == "EFBIG" else 1 << 40):
        cache.open(LocalStore(str(tmp_path / "store")), "train/a.mds", 1000, retries=1, digest=digest)
    message = str(err.value)
    assert message.startswith(f"cannot write the node cache {cache.root} ({os.strerror(code)}): pass")
    assert "--data.cache_dir=" in message and "\n" not in message
    assert not [p for p in cache_root.rglob("*") if p.name.endswith(".mds") or ".tmp-" in p.name]


def test_a_seal_that_cannot_be_written_costs_a_hash_and_leaves_nothing(tmp_path: Path) -> None:
    """A shard's seal (its verified SHA-1) on a full disk: the shard is still read, and no half-written
    seal is left in the cache folder (a ``.partial`` file of each process was)."""
    shard = tmp_path / "a.mds"
    shard.write_bytes(b"a" * 1000)
    digest = hashlib.sha1(b"a" * 1000).hexdigest()
    (tmp_path / "seals").mkdir()
    with file_size_limit(0):
        assert shards.verified(shard, digest, tmp_path / "seals" / "a.mds.sha1")
    assert list((tmp_path / "seals").iterdir()) == []
    assert shards.verified(shard, digest, tmp_path / "seals" / "a.mds.sha1")  # and sealed now
    assert [p.name for p in (tmp_path / "seals").iterdir()] == ["a.mds.sha1"]
