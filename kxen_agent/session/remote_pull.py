"""Sessions from a Git remote: pull and ls-remote (push and the shared readers: :mod:`.remote`).

- **pull**: fetch, then verify every new object — its BLAKE3 id, strict
  CBOR, the session schema, the kind of each link and ref, the closure —
  before anything is written; then fast-forward local refs, or create the
  session bound to a workspace after the identity check of ``session
  import``; a diverged session is refused;
- **ls-remote** (:mod:`.remote_listing`): the sessions on a remote with
  their heads, forks, last run and lease holder, from the tip commits alone.

A refused pull changes nothing on either side.
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.store import RawObject, Store
from kxen_agent.store.gitmap import (
    BadGitImage,
    GroupImage,
    group_tree_blob,
    parse_commit,
    parse_group_commit,
    parse_objects_commit,
    parse_objects_root,
    parse_objects_subtree,
)
from kxen_agent.store.objects import CorruptObject, SchemaViolation, a_kind, links_of, parse_object

from . import names
from .gitio import Mirror, Remote, Workbench, resolve_remote
from .remote import (
    RemoteRefused,
    _MAX_RAW,
    _Objects,
    _PACK_ABOVE,
    _compare,
    _follows,
    SESSION_REFS,
    _read_group,
    session_ref,
)

#: A whole session id as kxen-agent makes them (anything shorter on the command line is a prefix).
_FULL_SES = re.compile(r"ses_[0-9a-f]{20}")
from .remote_listing import RemoteListing, ls_remote  # ls-remote: its own module; its names stay importable here
from .schema import RUN_RE, SESSION_SCHEMA, misplaced
from .sessions import NS, SessionStore, is_id_or_prefix, resolve_prefix
from .workspace import WorkspaceIdentity, WorkspaceMismatch, check_binding, inspect_workspace


__all__ = ["PullReport", "RemoteListing", "ls_remote", "pull_sessions"]


# ---------------------------------------------------------------- pull


@dataclass(frozen=True)
class PullReport:
    remote: Remote
    sessions: Mapping[str, str]  # ses -> created | updated | unchanged | restored | ahead
    new_objects: int
    bindings: Mapping[str, str]  # ses -> workspace root it is bound to
    #: Names the remote gave that another session here holds: dropped (§14.16).
    dropped_names: tuple = ()

    def to_json(self) -> dict:
        return {"remote": self.remote.display, "sessions": dict(self.sessions), "newObjects": self.new_objects,
                "workspaces": dict(self.bindings),
                "droppedNames": [{"session": n.ses, "name": n.name, "heldBy": n.holder, "kept": n.kept} for n in self.dropped_names]}


def pull_sessions(store: Store, ses_ids: Sequence[str], workspace: str, *,
                  workspaces: Mapping[str, str] | None = None, remote: str | None = None,
                  acquire_lease: Callable[[str], Any] | None = None) -> PullReport:
    """Fetch the sessions from the remote, verify every new object, then fast-forward or create them here.

    The remote defaults to ``origin`` of the repository at ``workspace``. A
    session new here is bound to ``workspace`` (or to ``workspaces[ses]``)
    after the identity check of ``session import``; one that exists keeps
    its own binding. Refused (:class:`RemoteRefused`) when a session's
    history here and on the remote diverged; a bad remote is a
    :class:`BadGitImage` or :class:`~kxen_agent.store.objects.CorruptObject`.
    Either way nothing is written to the state dir.
    """
    if not ses_ids:
        raise UsageError("name at least one session to pull")
    for ses in ses_ids:
        if not is_id_or_prefix("ses", ses):
            raise UsageError(f"{ses!r} is not a session id (expected ses_ followed by at least 4 letters and digits: "
                             "an id or a unique prefix of one)")
    default = inspect_workspace(workspace)
    r = resolve_remote(default.repo_root, remote, what=f"workspace {default.root}")
    ids = list(dict.fromkeys(_remote_ids(r, ses_ids)))
    chosen = {}
    for text, d in (workspaces or {}).items():  # SES=DIR: one of the pulled sessions, or a unique prefix of one
        ses = resolve_prefix("session", "ses", text, lambda: ids, "among the sessions pulled")
        if ses is None:
            raise UsageError(f"--workspace {text}=DIR names a session that is not pulled; name it among SES")
        chosen[ses] = inspect_workspace(d)
    mirror = Mirror(store.root)
    with Workbench(r, mirror=mirror) as bench:
        seen = mirror.seen(r.key, [f"{NS}/{s}" for s in ids])
        # One fetch of the named sessions' refs alone (protocol v2 ref prefixes: a remote of
        # 10,000 sessions sends these, not 10,000 ref lines); what the mirror holds is not sent.
        live = bench.fetch_named([session_ref(s) for s in ids], what="pulled",
                                 negotiation_tips=[v for v in seen.values()])
        absent = [s for s in ids if session_ref(s) not in live]
        if absent:
            raise RemoteRefused(f"session {absent[0]} is not on {r.display}; nothing was pulled "
                                "(`kxen-agent session ls-remote` lists the sessions there)")
        fetch = [s for s in ids if live[session_ref(s)] != seen.get(f"{NS}/{s}")]
        objs = _Objects(store)
        try:
            images = {s: _read_group(bench, live[session_ref(s)], f"{NS}/{s}", f"{r.display} {session_ref(s)}")
                      for s in ids}
            _verify(bench, objs, images, [live[session_ref(s)] for s in ids], r, exclude=list(seen.values()))
        except (BadGitImage, CorruptObject) as e:
            msg = str(e)
            raise RemoteRefused(msg if "nothing was pulled" in msg else f"{msg}; nothing was pulled") from None
        plans = _plan_pull(store, objs, images, chosen, default, r)
        with ExitStack() as stack:
            if acquire_lease is not None:
                # Never under a running run; the ref transactions below still
                # compare-and-swap against what the plan read.
                for ses, p in plans.items():
                    if p.status in ("updated", "restored"):
                        stack.enter_context(acquire_lease(ses))
            dropped: list = []
            statuses, written = _write_pull(store, objs, plans, dropped)
        mirror_updates = [(f"{NS}/{s}", seen.get(f"{NS}/{s}"), live[session_ref(s)]) for s in ids
                          if live[session_ref(s)] != seen.get(f"{NS}/{s}")]
        if mirror_updates or fetch:
            mirror.ensure()
            mirror.adopt(bench)
            try:
                mirror.set_seen(r.key, mirror_updates)
            except KxenError:
                pass  # a concurrent pull recorded it first; the next push re-checks against the remote
    bindings = {s: p.binding.root for s, p in plans.items()}
    return PullReport(r, statuses, written, bindings, tuple(dropped))


def _remote_ids(r: Remote, texts: Sequence[str]) -> list[str]:
    """The full ids ``texts`` name on remote ``r``: a whole id as it is, a prefix resolved against the
    remote's session list (one ``git ls-remote``, only when a prefix is given), as ``--resume`` resolves
    one against this state dir's."""
    full = [t.strip() for t in texts]
    if all(_FULL_SES.fullmatch(t) for t in full):
        return full
    with Workbench(r, mirror=None, durable=False) as bench:
        there = [ref[len(SESSION_REFS):] for ref in bench.ls_remote([SESSION_REFS], what="listed")]
    out = []
    for t in full:
        found = t if _FULL_SES.fullmatch(t) else resolve_prefix("session", "ses", t, lambda: there, f"on {r.display}")
        if found is None:
            raise RemoteRefused(f"no session on {r.display} begins with {t}; nothing was pulled "
                                "(`kxen-agent session ls-remote` lists the sessions there)")
        out.append(found)
    return out


