"""The state directory: its layout, its version, and the object database.

:class:`Store` is the store layer's front door: objects (loose and packed,
read transparently), refs, and the state dir's format file. It knows
nothing of sessions: the namespaces whose directories belong to the
skeleton (§10.3) are given by the layer above (``Store(root,
namespaces=...)``). The state dir is created lazily by the first write, so
read-only commands (``fsck``, ``session list``) never create one. Every
file-system call, reads and metadata included, goes through the store's
:class:`~.fsio.FileIO` (``self.io``); this module never calls ``os`` on a
file itself.
"""

from __future__ import annotations

import hashlib
import os
import re
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Callable, Iterable, Iterator, Protocol

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.statedir import default_state_dir

from .caches import CacheKind, Caches
from .fsio import OS_IO, FileIO
# StoreLock, store_lock and GATE_WAIT_S lived here: imported from .locks,
# their home, so that existing imports from .repo keep working.
from .locks import GATE_WAIT_S, StoreLock, store_lock  # noqa: F401
from .loose import LooseObjects
from .objects import CorruptObject, ObjectId, RawObject, decode_kind, encode_object
from .refs import RefGroupState, RefStore, RefUpdate, validate_namespace
from .step import Step
from .steps import StepLogs
from .salvage import salvage_log

__all__ = [
    "AmbiguousId",
    "FORMAT_VERSION",
    "MissingObject",
    "NAMESPACE_TOPS",
    "ObjectSource",
    "StateDirError",
    "Store",
    "StoreLock",
    "default_state_dir",
    "resolve_object_id",
    "skeleton_dirs",
    "store_lock",
]

FORMAT_VERSION = 4
FORMAT_FILE = "FORMAT"
# The FORMAT file's temporary name while it is being written. A process that
# dies between creating it and renaming it leaves it behind; it must not make
# the otherwise empty directory look foreign (nor may a concurrent first
# writer's temp file).
_FORMAT_TMP_PREFIX = "FORMAT.tmp_"
# A decimal of §1.1: no leading zero (``02`` and ``00002`` are not 2).
_FORMAT_RE = re.compile(rb"kxen-agent-state (0|[1-9][0-9]*)\n")

#: The directories that hold one subdirectory per namespace: a namespace
#: given to :class:`Store` has its ``refs/<ns>``, ``logs/<ns>``,
#: ``locks/<ns>`` and ``leases/<ns>`` made with the skeleton (§10.3); any
#: other namespace's directories are made on first use.
NAMESPACE_TOPS = ("refs", "logs", "locks", "leases", "steps")
#: The settled marker's name in ``locks/`` (§10.3): this prefix, then the state dir's
#: device, inode and status-change time in nanoseconds, in decimal, and the first 16 hex
#: digits of the SHA-256 of its absolute path, joined by ``-``.
SETTLED_PREFIX = "settled-"

_BASE_SKELETON = (
    "objects",
    *(os.path.join("objects", "%02x" % i) for i in range(256)),
    os.path.join("objects", "pack"),
)


def skeleton_dirs(namespaces: Iterable[str] = ()) -> tuple[str, ...]:
    """The directories a version-2 state dir is made with, parents first (§10.3).

    ``objects/``, its fan-out dirs and ``pack/``, and each of
    :data:`NAMESPACE_TOPS` with a subdirectory per namespace in
    ``namespaces`` (the kxen-agent CLI gives its one, ``sessions``). They
    exist, with durable names, before ``FORMAT`` does: a writer never has
    to make their names durable again, which is what lets an object write
    cost two fsyncs (temp file, fan-out dir) instead of up to four.
    """
    if isinstance(namespaces, str):  # would be taken letter by letter
        raise TypeError(f"namespaces is a collection of names: ({namespaces!r},), not {namespaces!r}")
    out = list(_BASE_SKELETON)
    for top in NAMESPACE_TOPS:
        out.append(top)
        out += [os.path.join(top, validate_namespace(ns)) for ns in namespaces]
    return tuple(out)


