"""The settled marker (objects_spec.md §10.3, §9.3 rules 3 and 8; issue 32 item 2).

A store instance that finds ``FORMAT`` fsyncs the state dir and its parent
before its first write, unless ``locks/settled-<dev>-<ino>-<ctime>-<path>`` names
the state dir as it is now: then an earlier instance's fsyncs returned and
nothing since has moved or changed the state dir's top. These check that
the marker is left where the fsyncs ran, skips them only for the same
state dir unchanged, is best effort, and is no stray to fsck.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

from kxen_agent.store import ANY, FileIO, RefUpdate, Store, fsck
from kxen_agent.store.fsio import FaultyIO

from .helpers import CLI_NAMESPACES


class Ops(FileIO):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, str]] = []
        self.hook = lambda op, path: self.ops.append((op, path))

    def synced_dirs(self) -> list[str]:
        return [p for op, p in self.ops if op == "fsync_dir"]


def _first_write(root: Path, io: FileIO | None = None) -> FileIO:
    """A store instance's first write: a committed step (after which it leaves the marker it earned)."""
    io = io if io is not None else Ops()
    store = Store(str(root), io=io, namespaces=CLI_NAMESPACES)
    oid = store.put("blob", b"a write")
    store.refs.transaction("sessions/ses_marker", [RefUpdate("head", ANY, oid)], reason="a write")
    return io


def _markers(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root / "locks") if n.startswith("settled-"))


def test_the_creator_leaves_the_marker_and_the_next_instance_skips_the_two_fsyncs(tmp_path: Path) -> None:
    root = tmp_path / "state"
    _first_write(root)
    st = os.stat(root)
    where = hashlib.sha256(os.fsencode(str(root))).hexdigest()[:16]
    assert _markers(root) == [f"settled-{st.st_dev}-{st.st_ino}-{st.st_ctime_ns}-{where}"]
    io = _first_write(root)
    assert str(root) not in io.synced_dirs() and str(tmp_path) not in io.synced_dirs()
    assert ("create", str(root / "locks" / _markers(root)[0])) not in io.ops
    assert not fsck(Store(str(root), namespaces=CLI_NAMESPACES)).problems  # the marker is no stray


def test_a_changed_top_or_a_moved_state_dir_is_synced_again_and_marked_anew(tmp_path: Path) -> None:
    root = tmp_path / "state"
    _first_write(root)
    (root / "cache").mkdir()  # a change of the top directory (its status-change time moves)
    io = _first_write(root)
    assert io.synced_dirs()[:2] == [str(root), str(tmp_path)]
    assert len(_markers(root)) == 2
    assert str(root) not in _first_write(root).synced_dirs()
    moved = tmp_path / "elsewhere" / "state"
    moved.parent.mkdir()
    os.rename(root, moved)
    io = _first_write(moved)
    assert io.synced_dirs()[:2] == [str(moved), str(moved.parent)]
    assert str(moved) not in _first_write(moved).synced_dirs()
    assert len(_markers(moved)) == 3


def test_a_command_that_commits_nothing_leaves_no_marker(tmp_path: Path) -> None:
    root = tmp_path / "state"
    _first_write(root)
    (root / "cache").mkdir()
    io = Ops()
    Store(str(root), io=io, namespaces=CLI_NAMESPACES).put("blob", b"a loose write, no step")
    assert io.synced_dirs()[:2] == [str(root), str(tmp_path)]  # the fsyncs ran
    assert len(_markers(root)) == 1  # but the state dir is left as it was found, but for the object


def test_a_marker_that_cannot_be_made_changes_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "state"
    _first_write(root)
    (root / "cache").mkdir()
    counter = Ops()
    _first_write(root, counter)  # counts its operations: which one makes the marker
    create = [i for i, (op, p) in enumerate(counter.ops, 1) if op == "create" and "settled-" in p]
    assert len(create) == 1
    for m in _markers(root)[1:]:
        os.unlink(root / "locks" / m)
    io = FaultyIO(create[0], errno.ENOSPC)
    _first_write(root, io)  # no error: best effort
    assert io.faults == 1 and len(_markers(root)) == 1
    assert not fsck(Store(str(root), namespaces=CLI_NAMESPACES)).problems
