"""Workspace checkpoints: what a session's tools left in the workspace, as commits of the workspace's own repository.

A checkpoint (``objects_spec.md`` §14.14) is a Git commit in the workspace
repository's object database whose tree is the workspace as Git sees it —
``HEAD``'s files with every tracked and untracked-but-not-ignored file under
the bound directory as it is on disk — made with a per-session index kept in
the state dir (:data:`INDEX_CACHE`: a kept index re-hashes only what changed, and its untracked cache
re-reads only the directories that changed), ``update-index`` of the paths ``git status`` names (what
``git add -A`` would stage), ``write-tree`` and the commit ``commit-tree`` would write (made and
packed by :mod:`.checkpoint_pack`). Its first parent is the
session's previous checkpoint (a chain under one ref,
:func:`checkpoint_ref`), its second the workspace's ``HEAD`` of that time, so
the repository's own ``git gc`` keeps every checkpoint and a branch made at
one holds the commits of its time. Files over the bounds (:class:`Bounds`)
are left out and listed in the commit's message.

Every ``git`` process goes through :mod:`.gitproc` (its trust-boundary
configuration: no hooks, fsmonitor, repository filters, textconv or
external diff), and every object and ref a checkpoint writes is fsynced by
Git (``core.fsync=committed``) before its id is returned, so a journal entry
naming it never names something a crash lost.

It never touches the user's index, working tree, branches or ``HEAD``: the
only Git state it changes is the objects it adds and the refs under
``refs/kxen/checkpoints/``. It reads the store only to find where a session
forked (:func:`fork_base`) and the journal fields (:func:`session_checkpoints`).

The API (what ``session diff``, ``run show`` and a rewind or a fork with
code build on):

- :func:`open_repo` (or :func:`unavailable_reason`): the workspace
  repository, or :class:`NoCheckpoints` saying why there are none;
- :func:`for_session`: a session's :class:`Checkpointer` (kept index,
  bounds, fork base); :meth:`Checkpointer.take` records the workspace now;
- :func:`session_checkpoints`: the operations naming checkpoints, in
  history order (a fork's parent's up to the fork point included);
  :func:`checkpoint_at`: the checkpoint at a message;
- :meth:`Repo.tip`, :func:`checkpoints_of`, :meth:`Repo.exists`,
  :func:`file_at`, :func:`left_out_of`: reading them back;
  :func:`snapshot` / :func:`snapshot_tree`: the workspace now as a tree, no
  commit, nothing kept (compare it with a checkpoint's tree to find changes
  no checkpoint holds);
- :func:`diff`, :func:`numstat`: Git's diff between two of them;
- :func:`delete_checkpoint_refs`: the refs of pruned sessions;
  :func:`checkpoint_roots` (before a gc) and :func:`delete_pruned` (after
  it, with the groups it removed) wire that into gc.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

from kxen_agent.errors import KxenError
from kxen_agent.store.caches import CacheKind
from kxen_agent.store.fsio import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, SHARED_FILE_MODE

from . import checkpoint_pack, gitproc
from .workspace import WorkspaceIdentity

__all__ = [
    "AFTER_KEY",
    "BEFORE_KEY",
    "Bounds",
    "Checkpoint",
    "CheckpointError",
    "Checkpointer",
    "INDEX_CACHE",
    "NoCheckpoints",
    "OpCheckpoints",
    "REF_PREFIX",
    "Repo",
    "checkpoint_at",
    "checkpoint_ref",
    "checkpoint_roots",
    "chain_size",
    "checkpoints_of",
    "delete_checkpoint_refs",
    "delete_pruned",
    "diff",
    "for_session",
    "file_at",
    "fork_base",
    "left_out_of",
    "numstat",
    "open_repo",
    "session_checkpoints",
    "snapshot",
    "snapshot_tree",
    "stage",
    "unavailable_reason",
]

#: The journal keys (§14.6): the checkpoint before an operation's effect (on ``Started`` and every later
#: entry of the operation) and after it (on ``Settled``).
BEFORE_KEY = "checkpointBefore"
AFTER_KEY = "checkpointAfter"
#: Where the checkpoints of session ``ses`` are: ``refs/kxen/checkpoints/<ses>`` in the workspace repository.
REF_PREFIX = "refs/kxen/checkpoints/"
#: The kept index of a session: ``cache/checkpoint-index/sessions/<ses>`` (§11a; removed with the group).
INDEX_CACHE = CacheKind("checkpoint-index", title="checkpoint index")

DEFAULT_MAX_FILE_BYTES = 10 << 20
DEFAULT_MAX_FILES = 10_000
DEFAULT_MAX_BYTES = 256 << 20

_SHA1 = re.compile(r"[0-9a-f]{40}")
_ZERO = "0" * 40
# Git fsyncs the objects and the ref it writes (git 2.36+); batch: one fsync for the loose objects of an add.
_DURABLE = ("core.fsync=committed", "core.fsyncMethod=batch")
_AUTHOR = "kxen-agent <checkpoint@kxen-agent.invalid>"  # author and committer of every checkpoint (§14.14)
_IDENT = {"GIT_AUTHOR_NAME": "kxen-agent", "GIT_AUTHOR_EMAIL": "checkpoint@kxen-agent.invalid",
          "GIT_COMMITTER_NAME": "kxen-agent", "GIT_COMMITTER_EMAIL": "checkpoint@kxen-agent.invalid",
          "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"}


class CheckpointError(KxenError):
    """A git command of a checkpoint failed (the message names it and the repository)."""


class NoCheckpoints(KxenError):
    """The session records no checkpoints here (the message says why: policy, no Git workspace, SHA-256); exit 1."""


def checkpoint_ref(ses: str) -> str:
    """``refs/kxen/checkpoints/<ses>``."""
    return REF_PREFIX + ses


@dataclass(frozen=True)
class Bounds:
    """What a checkpoint leaves out (§14.14): files over ``max_file_bytes``; past ``max_files`` new or changed
    files, or ``max_bytes`` of them in all, the rest (in path order)."""

    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_files: int = DEFAULT_MAX_FILES
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def of(cls, policy: Mapping[str, Any]) -> Bounds:
        return cls(policy.get("checkpoint_max_file_bytes", DEFAULT_MAX_FILE_BYTES),
                   policy.get("checkpoint_max_files", DEFAULT_MAX_FILES),
                   policy.get("checkpoint_max_bytes", DEFAULT_MAX_BYTES))


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint taken: its commit, tree, and the files it left out as (path, why)."""

    commit: str
    tree: str
    left_out: tuple[tuple[str, str], ...] = ()
    reused: bool = False  # the workspace had not changed: the previous checkpoint stands


