"""Message positions (issue #32, item 1): `fork --at` finds its message with one lookup, and a positions
file that is stale, torn, damaged or raced never makes it fork wrong nor refuse wrongly (§11a.1).

Real state dirs; counts of message reads (the seam's read counter), never times.
"""

from __future__ import annotations

import os
from pathlib import Path
import pytest

from kxen_agent.errors import UsageError
from kxen_agent.runtime.history_index import CACHES
from kxen_agent.session.positions import ID_SIZE, MAGIC, POSITIONS, find
from kxen_agent.session.sessions import NS, SessionStore, msg_id
from kxen_agent.store import Store, fsck
from kxen_agent.store.fsio import FaultyIO

from tests.runtime.test_history import chat, session_with_history


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[str, str, str]:
    base = tmp_path_factory.mktemp("positions")
    ws = base / "ws"
    ws.mkdir()
    root = base / "state"
    ses = session_with_history(root, ws, 300)
    return str(root), str(ws), ses


def _store(root: str) -> Store:
    return Store(root, io=FaultyIO(None, sync=False), namespaces=(NS,), caches=CACHES)


def _history(root: str, ses: str) -> list:
    s = SessionStore(_store(root))
    return s.history(s.get(ses).head)


def _reads_of_lookup(root: str, ses: str, m) -> int:
    store = _store(root)
    sessions = SessionStore(store)
    info = sessions.get(ses)
    before = store.io.read_count
    assert sessions.resolve_message(info, msg_id(m.oid)[:20]) == m.oid
    return store.io.read_count - before


def test_a_second_lookup_reads_a_fixed_number_of_objects_whatever_the_distance(built) -> None:
    root, _, ses = built
    path = _store(root).caches.path(POSITIONS, f"{NS}/{ses}")
    if os.path.exists(path):
        os.unlink(path)
    hist = _history(root, ses)
    first = _reads_of_lookup(root, ses, hist[150])  # builds the file: walks the whole history once
    assert os.path.getsize(path) == len(MAGIC) + ID_SIZE * len(hist)
    near, far = _reads_of_lookup(root, ses, hist[-3]), _reads_of_lookup(root, ses, hist[1])
    assert near == far < 20 and first > len(hist)  # the first walked the history; the others read the same few


def test_a_message_of_another_history_is_refused_and_a_stale_file_is_rewritten(built) -> None:
    root, _, ses = built
    store = _store(root)
    sessions = SessionStore(store)
    foreign_head = sessions.append_messages(None, chat(20, tag="other"))
    foreign = sessions.history(foreign_head)[5]
    with pytest.raises(UsageError, match="is not in the history of session"):
        sessions.resolve_message(sessions.get(ses), msg_id(foreign.oid))
    # A file of another history (a rewind, a copy): it does not join the head, so it is written anew.
    path = store.caches.path(POSITIONS, f"{NS}/{ses}")
    with open(path, "wb") as f:
        f.write(MAGIC + b"".join(m.oid for m in sessions.history(foreign_head)))
    hist = _history(root, ses)
    assert sessions.resolve_message(sessions.get(ses), msg_id(hist[7].oid)) == hist[7].oid
    with open(path, "rb") as f:
        assert f.read() == MAGIC + b"".join(m.oid for m in hist)


@pytest.mark.parametrize("damage", ["torn", "flipped", "raced", "empty", "no-magic"])
def test_a_damaged_file_never_makes_a_lookup_wrong(built, damage: str) -> None:
    root, _, ses = built
    store = _store(root)
    sessions = SessionStore(store)
    info = sessions.get(ses)
    hist = sessions.history(info.head)
    good = MAGIC + b"".join(m.oid for m in hist)
    path = store.caches.path(POSITIONS, f"{NS}/{ses}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = {
        "torn": good[:-7],
        "flipped": good[:len(MAGIC) + ID_SIZE * 40] + bytes(ID_SIZE) + good[len(MAGIC) + ID_SIZE * 41:],
        "raced": good[:len(MAGIC) + ID_SIZE * 200] + good[len(MAGIC) + ID_SIZE * 100:],
        "empty": b"",
        "no-magic": b"x" + good[1:],
    }[damage]
    with open(path, "wb") as f:
        f.write(data)
    for m in (hist[40], hist[10], hist[250], hist[-1]):
        assert sessions.resolve_message(info, msg_id(m.oid)) == m.oid
    assert find(store, info.group, info.head, hist[40].oid, 40) in (True, None)
    rep = fsck(Store(root, namespaces=(NS,), caches=CACHES))
    assert rep.clean or damage == "flipped", rep.problems


