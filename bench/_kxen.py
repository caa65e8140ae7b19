"""Building kxen state dirs for the benchmarks (setup only: nothing here is timed).

Setup writes through a :class:`~kxen_agent.store.fsio.FaultyIO` that never
fails and skips the fsync system calls, so that building a history of
100,000 messages takes seconds; every *measured* operation runs on a fresh
:class:`~kxen_agent.store.Store` over a plain :class:`FileIO` (real fsyncs,
its own counter).
"""

from __future__ import annotations

import os
from typing import Sequence

from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.sessions import NS, SessionStore, msg_id
from kxen_agent.session.workspace import WorkspaceIdentity, inspect_workspace
from kxen_agent.store import RefUpdate, Store
from kxen_agent.store.fsio import FaultyIO, FileIO

__all__ = ["Builder", "measuring_store"]


def measuring_store(root: str) -> Store:
    """A store as a CLI process opens it: real fsyncs, a fresh counter."""
    return Store(root, io=FileIO(), namespaces=(NS,))


class Builder:
    """Writes sessions quickly into the state dir ``root`` (no fsync)."""

    def __init__(self, root: str, workspace_dir: str) -> None:
        os.makedirs(workspace_dir, exist_ok=True)
        self.store = Store(root, io=FaultyIO(None, sync=False), namespaces=(NS,))
        self.sessions = SessionStore(self.store)
        self.lock = default_agent_definition([{"content": "done"}], name="bench")
        self.ws: WorkspaceIdentity = inspect_workspace(workspace_dir)

    def chain(self, messages: Sequence[dict], cuts: Sequence[int], parent: bytes | None = None) -> dict[int, bytes]:
        """Append ``messages`` after ``parent``; the head after each count in ``cuts``."""
        heads: dict[int, bytes] = {}
        head, pos = parent, 0
        # Loose objects, one durability barrier for all (no ref moves here).
        with self.store.batch():
            for cut in sorted(set(cuts) | {len(messages)}):
                if cut > pos:
                    head = self.sessions.append_messages(head, list(messages[pos:cut]))
                    pos = cut
                if head is not None:
                    heads[cut] = head
        return heads

    def session(self, head: bytes | None) -> str:
        """A new root session whose history ends at ``head``."""
        info = self.sessions.create(self.lock, self.ws)
        if head is not None:
            self.store.refs.transaction(info.group, [RefUpdate("head", None, head)], reason="bench: history")
        return info.id

    def fork_with(self, ses: str, at: bytes, own: Sequence[dict]) -> str:
        """Fork ``ses`` at message ``at`` and append ``own`` messages to the fork."""
        info = self.sessions.fork(ses, at=msg_id(at))
        if own:
            head = self._append_after(at, own)
            self.store.refs.transaction(info.group, [RefUpdate("head", at, head)], reason="bench: fork's own turns")
        return info.id

    def _append_after(self, parent: bytes, own: Sequence[dict]) -> bytes:
        with self.store.batch():
            head = self.sessions.append_messages(parent, list(own))
        assert head is not None
        return head
