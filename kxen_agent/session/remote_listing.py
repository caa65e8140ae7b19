"""``session ls-remote``: the sessions on a Git remote, incrementally (``objects_spec.md`` §16.7, §16.11).

A remote may hold thousands of sessions (a fleet of runners pushing to one
repository), so a listing costs a constant number of ``git`` processes and
reads only what changed since this state dir last looked:

1. one ``git ls-remote`` of ``refs/kxen/sessions/`` and
   ``refs/kxen/leases/`` (protocol v2: those refs alone);
2. the **listing cache** (``<state dir>/git/kxen-listing/<remote key>``)
   says what each session's group commit and each lease commit said when
   this state dir last read it, keyed by ref and commit id; every ref whose
   commit it does not hold is new;
3. one shallow ``git fetch`` of the new refs alone (their tips: a group
   commit's tree holds only its refs blob, its parents are not fetched),
   then one ``git cat-file --batch`` reads each new commit, its tree and
   its one blob, each size-bounded, and each is checked as a pull checks a
   tip (§16.4, §16.6).

The cache is never needed: without it (a fresh state dir, a damaged or
deleted file) every ref is new and the listing reads them all, and its
rows are the same. A ref or commit that is not a session's image is that
session's row's ``error``; it never fails the listing (only a remote that
cannot be reached does). Nothing is written unless the state dir exists
(readers never create one, §10.3).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import blake3

from kxen_agent.errors import KxenError
from kxen_agent.store import OS_IO, Store
from kxen_agent.store.gitmap import BadGitImage, GroupImage, group_tree_blob, lease_tree_blob, parse_group_commit

from .gitio import MIRROR_DIR, Remote, RemoteUnreachable, Workbench, resolve_remote
from .remote import LEASE_REFS, SESSION_REFS, _Objects, _compare, holder_from
from .schema import SES_RE
from .sessions import NS
from .workspace import inspect_workspace

__all__ = ["LISTING_DIR", "RemoteListing", "ls_remote"]

#: Where, in the mirror's directory, the listing cache of each remote lives.
LISTING_DIR = "kxen-listing"
_MAGIC = b"kxen-listing 1 "
#: The largest refs blob a listing reads (as a pull), the largest lease record, and a commit's bound.
_REFS_MAX = 16 << 20
_LEASE_MAX = 1 << 16
_COMMIT_MAX = 1 << 20
#: Past this share of the refs being new, one fetch of every tip (a wildcard) is cheaper than naming each.
_ALL_ABOVE = 0.5
#: A tip the fetch did not bring: the ref moved between ``git ls-remote`` and ``git fetch`` (never cached).
_MOVED = "the remote moved this ref while it was being listed; list again"


@dataclass(frozen=True)
class RemoteListing:
    remote: Remote
    sessions: list[dict]

    def to_json(self) -> dict:
        return {"remote": self.remote.display, "sessions": self.sessions}


# ---------------------------------------------------------------- the cache


class ListingCache:
    """What this state dir last read of one remote's refs: commit hex -> what it said, per session and lease.

    A derived file in the §11a sense: never needed, checked against damage
    (a BLAKE3 of its body), joined to the remote's refs by commit id, and
    written without fsync (temp file, rename): a crash loses at most one
    listing's worth of reading.
    """

    def __init__(self, store: Store, key: str) -> None:
        self.dir = os.path.join(store.root, MIRROR_DIR, LISTING_DIR)
        self.path = os.path.join(self.dir, key)
        self.writable = store.exists
        self.sessions: dict[str, dict] = {}
        self.leases: dict[str, dict] = {}
        self._load()

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError:
            return
        head, _, body = data.partition(b"\n")
        if not head.startswith(_MAGIC) or head[len(_MAGIC):] != blake3.blake3(body).hexdigest().encode("ascii"):
            return  # damaged or another version's: read everything again
        try:
            d = json.loads(body)
            sessions, leases = d["sessions"], d["leases"]
        except (ValueError, KeyError, TypeError):
            return
        if isinstance(sessions, dict) and isinstance(leases, dict):
            self.sessions, self.leases = sessions, leases

    def save(self, sessions: Mapping[str, dict], leases: Mapping[str, dict]) -> None:
        sessions = {k: v for k, v in sessions.items() if not v.get("moved")}
        leases = {k: v for k, v in leases.items() if not v.get("moved")}
        if not self.writable or (sessions == self.sessions and leases == self.leases):
            return
        body = json.dumps({"sessions": sessions, "leases": leases}, separators=(",", ":"),
                          sort_keys=True).encode("utf-8")
        data = _MAGIC + blake3.blake3(body).hexdigest().encode("ascii") + b"\n" + body
        tmp = os.path.join(self.dir, "tmp_" + os.urandom(8).hex())
        try:
            os.makedirs(self.dir, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640 if OS_IO.is_shared(self.dir) else 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
        except OSError:
            # A cache that cannot be written costs the next listing time, nothing else.
            try:
                os.unlink(tmp)
            except OSError:
                pass


# ---------------------------------------------------------------- reading new tips


def _session_entry(commit: bytes, ses: str, got: Sequence[tuple[str | None, bytes | None]], where: str) -> dict:
    """The cache entry of a session's tip: what its group commit says, or why it is not one."""
    entry: dict[str, Any] = {"commit": commit.hex()}
    (ct, cbody), (tt, tbody), (bt, bbody) = got
    if ct is None:
        return dict(entry, error=_MOVED, moved=True)
    try:
        if ct != "commit" or cbody is None:
            raise BadGitImage(where, f"{commit.hex()} is not a commit" if ct != "commit" else "the commit is too large")
        if tt != "tree" or tbody is None:
            raise BadGitImage(where, "the commit's tree is missing")
        group_tree_blob(tbody, where)  # exactly one entry, `refs`
        if bt != "blob" or bbody is None:
            raise BadGitImage(where, "the refs blob is missing or larger than 16 MiB")
        img = parse_group_commit(cbody, tbody, bbody, where)
        if img.group != f"{NS}/{ses}":
            raise BadGitImage(where, f"the commit is the image of {img.group}, not of {NS}/{ses}")
    except BadGitImage as e:
        entry["error"] = e.reason
        return entry
    entry["image"] = _image_fields(img)
    return entry


