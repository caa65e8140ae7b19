"""Sessions on many machines: push, pull and ls-remote through the repository's own Git remote.

A session lives on a Git remote as one ref, ``refs/kxen/sessions/<ses>``,
naming the group commit of its Git image (``objects_spec.md`` §16,
:mod:`kxen_agent.store.gitmap`); a run that holds the remote lease adds a
second, ``refs/kxen/leases/<ses>`` (the protocol is the runtime's,
:mod:`kxen_agent.runtime.remote_lease`; the holder record is defined here
because a listing shows it). Git moves the bytes
(:mod:`.gitio`); this module decides:

- **push**: per remote, one atomic ``git push`` of every session bound to
  it, each a compare-and-swap against the group commit this state dir last
  saw there (refused, "pull first", if the remote moved since), each a
  fast-forward of what was seen (refused, "diverged", otherwise); only the
  objects the remote lacks travel;
- **pull**: fetch, then verify every new object — its BLAKE3 id, strict
  CBOR, the session schema, the kind of each link and ref, the closure —
  before anything is written; then fast-forward local refs, or create the
  session bound to a workspace after the identity check of ``session
  import``; a diverged session is refused;
- **ls-remote**: the sessions on a remote with their heads, forks, last run
  and lease holder, from the tip commits alone (a shallow fetch).

A refused push or pull changes nothing on either side. It works on the disk
:class:`~kxen_agent.store.Store` (it runs ``git``); it never takes a run
lease itself (``acquire_lease`` is given by the caller, as for ``session
import``).
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.store import MissingObject, RawObject, RefUpdate, Store
from kxen_agent.store.gitmap import (
    BadGitImage,
    GitObject,
    GroupImage,
    group_commit,
    group_tree_blob,
    kxen_id_of_path,
    lease_tree_blob,
    objects_commit,
    parse_commit,
    parse_group_commit,
    parse_lease_commit,
)
from kxen_agent.store.objects import (
    MAX_OBJECT_SIZE,
    CorruptObject,
    SchemaViolation,
    a_kind,
    decode_body,
    decode_stored,
    links_of,
    parse_object,
)

from .gitio import Mirror, PushRejected, PushUpdate, Remote, RemoteUnreachable, Workbench, resolve_remote
from .schema import RUN_RE, SES_RE, SESSION_SCHEMA, misplaced
from .sessions import NS, SessionStore, UnknownSession, msg_id, resolve_prefix
from .workspace import WorkspaceIdentity, WorkspaceMismatch, check_binding, inspect_workspace

__all__ = [
    "GroupPlan",
    "LEASE_REFS",
    "PullReport",
    "PushReport",
    "RemoteHolder",
    "RemoteListing",
    "RemoteRefused",
    "RemoteSession",
    "RemoteSessionBusy",
    "SESSION_REFS",
    "lease_ref",
    "ls_remote",
    "pull_first",
    "pull_sessions",
    "push_sessions",
    "read_holder",
    "session_ref",
]

SESSION_REFS = "refs/kxen/sessions/"
LEASE_REFS = "refs/kxen/leases/"
#: The longest object a pull reads: the object bytes of §3 at most.
_MAX_RAW = MAX_OBJECT_SIZE + 17
#: Above this many new objects a pull stages them in one pack instead of loose files.
_PACK_ABOVE = 64


def session_ref(ses: str) -> str:
    return SESSION_REFS + ses


def lease_ref(ses: str) -> str:
    return LEASE_REFS + ses


class RemoteRefused(KxenError):
    """A push or pull that would lose or mix history was refused; nothing changed on either side."""


class RemoteSessionBusy(KxenError):
    """Another machine holds the session's remote lease (exit 75, as the local run lease)."""

    exit_code = 75


# ---------------------------------------------------------------- the remote lease's holder record