@dataclass(frozen=True)
class Repo:
    """The workspace repository as checkpoints need it: the bound directory and the common Git directory."""

    root: str
    top: str
    common_dir: str

    @functools.cached_property
    def prefix(self) -> str:
        """The bound directory relative to the top, with a final ``/`` (``""``: the top itself)."""
        rel = os.path.relpath(os.path.realpath(self.root), os.path.realpath(self.top))
        return "" if rel == "." else rel.replace(os.sep, "/") + "/"

    def git(self, args: Sequence[str], *, input: bytes | None = None, env: Mapping[str, str] | None = None,
            config: Sequence[str] = (), cwd: str | None = None,
            overrides: tuple[Sequence[str], Mapping[str, str]] | None = None) -> bytes:
        p = gitproc.run(args, cwd=cwd or self.root, input=input, env={**_IDENT, **(env or {})}, config=config,
                        overrides=overrides)
        if p.returncode != 0:
            err = p.stderr.decode("utf-8", "replace").strip().splitlines()
            raise CheckpointError(f"git {args[0]} failed in {self.root}: {err[-1] if err else 'exit ' + str(p.returncode)}")
        return p.stdout

    def exists(self, commit: str) -> bool:
        """Whether ``commit`` is a commit of this repository."""
        if not _SHA1.fullmatch(commit):
            return False
        p = gitproc.run(["cat-file", "-e", commit + "^{commit}"], cwd=self.root, env=_IDENT)
        return p.returncode == 0

    def tip(self, ses: str) -> str | None:
        p = gitproc.run(["rev-parse", "-q", "--verify", checkpoint_ref(ses) + "^{commit}"], cwd=self.root, env=_IDENT)
        out = p.stdout.decode().strip()
        return out if p.returncode == 0 and _SHA1.fullmatch(out) else None


def unavailable_reason(workspace: WorkspaceIdentity, policy: Mapping[str, Any]) -> str | None:
    """Why a session bound to ``workspace`` under ``policy`` records no checkpoints, or None when it does."""
    if policy.get("checkpoints", True) is False:
        return "[policy] checkpoints = false in the agent definition"
    if workspace.repo_root is None:
        return f"the workspace {workspace.root} is not in a Git repository"
    try:
        fmt = gitproc.run(["rev-parse", "--show-object-format"], cwd=workspace.root, env=_IDENT)
    except OSError as ex:
        return f"git cannot run ({ex})"
    if fmt.returncode != 0:
        return f"the workspace {workspace.root} is not a Git work tree any more"
    name = fmt.stdout.decode().strip() or "sha1"
    if name != "sha1":
        return f"the repository of {workspace.root} uses {name} object ids; checkpoints support sha1 repositories only"
    return None


def open_repo(workspace: WorkspaceIdentity, policy: Mapping[str, Any]) -> Repo:
    """The workspace repository, or :class:`NoCheckpoints` saying why the session has none there."""
    why = unavailable_reason(workspace, policy)
    if why is not None:
        raise NoCheckpoints(f"no checkpoints: {why}")
    out = gitproc.run(["rev-parse", "--path-format=absolute", "--git-common-dir", "--show-toplevel"],
                      cwd=workspace.root, env=_IDENT)
    lines = out.stdout.decode("utf-8", "surrogateescape").splitlines()
    if out.returncode != 0 or len(lines) < 2:
        raise NoCheckpoints(f"no checkpoints: the workspace {workspace.root} is not a Git work tree any more")
    return Repo(workspace.root, lines[1], lines[0])


# ---------------------------------------------------------------- taking checkpoints


