"""Simulated power loss: every crash state of every workload is old or new, never a mixture.

See :mod:`tests.reliability.crashsim` for the model. The first test is the
claim; the others show the simulator has teeth: a store that forgets one
barrier, renames unsynced data, skips the reflog fsync or writes around
``store.io`` is caught.

``KXEN_RELIABILITY_LONG=1`` explores every policy at every crash point
(with 8 random subsets each) and recovers every distinct state.
"""

from __future__ import annotations

import os

import pytest

from kxen_agent.store.fsio import TracingIO

from .crashsim import FS, Trace, explore
from .workloads import ForkWorkload, all_workloads


@pytest.mark.slow
@pytest.mark.parametrize("workload", all_workloads(), ids=lambda w: w.name)
def test_every_crash_state_opens_is_clean_and_is_old_or_new(workload) -> None:
    rep = explore(workload)
    print(rep.line())
    assert rep.ops > 10 and rep.crash_points == rep.ops + 1
    assert rep.by_policy.get("sync") == rep.crash_points, "every prefix is explored with the durable-only policy"
    assert rep.by_policy.get("kill", 0) > 0 and rep.by_policy.get("meta", 0) > 0 and rep.recovered > 0
    assert rep.failures == [], "\n".join(rep.failures[:20])


# ------------------------------------------------------------------ the simulator has teeth


def _under(path: str, name: str) -> bool:
    return f"{os.sep}{name}{os.sep}" in path + os.sep


class ForgetsRefDirSync(TracingIO):
    """A store that returns from a ref transaction before its rename is durable."""

    def fsync_dir(self, directory: str) -> None:
        if not _under(directory, "refs"):
            super().fsync_dir(directory)


class ForgetsObjectDirSync(TracingIO):
    """A store that names objects in refs before their directory entries are durable."""

    def fsync_dir(self, directory: str) -> None:
        if not (_under(directory, "objects") and len(os.path.basename(directory)) == 2):
            super().fsync_dir(directory)


class RenamesUnsyncedData(TracingIO):
    """A store that renames temp files into place without fsyncing them first."""

    def write_tmp(self, directory: str, data: bytes, *, sync: bool = True, prefix: str = "tmp_") -> str:
        return super().write_tmp(directory, data, sync=False, prefix=prefix)


class SkipsReflogSync(TracingIO):
    """A store that commits a ref file counting reflog bytes it never fsynced."""

    def append(self, path: str, data: bytes, *, sync: bool = True) -> int:
        return super().append(path, data, sync=False)


class BypassesTheSeam(TracingIO):
    """A store that writes ref files around ``store.io``."""

    def write_durable(self, path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)


@pytest.mark.parametrize(
    ("broken", "expect"),
    [
        (ForgetsRefDirSync, "older state than one acknowledged"),
        (ForgetsObjectDirSync, "missing-object"),
        (RenamesUnsyncedData, "corrupt"),
        (SkipsReflogSync, "shorter"),
        (BypassesTheSeam, "bypassed store.io"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_the_simulator_catches_a_broken_store(broken: type, expect: str) -> None:
    rep = explore(ForkWorkload(), long=False, io_factory=lambda: broken(sync=False))
    assert rep.failures, f"{broken.__name__} went unnoticed: {rep.line()}"
    assert any(expect in f for f in rep.failures), "\n".join(rep.failures[:10])


def test_the_model_follows_inodes_through_renames_and_barriers(tmp_path) -> None:
    """Unit check of the model: a rename carries its file's unsynced data with it."""
    top = tmp_path / "top"
    top.mkdir()
    io = TracingIO(sync=False)
    snapshot = FS.capture(str(top))
    d = str(top / "d")
    io.makedirs(d)  # mkdir d, fsync top
    tmp = io.write_tmp(d, b"hello", sync=False)  # create, write: unsynced
    io.rename(tmp, os.path.join(d, "f"))  # unsynced rename
    io.fsync_dir(d)  # the name is durable, the data is not
    io.fsync_path(os.path.join(d, "f"))  # now the data is too
    t = Trace(snapshot, list(io.trace), str(top))
    n = len(t)
    assert [op.kind for op in io.trace] == ["mkdir", "fsync_dir", "create", "write", "rename", "fsync_dir", "fsync"]
    assert t.state(n, "sync").listing() == {"d": None, "d/f": b"hello"}
    # Before the file's fsync, a power loss keeps the durable name with no durable data.
    assert t.state(n - 1, "sync").listing() == {"d": None, "d/f": b""}
    assert t.state(n - 1, "kill").listing() == {"d": None, "d/f": b"hello"}
    # Before the directory fsync: the rename may or may not have happened.
    assert t.state(5, "sync").listing() == {"d": None}
    assert t.state(5, "kill").listing() == {"d": None, "d/f": b"hello"}
    assert t.state(5, "meta").listing() == {"d": None, "d/f": b""}  # renamed, data lost
    assert t.state(5, "data").listing() == {"d": None}
    assert t.state(0, "kill").listing() == {}
