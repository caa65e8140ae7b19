"""A run's history in memory: the provider's message list, built once and extended.

Before each model call the runner needs the whole Session history in the
provider's form (:meth:`~kxen_agent.session.sessions.Message.to_provider`).
Re-reading it from the store every turn made a turn's cost grow with the
history (a run of n turns O(n²) reads). :class:`RunHistory` holds it in
memory instead and, given the Session's current head, reads only the
messages it does not hold yet: per turn, O(messages added).

How a head is joined to what is held: messages are immutable objects named
by their id, and each names its parent, so walking back from the new head
until a message whose *parent* is the held message at the parent's position
(``seq - 1``) proves that everything before is the held prefix — an id is
the content's hash, so an equal id is an equal message with an equal
ancestry. A head that is not a descendant of what is held (another
Session's, a rewound head) shares the longest such prefix; one that shares
nothing is read whole, as before. ``seq`` only says where to look: a chain
whose ``seq`` values are wrong never joins and is read whole.

What it never does: write anything but its history index (below), cache
anything but the history of the one head it was last given, or trust a
message without reading it through the store (every message it adds is
read, checked and decoded by :class:`~kxen_agent.session.sessions.SessionStore`)
or from a history index whose checksums hold.

The history index (:mod:`.history_index`) is where a process's first call
starts: :meth:`RunHistory.load_index` takes the good prefix of a Session's
index (or of its parent's, for a fork) as what is held, and the join above
then reads from the store only the messages the index lacks — and drops
whatever of it is not the head's history. :meth:`RunHistory.save_index`,
after a run, appends what the index lacks. The dicts it hands out
are shared from turn to turn: a provider treats the messages it is given as
read-only (the :class:`~kxen_agent.runtime.providers.Provider` inputs).

The list :meth:`RunHistory.messages` returns is *lent*: its borrower (the run
loop, for one model call and its retries) hands it back with
:meth:`RunHistory.give_back` when nobody holds it any more, and only a list
given back is extended in place by the next call; one never given back is
never changed again (the next call builds a new list). Ownership is said, not
guessed: nothing here looks at reference counts.
"""

from __future__ import annotations

from typing import Any, Sequence

from kxen_agent.errors import KxenError
from kxen_agent.session import positions
from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.store import Store

from .answer_check import safe_provider_message
from .history_bound import ELIDED, ViewBound
from .history_index import HISTORY, INDEX_MIN_MESSAGES, Entry, read_index, sync_positions_beside, write_index

__all__ = ["RunHistory"]

#: How far up a fork's ancestry :meth:`RunHistory.start` looks for an index.
_ANCESTORS = 8


