"""A run holds its history in memory (issue #13, item 1): per turn, the store is read for what changed.

:class:`RunHistory` on a memory store (exactness: every head it is given
yields exactly the history a full read yields, with reads counted), then
the real :class:`Runner` on a disk state dir, counting the store's reads
through its :class:`FileIO` seam (``read_count``): the reads of a turn do
not depend on the length of the history behind it. Counts, never times.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kxen_agent.runtime.history import RunHistory
from kxen_agent.runtime.providers import AssistantTurn, ToolCall
from kxen_agent.runtime.runner import Runner
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.session.workspace import inspect_workspace
from kxen_agent.store import RefUpdate, Store
from kxen_agent.store.fsio import FaultyIO, FileIO
from kxen_agent.store.memory import MemoryStore


def chat(n: int, start: int = 0, tag: str = "m") -> list[dict]:
    """``n`` alternating user/assistant messages; every third is long (its content in a blob)."""
    out = []
    for i in range(start, start + n):
        text = f"{tag} {i} " + ("x" * 1500 if i % 3 == 0 else "")
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return out


def full(ss: SessionStore, head: bytes | None) -> list[dict]:
    return [m.to_provider() for m in ss.history(head)]


@pytest.fixture
def ss() -> SessionStore:
    return SessionStore(MemoryStore("history"))


def test_extending_reads_only_the_added_messages(ss: SessionStore) -> None:
    h = RunHistory(ss)
    assert h.messages(None) == [] and h.reads == 0
    head = ss.append_messages(None, chat(40))
    assert h.messages(head) == full(ss, head)
    assert h.reads == 40 and len(h) == 40 and h.head == head
    for added in (1, 3, 1, 7):
        before = h.reads
        head = ss.append_messages(head, chat(added, start=len(h)))
        assert h.messages(head) == full(ss, head)
        assert h.reads - before == added
    before = h.reads
    assert h.messages(head) == full(ss, head)
    assert h.reads == before, "the same head again reads nothing"


def test_a_fork_or_a_rewind_reads_only_what_differs(ss: SessionStore) -> None:
    h = RunHistory(ss)
    base = ss.append_messages(None, chat(30))
    mine = ss.append_messages(base, chat(10, start=30, tag="mine"))
    other = ss.append_messages(base, chat(4, start=30, tag="other"))
    assert h.messages(mine) == full(ss, mine)
    before = h.reads
    assert h.messages(other) == full(ss, other)  # shares the first 30
    assert h.reads - before == 4
    before = h.reads
    assert h.messages(base) == full(ss, base)  # a rewind: the head itself is held
    assert h.reads - before == 1
    before = h.reads
    assert h.messages(mine) == full(ss, mine)
    assert h.reads - before == 10


def test_an_unrelated_history_is_read_whole(ss: SessionStore) -> None:
    h = RunHistory(ss)
    a = ss.append_messages(None, chat(12, tag="a"))
    b = ss.append_messages(None, chat(5, tag="b"))
    assert h.messages(a) == full(ss, a)
    before = h.reads
    assert h.messages(b) == full(ss, b)
    assert h.reads - before == 5
    assert h.messages(None) == [] and len(h) == 0


def test_a_list_a_caller_keeps_never_changes(ss: SessionStore) -> None:
    h = RunHistory(ss)
    system = [{"role": "system", "content": "be brief"}]
    head = ss.append_messages(None, chat(3))
    kept = h.messages(head, system)  # never given back
    snapshot = list(kept)
    head = ss.append_messages(head, chat(2, start=3))
    second = h.messages(head, system)
    assert kept == snapshot and second == system + full(ss, head) and second is not kept
    h.give_back(kept)  # too late: only the list lent last can be given back
    assert h.messages(head, system) is not kept and kept == snapshot
    kept.append({"role": "user", "content": "appended by a caller"})  # and a caller's change stays its own
    assert h.messages(head, system) == system + full(ss, head)


def test_a_list_given_back_is_extended_in_place(ss: SessionStore) -> None:
    # The copy of the whole list is what would make a turn grow with the history: the list its
    # borrower gave back (RunHistory.give_back) is the next one, with the new messages appended.
    h = RunHistory(ss)
    system = [{"role": "system", "content": "be brief"}]
    head = ss.append_messages(None, chat(5))
    first = h.messages(head, system)
    h.give_back(first)
    head = ss.append_messages(head, chat(2, start=5))
    again = h.messages(head, system)
    assert again is first and again == system + full(ss, head)
    h.give_back(again)
    h.give_back(list(again))  # not the list lent: ignored
    other = [{"role": "system", "content": "another prompt"}]
    changed = h.messages(head, other)  # another system message: built anew
    assert changed == other + full(ss, head) and changed is not again
    h.give_back(changed)
    back = ss.append_messages(None, chat(2, tag="unrelated"))
    assert h.messages(back, other) == other + full(ss, back)  # a history that drops messages: built anew


# ------------------------------------------------------------------ the runner, on disk, reads counted


class Tooling:
    """A provider asking for one ``read_file`` a turn, ``calls`` times, then answering.

    Records the store's ``read_count`` at each model call and the messages it was sent.
    """

    def __init__(self, store: Store, calls: int) -> None:
        self.store = store
        self.calls = calls
        self.turns = 0
        self.read_marks: list[int] = []
        self.sent: list[list[dict]] = []

    def factory(self, agent: dict, endpoint: Any) -> Any:
        outer = self

        class P:
            model = "counting"
            base_url = None

            def complete(self, messages: list[dict], tools: list[dict], **kw: Any) -> AssistantTurn:
                outer.read_marks.append(outer.store.io.read_count)
                outer.sent.append(list(messages))  # the list is lent for this call only (RunHistory.give_back)
                outer.turns += 1
                if outer.turns > outer.calls:
                    return AssistantTurn("done", (), "counting")
                call = ToolCall(f"call_{outer.turns}", "read_file", '{"path": "notes.txt"}')
                return AssistantTurn(None, (call,), "counting")

            def close(self) -> None:
                pass

        return P()


def session_with_history(root: Path, ws: Path, n: int, *, max_turns: int = 20) -> str:
    """A state dir holding one session of ``n`` messages (written without fsyncs: setup)."""
    store = Store(str(root), io=FaultyIO(None, sync=False), namespaces=(NS,))
    ss = SessionStore(store)
    lock = default_agent_definition([{"content": "unused"}])
    lock["policy"]["max_turns"] = max_turns
    info = ss.create(lock, inspect_workspace(str(ws)))
    head = ss.append_messages(None, chat(n))
    store.refs.transaction(info.group, [RefUpdate("head", None, head)], reason="test: history")
    return info.id


def reads_per_turn(tmp_path: Path, n: int, calls: int) -> tuple[list[int], Tooling, Store, str]:
    ws = tmp_path / f"ws{n}"
    ws.mkdir()
    (ws / "notes.txt").write_text("some notes\n" * 50)
    root = tmp_path / f"state{n}"
    ses = session_with_history(root, ws, n)
    store = Store(str(root), io=FileIO(), namespaces=(NS,))  # a fresh counter, as one CLI process
    tooling = Tooling(store, calls)
    result = Runner(store, providers=tooling.factory).resume(ses, task="read the notes again and again")
    assert result.status == "completed", result
    marks = tooling.read_marks
    return [b - a for a, b in zip(marks, marks[1:])], tooling, store, ses


@pytest.fixture(autouse=True)
def no_lease_renewal(monkeypatch: pytest.MonkeyPatch) -> None:
    # The lease renewer thread reads and writes through the same seam every TTL/3: a renewal
    # landing in one turn would add its reads to that turn's count.
    monkeypatch.setenv("KXEN_AGENT_LEASE_TTL_S", "3600")


def test_a_turns_store_reads_do_not_grow_with_the_history(tmp_path: Path) -> None:
    calls = 6
    short, _, _, _ = reads_per_turn(tmp_path, 20, calls)
    long, tooling, store, ses = reads_per_turn(tmp_path, 600, calls)
    assert len(short) == len(long) == calls
    # Every turn after the first reads the same whatever the history behind it:
    # what the turn added (an assistant message, a tool message), refs, run
    # state and journal — never the 600 messages again.
    assert long == short, (short, long)
    assert max(long) < 100, long
    # And what the model was sent on its last turn is the history as stored.
    ss = SessionStore(store)
    last = tooling.sent[-1]
    stored = [m.to_provider() for m in ss.history(ss.get(ses).head)]
    assert last[1:] == stored[: len(last) - 1]
    assert len(last) - 1 == 600 + 1 + 2 * calls  # the history, the task, each turn's call and result


def test_the_first_turn_reads_the_history_once(tmp_path: Path) -> None:
    # The first model call of a process pays for the whole history (the load
    # for resume); the difference between 600 and 20 messages is read there once.
    _, short_t, short_store, _ = reads_per_turn(tmp_path, 20, 2)
    _, long_t, long_store, _ = reads_per_turn(tmp_path, 600, 2)
    first_short, first_long = short_t.read_marks[0], long_t.read_marks[0]
    # Blobs: every third message has one; a long message is two reads (message, blob).
    extra = (600 - 20) + sum(1 for i in range(20, 600) if i % 3 == 0)
    assert first_long - first_short >= extra
    assert first_long - first_short <= extra + 600 // 10, (first_short, first_long)
    assert os.path.isdir(long_store.root) and os.path.isdir(short_store.root)