def compare_with_remote(store: Store, ses_ids: Sequence[str], workspace: str, *,
                        remote: str | None = None) -> dict[str, str]:
    """How each session here stands to the remote's: ``same``, ``ahead`` (this state dir has more),
    ``behind`` (the remote has more: a pull fast-forwards it) or ``diverged``; proven from the objects,
    which are fetched and verified as a pull does, and written nowhere."""
    ws = inspect_workspace(workspace)
    r = resolve_remote(ws.repo_root, remote, what=f"workspace {ws.root}")
    mirror = Mirror(store.root)
    out: dict[str, str] = {}
    with Workbench(r, mirror=mirror if mirror.exists() else None, durable=False) as bench:
        seen = mirror.seen(r.key, [f"{NS}/{s}" for s in ses_ids]) if mirror.exists() else {}
        live = bench.fetch_named([session_ref(s) for s in ses_ids], what="compared",
                                 negotiation_tips=list(seen.values()))
        there = [s for s in ses_ids if session_ref(s) in live]
        objs = _Objects(store)
        images = {s: _read_group(bench, live[session_ref(s)], f"{NS}/{s}", f"{r.display} {session_ref(s)}")
                  for s in there}
        _verify(bench, objs, images, [live[session_ref(s)] for s in there], r, exclude=list(seen.values()))
        for s in there:
            mine = {k: v for k, v in store.refs.read(f"{NS}/{s}").refs.items() if k != "meta"}
            theirs = {k: v for k, v in images[s].refs.items() if k != "meta"}
            how = _compare(objs, mine, theirs)[0]
            out[s] = {"ahead": "behind", "behind": "ahead"}.get(how, how)  # _compare says how theirs stand
    return out