@dataclass(frozen=True)
class RemoteHolder:
    """The record in a lease commit (``objects_spec.md`` §16.6): who holds a session's remote lease, until when.

    ``fence`` only grows from one grant to the next; ``expiresNs`` is the
    holder's wall clock plus the lease's TTL at its last renewal.
    """

    session: str
    host: str
    pid: int
    run: str | None
    fence: int
    sinceNs: int
    expiresNs: int
    ttlMs: int

    def to_bytes(self) -> bytes:
        d = {"expiresNs": self.expiresNs, "fence": self.fence, "host": self.host, "pid": self.pid,
             "run": self.run, "session": self.session, "sinceNs": self.sinceNs, "ttlMs": self.ttlMs}
        return json.dumps(d, sort_keys=True).encode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "RemoteHolder":
        try:
            d = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise BadGitImage(where, "lease record is not JSON") from None
        ints = ("expiresNs", "fence", "pid", "sinceNs", "ttlMs")
        if (not isinstance(d, dict) or set(d) != {*ints, "host", "run", "session"}
                or any(type(d[k]) is not int or d[k] < 0 for k in ints)
                or not isinstance(d["host"], str) or not (d["run"] is None or isinstance(d["run"], str))
                or not isinstance(d["session"], str) or not SES_RE.fullmatch(d["session"])):
            raise BadGitImage(where, "lease record does not have the keys and types of objects_spec.md §16.6")
        return cls(**d)

    def to_json(self) -> dict:
        return {"host": self.host, "pid": self.pid, "run": self.run, "fence": self.fence,
                "sinceNs": self.sinceNs, "expiresNs": self.expiresNs}

    def expired(self, now_ns: int) -> bool:
        return self.expiresNs <= now_ns

    def line(self, now_ns: int) -> str:
        left = (self.expiresNs - now_ns) / 1e9
        run = f"run {self.run}" if self.run else "no run"
        state = f"expires in {left:.0f}s unless renewed" if left > 0 else f"expired {-left:.0f}s ago"
        return f"host {self.host} (pid {self.pid}, {run}, fence {self.fence}, {state})"


# ---------------------------------------------------------------- reading what Git holds


