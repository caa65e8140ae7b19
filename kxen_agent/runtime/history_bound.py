"""How much of a history a run holds in memory: the view's bounds, applied as :class:`~.history.RunHistory` reads.

A Session that arrived from elsewhere (a bundle, a pull) can hold far more
text than any model can be shown: 36 user messages of 64 MiB each in a
90 KB bundle, or a thousand messages naming one 64 MiB text blob (a bundle
of a few KB that verifies: the blob is stored once). Before these bounds a
resume read every message's text whole and held it — 2.5 GB — and read the
shared blob once per message. A model takes a few million characters at
most, so a run never holds more than it could show:

- one message shows at most :data:`MESSAGE_CHARS` characters of its text
  (the head and the tail, and a note saying how much is left out between);
- the history shows at most :data:`HISTORY_CHARS` characters in all, the
  newest messages first; older messages are each shown as
  :data:`ELIDED` (one shared dict), and their text blobs are not read at all;
- a tool result left at the oldest end of what is shown, whose call is in a
  message not shown, is not shown either (a result without its call is an
  error for every provider).

Nothing stored changes: the Session holds every message as written
(``session log`` shows them); only what a run holds and sends is bounded.
These numbers are far above what the runner itself writes (a tool's output
is capped at 64 KiB, an answer by the model's output limit), so a Session
this machine ran is shown whole until its history passes 8 Mi characters,
past every model's context (compaction, §14.4, is the way on from there).
"""

from __future__ import annotations

from typing import Any

from kxen_agent.session.schema import read
from kxen_agent.session.sessions import Message, SessionStore

__all__ = ["ELIDED", "HISTORY_CHARS", "MESSAGE_CHARS", "ViewBound"]

#: The most characters of one message's text a run holds and shows (1 Mi).
MESSAGE_CHARS = 1 << 20
#: The most characters of text and tool calls a run holds of a history (8 Mi, about 2 M tokens).
HISTORY_CHARS = 8 << 20
_NOTE = "[kxen-agent: not shown: the history a run shows the model holds at most {} characters; this message is older]"
#: What a message past :data:`HISTORY_CHARS` is shown as (one dict, shared: the caller must not modify it).
ELIDED: dict[str, Any] = {"role": "user", "content": _NOTE.format(HISTORY_CHARS)}


def _cut(text: str) -> str:
    half = MESSAGE_CHARS // 2
    return (f"{text[:half]}\n[kxen-agent: {len(text) - 2 * half} characters of this message not shown: one "
            f"message shows at most {MESSAGE_CHARS}]\n{text[-half:]}")


class ViewBound:
    """One newest-first walk of a history: reads each message within the bounds; :attr:`cut` says if any was cut."""

    def __init__(self, sessions: SessionStore) -> None:
        self._sessions = sessions
        self.spent = 0
        #: Whether a message was cut or left out (the run's history index is then not written: it holds
        #: what the store's messages say, and fsck compares the two).
        self.cut = False
        self._elided: set[bytes] = set()

    def read(self, oid: bytes) -> Message:
        """The message ``oid``, its text cut to :data:`MESSAGE_CHARS`; past :data:`HISTORY_CHARS`, a stub
        (the same ``seq``, ``parent`` and ``run``; its text blob is never read)."""
        if self.spent >= HISTORY_CHARS:
            v = read(self._sessions.store, oid, "message")
            self.cut = True
            self._elided.add(oid)
            return Message(oid, v["seq"], "user", ELIDED["content"], v.get("run"), [], None, v.get("parent"))
        m = self._sessions.read_message(oid)
        text = m.content or ""
        if len(text) > MESSAGE_CHARS:
            m = m._replace(content=_cut(text))
            self.cut = True
        self.spent += len(m.content or "") + sum(len(c.get("name", "")) + len(c.get("arguments", ""))
                                                 for c in m.tool_calls)
        return m

    @property
    def spent_all(self) -> bool:
        """Whether every message read from here on is a stub (:data:`ELIDED`): the walk may take the
        older ids from elsewhere (the session's message positions) instead of reading each message."""
        return self.spent >= HISTORY_CHARS

    def elide(self, oid: bytes) -> None:
        """Message ``oid``, older than the bound, shown as :data:`ELIDED` without being read."""
        self.cut = True
        self._elided.add(oid)

    def settle(self, newer: list[tuple[bytes, dict[str, Any], bytes | None]]) -> None:
        """Make the walk's provider forms (newest first) share :data:`ELIDED` for every stub, and leave out the
        tool results at the oldest end of what is shown when their call is left out."""
        if not self._elided:
            return
        first = next(i for i, (oid, _, _) in enumerate(newer) if oid in self._elided) if any(
            oid in self._elided for oid, _, _ in newer) else len(newer)
        for i in range(first, len(newer)):
            newer[i] = (newer[i][0], ELIDED, None)
        i = first - 1
        while i >= 0 and newer[i][1].get("role") == "tool":
            newer[i] = (newer[i][0], ELIDED, None)
            i -= 1