def _verify(bench: Workbench, objs: _Objects, images: Mapping[str, GroupImage], commits: Sequence[bytes],
            r: Remote, exclude: Sequence[bytes]) -> None:
    """Verify every object the images' refs reach that this store lacks; keep them in ``objs.pulled``.

    The objects new since ``exclude`` (the last-seen commits) are listed
    once (``git rev-list --objects``: their paths are their kxen ids),
    size-checked before any is read, read in one stream and rehashed
    (BLAKE3); then a walk from the refs decodes each reachable one strictly,
    checks it against the session schema and the kind each ref and link
    must name, and finds every object it needs here or among them. Objects
    the refs do not reach are ignored (not written).
    """
    where = f"{r.display}"
    candidates: dict[bytes, RawObject] = {}
    index: dict[bytes, bytes] = {}

    def read_new(full: bool) -> None:
        for kid, oid in _checked_objects_trees(bench, commits, () if full else exclude, where).items():
            if kid not in index and not objs.has(kid):
                index[kid] = oid
        wanted = [(k, g) for k, g in index.items() if k not in candidates]
        by_git = {g: k for k, g in wanted}
        for g, _, body in bench.read([g for _, g in wanted]):
            kid = by_git[g]
            candidates[kid] = parse_object(body, f"{kid.hex()} (from {where})", expect_id=kid)

    read_new(False)
    listed_all = False
    expect: dict[bytes, tuple[str, str]] = {}  # kxen id -> (kind it must be, who says so)
    stack: list[bytes] = []
    for ses, img in images.items():
        group = f"{NS}/{ses}"
        if "meta" not in img.refs:
            raise RemoteRefused(f"{where}: session {ses} has no metadata ref; nothing was pulled")
        for name, oid in img.refs.items():
            if name not in ("meta", "head") and not (name.startswith("runs/") and RUN_RE.fullmatch(name[5:])):
                raise RemoteRefused(f"{where}: session {ses} has ref {name!r}, which no session has "
                                    "(meta, head, runs/<run>); nothing was pulled")
            _expect(objs, expect, oid, SESSION_SCHEMA.ref_kind(group, name), f"ref {group}/{name}", where)
            stack.append(oid)
    visited: set[bytes] = set()
    while stack:
        kid = stack.pop()
        if kid in visited or objs.has(kid):
            continue  # what this store holds was verified when it came in
        if kid not in candidates and not listed_all:
            # Not new since the last-seen commits: this store lost it (gc of a
            # deleted session); the remote's whole closure may hold it.
            read_new(True)
            listed_all = True
        obj = candidates.get(kid)
        if obj is None:
            who = expect.get(kid, ("", "an object"))[1]
            raise RemoteRefused(f"{where}: {who} names object {kid.hex()}, which the remote does not hold; "
                                "nothing was pulled (the remote is damaged: push it again from a good copy)")
        visited.add(kid)
        objs.pulled[kid] = obj
        want = expect.pop(kid, None)
        if want is not None and want[0] != obj.kind:
            raise CorruptObject(kid.hex(), f"{want[1]} must name {a_kind(want[0])} object, but it is "
                                f"{a_kind(obj.kind)} (from {where}); nothing was pulled")
        if obj.kind == "blob":
            continue
        value = objs.kind_value(kid)[1]  # strict decoding
        try:
            typed = SESSION_SCHEMA.check(obj.kind, value)
        except SchemaViolation as e:
            raise CorruptObject(kid.hex(), f"{obj.kind} object from {where} does not match objects_spec.md "
                                f"§14: {e}; nothing was pulled") from None
        for link, k in typed:
            _expect(objs, expect, link, k, f"object {kid.hex()}", where)
        stack.extend(links_of(obj.kind, value))
    for ses, img in images.items():
        for name, oid in img.refs.items():
            if name == "head":
                continue
            _, value = objs.kind_value(oid)
            wrong = misplaced(ses, name, value)
            if wrong:
                raise RemoteRefused(f"{where}: {wrong}; nothing was pulled")