class Checkpointer:
    """Takes the checkpoints of one session in its workspace (one per process and run; not thread-safe).

    ``index_path`` is the session's kept index (:data:`INDEX_CACHE`). :meth:`take` records the workspace
    now; :meth:`before` is the last checkpoint this object took, or a new one; the first checkpoint of a
    session with no ref chains onto ``base`` (a fork's parent checkpoint at the fork point, :func:`fork_base`).
    """

    def __init__(self, repo: Repo, ses: str, index_path: str, bounds: Bounds, *, base: str | None = None,
                 io: Any = None) -> None:
        self.repo = repo
        # The store's file layer (None: a throw-away index outside the state dir): the kept index is state,
        # and takes the state dir's modes (§10.4) whatever the umask, as every other file there does.
        self.io = io
        self.ses = ses
        self.index_path = index_path
        self.bounds = bounds
        self.base = base
        self.last: Checkpoint | None = None
        self._heads: dict[str, str | None] = {}  # checkpoint commit -> the HEAD it recorded
        # The tree of the kept index as this object last wrote it: when nothing changed since, no write-tree.
        self._staged: str | None = None
        self._tip: tuple[str, str] | None = None  # the ref's (commit, tree) as this object last read or moved it

    def before(self, label: str) -> Checkpoint:
        """The checkpoint before an operation: the one this process took last (after the previous operation),
        else a new one."""
        return self.last if self.last is not None else self.take(label)

    def take(self, label: str) -> Checkpoint:
        """Record the workspace now as a checkpoint (the previous one when nothing changed); durable on return."""
        self._seed_index()
        tip = self._read_tip()
        # The kept index may name only objects that are durable in the repository: it is staged as a copy and
        # replaced once the objects are packed, so a crash (or error) in between leaves the old one.
        work = self.index_path + ".new"
        if os.path.exists(self.index_path):
            shutil.copy2(self.index_path, work)
        try:
            overrides = gitproc.repository_overrides(self.repo.root)  # once for every command of this checkpoint
            with _Quarantine(self.repo) as q:
                began = _fs_now(work, q.dir)
                s = _stage(self.repo, work, self.bounds, env=q.env, config=q.config, known=self._staged,
                           overrides=overrides)
                head, tree, left_out = s.head, s.tree, s.left_out
                reuse = tip is not None and tip[1] == tree and (head is None or self._recorded_head(tip[0]) == head)
                if reuse:
                    q.persist()
                else:
                    # The commit `git commit-tree` would write, made here and packed with the new blobs and trees.
                    parents = list(dict.fromkeys(p for p in ((tip[0] if tip else self.base), head) if p))
                    msg = _message(self.ses, label, left_out, self.bounds).encode("utf-8", "surrogateescape")
                    commit, body = checkpoint_pack.commit_object(tree, parents, _AUTHOR, msg)
                    q.persist([(commit, "commit", body)])
            if os.path.exists(work):
                self._own_mode(work)  # Git made it with 0666 less the umask, or copy2 kept the old mode
                _set_back(work, began)
                os.replace(work, self.index_path)
            self._staged = tree
        finally:
            if os.path.exists(work):
                os.unlink(work)
        if reuse:
            assert tip is not None
            cp = Checkpoint(tip[0], tree, tuple(left_out), reused=True)
            self.last = cp
            return cp
        self.repo.git(["update-ref", "-m", f"kxen-agent checkpoint {label}", checkpoint_ref(self.ses), commit,
                       tip[0] if tip else _ZERO], config=_DURABLE)
        self._fsync_dir(os.path.join(self.repo.common_dir, *REF_PREFIX.rstrip("/").split("/")))
        self._tip = (commit, tree)
        self._heads[commit] = head
        cp = Checkpoint(commit, tree, tuple(left_out))
        self.last = cp
        return cp

    # ---- the pieces

    def _recorded_head(self, commit: str) -> str | None:
        """The ``HEAD`` a checkpoint recorded: its last parent (the chain's previous checkpoint comes first)."""
        if commit not in self._heads:
            parents = self.repo.git(["rev-list", "--parents", "-n", "1", commit]).decode().split()[1:]
            self._heads[commit] = parents[-1] if parents else None
        return self._heads[commit]

    def _read_tip(self) -> tuple[str, str] | None:
        """(commit, tree) of the session's ref, or None. When the ref's loose file still names the commit this
        object left it at, its tree is known: no ``git`` process. Anything else (another commit, a packed ref,
        another ref store) is read with ``git cat-file``; ``update-ref`` checks the old value in any case."""
        if self._tip is not None:
            try:
                with open(os.path.join(self.repo.common_dir, *checkpoint_ref(self.ses).split("/")), "rb") as f:
                    if f.read(64).strip() == self._tip[0].encode():
                        return self._tip
            except OSError:
                pass
        ref = checkpoint_ref(self.ses)
        out = self.repo.git(["cat-file", "--batch-check=%(objectname) %(objecttype)"],
                            input=f"{ref}\n{ref}^{{tree}}\n".encode()).decode().splitlines()
        vals = [ln.split()[0] if ln.endswith((" commit", " tree")) else None for ln in out] + [None, None]
        self._tip = (vals[0], vals[1]) if vals[0] and vals[1] else None
        return self._tip

    def _seed_index(self) -> None:
        """A session's first checkpoint starts from a copy of the repository's index (its stat data, so only
        what changed is hashed; ``copy2`` keeps its time, so Git's racy-entry check still holds)."""
        if os.path.exists(self.index_path):
            return
        if self.io is not None:
            self.io.makedirs(os.path.dirname(self.index_path))
        else:
            os.makedirs(os.path.dirname(self.index_path), PRIVATE_DIR_MODE, exist_ok=True)
        gitdir = gitproc.run(["rev-parse", "--path-format=absolute", "--git-dir"], cwd=self.repo.root, env=_IDENT)
        real = os.path.join(gitdir.stdout.decode("utf-8", "surrogateescape").strip(), "index")
        if gitdir.returncode == 0 and os.path.isfile(real):
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.index_path), prefix=".seed-")
            os.close(fd)
            shutil.copy2(real, tmp)
            self._own_mode(tmp)
            os.replace(tmp, self.index_path)

    def _own_mode(self, path: str) -> None:
        shared = self.io is not None and self.io.is_shared(path)
        os.chmod(path, SHARED_FILE_MODE if shared else PRIVATE_FILE_MODE)

    @staticmethod
    def _fsync_dir(d: str) -> None:
        # Git fsyncs a file before its rename, not the directory holding the new name.
        try:
            fd = os.open(d, os.O_RDONLY)
        except OSError:
            return  # the ref is packed: Git fsynced packed-refs before its rename
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fs_now(index: str, quarantine: str) -> int:
    """The file system's clock now (ns), as it stamps what changes next: the older of the kept index copy's
    change time (``copy2`` has just set its times) and the new quarantine directory's time."""
    times = []
    for path, attr in ((index, "st_ctime_ns"), (quarantine, "st_mtime_ns")):
        try:
            times.append(getattr(os.stat(path), attr))
        except OSError:
            pass
    return min(times) if times else time.time_ns()