def _may_be_skeleton(rel: str, allowed: set[str]) -> bool:
    """Whether ``rel`` may be a directory of some unfinished skeleton (§10.3).

    The base skeleton's, or a namespace directory under one of
    :data:`NAMESPACE_TOPS`, whatever the namespace: the first write that
    died may have been made by a store given other namespaces than this
    one, and its leftovers must not make the directory look foreign.
    """
    if rel in allowed:
        return True
    top, sep, ns = rel.partition(os.sep)
    if not sep or top not in NAMESPACE_TOPS:
        return False
    try:
        validate_namespace(ns)
    except UsageError:
        return False
    return True


def _only_skeleton(root: str, io: FileIO) -> bool:
    """True if ``root`` holds nothing but ``FORMAT.tmp_*`` files and empty skeleton dirs.

    That is what a first write that died before renaming ``FORMAT`` in
    leaves: an unfinished empty store, not somebody else's directory.

    A top-down walk that does not follow symlinks, as ``os.walk`` is; the seam
    sees the same reads in the same order as ``io.walk`` plus an ``io.islink``
    of each subdirectory would show it (a stat of each subdirectory, then the
    listing of each, then the same for each in turn), but each directory costs
    one ``scandir`` and one ``lstat`` rather than ``os.walk``'s two ``lstat``
    and path arithmetic: a skeleton has some 270 directories, and a crash
    simulation opens thousands of unfinished state dirs.
    """
    allowed = set(skeleton_dirs())

    def subdirs(rel: str, entries: list[os.DirEntry[str]]) -> list[str] | None:
        """The subdirectories of the directory ``rel`` (``""``: the root) listed as ``entries``;
        None if it holds anything a skeleton does not."""
        names = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows a symlink, as os.walk's does
            except OSError:
                is_dir = False
            if not is_dir:
                if rel or not entry.name.startswith(_FORMAT_TMP_PREFIX):
                    return None
                continue
            names.append(entry.name)
        prefix = rel + os.sep if rel else ""
        for name in names:
            # A symlink to a directory is a directory here (and would not be
            # entered by a walk): the skeleton has no links.
            if not _may_be_skeleton(prefix + name, allowed) or io.islink(entry_path(rel, name)):
                return None
        return [prefix + name for name in names]

    def entry_path(rel: str, name: str) -> str:
        return os.path.join(root, rel, name) if rel else os.path.join(root, name)

    def only_skeleton_under(rel: str, entries: list[os.DirEntry[str]]) -> bool:
        kids = subdirs(rel, entries)
        if kids is None:
            return False
        listed = [io.scandir(os.path.join(root, kid)) for kid in kids]
        return all(only_skeleton_under(kid, kid_entries) for kid, kid_entries in zip(kids, listed))

    try:
        return only_skeleton_under("", io.scandir(root))
    except PermissionError:
        # A directory we cannot list may hold anything: not ours to fill.
        return False
    # Any other error (EIO...) propagates: the directory could not be read,
    # which says nothing about whose it is.


class StateDirError(KxenError):
    """The state directory cannot be used (unknown version, not ours, unreadable)."""


class MissingObject(KxenError):
    """An object is not in this store."""

    def __init__(self, oid_hex: str, where: str) -> None:
        super().__init__(f"object {oid_hex} not found in state dir {where}")
        self.oid_hex = oid_hex


class AmbiguousId(UsageError):
    """An id prefix matches several objects."""


class ObjectSource(Protocol):
    """A read-only source of verified objects (a pack, for example)."""

    def read_raw(self, oid: ObjectId) -> RawObject | None: ...
    def has(self, oid: ObjectId) -> bool: ...
    def iter_ids(self) -> Iterator[ObjectId]: ...
    def with_prefix(self, hexprefix: str) -> list[ObjectId]: ...