class _Objects:
    """kxen objects by id: the store's, and those a pull verified but has not written yet."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.pulled: dict[bytes, RawObject] = {}
        self._values: dict[bytes, Any] = {}

    def has(self, oid: bytes) -> bool:
        return oid in self.pulled or (self.store.exists and self.store.has(oid))

    def kind_value(self, oid: bytes) -> tuple[str, Any]:
        obj = self.pulled.get(oid)
        if obj is not None:
            if oid not in self._values:
                self._values[oid] = decode_body(obj)
            return obj.kind, self._values[oid]
        raw = self.store.read_raw(oid)
        return raw.kind, decode_stored(raw)


def _follows(objs: _Objects, new: bytes, old: bytes) -> bool:
    """Whether ``old`` is ``new`` or an earlier version of it: reachable through links to its own kind.

    A message's earlier versions are its ancestors (``parent``), a run
    state's and a metadata object's their ``previous`` chain; a message
    chain is cut at ``old``'s ``seq``, so the walk costs what lies between.
    """
    if new == old:
        return True
    try:
        okind, oval = objs.kind_value(old)
    except (MissingObject, CorruptObject):
        return False
    oseq = oval.get("seq") if okind == "message" and isinstance(oval, dict) else None
    stack, seen = [new], set()
    while stack:
        cur = stack.pop()
        if cur in seen:
            continue
        seen.add(cur)
        try:
            kind, val = objs.kind_value(cur)
            links = SESSION_SCHEMA.check(kind, val)
        except (MissingObject, CorruptObject, SchemaViolation):
            continue
        if kind != okind:
            continue
        for link, k in links:
            if k != okind:
                continue
            if link == old:
                return True
            if oseq is not None and isinstance(val.get("seq"), int) and val["seq"] - 1 <= oseq:
                continue  # the parent is no newer than ``old``, and is not it
            stack.append(link)
    return False


def _compare(objs: _Objects, local: Mapping[str, bytes], other: Mapping[str, bytes]) -> tuple[str, str | None]:
    """How ``other``'s refs stand to ``local``'s: ``same``, ``ahead`` (other is newer), ``behind`` or ``diverged``.

    With the first ref that decides it (for messages).
    """
    newer = older = None
    for name in sorted(set(local) | set(other)):
        lv, ov = local.get(name), other.get(name)
        if lv == ov:
            continue
        if lv is None:
            newer = newer or name
        elif ov is None:
            older = older or name
        elif _follows(objs, ov, lv):
            newer = newer or name
        elif _follows(objs, lv, ov):
            older = older or name
        else:
            return "diverged", name
    if newer and older:
        return "diverged", newer
    return ("ahead", newer) if newer else ("behind", older) if older else ("same", None)


def _read_group(bench: Workbench, commit: bytes, group: str, where: str) -> GroupImage:
    """The group image a commit of the remote names, checked (its group must be ``group``)."""
    got = dict((oid, (t, body)) for oid, t, body in bench.read([commit]))
    if commit not in got or got[commit][0] != "commit":
        raise BadGitImage(where, f"{commit.hex()} is not a commit")
    cbody = got[commit][1]
    c = parse_commit(cbody, where)
    tree = dict((oid, (t, b)) for oid, t, b in bench.read([c.tree]))
    if c.tree not in tree or tree[c.tree][0] != "tree":
        raise BadGitImage(where, "the commit's tree is missing")
    blob_id = group_tree_blob(tree[c.tree][1], where)
    sizes = bench.sizes([blob_id])
    if blob_id not in sizes or sizes[blob_id][0] != "blob" or sizes[blob_id][1] > 16 << 20:
        raise BadGitImage(where, "the refs blob is missing or larger than 16 MiB")
    blob = next(b for _, _, b in bench.read([blob_id]))
    img = parse_group_commit(cbody, tree[c.tree][1], blob, where)
    if img.group != group:
        raise BadGitImage(where, f"the commit is the image of {img.group}, not of {group}")
    return img


def read_holder(bench: Workbench, commit: bytes, ses: str, where: str) -> RemoteHolder:
    """The holder record of the lease commit ``commit`` (in ``bench``), checked."""
    got = dict((oid, (t, b)) for oid, t, b in bench.read([commit]))
    if commit not in got or got[commit][0] != "commit":
        raise BadGitImage(where, f"{commit.hex()} is not a commit")
    c = parse_commit(got[commit][1], where)
    tree = dict((oid, (t, b)) for oid, t, b in bench.read([c.tree]))
    if c.tree not in tree:
        raise BadGitImage(where, "the lease commit's tree is missing")
    blob_id = lease_tree_blob(tree[c.tree][1], where)
    sizes = bench.sizes([blob_id])
    if blob_id not in sizes or sizes[blob_id][1] > 1 << 16:
        raise BadGitImage(where, "the lease record is missing or larger than 64 KiB")
    blob = next(b for _, _, b in bench.read([blob_id]))
    parse_lease_commit(got[commit][1], tree[c.tree][1], blob, f"{NS}/{ses}", where)
    holder = RemoteHolder.from_bytes(blob, where)
    if holder.session != ses:
        raise BadGitImage(where, f"the lease record is session {holder.session}'s")
    return holder


# ---------------------------------------------------------------- push


def summary(store: Store, group: str, refs: Mapping[str, bytes]) -> list[tuple[str, str]]:
    """The listing lines of a group commit (informative, §16.4): fork, messages, the latest run."""
    out: list[tuple[str, str]] = []
    meta = store.get(refs["meta"], "session")
    out.append(("parent", meta.get("parentId") or "-"))
    out.append(("fork-kind", meta.get("forkKind") or "-"))
    head = refs.get("head")
    out.append(("head", msg_id(head) if head else "-"))
    out.append(("messages", str(store.get(head, "message")["seq"] + 1 if head else 0)))
    latest = None
    for name, oid in refs.items():
        if name.startswith("runs/"):
            st = store.get(oid, "run")
            if latest is None or st["index"] > latest["index"]:
                latest = st
    if latest is not None:
        out.append(("run", f"{latest['id']} {latest['status']}{'' if latest.get('settled') else ' unsettled'}"))
    return out


@dataclass(frozen=True)
class GroupPlan:
    """One group's part of a push: the commit that will replace ``seen`` (None: the remote has no such ref)."""

    ses: str
    seen: bytes | None
    commit: bytes
    objects: list[GitObject]
    new_objects: int
    refs: dict[str, bytes]
    fence: int
    covered: frozenset  # the kxen ids the commit's Git closure holds


