"""Encoding one pack, entry by entry, into a sink: :class:`PackStream`.

Owns the order of a pack's bytes (header, entries, end record, trailer),
the running BLAKE3 of them, and what the index needs (each entry's id,
offset and CRC). Used by :class:`~.writer.PackWriter` (sink: a temp file)
and by bundle export (sink: the bundle file), so both write the same
bytes.

It must never open or write a file itself: ``sink`` does the I/O.
"""

from __future__ import annotations

import zlib
from array import array
from typing import Callable, Iterable

import blake3

from ..objects import ObjectId, RawObject
from .compress import COMPRESSION_LEVEL, Compressor
from .format import (
    _ENTRY_COVERED,
    _U32,
    ENTRY_MAGIC,
    TRAILER_SIZE,
    check_entry_crc,
    encode_end,
    encode_index,
    encode_pack_header,
    parse_entry_header,
)

__all__ = ["PackStream"]

#: Writes are gathered into pieces of this size.
_FLUSH = 1 << 20
#: Objects compressed per batch by :meth:`PackStream.add_many`.
_BATCH_BYTES = 1 << 20


class PackStream:
    """Encode one pack into ``sink`` entry by entry, hashing as it goes.

    Pure: ``sink`` does the I/O. Remembers each entry's id, offset and CRC
    (for the index) in compact arrays; object contents are not kept.

    Entries are gathered into a buffer of about :data:`_FLUSH` bytes, which
    is hashed and handed to ``sink`` in one piece (one BLAKE3 update and one
    sink call per MiB rather than two per entry); a stored part of that size
    or more goes through on its own. ``sink`` receives ``bytes`` and the
    concatenation of what it receives is the pack, as before.
    """

    def __init__(self, sink: Callable[[bytes], None], dictionary: bytes | None = None, level: int = COMPRESSION_LEVEL) -> None:
        self._sink = sink
        self._hash = blake3.blake3()
        self.dictionary = dictionary or None
        self._compressor = Compressor(self.dictionary, level)
        self.size = 0
        self.ids: list[ObjectId] = []
        self.offsets = array("Q")
        self.crcs = array("I")
        self._seen: set[ObjectId] = set()
        self.raw_bytes = 0
        self.trailer: bytes | None = None
        self._out = bytearray()
        self._pre: dict[ObjectId, tuple[int, bytes]] | None = None
        self._emit(encode_pack_header(self.dictionary))

    def _drain(self) -> None:
        if self._out:
            data = bytes(self._out)
            self._out.clear()
            self._hash.update(data)
            self._sink(data)

    def _emit(self, b: bytes | memoryview) -> None:
        self.size += len(b)
        if len(b) >= _FLUSH:
            self._drain()
            self._hash.update(b)
            self._sink(b)
            return
        self._out += b
        if len(self._out) >= _FLUSH:
            self._drain()

    @property
    def count(self) -> int:
        return len(self.ids)

    def __contains__(self, oid: ObjectId) -> bool:
        return oid in self._seen

    def add(self, obj: RawObject) -> bool:
        """Compress and append ``obj``; False if the pack already holds it."""
        if obj.id in self._seen:
            return False
        method, stored = self._compressor.compress(obj.raw)
        self._append_new(method, obj.id, len(obj.raw), stored)
        return True

    def add_many(
        self,
        objs: Iterable[RawObject],
        batch_bytes: int = _BATCH_BYTES,
        precompressed: dict[ObjectId, tuple[int, bytes]] | None = None,
    ) -> int:
        """:meth:`add` each of ``objs`` in order; return how many were new.

        The same pack bytes as one :meth:`add` per object: objects are
        compressed in batches of about ``batch_bytes`` (at least one
        object; memory: one batch and its frames) by
        :meth:`~.compress.Compressor.compress_many`. An object found in
        ``precompressed`` (``id -> (method, stored)``, as
        :func:`~.compress.sample_dictionary` gives for this stream's
        dictionary at this stream's level) is not compressed again; its item
        is removed.
        """
        self._pre = precompressed if precompressed else None
        added = 0
        batch: list[RawObject] = []
        size = 0
        ids: set[ObjectId] = set()
        for obj in objs:
            if obj.id in self._seen or obj.id in ids:
                continue
            ids.add(obj.id)
            batch.append(obj)
            size += len(obj.raw)
            if size >= batch_bytes:
                added += self._add_batch(batch)
                batch, size = [], 0
                ids.clear()
        if batch:
            added += self._add_batch(batch)
        self._pre = None
        return added

    def _add_batch(self, batch: list[RawObject]) -> int:
        pre = self._pre
        if pre is None:
            done = self._compressor.compress_many([o.raw for o in batch])
        else:
            known = [pre.pop(o.id, None) for o in batch]
            fresh = iter(self._compressor.compress_many([o.raw for o, k in zip(batch, known) if k is None]))
            done = [k if k is not None else next(fresh) for k in known]
        append = self._append_new
        for obj, (method, stored) in zip(batch, done):
            append(method, obj.id, len(obj.raw), stored)
        return len(batch)

    def add_entry(self, head: bytes | memoryview, stored: bytes | memoryview) -> bool:
        """Append an entry copied verbatim from a pack with the same dictionary.

        The CRC is checked, nothing is decompressed: the caller vouches that
        the source pack was compressed with this pack's dictionary.
        """
        e = parse_entry_header(head, self.size, "copied entry", has_dict=self.dictionary is not None)
        check_entry_crc(head, stored, e, "copied entry")
        if e.id in self._seen:
            return False
        self._append(bytes(head), stored, e.id, e.raw_len, e.crc)
        return True

    def add_checked_entry(self, head: bytes, stored: bytes | memoryview, oid: ObjectId, raw_len: int, crc: int) -> bool:
        """:meth:`add_entry` for an entry the caller has already checked.

        ``head`` and ``stored`` are exactly the bytes that the caller parsed
        with :func:`~.format.parse_entry_fields` (against a pack with this
        pack's dictionary: same ``has_dict``), giving ``oid``, ``raw_len``
        and ``crc``, and whose CRC it verified (an import, which verifies
        each bundle entry and then stages it): parsing and CRC-ing the same
        bytes again would find nothing new, so this does not.
        """
        if oid in self._seen:
            return False
        self._append(head, stored, oid, raw_len, crc)
        return True

    def _append_new(self, method: int, oid: ObjectId, raw_len: int, stored: bytes) -> None:
        # encode_entry_header, inline: the CRC is kept for the index too.
        head = _ENTRY_COVERED.pack(ENTRY_MAGIC, method, oid, raw_len, len(stored))
        crc = zlib.crc32(stored, zlib.crc32(head))
        self._append(head + _U32.pack(crc), stored, oid, raw_len, crc)

    def _append(self, head: bytes, stored: bytes | memoryview, oid: ObjectId, raw_len: int, crc: int) -> None:
        """Record one entry and queue its bytes: its whole header, then ``stored``."""
        self._seen.add(oid)
        self.ids.append(oid)
        self.offsets.append(self.size)
        self.crcs.append(crc)
        self.raw_bytes += raw_len
        self._out += head
        self.size += len(head)
        self._emit(stored)

    def finish(self) -> bytes:
        """Write the end record and trailer; return the trailer (the pack's name)."""
        self._emit(encode_end(self.count))
        self._drain()
        self.trailer = self._hash.digest()
        self._sink(self.trailer)
        self.size += TRAILER_SIZE
        return self.trailer

    def index(self) -> bytes:
        assert self.trailer is not None, "finish() first"
        return encode_index(self.ids, self.crcs, self.offsets, self.trailer)