def _set_back(index: str, began: int) -> None:
    """Stamp the kept index with the time its checkpoint began, not that of Git's last write of it.

    Git trusts an entry's stat data (and a directory's in the untracked cache) only when it is older than the
    index file; one as new or newer is "racy" and looked at again. Written at the end, the index would vouch
    for what changed while the checkpoint read the work tree within the same clock tick as the read (a
    background process writing a file just after ``status`` read its directory): the next checkpoint would
    miss it until that file or directory changed again. Stamped with the start, anything changed since is
    racy for the next checkpoint, which reads it again. Only ever older than Git's own stamp: never trusts more.
    """
    st = os.stat(index)
    if st.st_mtime_ns > began:
        os.utime(index, ns=(st.st_atime_ns, began))


_QUARANTINE = "kxen-incoming-"


class _Quarantine:
    """Where a checkpoint's new objects are written first (``GIT_OBJECT_DIRECTORY``, the repository's objects as
    an alternate), then made durable as one pack: one fsync for the pack and one for its index instead of one
    per object (``write-tree`` writes a tree per changed directory, each fsynced on its own by
    ``core.fsync``). Git's own push quarantine works the same way. Removed on the way out, whatever happened."""

    def __init__(self, repo: Repo) -> None:
        self.repo = repo
        self.objects = os.path.join(repo.common_dir, "objects")
        self.dir = ""

    def __enter__(self) -> _Quarantine:
        self._sweep()
        self.dir = tempfile.mkdtemp(prefix=_QUARANTINE, dir=self.objects)
        return self

    def _sweep(self) -> None:
        """Remove quarantines a killed checkpoint left (Git never looks at them), once they are an hour old:
        a younger one may be another session's checkpoint at work."""
        old = time.time() - 3600
        try:
            names = [n for n in os.listdir(self.objects) if n.startswith(_QUARANTINE)]
        except OSError:
            return
        for n in names:
            path = os.path.join(self.objects, n)
            try:
                if os.stat(path).st_mtime < old:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass

    @property
    def env(self) -> dict[str, str]:
        return {"GIT_OBJECT_DIRECTORY": self.dir, "GIT_ALTERNATE_OBJECT_DIRECTORIES": self.objects}

    #: Loose objects here are read once, to be packed: not compressing them saves a zlib pass. Many blobs
    #: do not come here loose at all (:data:`_BULK_FROM`): Git streams them into a pack of their own, fsynced
    #: with its index before Git names them here, then moved to the repository (:meth:`persist`).
    config = ("core.looseCompression=0", "pack.compression=1", "core.fsync=pack,pack-metadata",
              "core.fsyncMethod=fsync")

    def persist(self, extra: Sequence[tuple[str, str, bytes]] = ()) -> None:
        """Pack what was written here, and the ``extra`` objects ``(id, type, body)`` (the commit), into the
        repository's ``objects/pack``, fsynced (nothing when there is nothing)."""
        ids = []
        for fan in os.listdir(self.dir):
            if len(fan) == 2:
                ids += [fan + name for name in os.listdir(os.path.join(self.dir, fan)) if len(name) == 38]
        pack_dir = os.path.join(self.objects, "pack")
        moved = self._move_packs(pack_dir)
        if not ids and not extra:
            if moved:
                Checkpointer._fsync_dir(pack_dir)
            return
        os.makedirs(pack_dir, exist_ok=True)
        # What `git pack-objects --window=0` made of them (no deltas), without its process; fsynced as
        # `core.fsync=pack,pack-metadata` has Git do it (:mod:`.checkpoint_pack`).
        try:
            checkpoint_pack.write_pack(self.dir, sorted(ids), extra, pack_dir)
        except ValueError as e:  # an object Git just wrote reads back damaged: the disk, not this session
            raise CheckpointError(f"cannot pack this checkpoint's new objects in {self.dir}: {e}; no checkpoint "
                                  f"was recorded (the run goes on); `git fsck` in {self.repo.root} checks the "
                                  "repository") from None
        Checkpointer._fsync_dir(pack_dir)
        if sum(name.endswith(".pack") for name in os.listdir(pack_dir)) > _PACKS_BEFORE_MERGE:
            # One small pack per checkpoint, and every Git process looks an object up in every pack: a run's
            # per-call cost grew with its length (46 ms per call at 50 calls, 174 ms at 2,000). A geometric
            # repack merges the small packs into progressively larger ones (amortized: what `git maintenance`
            # does incrementally), fsynced like the checkpoint packs; the repository's large packs are left.
            # On the repository itself (not the quarantine, whose objects are now in the pack just written).
            # No delta search (--window=0): Git rolls the repository's loose objects in too, and searching
            # deltas among them stalled a call for seconds (bench: 2.1 of a 2.5 s repack, 7,700 loose objects
            # `git stash create` left); packed deltas are reused as they are, and the user's gc deltifies the rest.
            self.repo.git(["repack", "-d", "-q", "--geometric=2", "--window=0", "--no-write-bitmap-index"],
                          config=("core.fsync=pack,pack-metadata", "core.fsyncMethod=fsync", "pack.compression=1"))
            Checkpointer._fsync_dir(pack_dir)

    def _move_packs(self, pack_dir: str) -> bool:
        """Move the packs Git wrote here (bulk checkin, fsynced with their indexes before Git named them) into
        the repository's ``objects/pack``: each pack and its reverse index before its index, since a reader
        takes a pack only through its index. Whether any moved (the caller fsyncs ``pack_dir``)."""
        here = os.path.join(self.dir, "pack")
        try:
            names = os.listdir(here)
        except FileNotFoundError:
            return False
        packs = sorted(n[:-5] for n in names if n.startswith("pack-") and n.endswith(".pack") and n[:-5] + ".idx" in names)
        if packs:
            os.makedirs(pack_dir, exist_ok=True)
        for base in packs:
            for ext in (".pack", ".rev", ".idx"):
                if base + ext in names:
                    os.replace(os.path.join(here, base + ext), os.path.join(pack_dir, base + ext))
        return bool(packs)

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


