"""Loose objects: one zstd file per object under ``objects/<2 hex>/<62 hex>``.

Writing follows ``objects_spec.md`` §5: temp file in the object's directory,
fsync, rename, fsync the directory. An object already present is never
rewritten (content addressing makes the old copy as good as the new one);
its mtime is freshened so that gc's grace period counts from the latest
write, and its name is made durable all the same (a file another process
has just renamed in looks exactly like a durable one, §9.3). Inside
:meth:`LooseObjects.batch` the directory fsyncs are deferred and done once
per directory when the batch ends — the one durability barrier a batch
shares; nothing written in a batch may be referenced by a ref before the
batch has ended.

Only lower-case names are objects: ``objects/<2 hex>/<62 hex>``. Anything
else under ``objects/`` (besides ``pack/``, §12) is a stray file that
lookups never see and that fsck lists (:meth:`LooseObjects.scan`).

Every file-system call — reads, ``stat``, listings, and the ``utime`` that
freshens an object — goes through the store's :class:`~.fsio.FileIO`;
nothing here calls ``os`` on a file.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from os import stat_result
from typing import Iterator

from .fsio import FileIO
from .objects import CorruptObject, ObjectId, RawObject, compress_loose, decompress_loose, parse_object

__all__ = ["LooseObjects"]

_FANOUT_NAME = re.compile(r"[0-9a-f]{2}")
_OBJECT_NAME = re.compile(r"[0-9a-f]{62}")
#: The one other name under ``objects/``, owned by the packs (§12).
PACK_DIR_NAME = "pack"


#: At most this many ids are remembered as made durable (then the set restarts).
_DURABLE_IDS_MAX = 100_000


def _identity(st: stat_result) -> tuple[int, int, int]:
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def _listdir(io: FileIO, d: str) -> list[str]:
    try:
        return sorted(io.listdir(d))
    except (FileNotFoundError, NotADirectoryError):
        return []


class LooseObjects:
    def __init__(self, objects_dir: str, io: FileIO, before_write=None) -> None:
        self.dir = objects_dir
        self.io = io
        # Directories to fsync at the end of the current batch (None: no
        # batch), and the directories whose own names become durable then.
        self._pending_dirs: set[str] | None = None
        self._pending_named: set[str] = set()
        # Directories (a fan-out dir, objects/) whose own name this instance
        # has made durable in its parent: see barrier.
        self._durable_dirs: set[str] = set()
        self._skeleton = False  # see trust_skeleton
        # Objects whose name this instance has made durable (its barrier, or
        # its batch's, has passed): id -> (st_dev, st_ino, st_mtime_ns) of
        # the file then. Found present again with the same identity, the
        # name needs no new directory fsync (§9.3 rule 4 asks it only of a
        # file someone else may have renamed in). Bounded: cleared past
        # _DURABLE_IDS_MAX. Ids written in the current batch wait in
        # _pending_ids until its barrier has run.
        self._durable_ids: dict[ObjectId, tuple[int, int, int]] = {}
        self._pending_ids: dict[ObjectId, tuple[int, int, int] | None] = {}
        self._before_write = before_write
        #: New loose files this instance has written (automatic packing counts with it, :mod:`.autopack`).
        self.written = 0

    def path(self, oid: ObjectId) -> str:
        h = oid.hex()
        return f"{self.dir}{os.sep}{h[:2]}{os.sep}{h[2:]}"  # os.path.join, without its per-call checks

    def has(self, oid: ObjectId) -> bool:
        return self.io.exists(self.path(oid))

    def read_raw(self, oid: ObjectId) -> RawObject | None:
        """The verified object, or None if there is no loose file for it."""
        path = self.path(oid)
        try:
            frame = self.io.read(path)
        except FileNotFoundError:
            return None
        raw = decompress_loose(frame, path)
        return parse_object(raw, path, expect_id=oid)

    def read_named(self, path: str, oid: ObjectId) -> RawObject:
        """Read and verify the object at ``path``, which :meth:`scan` named ``oid`` (fsck)."""
        return parse_object(decompress_loose(self.io.read(path), path), path, expect_id=oid)

    def read_path(self, path: str) -> RawObject:
        """Read and verify the object stored at ``path`` (fsck)."""
        sub, name = os.path.basename(os.path.dirname(path)), os.path.basename(path)
        if not (_FANOUT_NAME.fullmatch(sub) and _OBJECT_NAME.fullmatch(name)):
            raise CorruptObject(path, "file name is not an object id")
        raw = decompress_loose(self.io.read(path), path)
        return parse_object(raw, path, expect_id=bytes.fromhex(sub + name))

    def write(self, obj: RawObject) -> bool:
        """Store ``obj`` durably; return False if it was already there."""
        path = self.path(obj.id)
        d = os.path.dirname(path)
        try:
            st = self.io.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if st is not None:
            try:
                self.io.utime(path)  # restarts gc's grace period for this object
            except OSError:
                pass
            known = self._durable_ids.get(obj.id)
            if known is not None and known == _identity(st):
                # This instance made this very file's name durable and it has
                # not been unlinked since: a name is only unlinked by gc under
                # the exclusive store lock, and a file put back after that is
                # a new inode or has a newer mtime (it was pruned for being
                # older than the grace period's cutoff). A rename of another
                # copy over the durable name leaves the name durable (old or
                # new inode, both complete). Nothing to sync again.
                self._remember(obj.id, self._identity_of(path))
                return False
            # Present is not durable: another process may have renamed this
            # file in and not yet fsynced the directory (or died before it
            # did). The caller may name the object in a ref next (§9.3).
            ident = self._identity_of(path)  # the file whose name the barrier makes durable
            self.barrier(d)
            self._made_durable(obj.id, ident)
            return False
        if self._before_write:
            self._before_write()
        self.io.makedirs(d)
        self.io.rename_into_place(self.io.write_tmp(d, compress_loose(obj.raw)), path)
        self.written += 1
        ident = self._identity_of(path)  # taken before the barrier: the file it makes durable
        self.barrier(d)
        self._made_durable(obj.id, ident)
        return True

    def _identity_of(self, path: str) -> tuple[int, int, int] | None:
        try:
            return _identity(self.io.stat(path))
        except OSError:
            return None

    def _made_durable(self, oid: ObjectId, ident: tuple[int, int, int] | None) -> None:
        """``oid``'s name is durable now, or once the current batch's barrier has run."""
        if self._pending_dirs is not None:
            self._pending_ids[oid] = ident
        else:
            self._remember(oid, ident)

    def _remember(self, oid: ObjectId, ident: tuple[int, int, int] | None) -> None:
        if ident is None:
            self._durable_ids.pop(oid, None)
            return
        if len(self._durable_ids) >= _DURABLE_IDS_MAX and oid not in self._durable_ids:
            self._durable_ids.clear()
        self._durable_ids[oid] = ident

    def trust_skeleton(self) -> None:
        """``objects/`` and every fan-out dir have durable names (a version-2 state dir, §10.3).

        A fan-out dir removed by hand is remade by ``makedirs``, which
        syncs its parent, so the promise holds for every one of them.
        """
        self._skeleton = True

    def barrier(self, d: str) -> None:
        """Make a name in fan-out dir ``d`` durable: now, or at the end of the batch.

        That is an fsync of ``d``, and — the first time this instance uses
        ``d`` — of ``objects/`` and of the state dir, for the names of ``d``
        and of ``objects/``. ``makedirs`` syncs the parent of a directory it
        creates, but a directory found existing may have been made by
        another process that has not synced its parent yet, or died before
        it did; and "I made it" cannot be told from "I lost the race to
        make it". Syncing once per directory settles both (§9.1); a
        directory with nothing unsynced is cheap to fsync.
        """
        dirs = [d]
        named = [] if self._skeleton else [p for p in (d, self.dir) if p not in self._durable_dirs]
        dirs += [os.path.dirname(p) for p in named]
        if self._pending_dirs is not None:
            self._pending_dirs.update(dirs)
            self._pending_named.update(named)
            return
        for x in dirs:
            self.io.fsync_dir(x)
        self._durable_dirs.update(named)

    @contextmanager
    def batch(self) -> Iterator[None]:
        if self._pending_dirs is not None:  # nested: the outer batch syncs
            yield
            return
        self._pending_dirs = set()
        self._pending_named = set()
        self._pending_ids = {}
        try:
            yield
            for d in sorted(self._pending_dirs):
                self.io.fsync_dir(d)
            self._durable_dirs.update(self._pending_named)
            for oid, ident in self._pending_ids.items():  # the barrier has run: durable now
                self._remember(oid, ident)
        finally:
            self._pending_dirs = None
            self._pending_named = set()
            self._pending_ids = {}

    def _fanout_dirs(self) -> Iterator[tuple[str, str]]:
        for sub in _listdir(self.io, self.dir):
            d = os.path.join(self.dir, sub)
            if _FANOUT_NAME.fullmatch(sub) and self.io.isdir(d):
                yield sub, d

    def iter_ids(self) -> Iterator[ObjectId]:
        """Every loose object's id: lower-case names in lower-case fan-out dirs only."""
        for sub, d in self._fanout_dirs():
            for name in _listdir(self.io, d):
                if _OBJECT_NAME.fullmatch(name):
                    yield bytes.fromhex(sub + name)

    def scan(self) -> Iterator[tuple[str, ObjectId | None]]:
        """Every entry under ``objects/`` but ``pack/``: its path, and its id or None.

        None marks a stray: a temp file left by a crash, a name that is not
        lower-case hex of the right length, anything that is not a fan-out
        dir (fsck lists them; lookups never see them).
        """
        for sub in _listdir(self.io, self.dir):
            d = os.path.join(self.dir, sub)
            if sub == PACK_DIR_NAME:
                continue
            if not (_FANOUT_NAME.fullmatch(sub) and self.io.isdir(d)):
                yield d, None
                continue
            prefix = d + os.sep
            for name in _listdir(self.io, d):
                yield prefix + name, bytes.fromhex(sub + name) if _OBJECT_NAME.fullmatch(name) else None

    def with_prefix(self, hexprefix: str) -> list[ObjectId]:
        """Ids starting with ``hexprefix`` (at least 2 lower-case hex digits)."""
        rest = hexprefix[2:]
        return [
            bytes.fromhex(hexprefix[:2] + n)
            for n in _listdir(self.io, os.path.join(self.dir, hexprefix[:2]))
            if _OBJECT_NAME.fullmatch(n) and n.startswith(rest)
        ]