class _DiskSteps:
    """How a :class:`~.step.Step` of the disk store holds its group, commits and keeps objects."""

    def __init__(self, store: "Store") -> None:
        self._store = store

    @contextmanager
    def hold(self, group: str, timeout: float | None) -> Iterator[None]:
        # The shared store lock first (gc's prune waits), then the group's:
        # the order every writer takes them in.
        store = self._store
        with store.shared_lock(), store.refs.lock(group, timeout):
            yield

    def commit(self, group: str, updates: list[RefUpdate], reason: str, fence: int | None, new_fence: int | None,
               deleted: Any, objects: list[RawObject]) -> RefGroupState:
        state = self._store.refs.commit_locked(group, updates, reason, fence, new_fence, deleted, objects)
        if self._store._unmarked is not None:
            self._store.mark_settled()
        return state

    def keep(self, objects: list[RawObject]) -> None:
        store = self._store
        with store.shared_lock(), store.loose.batch():
            for o in objects:
                store._put_loose(o)

    def admit(self, obj: RawObject) -> None:
        pass  # the disk store verifies an object each time it reads one

    def read_raw(self, oid: ObjectId) -> RawObject:
        return self._store.read_raw(oid)

    def has(self, oid: ObjectId) -> bool:
        return self._store.has(oid)




def resolve_object_id(text: str, has: Callable[[ObjectId], bool], with_prefix: Callable[[str], Iterable[ObjectId]],
                      where: str) -> ObjectId:
    """Resolve 8 to 64 hex digits to the one object they name (a unique prefix, like git).

    ``has`` and ``with_prefix`` are the object store's; every store resolves
    ids through this one function, so they refuse alike.
    """
    h = text.strip().lower()
    if not _HEX_ID.fullmatch(h):
        raise UsageError(f"{text!r} is not an object id: give 8 to 64 hex digits")
    if len(h) == 64:
        oid = bytes.fromhex(h)
        if not has(oid):
            raise MissingObject(h, where)
        return oid
    found = set(with_prefix(h))
    if not found:
        raise MissingObject(h + "…", where)
    if len(found) > 1:
        raise AmbiguousId(f"object id prefix {h} is ambiguous ({len(found)} objects); give more digits")
    return found.pop()


_HEX_ID = re.compile(r"[0-9a-f]{8,64}")


