from pathlib import Path

import pytest
from lit_ddp.testing import conflict_markers, resolved_config

PROJECT = Path(__file__).resolve().parents[1]


def pytest_sessionstart(session: pytest.Session) -> None:
    # `cruft update` leaves git conflict markers in a file it could not merge, and says all went well.
    if found := conflict_markers(PROJECT):
        pytest.exit(
            f"merge conflict markers left by `cruft update` in {', '.join(found)}: resolve them, then rerun",
            returncode=1,
        )


@pytest.fixture(scope="session")
def default_config() -> dict:
    """configs/default.yaml as `fit` resolves it (defaults filled in): your network and your data."""
    from {{ cookiecutter.package_name }}.__main__ import main

    return resolved_config(main, "--config", str(PROJECT / "configs" / "default.yaml"))


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs write logs/ under a temporary folder, not into the project."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
