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
- **pull** (:mod:`.remote_pull`): fetch, then verify every new object — its BLAKE3 id, strict
  CBOR, the session schema, the kind of each link and ref, the closure —
  before anything is written; then fast-forward local refs, or create the
  session bound to a workspace after the identity check of ``session
  import``; a diverged session is refused;
- **ls-remote** (:mod:`.remote_pull`): the sessions on a remote with their heads, forks, last run
  and lease holder, from the tip commits alone (a shallow fetch).

A refused push or pull changes nothing on either side. It works on the disk
:class:`~kxen_agent.store.Store` (it runs ``git``); it never takes a run
lease itself (``acquire_lease`` is given by the caller, as for ``session
import``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.store import MissingObject, RawObject, Store
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
    decode_body,
    decode_stored,
    links_of,
)

from .gitio import Mirror, PushRejected, PushUpdate, Remote, RemoteUnreachable, Workbench, resolve_remote
from .schema import SES_RE, SESSION_SCHEMA
from .sessions import NS, SessionStore, UnknownSession, msg_id

__all__ = [
    "GroupPlan",
    "LEASE_REFS",
    "PushReport",
    "RemoteHolder",
    "RemoteRefused",
    "RemoteSession",
    "RemoteSessionBusy",
    "SESSION_REFS",
    "lease_ref",
    "holder_from",
    "pull_first",
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
    return holder_from(got[commit][1], tree[c.tree][1], blob, ses, where)


def holder_from(commit_body: bytes, tree_body: bytes, blob: bytes, ses: str, where: str) -> RemoteHolder:
    """The holder record of a lease commit of ``ses``, from the bytes of the commit, its tree and its blob, checked."""
    parse_lease_commit(commit_body, tree_body, blob, f"{NS}/{ses}", where)
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
        if seen is not None:
            bases = [seen]
        else:
            base = self._fork_base()
            bases = [base[1]] if base is not None else []
            if base is not None:
                # The remote must go on advertising that ref: Git finds the shared history from it.
                self.bench.builds_on([session_ref(base[0])])
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

    def _fork_base(self) -> tuple[str, bytes] | None:
        """The nearest ancestor session seen on this remote, and its last-seen commit there (its history is shared)."""
        sessions = SessionStore(self.store)
        cur = sessions.get(self.ses).meta.get("parentId")
        hops = 0
        while cur is not None and hops < 64:
            got = self.mirror.seen(self.remote.key, [f"{NS}/{cur}"]).get(f"{NS}/{cur}")
            if got is not None:
                return cur, got
            try:
                cur = sessions.get(cur, include_deleted=True).meta.get("parentId")
            except KxenError:
                return None
            hops += 1
        return None

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
        # The refs named, alone (protocol v2 ref prefixes), and their tips (already in the
        # mirror unless the remote moved): not `git ls-remote`, which lists every ref.
        live = bench.fetch_named(names, what="pushed")
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

