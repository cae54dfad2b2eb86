"""A run folder on S3 (``--trainer.default_root_dir=s3://bucket/runs``), written through fsspec, against the
S3-compatible server on 127.0.0.1 (tests/helpers/s3.py). Skipped without s3fs, which lit_ddp does not
install (without it a run is refused in one line: test_preflight's LINES)."""

from pathlib import Path

import pytest
from conftest import TINY_RUN
from helpers import s3

from lit_ddp.cli import build_cli

pytest.importorskip("s3fs")
s3_server = s3.s3_server  # the fixture: a moto server on 127.0.0.1

RUN = "runs/lightning_logs/version_0"


def test_a_validate_into_a_remote_runs_version_keeps_its_config(
    tmp_path: Path, monkeypatch, capsys, s3_server: s3.S3Server
) -> None:
    """validate into an earlier s3:// run's version replaced the run's config.yaml with its own, where a local
    folder keeps it: the validate's goes beside it, as validate_config.yaml. The fit's closing line said
    `--ckpt_path=last resumes it`, which does not search s3://."""
    monkeypatch.chdir(tmp_path)
    root = f"s3://{s3_server.bucket}/runs"
    build_cli(["fit", *TINY_RUN, f"--trainer.default_root_dir={root}"])
    # --ckpt_path=last does not search s3://: the closing line does not promise that it resumes the run.
    assert "pass it as --ckpt_path to train on from it" in capsys.readouterr().out
    client = s3_server.client()

    def read(key: str) -> bytes:
        return client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()

    trained = read(f"{RUN}/config.yaml")
    pinned = ["--trainer.logger=TensorBoardLogger", f"--trainer.logger.save_dir={root}"]
    build_cli(
        ["validate", *TINY_RUN, *pinned, "--trainer.logger.version=0"]
        + [f"--ckpt_path={root}/lightning_logs/version_0/checkpoints/last.ckpt"]
    )
    assert read(f"{RUN}/config.yaml") == trained
    assert b"version: 0" in read(f"{RUN}/validate_config.yaml") and b"version: 0" not in trained
