from pathlib import Path

import pytest


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs write logs/ under a temporary folder, not into the project."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
