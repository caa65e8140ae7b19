"""Writing a pack durably: :class:`PackWriter`, :class:`SealedPack`, :class:`PackInfo`.

Owns the file steps of ``objects_spec.md`` §12.3 around the bytes that
:class:`~.stream.PackStream` encodes: a temp file in ``objects/pack``,
appended in MiB pieces, fsynced, renamed to ``pack-<trailer>.pack``, then
the index written and renamed last (the index is the commit point), each
name made durable by a directory fsync. Every step goes through a
:class:`~kxen_agent.store.fsio.FileIO`, so traces, crash simulation and
fault injection see all of them.

It must never encode pack bytes itself (that is :mod:`.stream` and
:mod:`.format`) nor call ``os`` or ``open`` for a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..fsio import FileIO
from ..objects import ObjectId, RawObject
from .compress import COMPRESSION_LEVEL
from .reader import PackReader
from .stream import _FLUSH, PackStream

__all__ = ["PackInfo", "PackWriter", "SealedPack"]


@dataclass(frozen=True)
class PackInfo:
    """A committed pack: its name (the trailer in hex) and its files."""

    name: str
    pack_path: str
    idx_path: str
    count: int
    size: int


class PackWriter:
    """Write a pack into ``objects/pack`` durably; the index goes in last.

    Use as a context manager: leaving the block by an exception removes the
    temporary file. :meth:`seal` finishes the file (still invisible);
    :meth:`SealedPack.commit` renames it and its index into place.
    """

    def __init__(self, pack_dir: str, io: FileIO, dictionary: bytes | None = None, level: int = COMPRESSION_LEVEL,
                 *, parents: Sequence[str] = ()) -> None:
        self.dir = pack_dir
        self.io = io
        # Directories above pack_dir whose names must be durable before the
        # index names the pack (the state dir's "directories found existing"
        # rule, objects_spec.md §9.1): objects/ and the state dir.
        self.parents = tuple(parents)
        io.makedirs(pack_dir)
        self.tmp = io.write_tmp(pack_dir, b"", sync=False, prefix="tmp_pack_")
        self._buf = bytearray()
        self._done = False
        self.stream = PackStream(self._write, dictionary, level)

    def _write(self, b: bytes | memoryview) -> None:
        if len(b) >= _FLUSH:
            self._flush()
            self.io.append(self.tmp, b, sync=False)
            return
        self._buf += b
        if len(self._buf) >= _FLUSH:
            self._flush()

    def _flush(self) -> None:
        if self._buf:
            self.io.append(self.tmp, bytes(self._buf), sync=False)
            self._buf.clear()

    @property
    def count(self) -> int:
        return self.stream.count

    @property
    def dictionary(self) -> bytes | None:
        return self.stream.dictionary

    def __contains__(self, oid: ObjectId) -> bool:
        return oid in self.stream

    def add(self, obj: RawObject) -> bool:
        return self.stream.add(obj)

    def add_entry(self, head: bytes | memoryview, stored: bytes | memoryview) -> bool:
        return self.stream.add_entry(head, stored)

    def add_many(self, objs: Iterable[RawObject]) -> int:
        return self.stream.add_many(objs)

    def add_checked_entry(self, head: bytes, stored: bytes | memoryview, oid: ObjectId, raw_len: int, crc: int) -> bool:
        return self.stream.add_checked_entry(head, stored, oid, raw_len, crc)

    def seal(self) -> "SealedPack":
        """Finish and fsync the temporary pack; nothing is visible yet."""
        self.stream.finish()
        self._flush()
        self.io.fsync_path(self.tmp)
        self._done = True
        return SealedPack(self.dir, self.io, self.tmp, self.stream.trailer.hex(), self.stream.index(),
                          self.count, self.stream.size, self.dictionary, self.parents)

    def abort(self) -> None:
        if not self._done:
            self._done = True
            _unlink_quiet(self.io, self.tmp)

    def __enter__(self) -> "PackWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


class SealedPack:
    """A finished pack in its temporary file, with its index in memory."""

    def __init__(self, pack_dir: str, io: FileIO, tmp: str, name: str, index: bytes, count: int, size: int,
                 dictionary: bytes | None, parents: Sequence[str] = ()) -> None:
        self.dir, self.io, self.tmp, self.name = pack_dir, io, tmp, name
        self.index, self.count, self.size, self.dictionary = index, count, size, dictionary
        self.parents = tuple(parents)
        self.state = "sealed"

    def reader(self) -> PackReader:
        """Read the sealed pack before it is committed (import checks refs with it)."""
        return PackReader(self.tmp, self.index, check_name=False, io=self.io)

    def commit(self) -> PackInfo:
        """Rename the pack, then its index, into place: the index is the commit point."""
        base = os.path.join(self.dir, f"pack-{self.name}")
        self.io.rename(self.tmp, base + ".pack")
        self.state = "renamed"
        self.io.fsync_dir(self.dir)  # the pack's name is durable before the index names it
        for d in self.parents:
            self.io.fsync_dir(d)
        idx_tmp = self.io.write_tmp(self.dir, self.index, prefix="tmp_idx_")
        try:
            self.io.rename(idx_tmp, base + ".idx")
        except BaseException:
            _unlink_quiet(self.io, idx_tmp)
            raise
        self.io.fsync_dir(self.dir)
        self.state = "committed"
        return PackInfo(self.name, base + ".pack", base + ".idx", self.count, self.size)

    def discard(self) -> None:
        if self.state == "sealed":
            _unlink_quiet(self.io, self.tmp)
            self.state = "discarded"


def _unlink_quiet(io: FileIO, path: str) -> None:
    try:
        io.unlink(path)
    except FileNotFoundError:
        pass