class RemoteSession:
    """One session's side of a remote: what this state dir last saw there and how to move it (the runtime's lease uses it)."""

    def __init__(self, store: Store, ses: str, remote: Remote, bench: Workbench) -> None:
        self.store = store
        self.ses = ses
        self.group = f"{NS}/{ses}"
        self.remote = remote
        self.bench = bench
        self.mirror = Mirror(store.root)
        # (commit, refs, fence, kxen ids its Git closure holds) of the last push made here.
        self._last: tuple[bytes, dict[str, bytes], int, set[bytes]] | None = None

    def seen(self) -> bytes | None:
        return self.mirror.seen(self.remote.key, [self.group]).get(self.group)

    def image(self, commit: bytes) -> GroupImage:
        return _read_group(self.bench, commit, self.group, f"{self.remote.display} {session_ref(self.ses)}")

    def plan(self, seen: bytes | None, *, fence: int | None = None, now: int | None = None) -> GroupPlan | None:
        """The commit that moves the remote from ``seen`` to the local refs; None if it holds them already.

        Refuses (:class:`RemoteRefused`) unless the local refs are a
        fast-forward of what ``seen`` holds. ``fence`` sets the remote fence
        (a lease grant raises it: a commit is made even if no ref moved).
        """
        state = self.store.refs.read(self.group)
        if not state.exists or "meta" not in state.refs or state.deleted_ns is not None:
            raise UnknownSession(self.ses, self.store.root)
        refs = dict(state.refs)
        cached = self._last if self._last is not None and self._last[0] == seen else None
        if seen is None:
            theirs, their_fence = None, 0
        elif cached is not None:
            theirs, their_fence = cached[1], cached[2]
        else:
            img = self.image(seen)
            theirs, their_fence = img.refs, img.fence
        if theirs is not None:
            how, ref = _compare(_Objects(self.store), refs, theirs)
            if how in ("ahead", "diverged"):
                raise _refused_push(self.ses, self.remote, how, ref, refs, theirs)
            # Only the metadata moved (a binding to this machine's workspace, a
            # pull's or a rebind's): where a session lives here is no news for the
            # remote, and pushing it would make every pull elsewhere rebind again.
            moved = {n for n in refs if refs.get(n) != theirs.get(n)}
            if (how == "same" or moved == {"meta"}) and (fence is None or fence == their_fence):
                return None
        bases = [seen] if seen is not None else self._fork_bases()
        covered = cached[3] if cached is not None else _covered(self.bench, bases)
        new = _new_objects(self.store, refs.values(), covered)
        when = int(time.time()) if now is None else now
        made = objects_commit(new, when) if new else []
        parents = ([seen] if seen is not None else []) + ([made[-1].oid] if made else [])
        parents += [b for b in bases if b not in parents]
        gfence = fence if fence is not None else their_fence
        gc = group_commit(self.group, gfence, refs, parents, when, summary(self.store, self.group, refs))
        return GroupPlan(self.ses, seen, gc[-1].oid, made + gc, len(new), refs, gfence,
                         frozenset(covered | {o.id for o in new}))

    def _fork_bases(self) -> list[bytes]:
        """The last-seen commit, on this remote, of the nearest ancestor session (its history is shared)."""
        sessions = SessionStore(self.store)
        cur = sessions.get(self.ses).meta.get("parentId")
        hops = 0
        while cur is not None and hops < 64:
            got = self.mirror.seen(self.remote.key, [f"{NS}/{cur}"]).get(f"{NS}/{cur}")
            if got is not None:
                return [got]
            try:
                cur = sessions.get(cur, include_deleted=True).meta.get("parentId")
            except KxenError:
                return []
            hops += 1
        return []

    def record(self, plans: Sequence[GroupPlan]) -> None:
        """After a push landed: keep its objects in the mirror and remember what the remote holds now."""
        record_push(self.mirror, self.bench, self.remote, plans)
        for p in plans:
            if p.ses == self.ses:
                # The next step's plan starts from this one without asking Git again.
                self._last = (p.commit, p.refs, p.fence, set(p.covered))


def record_push(mirror: Mirror, bench: Workbench, remote: Remote, plans: Sequence[GroupPlan]) -> None:
    mirror.ensure()
    mirror.adopt(bench)
    bench.borrow(mirror.objects)
    # A lease's workbench lives as long as its run: it keeps reading what it
    # wrote through the mirror instead of piling up a pack per step.
    bench.forget_packs()
    try:
        mirror.set_seen(remote.key, [(f"{NS}/{p.ses}", p.seen, p.commit) for p in plans])
    except KxenError:
        # Another process recorded a newer commit meanwhile: a stale record
        # only makes the next push ask for a pull, never lose anything.
        pass


