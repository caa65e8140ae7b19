"""Fixtures shared by the end-to-end tests: a state dir that does not exist
yet, the installed CLI bound to it, and a fresh Git workspace."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# tests/ is not a package, so pytest puts only tests/ (not the repository
# root) on sys.path; the root makes ``tests.helpers`` importable the same way
# from every test directory, whatever the invocation (pytest or python -m pytest).
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.helpers import LONG_ENV, Cli, git_workspace, long_mode, require_tools

# One switch for the long mode: KXEN_TEST_LONG=1 also turns on the crash
# simulator's own (tests/reliability/crashsim.py reads KXEN_RELIABILITY_LONG).
# Set at import, before any test module reads it; xdist workers import this too.
if os.environ.get(LONG_ENV, "") not in ("", "0"):
    os.environ.setdefault("KXEN_RELIABILITY_LONG", "1")

# pytester runs a small pytest session in-process (tests/test_standard_tools.py).
pytest_plugins = ["pytester"]


#: The bytecode cache of this test session (see :func:`_bytecode_cache`), removed at the end.
_PYCACHE_ENV = "KXEN_TEST_PYCACHE"


def _bytecode_cache(config: pytest.Config) -> None:
    """Under ``PYTHONDONTWRITEBYTECODE`` every CLI process the tests start would compile all of
    kxen_agent from source (a third of a ``session show``'s CPU). Set once by the process that
    starts the session (xdist workers and every CLI inherit it), the bytecode goes to a private
    cache of this session instead (``PYTHONPYCACHEPREFIX``): still nothing written next to the
    sources, and each module compiled once. The CLI runs the same code; only its start is cheaper.
    """
    if hasattr(config, "workerinput") or not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return
    if os.environ.get("PYTHONPYCACHEPREFIX"):
        return  # a cache of the caller's (or an outer session's: pytester runs this plugin again)
    import tempfile

    cache = tempfile.mkdtemp(prefix="kxen-test-pycache-")
    os.environ[_PYCACHE_ENV] = os.environ["PYTHONPYCACHEPREFIX"] = cache
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    config.add_cleanup(lambda: _drop_bytecode_cache(cache))


def _drop_bytecode_cache(cache: str) -> None:
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    if os.environ.get(_PYCACHE_ENV) == cache:
        del os.environ[_PYCACHE_ENV], os.environ["PYTHONPYCACHEPREFIX"]
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    _bytecode_cache(config)
    # Registered here rather than in pyproject.toml so that a pytest run loading
    # this file as a plugin (tests/test_standard_tools.py) knows the marker too.
    config.addinivalue_line(
        "markers",
        "tools(*names): the test runs these commands (zstd, b3sum); skipped when one is missing, "
        "failed instead under KXEN_AGENT_REQUIRE_TOOLS=1",
    )
    config.addinivalue_line(
        "markers",
        "long(why): a test that repeats, at more cost, what a faster test covers (named in why); "
        "runs only under KXEN_TEST_LONG=1",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("tools"):
        require_tools(*mark.args)
    for mark in item.iter_markers("long"):
        if not long_mode():
            raise pytest.skip.Exception(f"long mode only ({LONG_ENV}=1): {mark.args[0]}", _use_item_location=True)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A state dir that does not exist yet (the first write creates it)."""
    return tmp_path / "state"


@pytest.fixture
def cli(state_dir: Path) -> Iterator[Cli]:
    c = Cli(state_dir)
    yield c
    c.kill_spawned()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return git_workspace(tmp_path / "ws")
