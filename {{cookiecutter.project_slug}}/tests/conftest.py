"""Shared fixtures of the project's tests."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def project_root() -> Path:
    """The baked project's folder, holding run.py and run.sh."""
    return ROOT
