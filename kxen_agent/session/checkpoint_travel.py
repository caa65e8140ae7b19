"""Checkpoints that travel, only when asked: in a bundle (``objects_spec.md`` §12.7a) or to a Git remote (§16.1).

By default ``session export`` and ``session push`` carry the journal's
checkpoint ids, not the commits (:func:`stays_behind` says what stays).
With ``--with-checkpoints``:

- a bundle gets a *checkpoint section*: a Git bundle (v2, ``git bundle
  create``) of each session's ``refs/kxen/checkpoints/<ses>`` holding every
  object those commits reach except what the repository's remote-tracking
  branches reach (published commits, which any clone of that remote has);
  without remote-tracking branches it holds everything — self-contained;
- a push also pushes ``refs/kxen/checkpoints/<ses>`` to the remote (Git's
  fast-forward rule; Git sends what the remote lacks).

Everything carried is scanned first (:func:`carried_blobs` gives the
caller the files). On the receiving side :func:`adopt_git_bundle` and
:func:`fetch_checkpoints` bring the commits into the workspace repository
and move its ref only forward (compare-and-swap), and
:func:`restore_workspace` writes the session's last checkpoint into the
workspace after the binding's identity check. Every ``git`` process goes
through :mod:`.gitproc` (directly, through :class:`.checkpoints.Repo` or a
:class:`.gitio.Workbench`).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from kxen_agent.errors import KxenError, UsageError

from . import checkpoints as ckpt
from .checkpoint_restore import _apply, _diff, _head, _plan, _scope, left_out_of

__all__ = [
    "Carried",
    "CheckpointTravelError",
    "adopt_git_bundle",
    "carried",
    "carried_blobs",
    "fetch_checkpoints",
    "push_checkpoints",
    "restore_workspace",
    "stays_behind",
    "write_git_bundle",
]

_DURABLE = ("core.fsync=committed", "core.fsyncMethod=batch")
_REF = re.compile(r"refs/kxen/checkpoints/(ses_[0-9a-f]{20})")
_SHA1 = re.compile(r"[0-9a-f]{40}")
#: The largest file the scan reads (a checkpoint holds none larger by default: checkpoint_max_file_bytes).
SCAN_MAX_BYTES = 10 << 20


class CheckpointTravelError(KxenError):
    """Checkpoints could not be carried or adopted (the message says what and what next): exit 1."""


@dataclass(frozen=True)
class Carried:
    """One session's checkpoints as they would travel: its workspace repository, ref and the ref's commit."""

    ses: str
    repo: ckpt.Repo
    ref: str
    tip: str


def carried(sessions: Any, infos: Sequence[Any]) -> list[Carried]:
    """The sessions of ``infos`` that have checkpoints in their workspace repository (the others carry none)."""
    out = []
    for info in infos:
        try:
            repo = ckpt.open_repo(info.workspace, sessions.agent(info).get("policy", {}))
        except (ckpt.NoCheckpoints, KxenError):
            continue
        tip = repo.tip(info.id)
        if tip is not None:
            out.append(Carried(info.id, repo, ckpt.checkpoint_ref(info.id), tip))
    return out


def stays_behind(sessions: Any, infos: Sequence[Any]) -> list[str]:
    """One line per session whose last checkpoint holds files ``HEAD`` does not (work that stays on this machine)."""
    lines = []
    for c in carried(sessions, infos):
        head = _head(c.repo)
        n = len(_diff(c.repo, head, c.tip, _scope(c.repo))) if head else len(
            c.repo.git(["ls-tree", "-r", "--name-only", "-z", c.tip]).split(b"\0")) - 1
        if n:
            lines.append(f"session {c.ses}: its workspace changes ({n} file(s) under {c.repo.root} that HEAD does not "
                         f"hold, checkpoint {c.tip[:12]}) stay here; --with-checkpoints carries them")
    return lines


def _one_repo(items: Sequence[Carried]) -> ckpt.Repo:
    roots = {c.repo.common_dir for c in items}
    if len(roots) > 1:
        raise UsageError(f"the sessions' checkpoints are in {len(roots)} repositories ({', '.join(sorted(roots))}); "
                         "a bundle carries those of one: export them in one bundle per repository")
    return items[0].repo


def _exclusions(repo: ckpt.Repo) -> list[str]:
    """What the carried objects leave out: the commits the remote-tracking branches reach (when there are any)."""
    out = repo.git(["for-each-ref", "--format=%(objectname)", "refs/remotes/"]).decode().split()
    return ["--remotes"] if out else []


def carried_blobs(items: Sequence[Carried]) -> Iterator[tuple[str, str, str, bytes]]:
    """(session, path, blob id, bytes) of every file the checkpoints carry that no published commit holds."""
    for c in items:
        excl = _exclusions(c.repo)
        listing = c.repo.git(["rev-list", "--objects", c.tip, *(["--not", *excl] if excl else [])])
        paths: dict[str, str] = {}
        for line in listing.decode("utf-8", "surrogateescape").splitlines():
            oid, _, path = line.partition(" ")
            if path:
                paths.setdefault(oid, path)
        if not paths:
            continue
        check = c.repo.git(["cat-file", "--batch-check=%(objectname) %(objecttype) %(objectsize)"],
                           input="".join(o + "\n" for o in paths).encode()).decode().splitlines()
        blobs = [ln.split()[0] for ln in check if ln.split()[1:2] == ["blob"] and int(ln.split()[2]) <= SCAN_MAX_BYTES]
        if not blobs:
            continue
        raw = c.repo.git(["cat-file", "--batch"], input="".join(b + "\n" for b in blobs).encode())
        pos = 0
        while pos < len(raw):
            nl = raw.index(b"\n", pos)
            oid, _kind, size = raw[pos:nl].decode().split(" ")
            n = int(size)
            yield c.ses, paths[oid], oid, raw[nl + 1:nl + 1 + n]
            pos = nl + 1 + n + 1


# ---------------------------------------------------------------- bundles


def write_git_bundle(items: Sequence[Carried], directory: str) -> tuple[str, int]:
    """A Git bundle of the sessions' checkpoint refs in a temporary file under ``directory``: (path, size).

    The caller removes the file. It holds what the refs reach minus what the remote-tracking branches reach.
    """
    repo = _one_repo(items)
    fd, path = tempfile.mkstemp(prefix=".kxen-checkpoints-", suffix=".bundle", dir=directory)
    os.close(fd)
    os.unlink(path)  # git bundle create writes it (through its own lock file)
    excl = _exclusions(repo)
    try:
        repo.git(["bundle", "create", "-q", "--version=2", path, *sorted(c.ref for c in items),
                  *(["--not", *excl] if excl else [])])
    except ckpt.CheckpointError as e:
        if os.path.exists(path):
            os.unlink(path)
        raise CheckpointTravelError(f"cannot write the checkpoints' Git bundle: {e}") from None
    return path, os.path.getsize(path)


def _adopt(repo: ckpt.Repo, ref: str, tip: str) -> str:
    """Move ``ref`` to ``tip`` when that is forward (or the ref is absent): 'created', 'updated', 'unchanged',
    or 'kept' (this repository's checkpoints are newer or diverged: left as they are)."""
    local = repo.tip(ref[len(ckpt.REF_PREFIX):])
    if local == tip:
        return "unchanged"
    if local is not None:
        from . import gitproc

        fwd = gitproc.run(["merge-base", "--is-ancestor", local, tip], cwd=repo.root).returncode == 0
        if not fwd:
            return "kept"
    repo.git(["update-ref", "-m", "kxen-agent checkpoints adopted", ref, tip, local or "0" * 40], config=_DURABLE)
    d = os.path.join(repo.common_dir, "refs", "kxen", "checkpoints")
    if os.path.isdir(d):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return "created" if local is None else "updated"


def adopt_git_bundle(repo: ckpt.Repo, path: str, sessions: Sequence[str]) -> dict[str, str]:
    """Bring a checkpoint section's Git bundle (a file) into ``repo``: session -> what happened to its ref.

    Only refs ``refs/kxen/checkpoints/<ses>`` of ``sessions`` are taken. Git checks every object (``index-pack``)
    and that the bundle's prerequisites are here; the objects are made durable before a ref names them.
    """
    from . import gitproc

    v = gitproc.run(["bundle", "verify", "-q", path], cwd=repo.root)
    if v.returncode != 0:
        why = [ln for ln in v.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        raise CheckpointTravelError(
            f"the bundle's checkpoints cannot go into {repo.root}: {' '.join(why[-2:]) or 'git bundle verify failed'} "
            "— they build on published commits this clone lacks: git fetch, then import again")
    heads = repo.git(["bundle", "list-heads", path]).decode("utf-8", "replace").splitlines()
    wanted = {}
    for line in heads:
        oid, _, ref = line.partition(" ")
        m = _REF.fullmatch(ref)
        if m and _SHA1.fullmatch(oid) and m.group(1) in sessions:
            wanted[ref] = oid
    if not wanted:
        return {}
    repo.git(["fetch", "-q", "--no-tags", "--no-write-fetch-head", "--no-auto-maintenance", path, *sorted(wanted)],
             config=_DURABLE)
    return {ref[len(ckpt.REF_PREFIX):]: _adopt(repo, ref, oid) for ref, oid in sorted(wanted.items())}


# ---------------------------------------------------------------- remotes


def push_checkpoints(items: Sequence[Carried], remote: str | None) -> list[tuple[str, str, str]]:
    """Push each session's checkpoint ref to its workspace's remote (fast-forward only): (ses, remote, tip)."""
    from .gitio import PushRejected, PushUpdate, Workbench, resolve_remote

    done = []
    for c in items:
        r = resolve_remote(c.repo.top, remote, what=f"session {c.ses}'s workspace {c.repo.root}")
        with Workbench(r, mirror=None, alternates=[os.path.join(c.repo.common_dir, "objects")]) as bench:
            try:
                bench.push([PushUpdate(c.ref, bytes.fromhex(c.tip), None, lease=False)], what="pushed")
            except PushRejected as e:
                raise CheckpointTravelError(
                    f"push of {c.ref} to {r.display} refused ({e}): the remote's checkpoints of {c.ses} are not an "
                    "ancestor of these (another machine rewound or ran the session); nothing of the session was "
                    "pushed — pull it with --with-checkpoints first") from None
        done.append((c.ses, r.display, c.tip))
    return done


def fetch_checkpoints(repo: ckpt.Repo, ses: str, remote: str | None) -> tuple[str | None, str]:
    """Fetch ``refs/kxen/checkpoints/<ses>`` from the remote into ``repo``: (its commit or None, what happened)."""
    from .gitio import Workbench, resolve_remote

    r = resolve_remote(repo.top, remote, what=f"session {ses}'s workspace {repo.root}")
    ref = ckpt.checkpoint_ref(ses)
    with Workbench(r, mirror=None, alternates=[os.path.join(repo.common_dir, "objects")]) as bench:
        got = bench.fetch_named([ref], what="pulled").get(ref)
        if got is None:
            return None, "absent"
        repo.git(["fetch", "-q", "--no-tags", "--no-write-fetch-head", "--no-auto-maintenance", bench.path, ref],
                 config=_DURABLE)
    tip = got.hex()
    return tip, _adopt(repo, ref, tip)


# ---------------------------------------------------------------- the workspace


@dataclass(frozen=True)
class Restored:
    checkpoint: str
    written: list[str]
    removed: list[str]
    left_alone: list[tuple[str, str]]


def restore_workspace(sessions: Any, info: Any) -> Restored:
    """Write session ``info``'s last checkpoint into its workspace (``--restore-workspace``).

    Refused (nothing written) when the checkpoints are not here, when ``HEAD`` is not the commit the checkpoint
    was made on (it would revert or mix commits), or when the workspace has changes ``HEAD`` does not hold.
    The caller has checked the binding (the identity check of an import or pull).
    """
    policy = sessions.agent(info).get("policy", {})
    repo = ckpt.open_repo(info.workspace, policy)
    tip = repo.tip(info.id)
    if tip is None:
        raise CheckpointTravelError(f"session {info.id} has no checkpoints in {repo.root} (they did not travel with "
                                    "it: export or push it with --with-checkpoints); the workspace was left as it is")
    parents = repo.git(["rev-list", "--parents", "-n", "1", tip]).decode().split()[1:]
    made_on = parents[-1] if parents else None
    head = _head(repo)
    if made_on is not None and head != made_on:
        raise CheckpointTravelError(
            f"session {info.id}'s last checkpoint was made on commit {made_on[:12]}, the workspace {repo.root} is at "
            f"{(head or 'no commit')[:12]}; nothing was written — check that commit out (git switch --detach "
            f"{made_on[:12]}), then run again with --restore-workspace")
    bounds = ckpt.Bounds.of(policy)
    now = ckpt.snapshot_tree(repo, sessions.store.caches.path(ckpt.INDEX_CACHE, info.group), bounds)
    base = head or "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # the empty tree
    if _diff(repo, now, base, _scope(repo)):
        raise CheckpointTravelError(
            f"the workspace {repo.root} has changes HEAD does not hold; nothing was written — commit or stash them, "
            "then run again with --restore-workspace")
    changes, alone = _plan(repo, base, tip, dict(left_out_of(repo, tip)))
    written, removed = _apply(repo, changes, None)
    return Restored(tip, written, removed, alone)