#: Paths staged at once past which a checkpoint's blobs are streamed into a pack by Git (:func:`stage`).
_BULK_FROM = 32

#: Packs in the repository past which a checkpoint merges the small ones (:meth:`_Quarantine.persist`).
_PACKS_BEFORE_MERGE = 16


#: What names the changes (``objects_spec.md`` §14.14): ``git status`` against the kept index, every untracked
#: file by name (``-uall``), no rename pairs, a submodule changed only when its commit moved (as ``ls-files -m``
#: saw it: never a walk into it), and the ``HEAD`` of that moment (``--branch``: no ``cat-file`` for it).
_STATUS = ("status", "--porcelain=v2", "-z", "--branch", "--no-ahead-behind", "--untracked-files=all",
           "--no-renames", "--ignore-submodules=dirty")
#: The untracked cache, kept in the session's index (never the repository's configuration): a directory whose
#: stat data has not changed since the last checkpoint is not read again. ``-uall`` uses it only when
#: ``status.showUntrackedFiles`` says ``all`` too (Git keeps one cache per mode). Before, ``ls-files -o``
#: read every directory of the work tree at each checkpoint (10,000 files: 7 ms of its 32 ms of CPU; the
#: rest was its serial lstat of every tracked file, which `status` spreads over threads).
_UNTRACKED_CACHE = ("core.untrackedCache=true", "status.showUntrackedFiles=all")


@dataclass(frozen=True)
class _Staged:
    left_out: list[tuple[str, str]]
    tree: str
    head: str | None  # the HEAD commit when the work tree was read; None: an unborn branch


def stage(repo: Repo, index_path: str, bounds: Bounds, *,
          env: Mapping[str, str] | None = None, config: Sequence[str] = (),
          known: str | None = None) -> tuple[list[tuple[str, str]], str]:
    """Stage the workspace into the index at ``index_path`` within ``bounds``: (the files left out, the tree).

    ``known``: the index's tree when the caller wrote it last; taken as it is when nothing is to be staged
    (a command that changed no file, the common case of a shell tool running tests, costs no ``write-tree``).
    """
    s = _stage(repo, index_path, bounds, env=env, config=config, known=known)
    return s.left_out, s.tree