class Store:
    """Objects and refs of one state directory.

    ``namespaces``: the ref namespaces whose directories the state dir's
    skeleton holds (§10.3), so that their names are durable from the start
    and a writer never syncs their parents; the layer above names them
    (the CLI: ``("sessions",)``, ``kxen_agent.session.sessions.NS``). A
    store given none still reads, writes and checks every namespace: their
    directories are made on first use (§9.1). Open a state dir with the
    same namespaces every time: fsck reports a missing skeleton directory
    of a namespace given here as damage. ``caches``: the kinds of derived
    cache (:class:`~.caches.CacheKind`) whose files fsck checks with their
    hooks (``store.caches``).
    """

    def __init__(self, root: str, io: FileIO = OS_IO, lock_timeout: float = 30.0, *,
                 namespaces: Iterable[str] = (), caches: Iterable[CacheKind] = ()) -> None:
        self.root = os.path.abspath(root)
        self.io = io
        if isinstance(namespaces, str):  # would be taken letter by letter
            raise TypeError(f"namespaces is a collection of names: namespaces=({namespaces!r},), not {namespaces!r}")
        self.namespaces: tuple[str, ...] = tuple(validate_namespace(ns) for ns in namespaces)
        self._initialized = False
        # Set once this instance may write with no more setup: it made the
        # state dir, or it found one and synced the names it relies on.
        self._writable = False
        # The settled marker (§10.3) this instance's fsyncs earned, left by mark_settled.
        self._unmarked: str | None = None
        self.format_version = 0
        self.loose = LooseObjects(os.path.join(self.root, "objects"), io, before_write=self.ensure_initialized)
        self.lock_timeout = lock_timeout
        #: The step logs of every group (§6.8): the store's, read by its
        #: object reads and by its ref store alike.
        self.steps = StepLogs(self.root, io)
        self.steps.salvager = salvage_log  # a damaged log's records that check still serve their objects (§18.1)
        #: The derived caches (§11a): placed, removed with their group, and checked by fsck (``caches``: the kinds).
        self.caches = Caches(self.root, io, caches)
        self._steps_engine = _DiskSteps(self)
        self.refs = RefStore(self.root, io, self.steps, lock_timeout, before_write=self.ensure_initialized,
                             open_step=self._transaction_step, removed=self.caches.remove)
        self._check_access()
        self._check_format()
        self.packs: list[ObjectSource] = []
        self._hot_pack: ObjectSource | None = None  # the pack that answered the last packed read
        # Sources read like packs but not listed in objects/pack (an import's
        # staged pack, before its index is committed): kept across reloads.
        self._pinned: list[ObjectSource] = []
        self._load_packs()

    @classmethod
    def open(cls, root: str | None = None, **kw: Any) -> "Store":
        """The store of ``root``, or of :func:`default_state_dir`; ``kw`` as for :class:`Store`."""
        return cls(root or default_state_dir(), **kw)

    def skeleton_dirs(self) -> tuple[str, ...]:
        """This store's skeleton: :func:`skeleton_dirs` of its :attr:`namespaces`."""
        return skeleton_dirs(self.namespaces)

    # ------------------------------------------------------------ format file

    def _check_access(self) -> None:
        """Refuse another user's state dir; learn its mode (§10.4, :mod:`.access`)."""
        from .access import AccessRefused, check_state_dir, wants_shared

        try:
            shared = check_state_dir(self.root, self.io)
            if shared or (shared is None and wants_shared()):
                self.io.share(self.root)  # a missing one is made shared by its first write
        except AccessRefused as e:
            raise StateDirError(str(e)) from None

    def _check_format(self) -> None:
        path = os.path.join(self.root, FORMAT_FILE)
        try:
            data = self.io.read(path)
        except FileNotFoundError:
            io = self.io
            if io.isdir(self.root) and not _only_skeleton(self.root, io):
                if io.exists(path):  # a concurrent first writer just created it
                    return self._check_format()
                raise StateDirError(
                    f"{self.root} is not empty and is not a kxen-agent state dir (no {FORMAT_FILE} file); "
                    "point KXEN_AGENT_STATE_DIR at an empty or new directory"
                ) from None
            if io.exists(self.root) and not io.isdir(self.root):
                raise StateDirError(f"state dir {self.root} exists and is not a directory")
            return
        except OSError as e:
            raise StateDirError(f"cannot read {path}: {e.strerror}") from None
        m = _FORMAT_RE.fullmatch(data)
        if not m:
            raise StateDirError(f"{path} is not a kxen-agent format file")
        version = int(m.group(1))
        if version > FORMAT_VERSION:
            raise StateDirError(
                f"state dir {self.root} has format version {version}, newer than this kxen-agent "
                f"understands ({FORMAT_VERSION}); upgrade kxen-agent"
            )
        if version < 1:
            raise StateDirError(f"{path}: unknown format version {version}")
        self.format_version = version
        self._initialized = True
        if version >= 2:
            self._trust_skeleton()

    @property
    def exists(self) -> bool:
        return self._initialized

    def ensure_initialized(self) -> None:
        """Create the state dir on first write: its skeleton, then FORMAT (§10.3).

        Also upgrades an older state dir the first time this version writes
        to it (§10.2): version 1 made its skeleton lazily; version 3's step
        logs are of step-log version 1, which this version reads but, as
        FORMAT 4 says to older binaries, writes as version 2 (§6.8): FORMAT
        goes first, so an older kxen-agent refuses the dir as too new
        rather than calling a version-2 log damaged.
        """
        if self._writable:
            return
        if not self._initialized:
            self.io.makedirs(self.root)
            # Refuses a foreign non-empty directory; finds a FORMAT that a
            # concurrent first writer has just put in.
            self._check_format()
        if self._initialized and self.format_version >= FORMAT_VERSION:
            # FORMAT was found, not made here: its name (and with it the
            # skeleton's top names), and the state dir's own name, may be
            # those of a creator whose last fsyncs failed or never ran; a
            # write must not build on them (§9.3 rules 3 and 8). Once per
            # store instance, unless the settled marker of the state dir as
            # it is now says an earlier instance's fsyncs returned.
            self._settle_root(creating=False)
            marker = self._settled_marker()
            if marker is None or not self.io.lexists(marker):
                self.io.fsync_dir(self.root)
                self.io.fsync_dir(os.path.dirname(self.root) or ".")
                self._unmarked = marker
            self._writable = True
            return
        self._settle_root(creating=True)
        self._make_skeleton()
        path = os.path.join(self.root, FORMAT_FILE)
        tmp = self.io.write_tmp(
            self.root, b"kxen-agent-state %d\n" % FORMAT_VERSION, prefix=_FORMAT_TMP_PREFIX
        )
        self.io.rename_into_place(tmp, path)
        self.io.fsync_dir(self.root)
        # The state dir's own name must be durable too: an earlier
        # attempt may have made it and failed before syncing its parent.
        self.io.fsync_dir(os.path.dirname(self.root) or ".")
        self.format_version = FORMAT_VERSION
        self._initialized = True
        self._writable = True
        self._trust_skeleton()
        self._unmarked = self._settled_marker()

    def _settled_marker(self) -> str | None:
        """The settled marker's path for the state dir as it is now (§10.3).

        ``locks/settled-<dev>-<ino>-<ctime>-<path>``: named by the state
        dir's device, inode and status-change time and its path's digest,
        so a rename, move or copy of the state dir, or any change of its
        top directory (a new ``FORMAT``), names another marker. None if
        the state dir cannot be stat-ed (the fsyncs then run, and say why).
        """
        try:
            st = self.io.stat(self.root)
        except OSError:
            return None
        where = hashlib.sha256(os.fsencode(self.root)).hexdigest()[:16]
        return os.path.join(self.root, "locks", f"{SETTLED_PREFIX}{st.st_dev}-{st.st_ino}-{st.st_ctime_ns}-{where}")

    def mark_settled(self) -> None:
        """Leave the settled marker this instance's fsyncs of rules 3 and 8 earned (§9.3), if not done yet.

        Called after the instance's first committed step (``_DiskSteps``):
        a command that writes nothing (a refused import, a dry run) leaves
        the state dir as it found it. The marker is named by the ``stat``
        taken before those fsyncs (``_unmarked``): an empty file, never
        fsynced, since it only says that they returned, which stays true
        whether or not a crash keeps it; a lost marker costs the next
        instance the two fsyncs and nothing else. Best effort: a failure to
        leave it changes nothing else.
        """
        marker, self._unmarked = self._unmarked, None
        if marker is None:
            return
        try:
            self.io.ensure_file(marker)
        except OSError:
            pass

    def _settle_root(self, *, creating: bool) -> None:
        """Give the root its §10.4 mode (a dir made by hand, or 0755 by an older kxen-agent)."""
        from .access import root_mode

        mode = root_mode(self.root, self.io, shared=self.io.is_shared(self.root), creating=creating)
        if mode is not None:
            self.io.chmod(self.root, mode)

    def _make_skeleton(self) -> None:
        """Make every skeleton directory, then fsync each parent once (§10.3).

        Directories found existing get their parent synced as well: they
        may come from a writer that died between its ``mkdir`` and that
        fsync, or from a version-1 dir's lazy creation (§9.1).
        """
        parents: set[str] = set()
        for rel in self.skeleton_dirs():
            d = os.path.join(self.root, rel)
            try:
                self.io.mkdir(d)
            except FileExistsError:
                raise StateDirError(
                    f"{d} is in the way of a directory of the state dir's skeleton; "
                    "move it out of the state dir, then retry"
                ) from None
            parents.add(os.path.dirname(d))
        # Deepest first, so that each directory's own contents are synced
        # before the entry naming it is; one barrier would do as well, the
        # order only makes the trace easy to read.
        for p in sorted(parents, key=lambda p: (-p.count(os.sep), p)):
            self.io.fsync_dir(p)

    def _trust_skeleton(self) -> None:
        """Tell the writers that the skeleton's names are durable (§9.1, §10.3)."""
        root = self.root
        self.loose.trust_skeleton()
        dirs = []
        for top in ("refs", "logs", "steps"):
            dirs.append(os.path.join(root, top))
            dirs += [os.path.join(root, top, ns) for ns in self.namespaces]
        self.refs.trust_dirs(dirs)

    # ------------------------------------------------------------ packs

    @property
    def pack_dir(self) -> str:
        return os.path.join(self.root, "objects", "pack")

    def pack_writer(self, dictionary: bytes | None = None):
        """A :class:`~.pack.PackWriter` into this store's ``objects/pack``."""
        from .pack import PackWriter

        self.ensure_initialized()
        # objects/pack is in the skeleton: its name and objects/'s are durable.
        return PackWriter(self.pack_dir, self.io, dictionary)

    def _load_packs(self) -> None:
        """Open every pack whose index is in place (the index is the commit point).

        A pack already open is kept (its mapping stays valid even if gc
        unlinks it); one that vanished between listing and opening (gc
        removed it) is skipped; one that does not open is kept as a
        :class:`~.pack.BrokenPack` so fsck names it and reads go on.
        """
        old = {getattr(p, "path", id(p)): p for p in self.packs if p not in self._pinned}
        try:
            names = sorted(self.io.listdir(self.pack_dir))
        except FileNotFoundError:
            names = []
        if not old and not any(n.startswith("pack-") and n.endswith(".idx") for n in names):
            self.packs = list(self._pinned)
            self._hot_pack = None
            return  # no pack: the pack code is not even imported (the CLI's start-up)
        from .pack import BadPack, BrokenPack, PackReader

        packs: list[ObjectSource] = []
        for name in names:
            if not (name.startswith("pack-") and name.endswith(".idx")):
                continue
            base = os.path.join(self.pack_dir, name[:-4])
            kept = old.pop(base + ".pack", None)
            if kept is not None and not isinstance(kept, BrokenPack):
                packs.append(kept)
                continue
            try:
                packs.append(PackReader.open(base, io=self.io))
            except FileNotFoundError:
                continue
            except (BadPack, OSError, ValueError) as e:
                err = e if isinstance(e, BadPack) else BadPack(base + ".idx", f"cannot open: {e}")
                packs.append(BrokenPack(base + ".pack", err, io=self.io))
        for p in old.values():
            close = getattr(p, "close", None)
            if close:
                close()
        self.packs = packs + self._pinned
        self._hot_pack = None

    def reload_packs(self) -> None:
        """See packs written or removed by other processes since the last look."""
        self._load_packs()

    @contextmanager
    def pinned_source(self, source: ObjectSource) -> Iterator[None]:
        """Read objects from ``source`` too for the block (an import's staged pack)."""
        self._pinned.append(source)
        self.packs.append(source)
        try:
            yield
        finally:
            self._pinned.remove(source)
            if source in self.packs:
                self.packs.remove(source)
            if self._hot_pack is source:  # an aborted import's staged pack must answer nothing more
                self._hot_pack = None

    # ------------------------------------------------------------ objects

    def put(self, kind: str, value: Any) -> ObjectId:
        """Store ``value`` as an object of ``kind``; return its id."""
        obj = encode_object(kind, value)
        self.put_raw(obj)
        return obj.id

    def put_raw(self, obj: RawObject) -> bool:
        """Store ``obj``; False if it was already there (its copy is freshened).

        Holds the shared store lock (:meth:`shared_lock`), so gc's prune
        never runs in the middle of a write. The objects of a durable step
        go in the step instead (:meth:`step`): one record, one fsync.
        """
        with self.shared_lock():
            return self._put_loose(obj)

    def _put_loose(self, obj: RawObject) -> bool:
        if self.steps.has(obj.id) and self._in_live_log(obj.id):
            # Held by a committed step record: present, and made durable
            # before any ref may name it (§9.3 rule 12), not copied.
            self.steps.make_durable(obj.id)
            return False
        for p in self.packs:
            if p.has(obj.id):
                if self._freshen(p):
                    # Found is not durable: the pack's index may have been
                    # renamed in by a writer that failed before its fsync.
                    self.sync_pack_dir_once()
                    return False
                break  # the pack was removed by gc: write a loose copy
        return self.loose.write(obj)

    def _in_live_log(self, oid: ObjectId) -> bool:
        """Whether the step log holding ``oid`` is one its group reads: a stale or leftover log is
        replaced by that group's next write, so its copy does not count as present (§6.9 question 8)."""
        log = self.steps.where(oid)
        try:
            return log is not None and self.refs.read_with_log(log.group)[1] is log
        except KxenError:
            return False

    def sync_pack_dir_once(self) -> None:
        """fsync ``objects/pack`` once per Store: names found there become durable."""
        if not getattr(self, "_pack_dir_synced", False) and self.io.isdir(self.pack_dir):
            self.io.fsync_dir(self.pack_dir)
            self._pack_dir_synced = True

    def _freshen(self, pack: ObjectSource) -> bool:
        # As git does: an object written again restarts gc's grace period,
        # here by touching the pack that holds it (the loose store touches
        # the file). Without this, gc could prune an unreachable packed
        # object that a writer just "wrote" and is about to reference.
        path = getattr(pack, "path", None)
        if path is None:
            return True
        try:
            self.io.utime(path)
            return True
        except OSError:
            return False

    def batch(self):
        """Share one durability barrier among many :meth:`put` calls (§5.3)."""
        return self.loose.batch()

    def read_raw(self, oid: ObjectId) -> RawObject:
        # Packs first (Git's order): an index lookup costs no system call,
        # while a failed open of a loose name costs one per packed object.
        # A corrupt copy is passed over while another copy is good (fsck
        # still checks, and names, every copy); if none is, the first
        # error found is raised.
        obj, err = self._read_packed(oid, None)
        if obj is not None:
            return obj
        steps = self.steps
        obj, err = self._read_stepped(oid, err)
        if obj is not None:
            return obj
        try:
            obj = self.loose.read_raw(oid)
        except CorruptObject as e:
            raise (err or e) from None
        if obj is not None:
            return obj
        # Another process may have committed it in a step log since we
        # read them, or gc may have packed it since we listed packs.
        steps.scan_all()
        obj, err = self._read_stepped(oid, err)
        if obj is not None:
            return obj
        if self.io.isdir(self.pack_dir):
            self.reload_packs()
            obj, err = self._read_packed(oid, err)
            if obj is not None:
                return obj
        if err is not None:
            raise err
        raise MissingObject(oid.hex(), self.root)

    def _read_stepped(self, oid: ObjectId, err: CorruptObject | None) -> tuple[RawObject | None, CorruptObject | None]:
        """The object from the step logs this instance has read, and the first error met (or ``err``)."""
        try:
            return self.steps.read_raw(oid), err
        except CorruptObject as e:
            return None, err or e

    def _read_packed(self, oid: ObjectId, err: CorruptObject | None) -> tuple[RawObject | None, CorruptObject | None]:
        """The object from the first pack with a good copy, and the first error met (or ``err``)."""
        # The pack that answered last is asked first (Git's most-recently-used
        # order): a history lives mostly in one pack, and every other pack
        # asked first costs a lookup per object — a resume through two packs
        # paid twice. Kept beside the list, never moved within it, so that a
        # reader in another thread never sees a pack missing from it.
        hot = self._hot_pack
        if hot is not None:
            try:
                obj = hot.read_raw(oid)
            except CorruptObject as e:
                err, obj = err or e, None
            if obj is not None:
                return obj, err
        for p in self.packs:
            if p is hot:
                continue
            try:
                obj = p.read_raw(oid)
            except CorruptObject as e:
                err = err or e
                continue
            if obj is not None:
                self._hot_pack = p
                return obj, err
        return None, err

    def get(self, oid: ObjectId, kind: str | None = None) -> Any:
        """The decoded value of object ``oid``, checking its kind if given."""
        return decode_kind(self.read_raw(oid), kind)

    def has(self, oid: ObjectId) -> bool:
        # Open packs first (an index lookup, no syscall): same answer either way.
        if any(p.has(oid) for p in self.packs) or self.steps.has(oid) or self.loose.has(oid):
            return True
        # Committed by another process since this one read the step logs?
        self.steps.scan_all()
        return self.steps.has(oid)

    def iter_ids(self) -> Iterator[ObjectId]:
        """Every object id, each once (an object may be both loose and packed)."""
        seen: set[ObjectId] = set()
        for oid in self.loose.iter_ids():
            seen.add(oid)
            yield oid
        for p in self.packs:
            for oid in p.iter_ids():
                if oid not in seen:
                    seen.add(oid)
                    yield oid
        self.steps.scan_all()
        for oid in self.steps.iter_ids():
            if oid not in seen:
                seen.add(oid)
                yield oid

    def resolve(self, text: str) -> ObjectId:
        """An object id from 8 to 64 hex digits (a unique prefix, like git)."""
        return resolve_object_id(text, self.has, self._with_prefix, self.root)

    def _with_prefix(self, h: str) -> set[ObjectId]:
        found = set(self.loose.with_prefix(h))
        self.steps.scan_all()
        found.update(self.steps.with_prefix(h))
        for p in self.packs:
            found.update(p.with_prefix(h))
        return found

    # ------------------------------------------------------------ steps and locks

    def step(self, group: str, *, fence: int | None = None, fail: str = "drop",
             timeout: float | None = None) -> Step:
        """A durable step of ``group`` (:class:`~.step.Step`): its objects and ref change, committed as one record.

        ``with store.step(g) as step:`` holds the shared store lock and the
        group's lock for the block (read, decide, write); ``timeout`` is the
        wait for the group's lock (default: the store's).
        """
        return Step(self._steps_engine, group, fence=fence, fail=fail, timeout=timeout)

    def shared_lock(self, timeout: float | None = None) -> AbstractContextManager[None]:
        """Hold the store's shared lock (a writer): gc's prune waits. Creates the state dir. Re-entrant."""
        self.ensure_initialized()
        return store_lock(self.root).shared(self.lock_timeout if timeout is None else timeout, self.io)

    def _transaction_step(self, group: str, fence: int | None) -> Step:
        """The step ``refs.transaction`` commits with (entered there)."""
        return self.step(group, fence=fence)

    @contextmanager
    def pruning(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the store's lock exclusively: no writer holds :meth:`shared_lock` or is in a step (gc)."""
        self.ensure_initialized()
        with store_lock(self.root).exclusive(self.lock_timeout if timeout is None else timeout, self.io):
            yield

    @contextmanager
    def lock_group(self, group: str, timeout: float | None = None):
        with self.refs.lock(group, timeout):
            yield
