"""Putting the workspace back to a checkpoint: ``session rewind`` (code), its ``--undo``, and the checkpoint at a message.

A rewind of the code restores the files under the bound directory to a
checkpoint's tree (§14.14), in four durable steps, each a commit on the
session's chain ``refs/kxen/checkpoints/<ses>``:

1. *from*: the workspace now, checkpointed (what ``--undo`` puts back);
2. *marker*: a commit with the same tree whose subject says ``rewind to <T>
   from <U>`` — written before any file is touched, so a crash while files
   are being written is recognised afterwards (the ref's tip is a marker);
3. the files: every path where the from-checkpoint and the target differ is
   written (through a temporary file, fsynced, renamed) or removed, then the
   directories are fsynced;
4. *restored*: the workspace now, checkpointed again (the tip is no longer a
   marker: the rewind is complete).

A crash in step 3 leaves each file either as it was (the from-checkpoint's
content) or as the target has it. The next rewind command *proves* that —
every path that differs from the from-checkpoint has the target's content —
and completes the interrupted rewind before doing what it was asked (so
``--undo`` still puts back the from-checkpoint). If the proof fails (the
files were changed since), it refuses without ``--force``.

Left alone, and listed: ignored files (never in a checkpoint), files a
checkpoint left out (over the bounds: the checkpoint does not hold their
content), submodules (their commit is recorded, not their files), and
anything outside the bound directory.

Every ``git`` process goes through the checkpoint repository's runner
(:meth:`.checkpoints.Repo.git`, hence :mod:`.gitproc`). The user's index,
``HEAD`` and branches are never touched: only work-tree files under the
bound directory and the session's checkpoint ref.
"""

from __future__ import annotations

import os
import re
import stat as stat_mod
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kxen_agent.errors import KxenError, UsageError

from . import checkpoints as ckpt

__all__ = [
    "RewindRefused",
    "RewindResult",
    "checkpoint_at",
    "last_checkpoint",
    "left_out_of",
    "rewind_code",
    "undo_session",
    "undo_target",
]

_SUBJECT = "kxen-agent checkpoint: "
_MARKER = re.compile(r"rewind to ([0-9a-f]{40}) from ([0-9a-f]{40})")
_LEFT = re.compile(r"^  (.*): ((?:over|past) checkpoint_\S+ .*)$")
_DURABLE = ("core.fsync=committed", "core.fsyncMethod=batch")
_ZERO = "0" * 40


class RewindRefused(UsageError):
    """The workspace has changes no checkpoint holds (or an interrupted rewind cannot be proven): exit 1."""

    exit_code = 1


@dataclass
class RewindResult:
    """What a code rewind did: the checkpoints, the files written and removed, and what it left alone."""

    target: str
    undo: str  # the from-checkpoint: what `--undo` restores
    restored: str  # the checkpoint after restoring
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    left_alone: list[tuple[str, str]] = field(default_factory=list)  # (path or what, why)
    completed: str | None = None  # the target of an interrupted rewind completed first
    noop: bool = False


# ---------------------------------------------------------------- which checkpoint


def checkpoint_at(sessions: Any, info: Any, repo: ckpt.Repo, msg_oid: bytes) -> tuple[str, str | None]:
    """(the checkpoint of the workspace as it was at message ``msg_oid``, a note or None).

    The after-checkpoint of the last operation whose call is in the history up to the message (a fork point
    never splits calls from their results, so those operations had finished); one without an after is taken at
    the next checkpoint the session names. Before any such operation: the before-checkpoint of the first one
    (the workspace before the session changed it).
    """
    ops = ckpt.session_checkpoints(sessions, info)
    if not ops:
        raise UsageError(f"session {info.id} has no checkpoints (no tool that changes files has run in it)")
    history = set()
    cur: bytes | None = msg_oid
    while cur is not None:
        history.add(cur)
        cur = sessions.read_message(cur).parent
    idx = [i for i, o in enumerate(ops) if o.message in history]
    if not idx:
        first = next((o.before for o in ops if o.before), None)
        if first is None:
            raise UsageError(f"session {info.id} names no before checkpoint to go back to")
        return first, "no tool had changed files by that message: the checkpoint before the session's first change"
    i = idx[-1]
    if ops[i].after is not None:
        return ops[i].after, None
    for later in ops[i + 1:]:
        if later.before is not None:
            return later.before, f"{ops[i].op} has no after checkpoint; the before checkpoint of {later.op} stands for it"
    if ops[i].before is not None and i + 1 == len(ops):
        tip = repo.tip(info.id)
        if tip is not None:
            return tip, f"{ops[i].op} has no after checkpoint; the session's last checkpoint stands for it"
    raise UsageError(f"operation {ops[i].op} has no after checkpoint and no later one stands for it")


