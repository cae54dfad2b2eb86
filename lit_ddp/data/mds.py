"""Mosaic's MDS format, written: ``index.json`` and ``shard.NNNNN.mds`` files, byte for byte what Mosaic
Streaming's ``MDSWriter`` (0.13.0) writes for the same rows, columns and size limit, uncompressed, with
each shard's SHA-1 in the index (tests/test_mds.py holds it to files that writer made).

Why not Mosaic's writer: mosaicml-streaming 0.13.0, its last release, requires numpy < 2.2
(mosaicml/streaming#849), and its maintained fork (streaming-community) brings transformers and the Azure,
GCS and OCI clients to write a file. Back to it when a release of either installs beside the numpy the rest
of the stack takes with a light dependency set.

A shard, every integer little-endian::

    uint32 n                     samples in the shard
    uint32 offsets[n + 1]        byte offset of each sample in the file, and of the file's end
    config                       the writer's settings as JSON (sorted keys): columns, size limit, hashes
    n samples                    each: a uint32 size per variable-size column, then every column's bytes

Columns are stored sorted by name. Encodings: ``bytes`` (as given), ``str`` (UTF-8), ``int`` (int64).
A shard is closed before the row that would take it over ``size_limit`` bytes (each sample counting 4
more, its offset): a first row larger than the limit leaves an empty shard before its own, as Mosaic's
does.
"""

import hashlib
import json
import struct
from pathlib import Path

from lit_ddp.errors import UserError
from lit_ddp.writes import write_file

INDEX = "index.json"
# Offsets are uint32: no shard can reach 4 GiB.
MAX_SHARD_BYTES = 1 << 32
# name -> (fixed size or None, encode)
ENCODINGS = {
    "bytes": (None, lambda value: bytes(value)),
    "str": (None, lambda value: value.encode("utf-8")),
    "int": (8, lambda value: struct.pack("<q", value)),
}


class MDSWriter:
    """Rows (dicts of column → value) written in order into shards under ``out``; ``finish()`` writes the
    last shard and ``index.json``. ``size_limit``: bytes per shard, None or 0 for one shard."""

    def __init__(self, out: Path, columns: dict[str, str], size_limit: int | None) -> None:
        unknown = {name: enc for name, enc in columns.items() if enc not in ENCODINGS}
        if unknown:
            raise ValueError(f"columns of encodings lit_ddp does not write: {unknown}")
        if size_limit and size_limit >= MAX_SHARD_BYTES:
            raise UserError(
                f"a shard size of {size_limit:,} bytes is over MDS's 4 GiB (its offsets are 32-bit): pass"
                " --shard-mb below 4096"
            )
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.names = sorted(columns)
        self.encodings = [columns[name] for name in self.names]
        self.sizes = [ENCODINGS[enc][0] for enc in self.encodings]
        self.size_limit = size_limit or None
        self.config = {
            "version": 2,
            "format": "mds",
            "compression": None,
            "hashes": ["sha1"],
            "size_limit": self.size_limit,
            "column_names": self.names,
            "column_encodings": self.encodings,
            "column_sizes": self.sizes,
        }
        self.config_data = json.dumps(self.config, sort_keys=True).encode()
        self.shards: list[dict] = []
        self._reset()

    def _reset(self) -> None:
        self.samples: list[bytes] = []
        self.shard_bytes = 8 + len(self.config_data)  # the count, the end offset, the config

    def encode(self, row: dict) -> bytes:
        sizes, data = [], []
        for name, encoding, size in zip(self.names, self.encodings, self.sizes, strict=True):
            datum = ENCODINGS[encoding][1](row[name])
            if size is None:
                sizes.append(len(datum))
            data.append(datum)
        return struct.pack(f"<{len(sizes)}I", *sizes) + b"".join(data)

    def write(self, row: dict) -> None:
        sample = self.encode(row)
        if self.size_limit and self.size_limit < self.shard_bytes + len(sample) + 4:
            self._flush()
        self.samples.append(sample)
        self.shard_bytes += len(sample) + 4

    def _flush(self) -> None:
        n = len(self.samples)
        head = 4 + 4 * (n + 1) + len(self.config_data)
        offsets = [head]
        for sample in self.samples:
            offsets.append(offsets[-1] + len(sample))
        if offsets[-1] >= MAX_SHARD_BYTES:
            raise UserError(
                f"shard {len(self.shards)} of {self.out} would hold {offsets[-1]:,} bytes, over MDS's 4 GiB"
                " (its offsets are 32-bit): pass a --shard-mb below 4096"
            )
        data = b"".join([struct.pack(f"<I{n + 1}I", n, *offsets), self.config_data, *self.samples])
        name = f"shard.{len(self.shards):05}.mds"
        write_file(self.out / name, data, "shard", elsewhere="a DEST")
        raw = {"basename": name, "bytes": len(data), "hashes": {"sha1": hashlib.sha1(data).hexdigest()}}
        self.shards.append({"samples": n, "raw_data": raw, "zip_data": None, **self.config})
        self._reset()

    def finish(self) -> None:
        if self.samples:
            self._flush()
        index = json.dumps({"version": 2, "shards": self.shards}, sort_keys=True)
        write_file(self.out / INDEX, index, "the shard index", elsewhere="a DEST")

    def __enter__(self) -> "MDSWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:  # a failed split leaves no index: nothing reads it as complete
            self.finish()
