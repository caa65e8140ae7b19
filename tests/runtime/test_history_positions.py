"""A history past the view's bound (history_bound) is held without reading the messages older than it.

A cut view writes no history index (it would hold the cut text, not what the
messages say), so before this every run of a long session read every message
object back to the root only to show it as a stub: 100,000 messages took 3x
the time of parsing the same history as JSON Lines (bench workload 4). The run
now leaves the session's message positions (§11a.1) up to date, and the next
walk takes the stubs' ids from that file, joined at the first stub's id.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kxen_agent.runtime import history_bound
from kxen_agent.runtime import history_index as hi
from kxen_agent.runtime.history import RunHistory
from kxen_agent.session import positions
from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.store import RefUpdate, Store

from .test_history import chat
from .test_history_index import long_session

#: A bound this test's 600 messages pass after about 40 of them (each ~30 or ~1,500 characters).
BOUND = 20_000


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history_bound, "HISTORY_CHARS", BOUND)


def held(store: Store, ses: str, *, start: bool = True) -> tuple[list, int, list[bytes]]:
    """What a fresh process's run would hold of ``ses``: the provider view, the messages read, the ids."""
    h = RunHistory(SessionStore(Store(store.root, namespaces=(NS,))))
    if start:
        h.start(ses)
    view = h.messages(SessionStore(store).get(ses).head)
    return view, h.reads, [h.oid_at(i) for i in range(len(h))]


def test_a_cut_history_is_walked_only_to_the_bound_once_a_run_left_its_positions(tmp_path: Path,
                                                                               small_bound: None) -> None:
    store, ses = long_session(tmp_path)
    ss = SessionStore(store)
    head = ss.get(ses).head
    # The walk of every message: what a run held before (and holds without the positions file).
    walked, reads, ids = held(store, ses, start=False)
    assert reads == 600 and len(walked) == 600
    shown = [m for m in walked if m is not history_bound.ELIDED]
    assert 10 < len(shown) < 100, "the bound cuts the view"
    # A run ends: no history index of a cut view, but the positions are written.
    h = RunHistory(ss)
    h.start(ses)
    h.messages(head)
    assert h.finish(ses, head) is None
    path = store.caches.path(positions.POSITIONS, f"{NS}/{ses}")
    assert os.path.exists(path) and not os.path.exists(store.caches.path(hi.HISTORY, f"{NS}/{ses}"))
    # The next process reads only the messages within the bound, and holds the same view and ids.
    view, reads2, ids2 = held(store, ses)
    assert view == walked and ids2 == ids
    assert reads2 == len(shown), "only the newest messages, up to the bound: no stub is read"
    # Ten messages later the join still holds: only what is new and within the bound is read.
    head2 = ss.append_messages(head, chat(10, start=600))
    store.refs.transaction(ss.get(ses).group, [RefUpdate("head", head, head2)], reason="test: more")
    view3, reads3, ids3 = held(store, ses)
    full3, reads_full, ids_full = held(store, ses, start=False)
    assert view3 == full3 and ids3 == ids_full and reads_full == 610
    assert reads3 < 100


def test_a_positions_file_that_does_not_join_is_passed_over(tmp_path: Path, small_bound: None) -> None:
    store, ses = long_session(tmp_path)
    ss = SessionStore(store)
    head = ss.get(ses).head
    walked, _reads, ids = held(store, ses, start=False)
    path = store.caches.path(positions.POSITIONS, f"{NS}/{ses}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Another history's ids (a rewind, a planted file): the entry at the join is not the message read.
    with open(path, "wb") as f:
        f.write(positions.MAGIC + b"".join(bytes([i % 251]) * 32 for i in range(600)))
    view, reads, ids2 = held(store, ses)
    assert view == walked and ids2 == ids and reads == 600, "walked, as without the file"
    # A file cut short (a torn write): it serves as far as it goes, from where the walk reaches it.
    with open(path, "wb") as f:
        f.write(positions.MAGIC + b"".join(ids[:5]) + b"\x00" * 7)
    view, reads, ids2 = held(store, ses)
    assert view == walked and ids2 == ids and reads == 595
    assert ss.get(ses).head == head
