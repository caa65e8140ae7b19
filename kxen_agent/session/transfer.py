"""Moving sessions between runners: export to a bundle, import with a binding.

Export is the store's bundle of the sessions' ref groups: metadata, messages,
the DCPAgent lock, DCPRun states and the tool journal — every object
reachable from the sessions' refs and nothing else (no auth store, no
provider key, no environment: none of those is ever an object).

Import verifies the whole bundle, then binds every session in it to the
workspace given, which must pass the same identity check as a rebind
(repository identity, branch, recorded HEAD an ancestor of the current one);
if any session fails it, nothing is imported. The binding is a new session
metadata object linking to the bundle's (``reason: "import"``), or to this
runner's own later binding of it, so the meta ref only moves forward and the
history of where a session has lived stays readable. A binding that already
names the workspace (HEAD aside) is kept: importing twice is a no-op.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from kxen_agent.errors import UsageError
from kxen_agent.store import Store
from kxen_agent.store.bundle import (BundleInfo, ImportResult, bundle_objects, export_bundle, import_bundle,
                                     verify_bundle_with_ref_targets)
from kxen_agent.store.objects import RawObject, decode_stored
from kxen_agent.store.step import Step

from .schema import RUN_RE, SES_RE, SESSION_SCHEMA, misplaced
from . import names
from .names import NameDropped
from .sessions import NS, SessionStore, resolve_prefix
from .workspace import WorkspaceIdentity, WorkspaceMismatch, check_binding, inspect_workspace

__all__ = ["ImportedSessions", "export_sessions", "import_sessions", "session_objects"]


def session_objects(store: Store, ses_ids: list[str]) -> Iterator[RawObject]:
    """Every object an export of these sessions writes, in bundle order (to look at them before writing)."""
    sessions = SessionStore(store)
    if not ses_ids:
        raise UsageError("name at least one session to export")
    groups = []
    for ses in dict.fromkeys(ses_ids):
        sessions.get(ses)  # UnknownSession names the state dir and points at import
        groups.append(sessions.group(ses))
    return bundle_objects(store, groups)


def export_sessions(store: Store, ses_ids: list[str], out: str, *, fmt: str | None = None,
                    progress: Callable[[int], None] | None = None) -> BundleInfo:
    """Write one bundle holding every named session (shared history once)."""
    sessions = SessionStore(store)
    if not ses_ids:
        raise UsageError("name at least one session to export")
    groups = []
    for ses in dict.fromkeys(ses_ids):
        sessions.get(ses)  # UnknownSession names the state dir and points at import
        groups.append(sessions.group(ses))
    from kxen_agent.store.bundle import format_for_path

    return export_bundle(store, groups, out, fmt=format_for_path(out, fmt), progress=progress)


@dataclass(frozen=True)
class ImportedSessions:
    result: ImportResult
    sessions: Mapping[str, str]  # ses id -> created | updated | unchanged | restored
    workspace: WorkspaceIdentity  # the default binding (``--workspace DIR``)
    bindings: Mapping[str, WorkspaceIdentity]  # ses id -> the workspace it is bound to
    #: Names the bundle gave that another session here holds: dropped (§14.16).
    dropped_names: tuple[NameDropped, ...] = field(default=())

    def to_json(self) -> dict:
        d = self.result.to_json()
        d["droppedNames"] = [{"session": n.ses, "name": n.name, "heldBy": n.holder, "kept": n.kept} for n in self.dropped_names]
        d["sessions"] = dict(self.sessions)
        d["workspace"] = self.workspace.root
        d["workspaces"] = {ses: ws.root for ses, ws in sorted(self.bindings.items())}
        return d


def import_sessions(store: Store, path: str, workspace: str, *,
                    workspaces: Mapping[str, str] | None = None,
                    progress: Callable[[int], None] | None = None,
                    acquire_lease: Callable[[str], object] | None = None) -> ImportedSessions:
    """Import every session of the bundle at ``path`` and bind it to ``workspace``.

    ``workspaces`` (ses id -> dir) binds some sessions elsewhere: a worktree
    fork (its own branch ``kxen/NAME``) exported with its parent is bound to
    a worktree of that branch on this runner, the parent to ``workspace``.
    ``acquire_lease(ses)`` (the runtime's mutation lock) is taken for each
    session that already exists here, so an import never lands under a
    running run.
    """
    default = inspect_workspace(workspace)
    given = {ses: inspect_workspace(d) for ses, d in (workspaces or {}).items()}
    chosen: dict[str, WorkspaceIdentity] = {}  # by full id, once the header names the sessions

    def judge_refs(refs: Mapping[str, Mapping[str, bytes]]) -> None:
        # What the header shows is judged before any object is read: a bundle
        # that is not a set of sessions is refused without reading the rest.
        for group in refs:
            ns, _, ses = group.partition("/")
            if ns != NS or not SES_RE.fullmatch(ses):
                raise UsageError(f"bundle {path} holds ref group {group!r}, which is not a session; nothing imported")
        held = sorted(g.partition("/")[2] for g in refs)
        for text, where in given.items():  # SES=DIR: an id or a unique prefix of one of the bundle's sessions
            ses = resolve_prefix("session", "ses", text, lambda: held, f"in bundle {path}")
            if ses is None:
                raise UsageError(f"bundle {path} holds no session {text} (it holds {', '.join(held)}); "
                                 "nothing imported")
            if ses in chosen:
                raise UsageError(f"--workspace {text}=DIR names session {ses} again; give each session once")
            chosen[ses] = where
        for group, names in refs.items():
            ses = group.partition("/")[2]
            if "meta" not in names:
                raise UsageError(f"bundle {path}: session {ses} has no metadata ref; nothing imported")
            for name in names:
                if name not in ("meta", "head") and not (name.startswith("runs/") and RUN_RE.fullmatch(name[5:])):
                    raise UsageError(f"bundle {path}: session {ses} has ref {name!r}, which no session has "
                                     "(meta, head, runs/<run>); nothing imported")

    # Every object's shape and link kinds are checked with the bytes (§14),
    # so what lands here is what the readers can read.
    info, targets = verify_bundle_with_ref_targets(path, schema=SESSION_SCHEMA, judge_refs=judge_refs)
    for group in info.refs:
        ses = group.partition("/")[2]
        refs = info.refs[group]
        meta = decode_stored(targets[refs["meta"]])
        for name, oid in refs.items():
            wrong = misplaced(ses, name, decode_stored(targets[oid])) if name != "head" else None
            if wrong:
                raise UsageError(f"bundle {path}: {wrong}; nothing imported")
        # Judged before the state dir is touched, so a refused import leaves
        # nothing behind (not even a new, empty state dir); ``transform``
        # below checks again against what it builds on.
        try:
            check_binding(WorkspaceIdentity.from_record(meta["workspace"]), chosen.get(ses, default), rebind=True)
        except WorkspaceMismatch as e:
            if len(info.refs) == 1 or ses in chosen:
                raise
            # A family: a fork with its own worktree needs its own binding.
            raise WorkspaceMismatch(
                f"session {ses}: {e}; or bind this session to another checkout with --workspace {ses}=DIR "
                f"(for a worktree fork: a worktree of its branch {meta['workspace'].get('branch') or '?'})",
                field=e.field, recorded=e.recorded, current=e.current) from None
    sessions = SessionStore(store)
    dropped: dict[str, NameDropped] = {}

    def transform(group: str, refs: dict[str, bytes], step: Step) -> dict[str, bytes]:
        current = chosen.get(group.partition("/")[2], default)
        meta_oid = refs["meta"]
        meta = store.get(meta_oid, "session")
        recorded = WorkspaceIdentity.from_record(meta["workspace"])
        check_binding(recorded, current, rebind=True)  # raises: nothing is imported
        base_oid, base = meta_oid, meta
        local = store.refs.read(group).refs.get("meta")
        if local is not None and local != meta_oid and _descends(store, local, meta_oid):
            # This runner already bound the bundle's metadata (an earlier
            # import or rebind here): build on that binding, so the meta ref
            # only moves forward and re-importing to another path is a rebind.
            base_oid, base = local, store.get(local, "session")
        # A name another session here holds is dropped: nothing from elsewhere takes a local name (§14.16).
        mine = store.get(local, "session") if local is not None else {}
        kept, gone = names.importable(sessions, group.partition("/")[2], base, names.name_of(mine))
        if gone is not None:
            dropped[gone.ses] = gone
            base = {k: v for k, v in base.items() if k != "name"}
            if kept is not None:
                base["name"] = kept
        elif _same_binding(base["workspace"], current):
            return dict(refs, meta=base_oid)  # importing twice is a no-op
        return dict(refs, meta=sessions.rebound_meta(base, base_oid, current, "import", into=step))

    with ExitStack() as stack:
        stack.enter_context(names.lock(sessions))  # first: the names lock comes before any group lock
        if acquire_lease is not None:
            for group in info.refs:
                ses = group.partition("/")[2]
                if store.refs.read(group).refs.get("meta") is not None:
                    stack.enter_context(acquire_lease(ses))
        res = import_bundle(store, path, transform=transform, progress=progress, schema=SESSION_SCHEMA)
    by_ses = {g.partition("/")[2]: s for g, s in res.groups.items()}
    return ImportedSessions(res, by_ses, default, {ses: chosen.get(ses, default) for ses in by_ses},
                            tuple(dropped[s] for s in sorted(dropped)))


def _same_binding(record: Mapping, current: WorkspaceIdentity) -> bool:
    """Whether a recorded binding already names ``current``.

    The recorded HEAD is left out: it is the HEAD when the binding was made,
    and a resume accepts any descendant of it without writing a new binding.
    """
    now = current.to_record()
    return all(record.get(k) == now[k] for k in now if k != "head")


def _descends(store: Store, meta_oid: bytes, ancestor: bytes) -> bool:
    """Whether session metadata ``meta_oid`` is ``ancestor`` rebound (``previous`` links), once or more."""
    seen = set()
    while meta_oid not in seen:
        seen.add(meta_oid)
        prev = store.get(meta_oid, "session").get("previous")
        if prev is None:
            return False
        if prev == ancestor:
            return True
        meta_oid = prev
    return False