def _covered(bench: Workbench, bases: Sequence[bytes]) -> set[bytes]:
    """The kxen ids the Git closure of ``bases`` holds (the remote has them: it has ``bases``)."""
    out = set()
    for _, path in bench.rev_list_objects(bases):
        kid = kxen_id_of_path(path)
        if kid is not None:
            out.add(kid)
    return out


def _new_objects(store: Store, tips: Iterable[bytes], covered: set[bytes]) -> list[RawObject]:
    """Every object reachable from ``tips`` that ``covered`` lacks, parents first."""
    out: list[RawObject] = []
    seen: set[bytes] = set()
    stack = [t for t in tips]
    while stack:
        oid = stack.pop()
        if oid in seen or oid in covered:
            continue
        seen.add(oid)
        obj = store.read_raw(oid)
        out.append(obj)
        if obj.kind != "blob":
            stack.extend(reversed(links_of(obj.kind, decode_stored(obj))))
    return out


def _refused_push(ses: str, remote: Remote, how: str, ref: str | None, local: Mapping[str, bytes],
                  theirs: Mapping[str, bytes]) -> RemoteRefused:
    lv, tv = local.get(ref or ""), theirs.get(ref or "")
    at = f" (ref {ref}: here {lv.hex()[:16] if lv else 'absent'}, there {tv.hex()[:16] if tv else 'absent'})"
    if how == "ahead":
        return RemoteRefused(f"push of session {ses} to {remote.display} refused: the remote is ahead of this state "
                             f"dir{at}; nothing was pushed — pull it first (kxen-agent session pull {ses})")
    return RemoteRefused(f"push of session {ses} to {remote.display} refused: its history here and on the remote "
                         f"diverged{at}; nothing was pushed — fork it (kxen-agent session fork {ses}) and push the "
                         "fork, or pull the remote's into another state dir")


def pull_first(ses: str, remote: Remote, theirs: bytes | None, seen: bytes | None, what: str) -> RemoteRefused:
    there = theirs.hex()[:12] if theirs else "no such ref"
    last = seen.hex()[:12] if seen else "never"
    return RemoteRefused(
        f"{what} of session {ses} refused: {remote.display} changed since this state dir last saw it "
        f"(there: {there}, last seen: {last}); nothing was pushed — pull first (kxen-agent session pull {ses})"
    )


@dataclass(frozen=True)
class PushReport:
    """One remote's push: each session's fate and the commit its ref names now."""

    remote: Remote
    sessions: Mapping[str, str]  # ses -> "created" | "updated" | "up-to-date"
    commits: Mapping[str, str]  # ses -> group commit hex on the remote
    new_objects: Mapping[str, int]
    branches: Mapping[str, str]  # refs/heads/kxen/NAME -> commit hex (pushed with --with-branch)

    def to_json(self) -> dict:
        return {"remote": self.remote.display, "sessions": dict(self.sessions), "commits": dict(self.commits),
                "newObjects": dict(self.new_objects), "branches": dict(self.branches)}


def push_sessions(store: Store, ses_ids: Sequence[str], *, remote: str | None = None,
                  with_branch: bool = False) -> list[PushReport]:
    """Push every session in ``ses_ids`` to its remote: one atomic push per remote.

    The remote defaults to ``origin`` of each session's bound workspace
    repository; ``remote`` names another remote of it, or a URL. Refused
    (:class:`RemoteRefused`, nothing changed) when the remote moved since
    this state dir last saw it or the histories diverged;
    :class:`RemoteSessionBusy` when another machine holds the remote lease.
    """
    if not ses_ids:
        raise UsageError("name at least one session to push")
    sessions = SessionStore(store)
    infos = [sessions.get(ses) for ses in dict.fromkeys(ses_ids)]
    by_remote: dict[str, tuple[Remote, list]] = {}
    for info in infos:
        r = resolve_remote(info.workspace.repo_root, remote, what=f"session {info.id}'s workspace {info.workspace.root}")
        by_remote.setdefault(r.key, (r, []))[1].append(info)
    reports = []
    for r, group in by_remote.values():
        reports.append(_push_to(store, r, group, with_branch=with_branch, done=reports))
    return reports


