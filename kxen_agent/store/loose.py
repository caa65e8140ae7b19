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
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from typing import Iterator

from .fsio import FileIO
from .objects import CorruptObject, ObjectId, RawObject, compress_loose, decompress_loose, parse_object

__all__ = ["LooseObjects"]

_FANOUT_NAME = re.compile(r"[0-9a-f]{2}")
_OBJECT_NAME = re.compile(r"[0-9a-f]{62}")
#: The one other name under ``objects/``, owned by the packs (§12).
PACK_DIR_NAME = "pack"


def _listdir(d: str) -> list[str]:
    try:
        return sorted(os.listdir(d))
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
        # has made durable in its parent: see _barrier.
        self._durable_dirs: set[str] = set()
        self._before_write = before_write

    def path(self, oid: ObjectId) -> str:
        h = oid.hex()
        return os.path.join(self.dir, h[:2], h[2:])

    def has(self, oid: ObjectId) -> bool:
        return os.path.exists(self.path(oid))

    def read_raw(self, oid: ObjectId) -> RawObject | None:
        """The verified object, or None if there is no loose file for it."""
        path = self.path(oid)
        try:
            frame = self.io.read(path)
        except FileNotFoundError:
            return None
        raw = decompress_loose(frame, path)
        return parse_object(raw, path, expect_id=oid)

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
        if os.path.exists(path):
            try:
                os.utime(path)
            except OSError:
                pass
            # Present is not durable: another process may have renamed this
            # file in and not yet fsynced the directory (or died before it
            # did). The caller may name the object in a ref next (§9.3).
            self._barrier(d)
            return False
        if self._before_write:
            self._before_write()
        self.io.makedirs(d)
        tmp = self.io.write_tmp(d, compress_loose(obj.raw))
        try:
            self.io.rename(tmp, path)
        except BaseException:
            try:
                self.io.unlink(tmp)
            except OSError:
                pass
            raise
        self._barrier(d)
        return True

    def _barrier(self, d: str) -> None:
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
        named = [p for p in (d, self.dir) if p not in self._durable_dirs]
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
        try:
            yield
            for d in sorted(self._pending_dirs):
                self.io.fsync_dir(d)
            self._durable_dirs.update(self._pending_named)
        finally:
            self._pending_dirs = None
            self._pending_named = set()

    def _fanout_dirs(self) -> Iterator[tuple[str, str]]:
        for sub in _listdir(self.dir):
            d = os.path.join(self.dir, sub)
            if _FANOUT_NAME.fullmatch(sub) and os.path.isdir(d):
                yield sub, d

    def iter_ids(self) -> Iterator[ObjectId]:
        """Every loose object's id: lower-case names in lower-case fan-out dirs only."""
        for sub, d in self._fanout_dirs():
            for name in _listdir(d):
                if _OBJECT_NAME.fullmatch(name):
                    yield bytes.fromhex(sub + name)

    def scan(self) -> Iterator[tuple[str, ObjectId | None]]:
        """Every entry under ``objects/`` but ``pack/``: its path, and its id or None.

        None marks a stray: a temp file left by a crash, a name that is not
        lower-case hex of the right length, anything that is not a fan-out
        dir (fsck lists them; lookups never see them).
        """
        for sub in _listdir(self.dir):
            d = os.path.join(self.dir, sub)
            if sub == PACK_DIR_NAME:
                continue
            if not (_FANOUT_NAME.fullmatch(sub) and os.path.isdir(d)):
                yield d, None
                continue
            for name in _listdir(d):
                path = os.path.join(d, name)
                yield path, bytes.fromhex(sub + name) if _OBJECT_NAME.fullmatch(name) else None

    def with_prefix(self, hexprefix: str) -> list[ObjectId]:
        """Ids starting with ``hexprefix`` (at least 2 lower-case hex digits)."""
        rest = hexprefix[2:]
        return [
            bytes.fromhex(hexprefix[:2] + n)
            for n in _listdir(os.path.join(self.dir, hexprefix[:2]))
            if _OBJECT_NAME.fullmatch(n) and n.startswith(rest)
        ]