def last_checkpoint(sessions: Any, info: Any, repo: ckpt.Repo) -> str | None:
    """The session's last checkpoint: its ref's commit, else (a fork that took none) the last its history names."""
    tip = repo.tip(info.id)
    if tip is not None:
        return tip
    base = ckpt.fork_base(sessions, info)
    return base if base is not None and repo.exists(base) else None


def _chain(repo: ckpt.Repo, tip: str) -> list[tuple[str, str, str]]:
    """(commit, tree, subject) of the first-parent chain from ``tip``, newest first."""
    out = []
    for line in repo.git(["log", "--first-parent", "--format=%H %T %s", tip]).decode("utf-8", "replace").splitlines():
        c, t, s = line.split(" ", 2) if line.count(" ") >= 2 else (*line.split(" "), "")
        out.append((c, t, s))
    return out


def undo_target(repo: ckpt.Repo, ses: str) -> tuple[str, str]:
    """(the from-checkpoint of the session's newest rewind, that rewind's target): what ``--undo`` restores."""
    tip = repo.tip(ses)
    if tip is not None:
        prefix = f"{_SUBJECT}{ses} "
        for _c, _t, subject in _chain(repo, tip):
            if not subject.startswith(prefix):
                break
            m = _MARKER.fullmatch(subject[len(prefix):])
            if m:
                return m.group(2), m.group(1)
    raise UsageError(f"session {ses} has no rewind to undo (`kxen-agent session rewind {ses} --at MSG` makes one)")


def undo_session(sessions: Any, info: Any, repo: ckpt.Repo) -> tuple[Any, str, str]:
    """(the session whose newest rewind ``--undo`` undoes, that rewind's from-checkpoint, its target).

    ``--undo`` takes the session a rewind was made on, or the fork a ``rewind --both`` made: a conversation
    fork with no rewind of its own whose parent's newest rewind went back to the checkpoint at the fork point
    (or undid that one: ``--undo`` again redoes it). The fork shares its parent's workspace, so the rewind is
    undone on the parent's chain, as the parent's ``--undo`` would. Anything else is refused in one line.
    """
    try:
        frm, to = undo_target(repo, info.id)
        return info, frm, to
    except UsageError:
        pass
    meta = info.meta
    if meta.get("parentId") and meta.get("forkKind") == "conversation" and meta.get("forkPoint"):
        try:
            parent = sessions.get(meta["parentId"])
            frm, to = undo_target(repo, parent.id)
            at, _note = checkpoint_at(sessions, parent, repo, sessions.resolve_message(parent, meta["forkPoint"]))
        except KxenError:
            at = None
        if at is not None and (to == at or _tree(repo, frm) == _tree(repo, at)):
            return parent, frm, to
    raise UsageError(f"session {info.id} has no rewind to undo: --undo takes the session a rewind was made on, or "
                     "the fork a `session rewind --both` made while that rewind is its parent's newest "
                     f"(`kxen-agent session rewind {info.id} --at MSG` makes one)")


def left_out_of(repo: ckpt.Repo, commit: str) -> list[tuple[str, str]]:
    """The files a checkpoint's message lists as left out (over the bounds), as (path from the repository's top,
    why); the message names them from the bound directory, as ``git ls-files`` there does."""
    body = repo.git(["show", "-s", "--format=%B", commit]).decode("utf-8", "surrogateescape")
    return _from_top(repo, [(m.group(1), m.group(2)) for m in map(_LEFT.match, body.splitlines()) if m])


