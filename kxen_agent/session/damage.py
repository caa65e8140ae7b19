"""Sessions and damage: which sessions a damaged store still holds whole, and where each stops.

The store names damaged objects, the refs (group/name) that reach them and
the groups that do not read (:mod:`kxen_agent.store.fsck`); this module says
the same in sessions' words (``objects_spec.md`` §18): each session is
``intact``, ``damaged`` (its first unreadable message, met from the head,
and its last *intact* message: the newest head its reflog or step records
name whose whole history reads) or ``unreadable`` (its group or its
metadata does not read). It also makes the new branch that repair gives a
session it cannot mend: a fork at the last intact message.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from kxen_agent.errors import KxenError
from kxen_agent.store import decode_body
from kxen_agent.store.objects import links_of

from .schema import put
from .sessions import NS, msg_id, new_id

__all__ = ["branch_at", "classify", "closure_reads", "last_intact", "salvage_refs"]


def closure_reads(store: Any, oid: bytes, memo: dict[bytes, bool]) -> bool:
    """Whether ``oid`` and everything it links to read (memoised in ``memo``)."""
    if oid in memo:
        return memo[oid]
    # Iterative post-order: a history is a chain thousands of messages long.
    stack: list[tuple[bytes, list[bytes] | None]] = [(oid, None)]
    while stack:
        cur, kids = stack[-1]
        if cur in memo:
            stack.pop()
            continue
        if kids is None:
            try:
                obj = store.read_raw(cur)
                kids = list(links_of(obj.kind, decode_body(obj)))
            except KxenError:
                memo[cur] = False
                stack.pop()
                continue
            stack[-1] = (cur, kids)
            pending = [k for k in kids if k not in memo]
            if pending:
                stack.extend((k, None) for k in pending)
                continue
        memo[cur] = all(memo.get(k, False) for k in kids)
        stack.pop()
    return memo[oid]


def last_intact(store: Any, heads: Iterable[bytes | None], memo: dict[bytes, bool] | None = None) -> bytes | None:
    """The first of ``heads`` (newest first: the current head, then the reflog's) whose whole history reads."""
    memo = {} if memo is None else memo
    for h in heads:
        if h is not None and closure_reads(store, h, memo):
            return h
    return None


def _first_unreadable(store: Any, head: bytes | None, memo: dict[bytes, bool]) -> bytes | None:
    """The first message, walking back from ``head``, that does not read whole (itself or what it links)."""
    cur = head
    while cur is not None:
        try:
            obj = store.read_raw(cur)
            value = decode_body(obj)
        except KxenError:
            return cur
        parent = value.get("parent") if isinstance(value, dict) else None
        others = [k for k in links_of(obj.kind, value) if k != parent]
        if not all(closure_reads(store, k, memo) for k in others):
            return cur
        cur = parent
    return None


def classify(store: Any, unreadable: dict[str, tuple[str, str]]) -> list[dict]:
    """Every session of the state dir: ``{id, state, ...}`` (JSON-ready), in group order.

    ``unreadable``: the groups fsck found do not read, group -> (file, why).
    """
    out: list[dict] = []
    memo: dict[bytes, bool] = {}
    for group in store.refs.groups(NS):
        ses = group.split("/", 1)[1]
        if group in unreadable:
            f, why = unreadable[group]
            out.append({"id": ses, "state": "unreadable", "file": f, "reason": why})
            continue
        try:
            state = store.refs.read(group)
            log = store.refs.reflog(group, state)
        except KxenError as e:
            out.append({"id": ses, "state": "unreadable", "file": store.refs.ref_path(group), "reason": str(e)})
            continue
        meta = state.refs.get("meta")
        if meta is None or not closure_reads(store, meta, memo):
            out.append({"id": ses, "state": "unreadable", "file": store.refs.ref_path(group),
                        "reason": "its metadata (or the agent lock it names) does not read"})
            continue
        head = state.refs.get("head")
        bad_runs = sorted(name[5:] for name, v in state.refs.items()
                          if name.startswith("runs/") and not closure_reads(store, v, memo))
        first = _first_unreadable(store, head, memo)
        if first is None and not bad_runs:
            out.append({"id": ses, "state": "intact"})
            continue
        heads = [head] + [e.new for e in reversed(log) if e.name == "head"]
        good = last_intact(store, heads, memo)
        out.append({"id": ses, "state": "damaged",
                    "firstUnreadableMessage": msg_id(first) if first else None,
                    "lastIntactMessage": msg_id(good) if good else None,
                    "damagedRuns": bad_runs})
    return out


def describe(entry: dict) -> str:
    """One line of fsck's text output for a session that is not intact."""
    ses, st = entry["id"], entry["state"]
    if st == "unreadable":
        return f"session {ses}: unreadable ({entry['reason']})"
    parts = []
    if entry.get("firstUnreadableMessage"):
        parts.append(f"message {entry['firstUnreadableMessage']} does not read (the first met from the head)")
    if entry.get("damagedRuns"):
        parts.append(", ".join(entry["damagedRuns"])
                     + " does not read")
    last = entry.get("lastIntactMessage")
    parts.append(f"last intact message {last}" if last else "no intact message")
    return f"session {ses}: damaged: {'; '.join(parts)}"


def branch_at(store: Any, ses: str, meta: dict, agent: bytes, point: bytes | None, reason: str) -> str:
    """A new session forked from ``ses`` at ``point`` (a message whose history reads): its id.

    ``meta``: the damaged session's metadata value (read whole), whose
    workspace and family the branch keeps. One durable step, reason
    ``reason`` (``repair``) in the new group's reflog.
    """
    new = new_id("ses")
    step = store.step(f"{NS}/{new}")
    now = time.time_ns()
    value = {
        "id": new,
        "parentId": ses,
        "branchRootId": meta.get("branchRootId", ses),
        "forkPoint": msg_id(point) if point else None,
        "forkKind": "conversation",
        "agent": agent,
        "workspace": meta["workspace"],
        "createdNs": now,
        "reason": "fork",
        "revisedNs": now,
    }
    oid = put(step, "session", value)
    step.update("meta", None, oid)
    if point is not None:
        step.update("head", None, point)
    step.commit(reason)
    return new


def salvage_refs(store: Any, ses: str) -> tuple[dict[str, bytes], list[str]]:
    """The refs of ``ses`` up to its damage (``session export --salvage``): what was left out, in words.

    ``head`` moves back to the last message whose whole history reads (the
    current head, else the newest its reflog names); a run whose state does
    not read is left out. Refused if the group or its metadata does not read.
    """
    from kxen_agent.errors import KxenError as _E

    group = f"{NS}/{ses}"
    try:
        state = store.refs.read(group)
        log = store.refs.reflog(group, state)
    except _E as e:
        raise _E(f"session {ses} does not read ({e}); `kxen-agent repair --apply` keeps every record that "
                 "checks, then export it") from None
    memo: dict[bytes, bool] = {}
    meta = state.refs.get("meta")
    if meta is None or not closure_reads(store, meta, memo):
        raise _E(f"session {ses}: its metadata does not read, so no bundle of it can be made; "
                 "`kxen-agent repair --from BUNDLE` or `--remote NAME` restores it from a good copy")
    refs = {"meta": meta}
    left: list[str] = []
    head = state.refs.get("head")
    if head is not None:
        heads = [head] + [e.new for e in reversed(log) if e.name == "head"]
        good = last_intact(store, heads, memo)
        if good is not None:
            refs["head"] = good
        if good != head:
            left.append(f"head {msg_id(head)} -> {msg_id(good) if good else 'no message'} (the last message "
                        "whose history reads)")
    for name, v in sorted(state.refs.items()):
        if name in ("meta", "head"):
            continue
        if closure_reads(store, v, memo):
            refs[name] = v
        else:
            left.append(f"{name} left out (it does not read)")
    return refs, left