def _branch_of(info) -> tuple[str, str] | None:
    """(refs/heads/kxen/NAME, the workspace's git objects dir) of a worktree fork, else None."""
    ws = info.workspace
    if info.meta.get("forkKind") != "worktree" or not ws.branch or not ws.branch.startswith("kxen/"):
        return None
    return f"refs/heads/{ws.branch}", ws.root


def _push_to(store: Store, r: Remote, infos: list, *, with_branch: bool, done: list) -> PushReport:
    from .gitio import run_git

    mirror = Mirror(store.root)
    branches: dict[str, tuple[str, bytes]] = {}
    alternates: list[str] = []
    if with_branch:
        for info in infos:
            b = _branch_of(info)
            if b is None:
                continue
            ref, root = b
            p = run_git(["rev-parse", "--verify", "-q", f"{ref}^{{commit}}"], cwd=root, check=False)
            objdir = run_git(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=root, check=False)
            if p.returncode != 0 or objdir.returncode != 0:
                raise UsageError(f"session {info.id}'s worktree branch {ref[11:]} is not in {root}; "
                                 "push without --with-branch, or restore the worktree")
            branches[ref] = (root, bytes.fromhex(p.stdout.decode("ascii").strip()))
            alternates.append(objdir.stdout.decode("utf-8", "surrogateescape").strip() + "/objects")
    with Workbench(r, mirror=mirror, alternates=alternates) as bench:
        names = [session_ref(i.id) for i in infos] + [lease_ref(i.id) for i in infos] + list(branches)
        live = bench.ls_remote(names, what="pushed")
        seen = mirror.seen(r.key, [i.group for i in infos])
        plans: list[GroupPlan] = []
        statuses: dict[str, str] = {}
        commits: dict[str, str] = {}
        for info in infos:
            there, last = live.get(session_ref(info.id)), seen.get(info.group)
            # A run elsewhere holds the session: say so before anything else (its
            # steps move the ref, so "pull first" would only send the user in circles).
            held = live.get(lease_ref(info.id))
            if held is not None:
                bench.fetch([f"+{lease_ref(info.id)}:{lease_ref(info.id)}"], what="pushed")
                holder = read_holder(bench, held, info.id, f"{r.display} {lease_ref(info.id)}")
                if not holder.expired(time.time_ns()):
                    raise RemoteSessionBusy(
                        f"session {info.id} is busy on {r.display}: its remote lease is held by "
                        f"{holder.line(time.time_ns())}; nothing was pushed — wait for that run to end "
                        "(or for its lease to expire), then pull and push again")
            if there != last:
                raise pull_first(info.id, r, there, last, "push")
            plan = RemoteSession(store, info.id, r, bench).plan(last)
            if plan is None:
                statuses[info.id] = "up-to-date"
                commits[info.id] = last.hex() if last else ""
                continue
            plans.append(plan)
            statuses[info.id] = "created" if last is None else "updated"
            commits[info.id] = plan.commit.hex()
        updates = [PushUpdate(session_ref(p.ses), p.commit, p.seen) for p in plans]
        pushed_branches = {}
        for ref, (_, oid) in branches.items():
            if live.get(ref) != oid:
                # A branch moves by Git's own fast-forward rule, atomically with the sessions.
                updates.append(PushUpdate(ref, oid, live.get(ref), lease=False))
            pushed_branches[ref] = oid.hex()
        if updates:
            bench.write([o for p in plans for o in p.objects])
            try:
                bench.push(updates, what="pushed")
            except PushRejected as e:
                raise _push_rejected(e, r, [p.ses for p in plans], done) from None
            except RemoteUnreachable as e:
                if done:
                    raise RemoteUnreachable(r, f"{e}; the pushes to {', '.join(d.remote.display for d in done)} "
                                            "before it stand", "pushed") from None
                raise
            if plans:
                record_push(mirror, bench, r, plans)
    return PushReport(r, statuses, commits, {p.ses: p.new_objects for p in plans}, pushed_branches)