def _checked_objects_trees(bench: Workbench, tips: Sequence[bytes], exclude: Sequence[bytes],
                           where: str) -> dict[bytes, bytes]:
    """Check every commit reachable from ``tips`` and not from ``exclude``; kxen id -> blob id of their objects trees.

    ``objects_spec.md`` §16.7 pull step 1: each such commit is a group commit
    (§16.4-§16.5: its tree, its refs blob, its message; at most one objects
    commit among its parents) or an objects commit (§16.3, §16.5: no parents,
    message ``kxen objects <n>``, a root of two-hex-digit subtrees, in each
    only ``100644`` entries named by the other 62 hex digits, ``n`` entries
    in all, each a blob of at most ``MAX_OBJECT_SIZE`` + 17 bytes). All of it
    is judged from the commits, the trees and ``git cat-file --batch-check``
    before any kxen object is read, so a malformed image is refused whole,
    whichever of its objects the refs would take.
    """
    if not tips:
        return {}
    args = ["rev-list", *[t.hex() for t in tips]]
    if exclude:
        args += ["--not", *[e.hex() for e in exclude]]
    listed = [bytes.fromhex(line.decode("ascii")) for line in bench.git(args).stdout.split()]
    bodies = {oid: (t, body) for oid, t, body in bench.read(listed)}
    objects_commits: list[tuple[bytes, int, bytes]] = []  # (commit, n, root tree)
    groups: list[tuple[bytes, bytes, bytes]] = []  # (commit, its body, its tree)
    kinds: dict[bytes, str] = {}
    for oid in listed:
        w = f"{where} commit {oid.hex()}"
        t, body = bodies.get(oid, ("missing", b""))
        if t != "commit":
            raise BadGitImage(w, f"the remote holds a {t} object here, not a commit")
        c = parse_commit(body, w)
        if c.message.startswith(b"kxen objects "):
            objects_commits.append((oid, parse_objects_commit(body, w)[1], c.tree))
            kinds[oid] = "objects"
        elif c.message.startswith(b"kxen group "):
            groups.append((oid, body, c.tree))
            kinds[oid] = "group"
        else:
            raise BadGitImage(w, "neither a group commit nor an objects commit (objects_spec.md §16.3-§16.5)")
    # Group commits: tree and refs blob, as the tip's are checked (§16.4).
    trees = {oid: (t, b) for oid, t, b in bench.read(list({tree for _, _, tree in groups}))}
    blob_ids: dict[bytes, bytes] = {}
    for oid, _, tree in groups:
        w = f"{where} commit {oid.hex()}"
        if trees.get(tree, ("missing",))[0] != "tree":
            raise BadGitImage(w, "the commit's tree is missing")
        blob_ids[oid] = group_tree_blob(trees[tree][1], w)
    sizes = bench.sizes(list(set(blob_ids.values())))
    for oid, b in blob_ids.items():
        if sizes.get(b, ("missing", 0))[0] != "blob" or sizes[b][1] > 16 << 20:
            raise BadGitImage(f"{where} commit {oid.hex()}", "the refs blob is missing or larger than 16 MiB")
    blobs = {oid: body for oid, _, body in bench.read(list(set(blob_ids.values())))}
    for oid, body, tree in groups:
        w = f"{where} commit {oid.hex()}"
        img = parse_group_commit(body, trees[tree][1], blobs[blob_ids[oid]], w)
        if sum(1 for p in img.commit.parents if kinds.get(p) == "objects") > 1:
            raise BadGitImage(w, "a group commit has at most one objects commit among its parents "
                              "(objects_spec.md §16.4)")
    # Objects commits: the fan-out, the modes, the names, the count, each entry a blob of bounded size (§16.3).
    roots = {oid: (t, b) for oid, t, b in bench.read(list({tree for _, _, tree in objects_commits}))}
    subtree_of: dict[bytes, list[tuple[bytes, bytes]]] = {}
    for oid, _, tree in objects_commits:
        w = f"{where} objects commit {oid.hex()}"
        if roots.get(tree, ("missing",))[0] != "tree":
            raise BadGitImage(w, "the commit's tree is missing")
        subtree_of[oid] = parse_objects_root(roots[tree][1], w)
    subs = {oid: (t, b) for oid, t, b in bench.read(list({s for v in subtree_of.values() for _, s in v}))}
    index: dict[bytes, bytes] = {}
    held: dict[bytes, bytes] = {}  # blob id -> kxen id, for the size check's message
    for oid, n, _ in objects_commits:
        w = f"{where} objects commit {oid.hex()}"
        count = 0
        for prefix, sub in subtree_of[oid]:
            if subs.get(sub, ("missing",))[0] != "tree":
                raise BadGitImage(w, f"subtree {prefix.decode('ascii')} is missing or not a tree")
            entries = parse_objects_subtree(prefix, subs[sub][1], w)
            count += len(entries)
            for kid, blob in entries:
                index.setdefault(kid, blob)
                held.setdefault(blob, kid)
        if count != n:
            raise BadGitImage(w, f"its message counts {n} objects, its tree holds {count} (objects_spec.md §16.3)")
    sizes = bench.sizes(list(held))
    for blob, kid in held.items():
        t, size = sizes.get(blob, ("missing", 0))
        if t != "blob":
            raise BadGitImage(f"{where} {blob.hex()}", f"object {kid.hex()} is a Git {t}, not a blob")
        if size > _MAX_RAW:
            raise CorruptObject(kid.hex(), f"the remote's copy ({where}) is {size} bytes, more than the "
                                f"{_MAX_RAW} an object may be; nothing was pulled")
    return index


