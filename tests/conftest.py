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


#: What the CLI processes of the suite import: compiled into the bytecode cache while the workers start.
_WARM = ("kxen_agent.cli.main", "kxen_agent.cli.run_cmds", "kxen_agent.cli.session_cmds", "kxen_agent.cli.store_cmds",
         "kxen_agent.cli.remote_cmds", "kxen_agent.runtime.providers.anthropic", "kxen_agent.runtime.providers.openai_compat",
         "anthropic", "openai")


def _warm_already(cache: str) -> bool:
    """Whether an earlier session filled ``cache``: the CLI's entry module and the heaviest SDK each have
    bytecode there no older than their source (a source edited since is compiled by its first user)."""
    import importlib.util

    sources = [os.path.join(_ROOT, "kxen_agent", "cli", "main.py")]
    spec = importlib.util.find_spec("anthropic")  # a top-level name: found, not imported
    if spec is not None and spec.origin:
        sources.append(spec.origin)
    for src in sources:
        head, name = os.path.split(os.path.abspath(src))
        pyc = os.path.join(cache, head.lstrip(os.sep), f"{name[:-3]}.{sys.implementation.cache_tag}.pyc")
        try:
            if os.stat(pyc).st_mtime < os.stat(src).st_mtime:
                return False
        except OSError:
            return False
    return True


def _bytecode_cache(config: pytest.Config) -> None:
    """Under ``PYTHONDONTWRITEBYTECODE`` every CLI process the tests start would compile all of
    kxen_agent from source (a third of a ``session show``'s CPU). Set by the process that starts
    the session (xdist workers and every CLI inherit it), bytecode goes to a cache of the venv's
    own instead (``PYTHONPYCACHEPREFIX``, ``<venv>/kxen-test-pycache``, gone with the venv): still
    nothing written next to the sources, and each module compiled once. Python checks each cached
    file against its source, so the CLI runs the same code; only its start is cheaper. A process
    started in the background fills the cache while the workers start, so that the first tests'
    processes do not all compile the same modules at once (not when an earlier session filled it).
    """
    if hasattr(config, "workerinput") or not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return
    if os.environ.get("PYTHONPYCACHEPREFIX"):
        return  # a cache of the caller's (or an outer session's: pytester runs this plugin again)
    import subprocess
    import tempfile

    cache = os.path.join(sys.prefix, "kxen-test-pycache")
    if sys.prefix == sys.base_prefix or not os.access(sys.prefix, os.W_OK):
        cache = tempfile.mkdtemp(prefix="kxen-test-pycache-")  # not a venv of ours: this session's only
        config.add_cleanup(lambda: __import__("shutil").rmtree(cache, ignore_errors=True))
    os.environ["PYTHONPYCACHEPREFIX"] = cache
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    warm = None
    if not _warm_already(cache):  # importing them all again costs ~3 s of CPU for nothing
        code = "import importlib\nfor m in %r:\n    try: importlib.import_module(m)\n    except ImportError: pass" % (_WARM,)
        warm = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def restore() -> None:
        if warm is not None:
            warm.kill()
            warm.wait()
        del os.environ["PYTHONPYCACHEPREFIX"]
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"

    config.add_cleanup(restore)


#: Where the tests' temporary directories go: a directory, or unset for /dev/shm when it can hold them.
TMP_ENV = "KXEN_TEST_TMP"
#: The free space /dev/shm needs to be chosen (a session's live directories peak well under this).
_SHM_FREE = 4 << 30


def _scratch_root(config: pytest.Config) -> None:
    """Every ``tmp_path`` (state dirs, workspaces, remotes) on a RAM file system when there is one.

    The suite makes tens of thousands of durable writes; on the disk each ``fsync`` blocks its
    worker for milliseconds (measured: 2.5 ms per fsync on this machine's ext4, 24 us on tmpfs).
    What an fsync makes durable is checked by the power-loss simulator, which models the disk and
    never trusts the one it runs on (RELIABILITY.md), so no verdict depends on where these files
    are; the store still makes every call, in the same order. Git's own suite offers the same
    (``--root`` on a tmpfs). ``KXEN_TEST_TMP=DIR`` puts them in DIR (``/tmp`` for the disk);
    ``--basetemp`` and pytest's ``PYTEST_DEBUG_TEMPROOT`` still win. Set by the process that starts
    the session: xdist workers get their directory from it."""
    if hasattr(config, "workerinput") or config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT"):
        return
    root = os.environ.get(TMP_ENV, "")
    if not root:
        try:
            st = os.statvfs("/dev/shm")
        except OSError:
            return
        if not os.access("/dev/shm", os.W_OK | os.X_OK) or st.f_bavail * st.f_frsize < _SHM_FREE:
            return
        root = "/dev/shm"
    os.environ["PYTEST_DEBUG_TEMPROOT"] = root  # read when the first temporary directory is made

    def restore() -> None:
        os.environ.pop("PYTEST_DEBUG_TEMPROOT", None)

    config.add_cleanup(restore)


def pytest_configure(config: pytest.Config) -> None:
    _bytecode_cache(config)
    _scratch_root(config)
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


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``-n N`` without ``--dist``: ``worksteal`` rather than xdist's ``load``. A worker that runs out
    of tests takes half of the other's queue, so no worker ends alone on a long tail (replaying a
    whole run's per-test CPU on two workers: ``load`` ended one 8% after the other). Set here, not
    in ``addopts``, so that ``-p no:xdist`` still works; an explicit ``--dist`` wins."""
    if getattr(config.option, "dist", None) == "no" and getattr(config.option, "numprocesses", None):
        config.option.dist = "worksteal"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores this process may use. A third of a worker's time
    is spent waiting, not computing (a run on two cores took 494 s of wall for 888 s of CPU): on
    lease and deadline timers, on the child processes a CLI test starts, on git. The extra worker
    runs while another waits; an explicit ``-n N`` wins."""
    return len(os.sched_getaffinity(0)) + 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``slow`` tests first, the rest in their order: with ``-n auto`` the workers take the long
    tests while the queue is full and finish on short ones, instead of one worker running a
    half-minute torture alone at the end. (xdist hands tests out in this order; every worker
    computes the same order.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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
