"""The rows of tests/data/mds_golden/ and how those files were made: Mosaic Streaming's own ``MDSWriter``
over ``CASES``, one folder per case (tests/test_mds.py holds lit_ddp's writer to them, byte for byte).

    pip install mosaicml-streaming==0.13.0 && python tests/helpers/mds_golden.py tests/data/mds_golden

Each case is (columns, size limit in bytes or None, rows): the columns `shard` writes for CIFAR-10 and
for an ImageFolder tree, shards closed by the limit, one shard without a limit, a first row larger than
the limit, and an empty split.
"""

import sys
from pathlib import Path

RAW = {"image": "bytes", "index": "int", "label": "int"}  # lit_ddp.data.shards.COLUMNS
FOLDER = {**RAW, "path": "str"}  # FOLDER_COLUMNS


def _raw_rows() -> list[dict]:
    pixels = [bytes((7 * i + k) % 256 for k in range(48)) for i in range(7)]
    return [{"image": image, "index": i, "label": i % 3} for i, image in enumerate(pixels)]


def _folder_rows() -> list[dict]:
    names = ["a/x.JPEG", "a/ÿé ü.jpg", "b/y.png", "b/empty.JPEG", "c/z.JPEG"]
    return [
        {"image": bytes(range(i * 37 % 256)) if i != 3 else b"", "index": i, "label": 2**40 + i, "path": p}
        for i, p in enumerate(names)
    ]


CASES = {
    "raw_limit": (RAW, 420, _raw_rows()),
    "folder_one_shard": (FOLDER, None, _folder_rows()),
    "first_row_over_limit": (RAW, 260, [{"image": b"\x01" * 300, "index": 0, "label": 1}, *_raw_rows()[1:4]]),
    "empty": (FOLDER, 1 << 20, []),
}


def main(out: Path) -> None:
    from streaming import MDSWriter

    for name, (columns, limit, rows) in CASES.items():
        with MDSWriter(
            out=str(out / name), columns=columns, size_limit=limit, compression=None, hashes=["sha1"]
        ) as writer:
            for row in rows:
                writer.write(row)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