def _stage(repo: Repo, index_path: str, bounds: Bounds, *, env: Mapping[str, str] | None = None,
           config: Sequence[str] = (), known: str | None = None,
           overrides: tuple[Sequence[str], Mapping[str, str]] | None = None) -> _Staged:
    """:func:`stage`, with the ``HEAD`` read in the same pass.

    Every command that reads the work tree or writes the index runs with the repository's command-running
    keys made inert (:func:`.gitproc.repository_overrides`, computed once here for the three commands, or
    given): ``status`` hashes a racily clean entry to compare it and ``write-tree``, writing the index back,
    does too — both through the clean filter.
    """
    ov = overrides if overrides is not None else gitproc.repository_overrides(repo.root)
    env = {**(env or {}), "GIT_INDEX_FILE": index_path}
    # `status` with a pathspec never uses the untracked cache: a session bound to the repository's top gives
    # none; one bound to a subdirectory gives "." (read from the bound directory: only what is under it).
    # Paths come relative to the top either way: the prefix goes, so the rest is as `ls-files` gave it.
    prefix = repo.prefix
    raw = repo.git([*_STATUS, *(["--", "."] if prefix else [])],
                   env={**env, "GIT_OPTIONAL_LOCKS": "1"},  # status writes the untracked cache back to the index
                   config=(*config, *_UNTRACKED_CACHE), overrides=ov)
    head: str | None = None
    names: list[bytes] = []
    items = iter(raw.split(b"\0"))
    for item in items:
        kind = item[:2]
        if kind == b"? ":
            names.append(item[2:])
        elif kind == b"1 ":  # 1 XY sub mH mI mW hH hI path; Y: the work tree against the index
            parts = item.split(b" ", 8)
            if parts[1][1:2] != b".":
                names.append(parts[8])
        elif kind == b"u ":  # unmerged (a copy of an index mid-merge): staged as the work tree has it
            names.append(item.split(b" ", 10)[10])
        elif kind == b"2 ":  # a rename pair (not asked for): both paths, the second in the next item
            names += [item.split(b" ", 9)[9], next(items, b"")]
        elif item.startswith(b"# branch.oid "):
            oid = item[13:].decode("ascii", "replace")
            head = oid if _SHA1.fullmatch(oid) else None  # "(initial)": no commit yet
    strip = len(prefix.encode("utf-8", "surrogateescape")) if prefix else 0
    paths = sorted({n[strip:].decode("utf-8", "surrogateescape") for n in names
                    if n and (not prefix or n.startswith(prefix.encode("utf-8", "surrogateescape")))})
    left: list[tuple[str, str]] = []
    keep: list[str] = []
    files = total = 0
    for path in paths:
        try:
            st = os.lstat(os.path.join(repo.root, path))
        except OSError:
            keep.append(path)  # deleted: update-index --remove records the deletion
            continue
        size = st.st_size if stat.S_ISREG(st.st_mode) else 0  # a link's target, a submodule: not its size
        if size > bounds.max_file_bytes:
            left.append((path, f"over checkpoint_max_file_bytes ({size} > {bounds.max_file_bytes})"))
        elif files + 1 > bounds.max_files:
            left.append((path, f"past checkpoint_max_files ({bounds.max_files})"))
        elif total + size > bounds.max_bytes:
            left.append((path, f"past checkpoint_max_bytes ({bounds.max_bytes})"))
        else:
            files += 1
            total += size
            keep.append(path)
    if not keep and known is not None:
        return _Staged(left, known, head)
    if keep:
        # Exactly the paths status named (changed, deleted, new and not ignored), by name: no pathspec
        # matching and no second walk of the work tree, which `add -A` does (1,000 of 10,000 files
        # changed: add 484 ms of CPU, this 338 ms; `git stash create` in all 568 ms). --replace: a file
        # that became a directory, or the other way round; a nested repository becomes its commit.
        # Many files: past ``core.bigFileThreshold`` Git streams each into one pack as it hashes it ("bulk
        # checkin"), compressed once; at 1 byte every non-empty file goes that way (1,000 files: no loose
        # write and no second pass to pack them, 314 -> 172 ms of CPU). A few: the loose way is one pack
        # (of the blobs and the trees) where bulk checkin would make two, each with its fsyncs.
        bulk = ("core.bigFileThreshold=1",) if len(keep) > _BULK_FROM else ()
        repo.git(["update-index", "--add", "--remove", "--replace", "-z", "--stdin"],
                 input=b"".join(p.rstrip("/").encode("utf-8", "surrogateescape") + b"\0" for p in keep),
                 env=env, config=(*config, *bulk), overrides=ov)
    tree = repo.git(["write-tree"], env=env, config=config, overrides=ov).decode().strip()
    return _Staged(left, tree, head)


def _message(ses: str, label: str, left_out: Sequence[tuple[str, str]], bounds: Bounds) -> str:
    lines = [f"kxen-agent checkpoint: {ses} {label}", ""]
    if left_out:
        lines.append(f"left out ({len(left_out)}):")
        lines += [f"  {path}: {why}" for path, why in left_out]
    else:
        lines.append("left out: none")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- reading checkpoints back


@dataclass(frozen=True)
class OpCheckpoints:
    """One operation's checkpoints as its newest journal entry names them (None: not recorded)."""

    op: str
    run: str
    message: bytes
    tool: str
    state: str
    before: str | None
    after: str | None


def _ops_of_run(sessions: Any, st: dict) -> list[dict]:
    """The newest entry of each op of run state ``st``, in order of the op's first entry."""
    from kxen_agent.session.schema import read  # session layer: the journal's reader

    chain: list[dict] = []
    oid = st.get("journal")
    while oid is not None:
        e = read(sessions.store, oid, "journal")
        chain.append(e)
        oid = e.get("previous")
    latest: dict[str, dict] = {}
    for e in reversed(chain):
        latest[e["op"]] = e
    return list(latest.values())