def _expect(objs: _Objects, expect: dict, oid: bytes, kind: str | None, who: str, where: str) -> None:
    if kind is None:
        return
    if oid in objs.pulled or (objs.store.exists and objs.store.has(oid)):
        have = objs.pulled[oid].kind if oid in objs.pulled else objs.store.read_raw(oid).kind
        if have != kind:
            raise CorruptObject(oid.hex(), f"{who} must name {a_kind(kind)} object, but it is {a_kind(have)} "
                                f"(from {where}); nothing was pulled")
        return
    prior = expect.setdefault(oid, (kind, who))
    if prior[0] != kind:
        raise CorruptObject(oid.hex(), f"must be {a_kind(prior[0])} for {prior[1]} and {a_kind(kind)} for {who} "
                            f"(from {where}); nothing was pulled")


@dataclass
class _PullPlan:
    ses: str
    local: Any  # RefGroupState
    refs: dict[str, bytes]  # as they will be here
    binding: WorkspaceIdentity
    status: str
    new_meta: dict | None = None  # the metadata a new binding copies (``base_oid``'s value)
    base_oid: bytes | None = None


def _plan_pull(store: Store, objs: _Objects, images: Mapping[str, GroupImage], chosen: Mapping[str, WorkspaceIdentity],
               default: WorkspaceIdentity, r: Remote) -> dict[str, _PullPlan]:
    plans: dict[str, _PullPlan] = {}
    for ses, img in images.items():
        group = f"{NS}/{ses}"
        local = store.refs.read(group) if store.exists else None
        exists = local is not None and local.exists and "meta" in local.refs
        _, meta = objs.kind_value(img.refs["meta"])
        recorded = WorkspaceIdentity.from_record(meta["workspace"])
        replace = exists and local.deleted_ns is not None  # deleted here: the remote's comes back whole
        if exists and not replace and ses not in chosen:
            _, lmeta = objs.kind_value(local.refs["meta"])
            current = WorkspaceIdentity.from_record(lmeta["workspace"])
            if current.identity != recorded.identity:
                raise WorkspaceMismatch(
                    f"session {ses} on {r.display} is bound to another repository than the local one "
                    f"({recorded.identity[:12]} there, {current.identity[:12]} here); nothing was pulled",
                    field="identity", recorded=recorded.identity, current=current.identity)
        else:
            current = chosen.get(ses, default)
            check_binding(recorded, current, rebind=True)
        base_oid, base = img.refs["meta"], meta
        lmeta_oid = local.refs.get("meta") if exists else None
        if lmeta_oid is not None and lmeta_oid != base_oid and _follows(objs, lmeta_oid, base_oid):
            base_oid, base = lmeta_oid, objs.kind_value(lmeta_oid)[1]
        refs = dict(img.refs)
        plan = _PullPlan(ses, local, refs, current, "")
        if not _same_binding(base["workspace"], current):
            plan.new_meta, plan.base_oid = base, base_oid
        else:
            refs["meta"] = base_oid
        if not exists:
            plan.status = "created"
        elif replace:
            plan.status = "restored"
        else:
            mine = {k: v for k, v in local.refs.items() if k != "meta"}
            theirs = {k: v for k, v in refs.items() if k != "meta"}
            how, ref = _compare(objs, mine, theirs)
            # The metadata: the binding here is this runner's own (it is rebuilt
            # on the remote's when that is newer), so only its history counts.
            lm = local.refs["meta"]
            meta_how = ("same" if base_oid == lm else "ahead" if _follows(objs, img.refs["meta"], lm)
                        else "diverged")
            if how == "diverged" or meta_how == "diverged" or (how == "behind" and meta_how == "ahead"):
                lv, tv = local.refs.get(ref or "meta"), refs.get(ref or "meta")
                raise RemoteRefused(
                    f"pull of session {ses} from {r.display} refused: its history here and on the remote diverged "
                    f"(ref {ref or 'meta'}: here {lv.hex()[:16] if lv else 'absent'}, there "
                    f"{tv.hex()[:16] if tv else 'absent'}); nothing was pulled — keep yours by forking it "
                    f"(kxen-agent session fork {ses}) and pushing the fork, or take the remote's by deleting "
                    f"yours (kxen-agent session delete {ses}) and pulling again")
            if how == "behind" or (how == "same" and meta_how == "same"):
                # Nothing to take. A binding of this machine's own on top of the
                # remote's metadata is not "ahead": where a session lives is local.
                plan.status = "ahead" if how == "behind" else "unchanged"
                plan.refs = dict(local.refs)
                plan.new_meta = None
            else:
                plan.status = "updated"
        plans[ses] = plan
    return plans


