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
from dataclasses import dataclass
from typing import Callable, Mapping

from kxen_agent.errors import UsageError
from kxen_agent.store import Store
from kxen_agent.store.bundle import (BundleInfo, ImportResult, export_bundle, import_bundle,
                                     verify_bundle_with_ref_targets)
from kxen_agent.store.objects import decode_stored

from .sessions import NS, SessionStore
from .workspace import WorkspaceError, WorkspaceIdentity, check_binding, inspect_workspace

__all__ = ["ImportedSessions", "export_sessions", "import_sessions"]


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
    workspace: WorkspaceIdentity

    def to_json(self) -> dict:
        d = self.result.to_json()
        d["sessions"] = dict(self.sessions)
        d["workspace"] = self.workspace.root
        return d


def import_sessions(store: Store, path: str, workspace: str, *,
                    progress: Callable[[int], None] | None = None,
                    acquire_lease: Callable[[str], object] | None = None) -> ImportedSessions:
    """Import every session of the bundle at ``path`` and bind it to ``workspace``.

    ``acquire_lease(ses)`` (the runtime's mutation lock) is taken for each
    session that already exists here, so an import never lands under a
    running run.
    """
    current = inspect_workspace(workspace)
    info, targets = verify_bundle_with_ref_targets(path)
    for group in info.refs:
        ns, _, ses = group.partition("/")
        if ns != NS:
            raise UsageError(f"bundle {path} holds ref group {group!r}, which is not a session; nothing imported")
        if "meta" not in info.refs[group]:
            raise UsageError(f"bundle {path}: session {ses} has no metadata ref; nothing imported")
        meta = targets[info.refs[group]["meta"]]
        if meta.kind != "session":
            raise UsageError(f"bundle {path}: the metadata ref of session {ses} names a {meta.kind} object, "
                             f"not a session; nothing imported")
        # Judged before the state dir is touched, so a refused import leaves
        # nothing behind (not even a new, empty state dir); ``transform``
        # below checks again against what it builds on.
        value = decode_stored(meta)
        try:
            recorded = WorkspaceIdentity.from_record(value.get("workspace") if isinstance(value, dict) else None)
        except WorkspaceError as e:
            raise UsageError(f"bundle {path}: session {ses}: {e}; nothing imported") from None
        check_binding(recorded, current, rebind=True)
    sessions = SessionStore(store)

    def transform(group: str, refs: dict[str, bytes]) -> dict[str, bytes]:
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
        if _same_binding(base["workspace"], current):
            return dict(refs, meta=base_oid)  # importing twice is a no-op
        return dict(refs, meta=sessions.rebound_meta(base, base_oid, current, "import"))

    with ExitStack() as stack:
        if acquire_lease is not None:
            for group in info.refs:
                ses = group.partition("/")[2]
                if store.refs.read(group).refs.get("meta") is not None:
                    stack.enter_context(acquire_lease(ses))
        res = import_bundle(store, path, transform=transform, progress=progress)
    by_ses = {g.partition("/")[2]: s for g, s in res.groups.items()}
    return ImportedSessions(res, by_ses, current)


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
