"""Loose objects: one zstd file per object under ``objects/<2 hex>/<62 hex>``.

Writing follows ``objects_spec.md`` §5: temp file in the object's directory,
fsync, rename, fsync the directory. An object already present is never
rewritten (content addressing makes the old copy as good as the new one);
its mtime is freshened so that gc's grace period counts from the latest
write. Inside :meth:`LooseObjects.batch` the directory fsyncs are deferred
and done once per directory when the batch ends — the one durability
barrier a batch shares; nothing written in a batch may be referenced by a
ref before the batch has ended.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from .fsio import FileIO
from .objects import CorruptObject, ObjectId, RawObject, compress_loose, decompress_loose, parse_object

__all__ = ["LooseObjects"]


class LooseObjects:
    def __init__(self, objects_dir: str, io: FileIO, before_write=None) -> None:
        self.dir = objects_dir
        self.io = io
        self._pending_dirs: set[str] | None = None
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
        name = os.path.basename(os.path.dirname(path)) + os.path.basename(path)
        try:
            oid = bytes.fromhex(name)
        except ValueError:
            raise CorruptObject(path, "file name is not an object id") from None
        raw = decompress_loose(self.io.read(path), path)
        return parse_object(raw, path, expect_id=oid)

    def write(self, obj: RawObject) -> bool:
        """Store ``obj`` durably; return False if it was already there."""
        path = self.path(obj.id)
        if os.path.exists(path):
            try:
                os.utime(path)
            except OSError:
                pass
            return False
        if self._before_write:
            self._before_write()
        d = os.path.dirname(path)
        self.io.makedirs(d)
        tmp = self.io.write_tmp(d, compress_loose(obj.raw))
        try:
            self.io.rename(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        if self._pending_dirs is not None:
            self._pending_dirs.add(d)
        else:
            self.io.fsync_dir(d)
        return True

    @contextmanager
    def batch(self) -> Iterator[None]:
        if self._pending_dirs is not None:  # nested: the outer batch syncs
            yield
            return
        self._pending_dirs = set()
        try:
            yield
            for d in sorted(self._pending_dirs):
                self.io.fsync_dir(d)
        finally:
            self._pending_dirs = None

    def iter_ids(self) -> Iterator[ObjectId]:
        if not os.path.isdir(self.dir):
            return
        for sub in sorted(os.listdir(self.dir)):
            if len(sub) != 2:
                continue
            d = os.path.join(self.dir, sub)
            for name in sorted(os.listdir(d)):
                if len(name) == 62:
                    try:
                        yield bytes.fromhex(sub + name)
                    except ValueError:
                        continue

    def iter_paths(self) -> Iterator[str]:
        """Every file under the fan-out dirs, including strays (fsck names them)."""
        if not os.path.isdir(self.dir):
            return
        for sub in sorted(os.listdir(self.dir)):
            d = os.path.join(self.dir, sub)
            if len(sub) != 2 or not os.path.isdir(d):
                continue
            for name in sorted(os.listdir(d)):
                yield os.path.join(d, name)

    def with_prefix(self, hexprefix: str) -> list[ObjectId]:
        d = os.path.join(self.dir, hexprefix[:2])
        rest = hexprefix[2:]
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            return []
        return [bytes.fromhex(hexprefix[:2] + n) for n in names if len(n) == 62 and n.startswith(rest)]