def _same_binding(record: Mapping, current: WorkspaceIdentity) -> bool:
    now = current.to_record()
    return all(record.get(k) == now[k] for k in now if k != "head")


def _write_pull(store: Store, objs: _Objects, plans: Mapping[str, _PullPlan],
                dropped: list | None = None) -> tuple[dict[str, str], int]:
    """Write the verified objects, then each session's refs (CAS against what was planned on).

    Under the names lock (§14.16): a pulled name another session here holds is dropped (into ``dropped``)."""
    changing = {s: p for s, p in plans.items() if p.status in ("created", "updated", "restored")}
    statuses = {s: p.status for s, p in plans.items()}
    if not changing:
        return statuses, 0
    sessions = SessionStore(store)
    with names.lock(sessions):
        for ses, p in changing.items():
            meta = p.new_meta if p.new_meta is not None else objs.kind_value(p.refs["meta"])[1]
            mine = objs.kind_value(p.local.refs["meta"])[1] if p.local is not None and "meta" in p.local.refs else {}
            kept, gone = names.importable(sessions, ses, meta, names.name_of(mine))
            if gone is not None:
                if dropped is not None:
                    dropped.append(gone)
                if p.new_meta is None:
                    p.base_oid = p.refs["meta"]
                p.new_meta = {k: v for k, v in meta.items() if k != "name"}
                if kept is not None:
                    p.new_meta["name"] = kept
        return _write_planned(store, objs, changing, statuses, sessions)


