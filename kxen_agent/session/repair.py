"""Repair in sessions' words: good copies from bundles or the session's Git remote, new branches for the lost.

The store mends what it can by itself (:mod:`kxen_agent.store.repair`).
This module gives it its sources — every object of the bundles named,
each verified as ``bundle verify`` verifies it, and the objects of the
damaged sessions as the workspace's Git remote holds them, pulled into a
scratch state dir and verified there — and, for a session whose group it
quarantines, makes the new branch ``objects_spec.md`` §18 asks for: a fork
of the session at its last message whose whole history reads, with reason
``repair`` in the new group's reflog.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Callable, Iterator

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.store import Store
from kxen_agent.store.objects import ObjectId, RawObject
from kxen_agent.store.repair import GroupSalvage, RepairReport, repair

from .damage import branch_at, classify, closure_reads, last_intact
from .schema import SESSION_SCHEMA
from .sessions import NS, msg_id

__all__ = ["bundle_source", "remote_source", "repair_sessions"]


def bundle_source(path: str) -> tuple[str, Callable[[ObjectId], RawObject | None], dict]:
    """Every object of the bundle at ``path``, verified (a bad bundle is refused whole: BadBundle)."""
    from kxen_agent.store.bundle import verify_bundle

    objs: dict[ObjectId, RawObject] = {}
    info = verify_bundle(path, schema=SESSION_SCHEMA, on_object=lambda o: objs.__setitem__(o.id, o))
    return f"bundle {path}", objs.get, dict(info.refs)


def remote_source(store: Store, ses_ids: list[str], workspace: str, remote: str,
                  scratch: str) -> tuple[str, Callable[[ObjectId], RawObject | None], dict]:
    """The sessions ``ses_ids`` as ``remote`` holds them, pulled (and verified) into a scratch state dir."""
    from .remote_pull import pull_sessions

    other = Store(os.path.join(scratch, "state"), namespaces=(NS,))
    pull_sessions(other, ses_ids, workspace, remote=remote)

    def read(oid: ObjectId) -> RawObject | None:
        try:
            return other.read_raw(oid)
        except KxenError:
            return None

    refs = {}
    for ses in ses_ids:
        try:
            state = other.refs.read(f"{NS}/{ses}")
        except KxenError:
            continue
        if state.refs:
            refs[f"{NS}/{ses}"] = dict(state.refs)
    return f"remote {remote}", read, refs


def _on_lost(store: Store, lost: GroupSalvage) -> str | None:
    """A quarantined session's new branch: at its last message whose history reads (none: no branch)."""
    ns, _, ses = lost.group.partition("/")
    if ns != NS:
        return None
    memo: dict[bytes, bool] = {}
    metas = ([lost.refs["meta"]] if "meta" in lost.refs else []) + lost.values.get("meta", [])
    meta_oid = next((m for m in metas if closure_reads(store, m, memo)), None)
    if meta_oid is None:
        return f"no new branch of {ses}: no metadata of it reads"
    meta = store.get(meta_oid, "session")
    heads = ([lost.refs["head"]] if "head" in lost.refs else []) + lost.values.get("head", [])
    point = last_intact(store, heads, memo)
    if point is None and heads:
        return f"no new branch of {ses}: none of its messages has a history that reads"
    new = branch_at(store, ses, meta, meta["agent"], point, f"repair: branch of {ses} (quarantined)")
    at = msg_id(point) if point else "its empty history"
    return f"new branch {new} of {ses} at {at}"


def damaged_sessions(store: Store) -> list[str]:
    """The sessions that are not intact now (fsck's classification)."""
    from kxen_agent.store import fsck

    rep = fsck(store, schema=SESSION_SCHEMA)
    if rep.clean:
        return []
    return [s["id"] for s in classify(store, rep.unreadable_groups) if s["state"] != "intact"]


def repair_sessions(store: Store, *, bundles: list[str] = (), remote: str | None = None,
                    workspace: str | None = None, apply: bool = False) -> RepairReport:
    """Plan or make the repair of ``store``: good copies from ``bundles`` and ``remote``, branches for the lost."""
    sources = [bundle_source(b) for b in bundles]
    scratch = None
    try:
        if remote is not None:
            ids = damaged_sessions(store)
            if ids:
                scratch = tempfile.mkdtemp(prefix="kxen-repair-")
                try:
                    sources.append(remote_source(store, ids, workspace or os.getcwd(), remote, scratch))
                except UsageError:
                    raise
                except KxenError as e:
                    raise KxenError(f"cannot read the damaged sessions from remote {remote}: {e}; nothing "
                                    "was changed") from None
        return repair(store, sources=sources, apply=apply, on_lost=_on_lost, schema=SESSION_SCHEMA)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