class LooseNames:
    """Which of many expected objects (an import's) the store holds as loose files, with few system calls.

    The first lookup in a fan-out directory lists it, unless it holds more
    than a few times the names expected to be looked up there (then each
    lookup is a ``stat``, as ``LooseObjects.has``): importing into a new or
    small store costs one listing per directory instead of a ``stat`` per
    object. The answer is the directory as it was when listed; an object
    another process writes later is then staged again, a harmless second
    copy (nothing removes loose objects meanwhile: that is gc's, under the
    exclusive store lock, and import holds it shared).
    """

    #: A fan-out dir is listed if it holds at most max(MIN_CAP, PER_LOOKUP x
    #: the lookups expected in it) names: listing costs about that many stats.
    #: At most MAX_CAP, whatever the (unchecked yet) header declares: memory
    #: holds at most 256 x MAX_CAP names.
    MIN_CAP = 256
    PER_LOOKUP = 8
    MAX_CAP = 4096

    def __init__(self, loose: LooseObjects, objects: int) -> None:
        self.loose = loose
        self.cap = min(self.MAX_CAP, max(self.MIN_CAP, self.PER_LOOKUP * (objects // 256 + 1)))
        self.names: dict[str, frozenset[str] | None] = {}  # fan-out name -> its entries, or None: stat

    def has(self, oid: ObjectId) -> bool:
        h = oid.hex()
        try:
            names = self.names[h[:2]]
        except KeyError:
            names = self._list(h)
        if names is None:
            return self.loose.has(oid)
        return h[2:] in names

    def _list(self, h: str) -> frozenset[str] | None:
        names: frozenset[str] | None = None
        try:
            # One entry past the cap is enough to know the directory is too big to list.
            entries = self.loose.io.scandir(os.path.join(self.loose.dir, h[:2]), limit=self.cap + 1)
            if len(entries) <= self.cap:
                names = frozenset(e.name for e in entries)
        except FileNotFoundError:
            names = frozenset()
        except OSError:
            names = None
        self.names[h[:2]] = names
        return names
