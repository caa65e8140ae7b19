"""Fixtures for the store tests: a fresh state dir and a store on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kxen_agent.store import Store

from .helpers import CLI_NAMESPACES


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A state dir that does not exist yet (the store creates it on first write)."""
    return tmp_path / "state"


@pytest.fixture
def store(state_dir: Path) -> Store:
    """A store opened as the CLI opens one (its namespaces in the skeleton)."""
    return Store(str(state_dir), namespaces=CLI_NAMESPACES)