def _push_rejected(e: PushRejected, r: Remote, sessions: list[str], done: list) -> RemoteRefused:
    before = f"; the pushes to {', '.join(d.remote.display for d in done)} before it stand" if done else ""
    return RemoteRefused(
        f"push to {r.display} refused by the remote ({e}): another push changed it since this state dir looked, "
        f"or a branch is not a fast-forward; nothing was pushed there{before} — pull "
        f"({' '.join(sessions) or 'the sessions'}) and push again")


# ---------------------------------------------------------------- pull


@dataclass(frozen=True)
class PullReport:
    remote: Remote
    sessions: Mapping[str, str]  # ses -> created | updated | unchanged | restored | ahead
    new_objects: int
    bindings: Mapping[str, str]  # ses -> workspace root it is bound to

    def to_json(self) -> dict:
        return {"remote": self.remote.display, "sessions": dict(self.sessions), "newObjects": self.new_objects,
                "workspaces": dict(self.bindings)}


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
    ids = list(dict.fromkeys(ses_ids))
    for ses in ids:
        if not SES_RE.fullmatch(ses):
            raise UsageError(f"{ses!r} is not a session id (expected ses_ followed by letters and digits)")
    chosen = {}
    for text, d in (workspaces or {}).items():  # SES=DIR: one of the pulled sessions, or a unique prefix of one
        ses = resolve_prefix("session", "ses", text, lambda: ids, "among the sessions pulled")
        if ses is None:
            raise UsageError(f"--workspace {text}=DIR names a session that is not pulled; name it among SES")
        chosen[ses] = inspect_workspace(d)
    default = inspect_workspace(workspace)
    r = resolve_remote(default.repo_root, remote, what=f"workspace {default.root}")
    mirror = Mirror(store.root)
    with Workbench(r, mirror=mirror) as bench:
        live = bench.ls_remote([session_ref(s) for s in ids], what="pulled")
        absent = [s for s in ids if session_ref(s) not in live]
        if absent:
            raise RemoteRefused(f"session {absent[0]} is not on {r.display}; nothing was pulled "
                                "(`kxen-agent session ls-remote` lists the sessions there)")
        seen = mirror.seen(r.key, [f"{NS}/{s}" for s in ids])
        fetch = [s for s in ids if live[session_ref(s)] != seen.get(f"{NS}/{s}")]
        if fetch:
            bench.fetch([f"+{session_ref(s)}:{session_ref(s)}" for s in fetch], what="pulled",
                        negotiation_tips=[v for v in seen.values()])
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
            statuses, written = _write_pull(store, objs, plans)
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
    return PullReport(r, statuses, written, bindings)


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
        for oid, path in bench.rev_list_objects(commits, () if full else exclude):
            kid = kxen_id_of_path(path)
            if kid is not None and kid not in index and not objs.has(kid):
                index[kid] = oid
        wanted = [(k, g) for k, g in index.items() if k not in candidates]
        sizes = bench.sizes([g for _, g in wanted])
        for kid, g in wanted:
            t, size = sizes.get(g, ("missing", 0))
            if t != "blob":
                raise BadGitImage(f"{where} {g.hex()}", f"object {kid.hex()} is a Git {t}, not a blob")
            if size > _MAX_RAW:
                raise CorruptObject(kid.hex(), f"the remote's copy ({where}) is {size} bytes, more than the "
                                    f"{_MAX_RAW} an object may be; nothing was pulled")
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


def _write_pull(store: Store, objs: _Objects, plans: Mapping[str, _PullPlan]) -> tuple[dict[str, str], int]:
    """Write the verified objects, then each session's refs (CAS against what was planned on)."""
    changing = {s: p for s, p in plans.items() if p.status in ("created", "updated", "restored")}
    statuses = {s: p.status for s, p in plans.items()}
    if not changing:
        return statuses, 0
    sessions = SessionStore(store)
    needed = _reachable_new(objs, [v for p in changing.values() for v in p.refs.values()])
    with store.writing():
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
            with store.batch():
                for obj in needed:
                    store.put_raw(obj)
        for ses, p in changing.items():
            if p.new_meta is not None:
                assert p.base_oid is not None
                p.refs["meta"] = sessions.rebound_meta(p.new_meta, p.base_oid, p.binding, "import")
        for ses, p in changing.items():
            group = f"{NS}/{ses}"
            local = p.local.refs if p.local is not None else {}
            updates = [RefUpdate(n, local.get(n), v) for n, v in sorted(p.refs.items()) if local.get(n) != v]
            updates += [RefUpdate(n, local[n], None) for n in sorted(local) if n not in p.refs]
            store.refs.transaction(group, updates, reason="pull from remote", deleted_ns=None)
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