def _from_top(repo: ckpt.Repo, pairs: Any) -> list[tuple[str, str]]:
    scope = _scope(repo)
    return [(p if scope is None else f"{scope}/{p}", w) for p, w in pairs]


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class _Change:
    path: str  # relative to the repository's top
    mode: str  # the target's mode; "000000": remove
    blob: str


def _diff(repo: ckpt.Repo, a: str, b: str, scope: str | None,
          env: Mapping[str, str] | None = None) -> list[tuple[str, str, str, str]]:
    """(old mode, new mode, new blob, path) of every path that differs between trees/commits ``a`` and ``b``
    (``env``: a snapshot's, to read a tree that lives in its quarantine)."""
    args = ["diff-tree", "-r", "-z", "--no-renames", "--raw", a, b, "--"]
    if scope:
        args.append(scope)
    raw = repo.git(args, cwd=repo.top, env={**(env or {}), "GIT_LITERAL_PATHSPECS": "1"}).split(b"\0")
    out = []
    i = 0
    while i + 1 < len(raw):
        head = raw[i].decode()
        if not head.startswith(":"):
            i += 1
            continue
        old_mode, new_mode, _old, new, _st = head[1:].split(" ")
        out.append((old_mode, new_mode, new, raw[i + 1].decode("utf-8", "surrogateescape")))
        i += 2
    return out


def _scope(repo: ckpt.Repo) -> str | None:
    rel = os.path.relpath(os.path.realpath(repo.root), os.path.realpath(repo.top))
    return None if rel == "." else rel.replace(os.sep, "/")


def _plan(repo: ckpt.Repo, frm: str, to: str, skip: Mapping[str, str]) -> tuple[list[_Change], list[tuple[str, str]]]:
    """What restoring ``to`` over ``frm`` writes and removes, and what it leaves alone (why)."""
    changes: list[_Change] = []
    alone: list[tuple[str, str]] = []
    for old_mode, new_mode, blob, path in _diff(repo, frm, to, _scope(repo)):
        if path in skip:
            alone.append((path, skip[path]))
        elif "160000" in (old_mode, new_mode):
            alone.append((path, "a submodule: its commit is recorded, not its files"))
        else:
            changes.append(_Change(path, new_mode, blob))
    scope = _scope(repo)
    if scope is not None:
        outside = [p for *_x, p in _diff(repo, frm, to, None) if not (p == scope or p.startswith(scope + "/"))]
        alone += [(p, "outside the bound directory") for p in outside]
    return changes, alone


def _ignored(repo: ckpt.Repo, limit: int = 20) -> list[str]:
    raw = repo.git(["ls-files", "-z", "-o", "-i", "--exclude-standard", "--directory"])
    return [p.decode("utf-8", "surrogateescape") for p in filter(None, raw.split(b"\0"))][:limit]


# ---------------------------------------------------------------- writing files


def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _blobs(repo: ckpt.Repo, ids: list[str]) -> dict[str, bytes]:
    if not ids:
        return {}
    raw = repo.git(["cat-file", "--batch"], input="".join(i + "\n" for i in dict.fromkeys(ids)).encode())
    out: dict[str, bytes] = {}
    pos = 0
    while pos < len(raw):
        nl = raw.index(b"\n", pos)
        oid, kind, size = raw[pos:nl].decode().split(" ")
        n = int(size)
        out[oid] = raw[nl + 1:nl + 1 + n]
        pos = nl + 1 + n + 1
    return out


def _remove(top: str, path: str, dirs: set[str]) -> bool:
    full = os.path.join(top, path)
    if not _parent_dirs(top, path, removing=True):
        return False
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return False
    if stat_mod.S_ISDIR(st.st_mode):
        return False  # a nested repository or a directory Git does not list: never removed whole
    os.unlink(full)
    d = os.path.dirname(full)
    dirs.add(d)
    # Empty directories go with their last file, as Git removes them (never the top).
    while d != top and d.startswith(top + os.sep):
        try:
            os.rmdir(d)
        except OSError:
            break
        d = os.path.dirname(d)
        dirs.add(d)
    return True