def _image_fields(img: GroupImage) -> dict:
    s = dict(img.summary)

    def opt(key: str) -> str | None:
        v = s.get(key)
        return v if v not in (None, "-") else None

    run = s.get("run", "").split()
    return {
        "head": opt("head"), "parentId": opt("parent"), "forkKind": opt("fork-kind"),
        "messages": int(s["messages"]) if s.get("messages", "").isdigit() else None,
        "run": run[0] if len(run) >= 2 else None, "runStatus": run[1] if len(run) >= 2 else None,
        "fence": img.fence, "time": img.commit.time, "refs": {k: v.hex() for k, v in img.refs.items()},
    }


def _lease_entry(commit: bytes, ses: str, got: Sequence[tuple[str | None, bytes | None]], where: str) -> dict:
    entry: dict[str, Any] = {"commit": commit.hex()}
    (ct, cbody), (tt, tbody), (bt, bbody) = got
    if ct is None:
        return dict(entry, error=_MOVED, moved=True)
    try:
        if ct != "commit" or cbody is None:
            raise BadGitImage(where, f"{commit.hex()} is not a commit")
        if tt != "tree" or tbody is None:
            raise BadGitImage(where, "the lease commit's tree is missing")
        lease_tree_blob(tbody, where)
        if bt != "blob" or bbody is None:
            raise BadGitImage(where, "the lease record is missing or larger than 64 KiB")
        h = holder_from(cbody, tbody, bbody, ses, where)
    except BadGitImage as e:
        entry["error"] = e.reason
        return entry
    entry["holder"] = h.to_json()
    return entry


def _fetch_tips(bench: Workbench, refs: Sequence[str], everything: bool, failed: dict[str, str]) -> None:
    """Fetch the tips ``refs`` name (shallow); a ref whose fetch fails alone goes into ``failed`` with Git's line.

    ``everything``: they are most of the remote's refs, fetched with one
    wildcard per prefix. If the whole fetch fails yet the remote answers,
    the refs are fetched in halves until each failure is one ref's (a
    damaged remote's missing object is that session's problem).
    """
    if not refs:
        return
    specs = ([f"+{SESSION_REFS}*:{SESSION_REFS}*", f"+{LEASE_REFS}*:{LEASE_REFS}*"] if everything
             else [f"+{r}:{r}" for r in refs])
    try:
        bench.fetch(specs, what="listed", depth=1)
        return
    except RemoteUnreachable as e:
        if len(refs) == 1:
            failed[refs[0]] = e.line
            return
        bench.ls_remote([SESSION_REFS], what="listed")  # unreachable after all: this raises
    half = len(refs) // 2
    _fetch_tips(bench, refs[:half], False, failed)
    _fetch_tips(bench, refs[half:], False, failed)


# ---------------------------------------------------------------- ls-remote


