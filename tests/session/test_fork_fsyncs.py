"""A fork's fsyncs (issue 32 item 2; objects_spec.md §6.8 writing step 2, §9.3 rules 3, 8 and 12, §10.3).

Each fork here is made by a fresh store instance, as one CLI process makes
it, and counted by the store's FileIO: 2 fsyncs (its new log's temp file and
``steps/sessions/``) when the state dir is settled and what the fork names
in its parent's log fits the carry bound; the state dir's two fsyncs again
after it moved; the parent's log and its directory fsynced instead of
carried past the bound. Real fsyncs, real files.
"""

from __future__ import annotations

import os
from pathlib import Path

from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.session.workspace import inspect_workspace
from kxen_agent.store import FileIO, Store, fsck
from kxen_agent.store import refs as refs_mod


def _store(root: Path) -> Store:
    return Store(str(root), io=FileIO(), namespaces=(NS,))


def _parent(root: Path, ws: Path, messages: int) -> str:
    """A session whose ``messages`` user messages are records of its step log (one a step)."""
    ws.mkdir(exist_ok=True)
    store = _store(root)
    ss = SessionStore(store)
    ses = ss.create(default_agent_definition([{"content": "x"}]), inspect_workspace(str(ws))).id
    head = None
    for i in range(messages):
        with store.step(ss.group(ses)) as step:
            new = SessionStore(step).append_messages(head, [{"role": "user", "content": f"question {i}"}])
            step.update("head", head, new)
            step.commit("message: user")
        head = new
    return ses


def _fork(root: Path, ses: str) -> tuple[int, object]:
    store = _store(root)
    info = SessionStore(store).fork(ses)
    return store.io.fsyncs, info


def test_a_fork_in_a_settled_state_dir_costs_its_new_logs_two_fsyncs(tmp_path: Path) -> None:
    root = tmp_path / "state"
    ses = _parent(root, tmp_path / "ws", 3)
    n, info = _fork(root, ses)
    assert n == 2
    # What it named in the parent's log (agent, messages) it carries: its own log holds them.
    store = _store(root)
    log = store.steps.load(f"{NS}/{info.id}")
    parent = SessionStore(store).get(ses)
    assert parent.agent_oid in log.ids and parent.head in log.ids
    assert [m.content for m in SessionStore(store).history(info.head)] == [f"question {i}" for i in range(3)]
    assert not fsck(store).problems


def test_a_moved_state_dir_is_settled_again_once(tmp_path: Path) -> None:
    root = tmp_path / "state"
    ses = _parent(root, tmp_path / "ws", 1)
    assert _fork(root, ses)[0] == 2
    moved = tmp_path / "moved"
    os.rename(root, moved)  # its parent's entry is new: not durable until fsynced
    assert _fork(moved, ses)[0] == 4  # the state dir and its parent, then the new log's two
    assert _fork(moved, ses)[0] == 2
    markers = [n for n in os.listdir(moved / "locks") if n.startswith("settled-")]
    assert len(markers) == 2
    assert not fsck(_store(moved)).problems


def test_past_the_carry_bound_a_fork_fsyncs_its_parents_log_instead(tmp_path: Path) -> None:
    root = tmp_path / "state"
    # Agent, metadata and the messages: more than the bound's objects in the parent's log.
    ses = _parent(root, tmp_path / "ws", refs_mod.CARRY_MAX_OBJECTS + 1)
    n, info = _fork(root, ses)
    assert n == 4  # the parent's log and steps/sessions, then the new log's two
    store = _store(root)
    assert store.steps.load(f"{NS}/{info.id}").ids == {SessionStore(store).get(info.id).meta_oid}
    assert len(SessionStore(store).history(info.head)) == refs_mod.CARRY_MAX_OBJECTS + 1