class RunHistory:
    """The provider-form history of the head last given to :meth:`messages` (oldest first)."""

    def __init__(self, sessions: SessionStore) -> None:
        self._sessions = sessions
        self._oids: list[bytes] = []  # message ids, position = seq
        self._messages: list[dict[str, Any]] = []  # their provider form, same positions
        self._compactions: list[tuple[int, bytes]] = []  # (position, the message it summarizes through), oldest first
        #: Messages read from the store by :meth:`messages` so far (what tests and the benchmark count).
        self.reads = 0
        # The list the last call lent, the one given back (None: not given back, or not reusable), and
        # the lent list's length and prefix length when lent (see messages()).
        self._lent: list[dict[str, Any]] | None = None
        self._returned: list[dict[str, Any]] | None = None
        self._handed_len = self._handed_before = 0
        # The index file last loaded or written, its entries and bytes, and the count of leading
        # positions unchanged since (a rewind lowers it): what save_index may append to.
        self._index: tuple[str, int, int] | None = None
        self._stable = 0
        self._cut = False  # a message held was cut to the view's bounds (history_bound): no index is written
        # The session's message positions file (§11a.1), known after start(): the ids of the messages older
        # than the view's bound, which a walk then need not read one by one.
        self._positions: str | None = None

    @property
    def head(self) -> bytes | None:
        """The newest message held (None: none)."""
        return self._oids[-1] if self._oids else None

    def __len__(self) -> int:
        return len(self._oids)

    def messages(self, head: bytes | None, before: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
        """``before`` (the system message), then the history ending at ``head`` in provider form,
        oldest first, as a list of shared dicts that the caller must not modify.

        The list is lent (see the module doc): it does not change until the caller hands it back
        with :meth:`give_back`. A copy of 100,000 pointers costs ~3.5 ms, the one cost of a turn that
        would grow with the history, so a list given back is extended in place by the next call when
        nothing was taken from the history; a list kept is never touched again.
        """
        added = self._sync(head)
        out, self._returned = self._returned, None
        if (out is not None and added is not None and len(out) == self._handed_len
                and len(before) == self._handed_before and out[:len(before)] == list(before)):
            out.extend(added)
        else:
            out = [*before, *self._messages]
        self._lent, self._handed_len, self._handed_before = out, len(out), len(before)
        return out

    def give_back(self, lent: list[dict[str, Any]]) -> None:
        """The borrower of the list :meth:`messages` last lent is done with it, and nobody else holds it:
        the next call may extend it in place. Any other list is ignored (a view built from it, a copy)."""
        if lent is self._lent:
            self._returned, self._lent = lent, None

    def _sync(self, head: bytes | None) -> list[dict[str, Any]] | None:
        """Hold the history of ``head``; the provider dicts appended, or None if any held one was dropped."""
        if head is None:
            self._oids, self._messages, self._compactions = [], [], []
            self._stable = 0
            return None
        held = len(self._oids)
        if held and self._oids[-1] == head:
            return []
        newer: list[tuple[bytes, dict[str, Any], bytes | None]] = []  # newest first (id, provider form, through)
        cur: bytes | None = head
        join = -1  # the position of the newest held message the chain goes through (-1: none)
        bound = ViewBound(self._sessions)  # what is held stays within what a model could be shown
        cur_seq: int | None = None  # the seq of ``cur`` when known (its child's, less one)
        while cur is not None:
            if cur_seq is not None and bound.spent_all and self._positions is not None:
                older = positions.prefix(self._sessions.store.io, self._positions, cur_seq, cur)
                if older is not None:
                    # Every message from here back is a stub, never read: its id from the positions
                    # file, joined at ``cur`` (100,000 messages: 3 MB read instead of 92,000 objects).
                    for j in range(cur_seq, -1, -1):
                        if j < held and self._oids[j] == older[j]:
                            join = j
                            break
                        newer.append((older[j], ELIDED, None))
                        bound.elide(older[j])
                    break
            m = bound.read(cur)
            self.reads += 1
            if m.seq < held and self._oids[m.seq] == cur:
                join = m.seq  # ``head`` itself is held: a rewind to an earlier message
                break
            # A call recorded before the door (answer_check) existed may hold arguments no SDK survives:
            # the model is shown them as refused, as the runner's tool result says they were.
            newer.append((cur, safe_provider_message(m.to_provider()), m.through if m.role == "compaction" else None))
            parent, pos = m.parent, m.seq - 1
            if parent is not None and 0 <= pos < held and self._oids[pos] == parent:
                join = pos
                break
            cur, cur_seq = parent, pos
        bound.settle(newer)
        self._cut = self._cut or bound.cut
        del self._oids[join + 1:]
        del self._messages[join + 1:]
        self._stable = min(self._stable, join + 1)
        self._compactions = [c for c in self._compactions if c[0] <= join]
        added = []
        for oid, msg, through in reversed(newer):
            if through is not None:
                self._compactions.append((len(self._oids), through))
            self._oids.append(oid)
            self._messages.append(msg)
            added.append(msg)
        return added if join == held - 1 else None

    def start(self, ses: str) -> int:
        """Before a run of Session ``ses``: if nothing is held yet, hold its history index's good prefix
        (or, for a fork, its nearest ancestor's); how many messages that gave. Never raises: the index is
        a cache, and the messages it cannot give are read from the store."""
        store = self._sessions.store
        if self._oids or not isinstance(store, Store):
            return 0
        paths, cur, limit = [], ses, None
        try:
            info = self._sessions.get(ses)
            if info.head is None:
                return 0
            # Never more entries than the head's history has: a fork of a far longer parent, or a
            # planted file, is not parsed past what the join could keep.
            limit = self._sessions.read_message(info.head).seq + 1
            self._positions = store.caches.path(positions.POSITIONS, f"{NS}/{ses}")
            for _ in range(_ANCESTORS + 1):
                paths.append(store.caches.path(HISTORY, f"{NS}/{cur}"))
                parent = info.meta.get("parentId")
                if not parent or parent == ses:
                    break
                cur = parent
                info = self._sessions.get(cur)
        except KxenError:
            pass  # an ancestor deleted and pruned: the paths found so far
        if limit is None:
            return 0
        return self.load_index(store.io, paths, limit)

    def finish(self, ses: str, head: bytes | None) -> str | None:
        """After a run of Session ``ses`` that ended at ``head``: bring its history index up to date.
        None, or what failed in one line (the run's result is not affected: the index is a cache)."""
        store = self._sessions.store
        if not isinstance(store, Store):
            return None
        try:
            self.save_index(store.io, store.caches.path(HISTORY, f"{NS}/{ses}"), head)
        except (OSError, KxenError) as e:
            return f"history index of {ses} not written: {e}"
        return None

    def load_index(self, io: Any, paths: Sequence[str], limit: int | None = None) -> int:
        """Hold the good prefix of the first of ``paths`` (a Session's index, then its ancestors') that
        has one, at most ``limit`` entries, if nothing is held yet; how many messages that gave (0: none,
        or something was held)."""
        if self._oids:
            return 0
        for path in paths:
            parsed = read_index(io, path, limit)
            if parsed is None or not parsed.entries:
                continue
            for oid, msg, through in parsed.entries:
                if through is not None:
                    self._compactions.append((len(self._oids), through))
                self._oids.append(oid)
                self._messages.append(safe_provider_message(msg))
            self._lent = self._returned = None
            n = len(self._oids)
            # Appending is for a file whose every byte is the prefix held: a torn tail is rewritten.
            self._index = (path, n, parsed.good_bytes) if parsed.stopped is None else None
            self._stable = n
            return n
        return 0

    def save_index(self, io: Any, path: str, head: bytes | None) -> bool:
        """Make the index at ``path`` hold the history of ``head``: append what it lacks when it holds a
        prefix of it, else write it anew. Whether anything was written (not below
        :data:`~.history_index.INDEX_MIN_MESSAGES` messages). Raises OSError."""
        if self._sync(head) != []:
            # What is held changed behind the list messages() last lent: it must be built anew
            # next time, not extended by what that call's own sync adds.
            self._lent = self._returned = None
        n = len(self._oids)
        if n < INDEX_MIN_MESSAGES:
            return False
        if self._cut:
            # No index (it would hold the cut view, not what the messages say); the positions still hold
            # (every id held is the message's own), so the next run's walk stops at the view's bound.
            sync_positions_beside(io, path, self._oids)
            return False
        through = dict(self._compactions)
        entries: list[Entry] = [(self._oids[i], self._messages[i], through.get(i)) for i in range(n)]
        idx = self._index
        if idx is not None and idx[0] == path and idx[1] <= self._stable and idx[1] <= n:
            if idx[1] == n:
                return False
            size = write_index(io, path, entries, keep=idx[1], keep_bytes=idx[2])
        else:
            size = write_index(io, path, entries)
        self._index, self._stable = (path, n, size), n
        return True

    def last_role(self) -> str | None:
        """The role of the newest message held (None: none)."""
        return self._messages[-1]["role"] if self._messages else None

    def oid_at(self, position: int) -> bytes:
        return self._oids[position]

    def latest_compaction(self) -> tuple[int, int | None] | None:
        """Of the history last synced: the newest ``compaction`` message's position and the position of the
        message it summarizes through (None: not an earlier message of this history); None if it has none."""
        if not self._compactions:
            return None
        at, through = self._compactions[-1]
        for i in range(at - 1, -1, -1):
            if self._oids[i] == through:
                return at, i
        return at, None