def test_fsck_names_an_entry_a_lookup_would_trust(built) -> None:
    root, _, ses = built
    store = _store(root)
    sessions = SessionStore(store)
    hist = sessions.history(sessions.get(ses).head)
    path = store.caches.path(POSITIONS, f"{NS}/{ses}")
    ids = [m.oid for m in hist]
    ids[40] = ids[41]
    with open(path, "wb") as f:
        f.write(MAGIC + b"".join(ids))
    rep = fsck(Store(root, namespaces=(NS,), caches=CACHES))
    assert [p.kind for p in rep.problems] == ["positions-cache"] and "entry 40" in rep.problems[0].message
    os.unlink(path)
    assert fsck(Store(root, namespaces=(NS,), caches=CACHES)).clean


def test_the_cli_fork_at_uses_and_keeps_the_file(cli, built) -> None:
    root, _, ses = built
    hist = _history(root, ses)
    cli("session", "fork", ses, "--at", msg_id(hist[100].oid)[:20], env={"KXEN_AGENT_STATE_DIR": root}, expect=0)
    path = _store(root).caches.path(POSITIONS, f"{NS}/{ses}")
    with open(path, "rb") as f:
        assert f.read() == MAGIC + b"".join(m.oid for m in hist)


def test_the_spec_vector_is_the_format_the_code_writes_and_reads(tmp_path) -> None:
    import re

    spec = (Path(__file__).resolve().parents[2] / "objects_spec.md").read_text()
    m = re.search(r"```\npositions: two-messages\nbytes: ([0-9a-f]+)\n```", spec)
    assert m, "objects_spec.md §11a.1 has no positions block"
    data = bytes.fromhex(m.group(1))
    ids = [b"\x11" * 32, b"\x22" * 32]
    assert data == MAGIC + b"".join(ids) and len(data) == 81
    store = _store(str(tmp_path / "s"))
    store.ensure_initialized()
    from kxen_agent.session import positions

    path = store.caches.path(POSITIONS, f"{NS}/ses_x")
    positions._write(store.io, path, ids)
    with open(path, "rb") as f:
        assert f.read() == data
        assert positions._read_entry(f, 1) == ids[1]


def test_the_run_loop_keeps_the_file_beside_its_history_index(built) -> None:
    from kxen_agent.runtime.history_index import HISTORY, write_index

    root, _, ses = built
    store = _store(root)
    sessions = SessionStore(store)
    hist = sessions.history(sessions.get(ses).head)
    entries = [(m.oid, m.to_provider(), None) for m in hist]
    group = f"{NS}/{ses}"
    index, path = store.caches.path(HISTORY, group), store.caches.path(POSITIONS, group)
    for p in (index, path):
        if os.path.exists(p):
            os.unlink(p)
    size = write_index(store.io, index, entries[:200])  # a first run's index: the positions written whole
    with open(path, "rb") as f:
        assert f.read() == MAGIC + b"".join(m.oid for m in hist[:200])
    write_index(store.io, index, entries, keep=200, keep_bytes=size)  # the next run's: appended
    with open(path, "rb") as f:
        assert f.read() == MAGIC + b"".join(m.oid for m in hist)
    # ... so the first lookup after the run walks nothing.
    assert _reads_of_lookup(root, ses, hist[3]) < 20
    # An index written elsewhere than its cache dir (a test's, a tool's) leaves positions alone.
    write_index(store.io, os.path.join(root, "elsewhere"), entries[:10])
    with open(path, "rb") as f:
        assert len(f.read()) == len(MAGIC) + ID_SIZE * len(hist)