def session_checkpoints(sessions: Any, info: Any) -> list[OpCheckpoints]:
    """The operations of session ``info`` that name a checkpoint, in the order of its history (runs in
    index order, ops in journal order), including — for a fork — those of its ancestors up to the fork point."""
    from kxen_agent.session.schema import read

    history = set()
    oid = info.head
    while oid is not None:
        history.add(oid)
        oid = read(sessions.store, oid, "message").get("parent")
    out: list[OpCheckpoints] = []
    seen_runs: set[str] = set()
    chain = [info]
    meta = info.meta
    while meta.get("parentId"):
        try:
            parent = sessions.get(meta["parentId"], include_deleted=True)
        except KxenError:
            break
        chain.append(parent)
        meta = parent.meta
    for sess in reversed(chain):
        states = []
        for run, roid in sess.runs.items():
            if run in seen_runs:
                continue
            seen_runs.add(run)
            st = read(sessions.store, roid, "run")
            states.append(st)
        for st in sorted(states, key=lambda s: (s.get("startedNs", 0), s["index"])):
            for e in _ops_of_run(sessions, st):
                if e["message"] not in history:
                    continue
                before, after = e.get(BEFORE_KEY), e.get(AFTER_KEY)
                if before is None and after is None:
                    continue
                out.append(OpCheckpoints(e["op"], e["run"], e["message"], e["tool"], e["state"], before, after))
    return out


def checkpoint_at(sessions: Any, info: Any, message: bytes) -> str | None:
    """The checkpoint of session ``info`` at ``message`` (a message of its history): the last one named by an
    operation asked for at or before it (its after, else its before), or None when no tool changed files
    before it. What ``session diff --at``, a rewind and a fork with code start from."""
    from kxen_agent.session.schema import read

    history = set()
    cur: bytes | None = message
    while cur is not None:
        history.add(cur)
        cur = read(sessions.store, cur, "message").get("parent")
    for o in reversed(session_checkpoints(sessions, info)):
        if o.message in history:
            return o.after or o.before
    return None


def fork_base(sessions: Any, info: Any) -> str | None:
    """Where a session's first checkpoint chains on: the last checkpoint named in its history (for a fork,
    its parent's at the fork point), or None."""
    for o in reversed(session_checkpoints(sessions, info)):
        return o.after or o.before
    return None


def checkpoints_of(repo: Repo, ses: str) -> list[str]:
    """The session's own checkpoint commits, newest first (its first-parent chain up to where it chains onto
    a fork's parent checkpoint or ``HEAD``)."""
    tip = repo.tip(ses)
    if tip is None:
        return []
    own = f"kxen-agent checkpoint: {ses} "
    out: list[str] = []
    for line in repo.git(["log", "--first-parent", "--format=%H %s", tip]).decode("utf-8", "replace").splitlines():
        commit, _, subject = line.partition(" ")
        if not subject.startswith(own):
            break
        out.append(commit)
    return out


def chain_size(repo: Repo, ses: str) -> tuple[int, int]:
    """(count, bytes): the session's own checkpoints (:func:`checkpoints_of`), and the on-disk size of the
    objects they reach that ``HEAD`` does not (what the checkpoints cost the repository)."""
    own = checkpoints_of(repo, ses)
    if not own:
        return 0, 0
    excl = ["--not", "HEAD"] if gitproc.run(["rev-parse", "-q", "--verify", "HEAD"], cwd=repo.root,
                                            env=_IDENT).returncode == 0 else []
    objs = repo.git(["rev-list", "--objects", "--no-object-names", own[0], *excl])
    out = repo.git(["cat-file", "--batch-check=%(objectsize:disk)"], input=objs)
    return len(own), sum(int(x) for x in out.split())


def delete_checkpoint_refs(repo_root: str, sessions: Iterable[str]) -> list[str]:
    """Delete ``refs/kxen/checkpoints/<ses>`` of each of ``sessions`` (pruned sessions) in the repository at
    ``repo_root``; the deleted ref names. Git's own gc then reclaims what only they kept."""
    wanted = set(sessions)
    out = gitproc.run(["for-each-ref", "--format=%(refname)", REF_PREFIX], cwd=repo_root, env=_IDENT)
    if out.returncode != 0:
        return []
    gone = [r for r in out.stdout.decode().split() if r[len(REF_PREFIX):] in wanted]
    if gone:
        script = "".join(f"delete {r}\n" for r in gone).encode()
        p = gitproc.run(["update-ref", "--stdin"], cwd=repo_root, input=script, env=_IDENT, config=_DURABLE)
        if p.returncode != 0:
            raise CheckpointError(f"git update-ref failed in {repo_root}: {p.stderr.decode('utf-8', 'replace').strip()}")
    return gone


@contextlib.contextmanager
def snapshot(repo: Repo, index_path: str, bounds: Bounds) -> Iterator[tuple[str, dict[str, str]]]:
    """``(tree, env)``: the workspace now as a tree, made with a copy of the session's kept index in a
    quarantine; ``env`` lets git read its objects (pass it to :func:`diff`). Nothing stays in the repository:
    no commit, no ref, no object once the block ends."""
    with tempfile.TemporaryDirectory(prefix="kxen-ckpt-") as d, _Quarantine(repo) as q:
        tmp = os.path.join(d, "index")
        if os.path.exists(index_path):
            shutil.copy2(index_path, tmp)
        else:
            Checkpointer(repo, "-", tmp, bounds)._seed_index()
        yield stage(repo, tmp, bounds, env=q.env, config=q.config)[1], q.env