def ls_remote(store: Store, workspace: str, *, remote: str | None = None) -> RemoteListing:
    """The sessions on the remote: each one's commit, head, fork, latest run and lease, from the tips alone."""
    ws = inspect_workspace(workspace)
    r = resolve_remote(ws.repo_root, remote, what=f"workspace {ws.root}")
    cache = ListingCache(store, r.key)
    with Workbench(r, mirror=None, durable=False) as bench:
        live = bench.ls_remote([SESSION_REFS, LEASE_REFS], what="listed")
        tips = {ref[len(SESSION_REFS):]: v for ref, v in live.items() if ref.startswith(SESSION_REFS)}
        leases = {ref[len(LEASE_REFS):]: v for ref, v in live.items() if ref.startswith(LEASE_REFS)}
        sessions: dict[str, dict] = {}
        held: dict[str, dict] = {}
        new_s = []
        for ses, c in tips.items():
            if not SES_RE.fullmatch(ses):
                continue
            hit = cache.sessions.get(ses)
            if isinstance(hit, dict) and hit.get("commit") == c.hex():
                sessions[ses] = hit
            else:
                new_s.append(ses)
        new_l = []
        for ses, c in leases.items():
            if ses not in tips or not SES_RE.fullmatch(ses):
                continue
            hit = cache.leases.get(ses)
            if isinstance(hit, dict) and hit.get("commit") == c.hex():
                held[ses] = hit
            else:
                new_l.append(ses)
        failed: dict[str, str] = {}
        wanted = [SESSION_REFS + s for s in new_s] + [LEASE_REFS + s for s in new_l]
        _fetch_tips(bench, wanted, len(wanted) > _ALL_ABOVE * len(live), failed)
        if wanted:
            # What the fetch brought wins over what ls-remote said: a ref that moved
            # in between (a lease renewed) is listed at its newer commit.
            for ref, v in bench.local_refs("refs/kxen/").items():
                if ref.startswith(SESSION_REFS) and ref[len(SESSION_REFS):] in tips:
                    tips[ref[len(SESSION_REFS):]] = v
                elif ref.startswith(LEASE_REFS) and ref[len(LEASE_REFS):] in leases:
                    leases[ref[len(LEASE_REFS):]] = v
        specs: list[tuple[str, int]] = []
        order: list[tuple[str, str, bytes]] = []  # (kind, ses, commit)
        for kind, names, refs, blob, bound in (("s", new_s, tips, "refs", _REFS_MAX),
                                               ("l", new_l, leases, "lease", _LEASE_MAX)):
            for ses in names:
                ref = (SESSION_REFS if kind == "s" else LEASE_REFS) + ses
                if ref in failed:
                    continue
                c = refs[ses].hex()
                specs += [(c, _COMMIT_MAX), (c + "^{tree}", _COMMIT_MAX), (f"{c}:{blob}", bound)]
                order.append((kind, ses, refs[ses]))
        got = bench.read_specs(specs)
        for i, (kind, ses, c) in enumerate(order):
            three = got[3 * i: 3 * i + 3]
            if kind == "s":
                sessions[ses] = _session_entry(c, ses, three, f"{r.display} {SESSION_REFS}{ses}")
            else:
                held[ses] = _lease_entry(c, ses, three, f"{r.display} {LEASE_REFS}{ses}")
    cache.save(sessions, held)
    return RemoteListing(r, _rows(store, tips, sessions, leases, held, failed))


def _rows(store: Store, tips: Mapping[str, bytes], sessions: Mapping[str, dict], leases: Mapping[str, bytes],
          held: Mapping[str, dict], failed: Mapping[str, str]) -> list[dict]:
    now = time.time_ns()
    objs = _Objects(store)
    local = set(store.refs.groups(NS)) if store.exists else set()
    out = []
    for ses in sorted(tips):
        row: dict[str, Any] = {"id": ses, "commit": tips[ses].hex()}
        if not SES_RE.fullmatch(ses):
            row["error"] = "not a session id"
            out.append(row)
            continue
        if SESSION_REFS + ses in failed:
            row["error"] = f"its commit cannot be fetched from the remote ({failed[SESSION_REFS + ses]})"
            out.append(row)
            continue
        entry = sessions[ses]
        if "error" in entry or not isinstance(entry.get("image"), dict):
            row["error"] = str(entry.get("error", "unreadable"))
            out.append(row)
            continue
        img = dict(entry["image"])
        refs = {k: bytes.fromhex(v) for k, v in img.pop("refs").items()}
        row.update(img)
        row["lease"] = None
        if ses in leases:
            if LEASE_REFS + ses in failed:
                row["lease"] = {"error": f"its commit cannot be fetched ({failed[LEASE_REFS + ses]})"}
            elif "holder" in held.get(ses, {}):
                h = dict(held[ses]["holder"])
                row["lease"] = dict(h, expired=h["expiresNs"] <= now)
            else:
                row["lease"] = {"error": str(held.get(ses, {}).get("error", "unreadable"))}
        row["local"] = _local_state(store, objs, ses, refs) if f"{NS}/{ses}" in local else "absent"
        out.append(row)
    return out


def _local_state(store: Store, objs: _Objects, ses: str, remote_refs: Mapping[str, bytes]) -> str:
    """``absent``, ``same``, ``ahead`` (this state dir has everything the remote has, and more) or ``differs``."""
    try:
        local = store.refs.read(f"{NS}/{ses}")
    except KxenError:
        return "differs"
    if not local.exists or "meta" not in local.refs:
        return "absent"
    theirs = {k: v for k, v in remote_refs.items() if k != "meta"}
    mine = {k: v for k, v in local.refs.items() if k != "meta"}
    if theirs == mine:
        return "same"
    if all(objs.has(v) for v in theirs.values()) and _compare(objs, mine, theirs)[0] == "behind":
        return "ahead"
    return "differs"
