"""lit_ddp's MDS writer (lit_ddp/data/mds.py) against files Mosaic Streaming's own writer made
(tests/data/mds_golden, tests/helpers/mds_golden.py): the same bytes for the same rows, read back by
Mosaic's reader where it is installed and by lit_ddp's everywhere. Needs no network and no
mosaicml-streaming."""

import json
from pathlib import Path

import pytest
from conftest import REPO
from mds_golden import CASES

from lit_ddp.data.mds import MDSWriter
from lit_ddp.data.shards import ShardedSamples
from lit_ddp.errors import UserError

GOLDEN = REPO / "tests" / "data" / "mds_golden"


def files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.name != "README.md"}


def write(out: Path, case: str) -> Path:
    columns, limit, rows = CASES[case]
    with MDSWriter(out / case, columns, limit) as writer:
        for row in rows:
            writer.write(row)
    return out / case


@pytest.mark.parametrize("case", list(CASES))
def test_the_writer_writes_the_bytes_mosaics_writer_wrote_for_the_same_rows(
    tmp_path: Path, case: str
) -> None:
    golden = files(GOLDEN / case)
    assert "index.json" in golden
    assert files(write(tmp_path, case)) == golden


def test_mosaics_reader_reads_back_every_row_lit_ddp_wrote(tmp_path: Path) -> None:
    mds = pytest.importorskip("streaming.base.format", reason="mosaicml-streaming is not installed")
    for case, (_, _, rows) in CASES.items():
        write(tmp_path, case)
        index = json.loads((tmp_path / case / "index.json").read_text())
        read = []
        for shard in index["shards"]:
            reader = mds.reader_from_json(str(tmp_path), case, shard)
            read += [reader.get_item(i) for i in range(shard["samples"])]
        assert read == rows, case


@pytest.mark.parametrize("case", ["raw_limit", "folder_one_shard", "first_row_over_limit"])
def test_lit_ddps_reader_reads_the_files_mosaics_writer_made(case: str) -> None:
    _, _, rows = CASES[case]
    samples = ShardedSamples(str(GOLDEN), case)
    assert len(samples) == len(rows)
    for i, row in enumerate(rows):
        sample = samples[i]
        assert (bytes(sample.image), sample.index, sample.label) == (row["image"], row["index"], row["label"])
        assert sample.path == row.get("path", "")


def test_a_shard_size_mds_offsets_cannot_address_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"over MDS's 4 GiB .*--shard-mb below 4096"):
        MDSWriter(tmp_path, {"image": "bytes"}, 1 << 32)