def _parent_dirs(top: str, path: str, *, removing: bool = False) -> bool:
    """Refuse to write below a symbolic link or a file (as Git refuses a path "beyond a symbolic link"): a
    link a checkpoint does not hold (ignored, or made since) would send the write outside the workspace."""
    cur = top
    for part in path.split("/")[:-1]:
        cur = os.path.join(cur, part)
        if removing and not os.path.islink(cur) and os.path.lexists(cur) and not os.path.isdir(cur):
            return False  # a file where a directory was: nothing below it to remove
        if os.path.islink(cur) or (os.path.lexists(cur) and not os.path.isdir(cur)):
            what = "a symbolic link" if os.path.islink(cur) else "a file"
            raise KxenError(f"cannot restore {os.path.join(top, path)}: {cur} is {what} no checkpoint holds; move it "
                            "away and run the rewind again (it completes the interrupted one)")
    return True


def _write(top: str, path: str, mode: str, data: bytes, dirs: set[str]) -> None:
    full = os.path.join(top, path)
    d = os.path.dirname(full)
    _parent_dirs(top, path)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".kxen-rewind-{os.getpid()}-{os.path.basename(path)[:40]}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    if mode == "120000":
        os.symlink(os.fsdecode(data), tmp)
    else:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o777 if mode == "100755" else 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    if os.path.isdir(full) and not os.path.islink(full):
        os.unlink(tmp)
        raise KxenError(f"cannot restore {full}: a directory is there (holding files no checkpoint has); move it "
                        "away and run the rewind again (it completes the interrupted one)")
    os.replace(tmp, full)
    dirs.add(d)


def _apply(repo: ckpt.Repo, changes: list[_Change], after_file: Callable[[int], None] | None) -> tuple[list[str], list[str]]:
    blobs = _blobs(repo, [c.blob for c in changes if c.mode != "000000"])
    dirs: set[str] = set()
    written: list[str] = []
    removed: list[str] = []
    # Removals first: a file the target has where a directory now is (or the reverse) needs the old one gone.
    for n, c in enumerate(sorted(changes, key=lambda c: (c.mode != "000000", c.path)), 1):
        if c.mode == "000000":
            if _remove(repo.top, c.path, dirs):
                removed.append(c.path)
        else:
            _write(repo.top, c.path, c.mode, blobs[c.blob], dirs)
            written.append(c.path)
        if after_file is not None:
            after_file(n)
    for d in sorted(dirs, key=len, reverse=True):
        if os.path.isdir(d):
            _fsync_dir(d)
    return written, removed


# ---------------------------------------------------------------- the rewind


def _head(repo: ckpt.Repo) -> str | None:
    from . import gitproc

    p = gitproc.run(["rev-parse", "-q", "--verify", "HEAD^{commit}"], cwd=repo.root)
    out = p.stdout.decode().strip()
    return out if p.returncode == 0 and out else None


def _commit(repo: ckpt.Repo, ses: str, tree: str, parents: list[str], subject: str, old: str | None) -> str:
    """A commit on the session's chain, durable before the ref names it and the ref durable before return."""
    args = ["commit-tree", tree]
    for p in dict.fromkeys(p for p in parents if p):
        args += ["-p", p]
    commit = repo.git([*args, "-F", "-"], input=f"{_SUBJECT}{ses} {subject}\n".encode(),
                      config=_DURABLE).decode().strip()
    repo.git(["update-ref", "-m", f"kxen-agent {subject}", ckpt.checkpoint_ref(ses), commit, old or _ZERO],
             config=_DURABLE)
    _fsync_dir(os.path.join(repo.common_dir, "refs", "kxen", "checkpoints"))
    return commit


def _tree(repo: ckpt.Repo, commit: str) -> str:
    return repo.git(["rev-parse", commit + "^{tree}"]).decode().strip()


def _interrupted(repo: ckpt.Repo, ses: str) -> tuple[str, str, str] | None:
    """(marker, from, target) when the ref's tip is a rewind marker: a rewind that did not finish."""
    tip = repo.tip(ses)
    if tip is None:
        return None
    subject = repo.git(["show", "-s", "--format=%s", tip]).decode("utf-8", "replace").strip()
    prefix = f"{_SUBJECT}{ses} "
    m = _MARKER.fullmatch(subject[len(prefix):]) if subject.startswith(prefix) else None
    return (tip, m.group(2), m.group(1)) if m else None