def snapshot_tree(repo: Repo, index_path: str, bounds: Bounds) -> str:
    """The tree id of the workspace now (:func:`snapshot`; its objects are not kept): equal to a checkpoint's
    tree exactly when the workspace holds nothing that checkpoint does not."""
    with snapshot(repo, index_path, bounds) as (tree, _env):
        return tree


def file_at(repo: Repo, commit: str, path: str) -> bytes | None:
    """The bytes of ``path`` (relative to the repository's top) in checkpoint ``commit``; None if it has none
    there or it is not a file."""
    p = gitproc.run(["cat-file", "--batch"], cwd=repo.root, input=f"{commit}:{path}\n".encode("utf-8",
                    "surrogateescape"), env=_IDENT)
    head, _, rest = p.stdout.partition(b"\n")
    parts = head.split()
    if p.returncode != 0 or len(parts) != 3 or parts[1] != b"blob":
        return None
    return rest[: int(parts[2])]


def left_out_of(repo: Repo, commit: str) -> set[str]:
    """The paths (relative to the bound directory) checkpoint ``commit`` lists as left out (§14.14)."""
    msg = repo.git(["log", "-1", "--format=%B", commit]).decode("utf-8", "surrogateescape")
    out = set()
    listing = False
    for line in msg.splitlines():
        if line.startswith("left out ("):
            listing = True
        elif listing and line.startswith("  "):
            out.add(line[2:].rpartition(": ")[0])
    return out


_DIFF_SAFE = ("--no-ext-diff", "--no-textconv")


def diff(repo: Repo, a: str, b: str, *, stat: bool = False, color: bool = False,
         env: Mapping[str, str] | None = None) -> str:
    """``git diff A B`` between two checkpoints (commits or trees), never running the repository's
    configured diff commands (``--no-ext-diff --no-textconv``; :mod:`.gitproc` empties them too)."""
    args = ["diff", *_DIFF_SAFE, "--color=always" if color else "--no-color"]
    if stat:
        args.append("--stat")
    return repo.git([*args, a, b, "--"], cwd=repo.top, env=env).decode("utf-8", "replace")


def numstat(repo: Repo, a: str, b: str) -> list[dict]:
    """The files that differ between ``a`` and ``b``: path, status letter, lines added and deleted (None: binary)."""
    raw = repo.git(["diff", *_DIFF_SAFE, "--no-renames", "--numstat", "-z", a, b, "--"], cwd=repo.top)
    status = repo.git(["diff", *_DIFF_SAFE, "--no-renames", "--name-status", "-z", a, b, "--"], cwd=repo.top)
    st_parts = status.split(b"\0")
    kinds = {st_parts[i + 1].decode("utf-8", "surrogateescape"): st_parts[i].decode()
             for i in range(0, len(st_parts) - 1, 2)}
    out = []
    for item in filter(None, raw.split(b"\0")):
        added, deleted, path = item.split(b"\t", 2)
        p = path.decode("utf-8", "surrogateescape")
        out.append({"path": p, "status": kinds.get(p, "M"),
                    "added": None if added == b"-" else int(added), "deleted": None if deleted == b"-" else int(deleted)})
    return out


# ---------------------------------------------------------------- a session's checkpointer


def for_session(store: Any, sessions: Any, info: Any, policy: Mapping[str, Any]) -> tuple[Checkpointer | None, str | None]:
    """(the checkpointer of session ``info``, None) or (None, why it records none)."""
    why = unavailable_reason(info.workspace, policy)
    if why is not None:
        return None, why
    repo = open_repo(info.workspace, policy)
    cp = Checkpointer(repo, info.id, store.caches.path(INDEX_CACHE, info.group), Bounds.of(policy), io=getattr(store, "io", None))
    if repo.tip(info.id) is None:
        base = fork_base(sessions, info)
        cp.base = base if base is not None and repo.exists(base) else None
    return cp, None


def checkpoint_roots(sessions: Any) -> dict[str, str]:
    """``{ses: repository top}`` of every deleted session bound to a Git workspace: what a gc must read before
    it removes their groups (their metadata, which names the repository, goes with them)."""
    out: dict[str, str] = {}
    for info in sessions.list(include_deleted=True):
        if info.deleted_ns is not None and info.workspace.repo_root is not None:
            out[info.id] = info.workspace.repo_root
    return out


def delete_pruned(roots: Mapping[str, str], removed_groups: Iterable[str]) -> list[str]:
    """Delete the checkpoint refs of the sessions whose groups a gc removed (``sessions/<ses>``), in the
    repositories :func:`checkpoint_roots` named before it; the refs deleted. A repository that is gone or
    fails is skipped: its refs only keep objects, and the next gc is no better placed to find it."""
    by_repo: dict[str, list[str]] = {}
    for group in removed_groups:
        ses = group.partition("/")[2]
        if ses in roots:
            by_repo.setdefault(roots[ses], []).append(ses)
    gone: list[str] = []
    for repo_root, ids in sorted(by_repo.items()):
        if os.path.isdir(repo_root):
            try:
                gone += delete_checkpoint_refs(repo_root, ids)
            except (CheckpointError, gitproc.GitTimeout):
                continue
    return gone