# ---------------------------------------------------------------- ls-remote


@dataclass(frozen=True)
class RemoteListing:
    remote: Remote
    sessions: list[dict]

    def to_json(self) -> dict:
        return {"remote": self.remote.display, "sessions": self.sessions}


def ls_remote(store: Store, workspace: str, *, remote: str | None = None) -> RemoteListing:
    """The sessions on the remote: each one's commit, head, fork, latest run and lease, from the tips alone."""
    ws = inspect_workspace(workspace)
    r = resolve_remote(ws.repo_root, remote, what=f"workspace {ws.root}")
    with Workbench(r, mirror=None) as bench:
        # A shallow fetch of the tips: a group commit's tree holds only its
        # refs, so this brings no history (its parents stay on the remote).
        bench.fetch([f"+{SESSION_REFS}*:{SESSION_REFS}*", f"+{LEASE_REFS}*:{LEASE_REFS}*"], what="listed", depth=1)
        from .gitio import run_git

        listed = run_git(["for-each-ref", "--format=%(objectname) %(refname)", "refs/kxen/"], git_dir=bench.path)
        tips: dict[str, bytes] = {}
        leases: dict[str, bytes] = {}
        for line in listed.stdout.decode("ascii", "replace").splitlines():
            oid, _, ref = line.partition(" ")
            if ref.startswith(SESSION_REFS):
                tips[ref[len(SESSION_REFS):]] = bytes.fromhex(oid)
            elif ref.startswith(LEASE_REFS):
                leases[ref[len(LEASE_REFS):]] = bytes.fromhex(oid)
        out = []
        now = time.time_ns()
        objs = _Objects(store)
        for ses in sorted(tips):
            row: dict[str, Any] = {"id": ses, "commit": tips[ses].hex()}
            if not SES_RE.fullmatch(ses):
                row["error"] = "not a session id"
                out.append(row)
                continue
            try:
                img = _read_group(bench, tips[ses], f"{NS}/{ses}", f"{r.display} {session_ref(ses)}")
            except BadGitImage as e:
                row["error"] = e.reason
                out.append(row)
                continue
            s = dict(img.summary)
            row.update({
                "head": s.get("head") if s.get("head") not in (None, "-") else None,
                "parentId": s.get("parent") if s.get("parent") not in (None, "-") else None,
                "forkKind": s.get("fork-kind") if s.get("fork-kind") not in (None, "-") else None,
                "messages": int(s["messages"]) if s.get("messages", "").isdigit() else None,
                "run": None, "runStatus": None, "fence": img.fence, "time": img.commit.time,
            })
            run = s.get("run", "").split()
            if len(run) >= 2:
                row["run"], row["runStatus"] = run[0], run[1]
            row["lease"] = None
            if ses in leases:
                try:
                    h = read_holder(bench, leases[ses], ses, f"{r.display} {lease_ref(ses)}")
                    row["lease"] = dict(h.to_json(), expired=h.expired(now))
                except BadGitImage as e:
                    row["lease"] = {"error": e.reason}
            row["local"] = _local_state(store, objs, ses, img)
            out.append(row)
    return RemoteListing(r, out)


def _local_state(store: Store, objs: _Objects, ses: str, img: GroupImage) -> str:
    """``absent``, ``same``, ``ahead`` (this state dir has everything the remote has, and more) or ``differs``."""
    if not store.exists:
        return "absent"
    local = store.refs.read(f"{NS}/{ses}")
    if not local.exists or "meta" not in local.refs:
        return "absent"
    theirs = {k: v for k, v in img.refs.items() if k != "meta"}
    mine = {k: v for k, v in local.refs.items() if k != "meta"}
    if theirs == mine:
        return "same"
    if all(objs.has(v) for v in theirs.values()) and _compare(objs, mine, theirs)[0] == "behind":
        return "ahead"
    return "differs"
