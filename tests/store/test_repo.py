"""The state dir: lazy creation, its FORMAT file, crashes during the first write."""

from __future__ import annotations

import os

import pytest

from kxen_agent.store import StateDirError, Store, fsck

from .helpers import run_python


def test_state_dir_is_created_by_the_first_write_only(state_dir):
    store = Store(str(state_dir))
    assert not state_dir.exists() and not store.exists
    assert list(store.iter_ids()) == []
    assert fsck(store).clean
    assert not state_dir.exists()
    store.put("blob", b"x")
    assert (state_dir / "FORMAT").read_bytes() == b"kxen-agent-state 2\n"
    assert store.exists and Store(str(state_dir)).exists


_CRASH_IN_INIT = r"""
import os, sys
from kxen_agent.store import FileIO, Store
io = FileIO()
def hook(op, path):
    if op == "rename" and os.path.basename(path) == "FORMAT":
        os._exit(9)  # killed after the FORMAT temp file exists, before its rename
io.hook = hook
Store(sys.argv[1], io=io).put("blob", b"x")
"""


def test_a_crash_during_the_first_write_does_not_brick_the_dir(state_dir):
    p = run_python(_CRASH_IN_INIT, str(state_dir))
    assert p.returncode == 9, p.stderr.decode()
    leftovers = os.listdir(state_dir)
    # The skeleton's directories (empty) and the temp file; no FORMAT.
    assert "FORMAT" not in leftovers
    assert [n for n in leftovers if n.startswith("FORMAT.tmp_")] and all(
        n.startswith("FORMAT.tmp_") or n in ("objects", "refs", "logs", "locks", "leases") for n in leftovers
    )
    store = Store(str(state_dir))
    oid = store.put("blob", b"x")
    assert store.get(oid) == b"x"
    assert fsck(store).clean


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"kxen-agent-state 99\n", "has format version 99, newer than this kxen-agent understands (2)"),
        (b"kxen-agent-state 0\n", "unknown format version 0"),
        (b"kxen-agent-state 1", "is not a kxen-agent format file"),
        (b"", "is not a kxen-agent format file"),
    ],
)
def test_format_file_is_checked(state_dir, content, reason):
    state_dir.mkdir()
    (state_dir / "FORMAT").write_bytes(content)
    with pytest.raises(StateDirError) as ei:
        Store(str(state_dir))
    assert reason in str(ei.value)
    assert "\n" not in str(ei.value)


def test_foreign_or_non_directory_is_refused(tmp_path):
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "data.db").write_bytes(b"")
    with pytest.raises(StateDirError, match="is not empty and is not a kxen-agent state dir"):
        Store(str(tmp_path / "foreign"))
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StateDirError, match="Not a directory"):
        Store(str(tmp_path / "file"))