def _write_planned(store: Store, objs: _Objects, changing: Mapping[str, _PullPlan], statuses: dict[str, str],
                   sessions: SessionStore) -> tuple[dict[str, str], int]:
    needed = _reachable_new(objs, [v for p in changing.values() for v in p.refs.values()])
    groups = {ses: f"{NS}/{ses}" for ses in changing}
    # One step per session; the first carries the pulled objects (unless a pack does) and the new
    # metadata objects in its record: one fsync for all of them. The shared lock keeps gc from
    # pruning a pack's objects before the refs that name them have moved.
    first = store.step(groups[next(iter(changing))])
    with store.shared_lock():
        if len(needed) > _PACK_ABOVE:
            writer = store.pack_writer(None)
            try:
                for obj in needed:
                    writer.add(obj)
                sealed = writer.seal()
            except BaseException:
                writer.abort()
                raise
            sealed.commit()
            store.reload_packs()
        else:
            for obj in needed:
                first.put_raw(obj)
        for ses, p in changing.items():
            if p.new_meta is not None:
                assert p.base_oid is not None
                p.refs["meta"] = sessions.rebound_meta(p.new_meta, p.base_oid, p.binding, "import", into=first)
        for ses, p in changing.items():
            step = first if first.group == groups[ses] else store.step(groups[ses])
            local = p.local.refs if p.local is not None else {}
            for n, v in sorted(p.refs.items()):
                if local.get(n) != v:
                    step.update(n, local.get(n), v)
            for n in sorted(local):
                if n not in p.refs:
                    step.update(n, local[n], None)
            step.mark_deleted(None)
            step.commit("pull from remote")
    return statuses, len(needed)


def _reachable_new(objs: _Objects, tips: Iterable[bytes]) -> list[RawObject]:
    """The pulled objects the tips reach, children before parents (links are written first)."""
    order: list[RawObject] = []
    seen: set[bytes] = set()
    stack: list[tuple[bytes, bool]] = [(t, False) for t in tips]
    while stack:
        oid, done = stack.pop()
        if done:
            order.append(objs.pulled[oid])
            continue
        if oid in seen or oid not in objs.pulled:
            continue
        seen.add(oid)
        stack.append((oid, True))
        obj = objs.pulled[oid]
        if obj.kind != "blob":
            stack.extend((c, False) for c in links_of(obj.kind, objs.kind_value(oid)[1]))
    return order