def _provable_mix(repo: ckpt.Repo, index_path: str, bounds: ckpt.Bounds, frm: str, to: str) -> bool:
    """Whether every path under the bound directory is as ``frm`` or as ``to`` has it (a half-done restore).

    The workspace's tree is compared inside its snapshot: a snapshot keeps no object once it ends."""
    scope = _scope(repo)
    with ckpt.snapshot(repo, index_path, bounds) as (now, env):
        from_diff = {p for *_x, p in _diff(repo, now, frm, scope, env)}
        to_diff = {p for *_x, p in _diff(repo, now, to, scope, env)}
    return not (from_diff & to_diff)


def rewind_code(sessions: Any, info: Any, policy: Mapping[str, Any], target: str, *, force: bool,
                after_file: Callable[[int], None] | None = None) -> RewindResult:
    """Restore the workspace of session ``info`` to checkpoint ``target`` (see the module's description).

    The caller holds the session's lease (no run changes the files meanwhile). ``after_file(n)`` is called
    after the n-th file is written or removed (crash tests).
    """
    cp, why = ckpt.for_session(sessions.store, sessions, info, policy)
    if cp is None:
        raise ckpt.NoCheckpoints(f"no checkpoints: {why}")
    repo = cp.repo
    if not repo.exists(target):
        raise RewindRefused(f"checkpoint {target} is not in the repository {repo.root}: the session was imported or "
                            "pulled without its checkpoints; nothing was changed")
    last = last_checkpoint(sessions, info, repo)
    if last is None:
        raise RewindRefused(f"session {info.id} has no checkpoints in {repo.root}; nothing to rewind to")
    bounds = ckpt.Bounds.of(policy)
    completed: str | None = None
    now = ckpt.snapshot_tree(repo, cp.index_path, bounds)
    pending = _interrupted(repo, info.id)
    if pending is not None:
        marker, frm, to = pending
        if _provable_mix(repo, cp.index_path, bounds, frm, to):
            # Complete it: the files not yet written are written, then the restored checkpoint ends it.
            skip = dict(left_out_of(repo, frm)) | dict(left_out_of(repo, to))
            changes, _alone = _plan(repo, frm, to, skip)
            _apply(repo, changes, None)
            done = cp.take(f"rewind: restored {to}")
            if done.reused:
                _commit(repo, info.id, done.tree, [marker, _head(repo)], f"rewind: restored {to}", marker)
            completed = to
            now = ckpt.snapshot_tree(repo, cp.index_path, bounds)
        elif not force:
            raise RewindRefused(
                f"a rewind of session {info.id} to {to[:12]} was interrupted and files under {repo.root} changed "
                "since; nothing was changed — give --force to checkpoint them first, then rewind")
    elif not force:
        trees = {t for _c, t, _s in _chain(repo, repo.tip(info.id) or last)}
        if now not in trees:
            raise RewindRefused(
                f"the workspace {repo.root} has changes no checkpoint of session {info.id} holds; nothing was changed "
                f"— see them with `git status`, or give --force to checkpoint them first (then --undo restores them)")
    frm = cp.take("rewind: the workspace before")
    frm_left = _from_top(repo, frm.left_out)
    skip = dict(frm_left) | dict(left_out_of(repo, target))
    changes, alone = _plan(repo, frm.commit, target, skip)
    listed = {p for p, _w in alone}
    alone += [(p, w) for p, w in frm_left if p not in listed]  # not in the checkpoint: kept as they are
    alone += [(p, "ignored") for p in _ignored(repo)]
    if not changes:
        return RewindResult(target, frm.commit, frm.commit, left_alone=alone, completed=completed, noop=True)
    marker = _commit(repo, info.id, frm.tree, [frm.commit, _head(repo)], f"rewind to {target} from {frm.commit}",
                     frm.commit)
    written, removed = _apply(repo, changes, after_file)
    cp.last = None
    done = cp.take(f"rewind: restored {target}")
    restored = done.commit
    if done.reused:
        restored = _commit(repo, info.id, done.tree, [marker, _head(repo)], f"rewind: restored {target}", marker)
    return RewindResult(target, frm.commit, restored, written, removed, alone, completed)
