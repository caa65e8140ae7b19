"""Session-layer object shapes (§14.10) where the library meets them, in-process over a ``MemoryStore``.

``test_schema.py`` makes its objects with the CLI on disk and checks what
users see (one-line errors, fsck); this file checks the same rules as the
library applies them — the readers, the runner, forks, listing — over the
memory store, in milliseconds. Nothing here needs the disk: that the same
values have the same ids on both stores is ``test_store_contract``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kxen_agent.errors import KxenError
from kxen_agent.runtime.runner import Runner
from kxen_agent.session import schema
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.schema import SESSION_SCHEMA, check
from kxen_agent.session.sessions import SessionStore
from kxen_agent.store import CorruptObject, RefUpdate
from kxen_agent.store.memory import MemoryStore

from .test_schema import STEPS


@pytest.fixture
def made(tmp_path: Path) -> tuple[MemoryStore, str, str, Path]:
    """Two runs and a fork in a memory store (the same steps as ``test_schema``'s CLI-made state dir)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    store = MemoryStore("schema")
    runner = Runner(store)
    first = runner.start(str(ws), "first", default_agent_definition(STEPS))
    assert first.status == "completed", first
    assert runner.resume(first.session, task="second").status == "completed"
    fork = SessionStore(store).fork(first.session)
    return store, first.session, fork.id, ws


def move(store: MemoryStore, ses: str, name: str, new: bytes) -> None:
    old = store.refs.read(f"sessions/{ses}").refs[name]
    store.refs.transaction(f"sessions/{ses}", [RefUpdate(name, old, new)], reason="test: hand edit")


def test_every_object_a_run_writes_matches_the_schema(made) -> None:
    store, _, _, _ = made
    kinds = {oid: store.read_raw(oid).kind for oid in store.iter_ids()}
    assert set(kinds.values()) == {"agent", "session", "message", "run", "journal", "blob"}
    for oid, kind in kinds.items():
        for child, want in check(kind, store.get(oid)):
            assert kinds[child] == want, (oid.hex(), kind, child.hex(), want)
    for group in store.refs.groups():
        assert SESSION_SCHEMA.governs(group)
        for name, oid in store.refs.read(group).refs.items():
            assert kinds[oid] == SESSION_SCHEMA.ref_kind(group, name), f"{group}/{name}"


def test_a_writer_never_stores_an_object_the_readers_refuse(made) -> None:
    store, ses, _, _ = made
    before = set(store.iter_ids())
    head = store.refs.read(f"sessions/{ses}").refs["head"]
    for kind, value in [("message", {"seq": 99, "role": "system", "parent": head, "content": "x"}),
                        ("run", {"id": "run_0123456789"}),
                        ("session", {"id": "not-a-session"})]:
        with pytest.raises(KxenError, match=f"refusing to write a {kind} object .* nothing was written"):
            schema.put(store, kind, value)
    assert set(store.iter_ids()) == before


def test_a_hand_edited_message_stops_every_reader_naming_it(made) -> None:
    store, ses, _, _ = made
    sessions = SessionStore(store)
    head = store.refs.read(f"sessions/{ses}").refs["head"]
    bad = store.put("message", {"seq": "7", "role": "user", "parent": head, "content": "hand-made"})
    move(store, ses, "head", bad)
    info = sessions.get(ses)
    runs_before = dict(info.runs)
    for read in (lambda: sessions.history(info.head), lambda: list(sessions.iter_forward(info.head)),
                 lambda: sessions.fork(ses), lambda: Runner(store).resume(ses, task="more")):
        with pytest.raises(CorruptObject) as e:
            read()
        text = str(e.value)
        assert bad.hex() in text and "§14.4" in text and "key 'seq' must be an int" in text, text
        assert "\n" not in text and "fsck" in text
    assert sessions.get(ses).runs == runs_before, "a task on a session whose head does not read starts no run"
    # The listing hands the damaged session to the caller and lists the rest.
    damaged: list[tuple[str, KxenError]] = []
    listed = [s.id for s in sessions.list(on_damaged=lambda g, e: damaged.append((g, e)))]
    assert ses in listed and damaged == []  # its metadata still reads: only its history is damaged


def test_a_link_to_the_wrong_kind_and_a_blob_without_utf8(made) -> None:
    store, ses, _, _ = made
    sessions = SessionStore(store)
    run_state = next(v for k, v in store.refs.read(f"sessions/{ses}").refs.items() if k.startswith("runs/"))
    bad = store.put("message", {"seq": 1, "role": "user", "parent": run_state, "content": "x"})
    move(store, ses, "head", bad)
    with pytest.raises(CorruptObject, match=f"{run_state.hex()}: is a run object, expected a message"):
        sessions.history(sessions.get(ses).head)
    blob = store.put("blob", b"\xff\xfe not text")
    move(store, ses, "head", store.put("message", {"seq": 0, "role": "user", "contentBlob": blob}))
    with pytest.raises(CorruptObject, match=f"{blob.hex()}: blob holds no UTF-8 text"):
        sessions.history(sessions.get(ses).head)


def test_refs_naming_another_sessions_or_runs_objects(made) -> None:
    store, ses, fork, _ = made
    sessions = SessionStore(store)
    runner = Runner(store)
    (a, a_oid), (b, b_oid) = sorted((k, v) for k, v in store.refs.read(f"sessions/{ses}").refs.items()
                                    if k.startswith("runs/"))
    move(store, ses, a, b_oid)
    with pytest.raises(CorruptObject, match=f"names the state of run {b[5:]} of session {ses}"):
        runner.run_state(sessions.get(ses), a[5:])
    with pytest.raises(CorruptObject, match=b_oid.hex()):
        runner.latest_run(sessions.get(ses))
    # The fork's metadata under the parent's meta ref: not this session's.
    move(store, ses, "meta", store.refs.read(f"sessions/{fork}").refs["meta"])
    with pytest.raises(CorruptObject, match=f"the metadata of session {ses} is that of {fork}"):
        sessions.get(ses)
    damaged: list[str] = []
    listed = [s.id for s in sessions.list(on_damaged=lambda g, e: damaged.append(g))]
    assert listed == [fork] and damaged == [f"sessions/{ses}"]


def test_a_group_that_is_no_session_is_passed_over(made) -> None:
    store, ses, fork, _ = made
    sessions = SessionStore(store)
    meta = store.refs.read(f"sessions/{ses}").refs["meta"]
    store.refs.transaction("sessions/notasession", [RefUpdate("meta", None, meta)], reason="test: hand edit")
    damaged: list[tuple[str, Any]] = []
    assert sorted(s.id for s in sessions.list(on_damaged=lambda g, e: damaged.append((g, e)))) == sorted([ses, fork])
    assert [g for g, _ in damaged] == ["sessions/notasession"]
    with pytest.raises(KxenError):
        sessions.list()  # without a handler the damage is raised


def test_a_fork_tree_whose_parents_make_a_cycle_is_drawn_once(made) -> None:
    store, ses, fork, _ = made
    sessions = SessionStore(store)
    meta = store.get(store.refs.read(f"sessions/{fork}").refs["meta"], "session")
    move(store, fork, "meta", store.put("session", {**meta, "parentId": fork}))  # its own parent
    root, children, family = sessions.tree(fork)
    assert root == ses and children == {ses: [fork]} and set(family) == {ses, fork}
