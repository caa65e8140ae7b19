"""A run's tool journal as the loop reads it: held in memory, extended by what is new.

The journal of a run is a chain of immutable entries, newest first from the run
state's ``journal`` link (``objects_spec.md`` §14.6). Reading it whole before
every step made a run of n calls cost O(n²) (a 2,000-call run spent a third of
its time there). :class:`JournalView` holds what was read and indexes it the
ways the loop asks (the newest entry of each op, the ops not settled yet, the
calls of one assistant message); :meth:`JournalView.sync` reads only the
entries newer than the head it holds, and the run's one writer
(:meth:`~kxen_agent.runtime.runner.Runner.commit`) adds what it wrote without
reading it back (:meth:`JournalView.add`). A step costs O(new entries).

Every entry added, read or written, must be a legal move of its op's state
machine (§14.6, :data:`~kxen_agent.session.status.OP_MOVES`): an entry read from
the store that breaks it is damage (:class:`RunStateDamage`, ``fsck`` kind
``run-state``); :func:`check_states` is the same rule over a whole chain of
run states and journal entries, for ``fsck``. Nothing here writes.
"""

from __future__ import annotations

from typing import Iterator

from kxen_agent.errors import KxenError
from kxen_agent.session.schema import read
from kxen_agent.session.sessions import SessionStore
from kxen_agent.session.status import IllegalTransition, OpState, check_op_move, check_run_move
from kxen_agent.store import CorruptObject
from kxen_agent.store.protocols import ObjectStore

__all__ = ["JournalView", "RunStateDamage", "check_states", "check_tip", "turn_usage", "verify_run_states"]


class RunStateDamage(KxenError):
    """A run state or journal entry read from the store breaks the §14.5/§14.6 state machine (exit 1).

    ``where`` is the id (hex) of the object that makes the illegal move.
    """

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"damaged run state {where}: {problem}; `kxen-agent fsck` lists every damaged object")
        self.where = where
        self.problem = problem


class JournalView:
    """The journal of one run up to :attr:`head`, with the indexes the loop needs (see the module doc).

    Entries are the decoded maps, shared: callers must not mutate them.
    """

    def __init__(self, run: str) -> None:
        self.run = run
        self.head: bytes | None = None
        self.entries: list[dict] = []  # oldest first
        self.latest: dict[str, dict] = {}  # op -> its newest entry, in order of first appearance
        self.open: dict[str, dict] = {}  # the same, for the ops not Settled (Settled is final: §14.6)
        self.by_message: dict[bytes, dict[str, dict]] = {}  # assistant message -> callId -> newest entry
        #: Outputs this process wrote (op -> text), so the turn's tool messages need not read them back.
        self.outputs: dict[str, str] = {}

    def add(self, oid: bytes, e: dict, *, output: str | None = None) -> None:
        """Add entry ``e`` (id ``oid``), newer than every entry held; IllegalTransition if its op may not move so."""
        op = e["op"]
        old = self.latest.get(op)
        check_op_move(None if old is None else old["state"], e["state"])
        self.entries.append(e)
        self.latest[op] = e
        if e["state"] == OpState.SETTLED:
            self.open.pop(op, None)
        else:
            self.open[op] = e
        self.by_message.setdefault(e["message"], {})[e["callId"]] = e
        if output is not None:
            self.outputs[op] = output
        self.head = oid

    def sync(self, store: ObjectStore, head: bytes | None) -> None:
        """Hold the journal whose newest entry is ``head``: read the entries newer than those held (all of them
        if ``head`` does not descend from :attr:`head`). Raises :class:`RunStateDamage` for an illegal move."""
        if head == self.head:
            return
        newer: list[tuple[bytes, dict]] = []
        cur = head
        while cur is not None and cur != self.head:
            e = read(store, cur, "journal")
            if e["run"] != self.run:
                raise CorruptObject(cur.hex(), f"journal entry of run {e['run']} in the journal of run {self.run}; "
                                    "`kxen-agent fsck` lists every damaged object")
            newer.append((cur, e))
            cur = e.get("previous")
        if cur is None and self.head is not None:  # not a descendant of what is held: read whole
            self.head, self.entries, self.latest, self.open, self.by_message = None, [], {}, {}, {}
            self.outputs = {}
        for oid, e in reversed(newer):
            try:
                self.add(oid, e)
            except IllegalTransition as ex:
                raise RunStateDamage(oid.hex(), f"operation {e['op']} of run {self.run}: {ex}") from None
        self.head = head

    def unsettled_states(self) -> Iterator[OpState]:
        """The states of the ops not settled yet (what :func:`~.recovery.next_step` looks at)."""
        return (OpState(e["state"]) for e in self.open.values())


def check_tip(store: ObjectStore, oid: bytes, st: dict) -> None:
    """Raise :class:`RunStateDamage` if run state ``st`` (id ``oid``) may not follow the state it replaces
    (§14.5: one read, of that state)."""
    prev = st.get("previous")
    try:
        check_run_move(None if prev is None else read(store, prev, "run")["status"], st["status"])
    except IllegalTransition as e:
        raise RunStateDamage(oid.hex(), f"run {st['id']}: {e}") from None


def check_states(store: ObjectStore, oid: bytes) -> Iterator[tuple[str, str]]:
    """The illegal moves in the chain of run states ending at ``oid`` and in its journal, as (object id hex,
    what is wrong), oldest first; for ``fsck`` (kind ``run-state``). Objects that do not read are not
    reported here (fsck names those already)."""
    chain: list[tuple[bytes, dict]] = []
    cur: bytes | None = oid
    try:
        while cur is not None:
            st = read(store, cur, "run")
            chain.append((cur, st))
            cur = st.get("previous")
    except KxenError:
        pass
    prev: str | None = None
    for at, st in reversed(chain):
        try:
            check_run_move(prev, st["status"])
        except IllegalTransition as e:
            yield at.hex(), f"run {st['id']}: {e}"
        prev = st["status"]
    if chain:
        view = JournalView(chain[0][1]["id"])
        try:
            view.sync(store, chain[0][1].get("journal"))
        except RunStateDamage as e:
            yield e.where, e.problem
        except KxenError:
            pass


def verify_run_states(sessions: SessionStore) -> list[tuple[str, str]]:
    """``fsck`` kind ``run-state``: every illegal move in the runs of every session (deleted ones too), as
    (object id hex, what is wrong). Sessions and objects that do not read are fsck's other kinds' business."""
    out: list[tuple[str, str]] = []
    for info in sessions.list(include_deleted=True, on_damaged=lambda group, e: None):
        for run in sorted(info.runs):
            out.extend(check_states(sessions.store, info.runs[run]))
    return out


def turn_usage(store: ObjectStore, st: dict) -> list[dict]:
    """The usage of each turn of the run whose state is ``st``, oldest first, from its chain of states
    (§14.5 ``turnUsage``)."""
    seen: dict[int, dict] = {}
    cur: dict | None = st
    while cur is not None:
        tu = cur.get("turnUsage")
        if tu is not None and tu["turn"] not in seen:
            seen[tu["turn"]] = tu
        prev = cur.get("previous")
        cur = read(store, prev, "run") if prev is not None else None
    return [seen[t] for t in sorted(seen)]
