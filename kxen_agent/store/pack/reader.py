"""Reading a committed pack: :class:`PackReader` (and :class:`BrokenPack` for one that will not open).

Owns the lookup of ``objects_spec.md`` §12.2: the index and the pack are
mapped read-only through the :class:`~kxen_agent.store.fsio.FileIO` seam
(``map_file``, so tracing and fault injection see the reads too), the id
is found by binary search over the fanout bucket (or a dict, after many
lookups), and the entry at its offset is checked — header, CRC, then the
object rehashed against its id, as loose objects are. Nothing reads a
whole pack.

The byte layout is :mod:`.format`'s: this module only asks it (the hot
path of :meth:`PackReader.read_raw` inlines the entry checks for speed and
hands every failure to :mod:`.format`'s parser for the precise error). It
must never write, and never call ``os`` or ``open`` for a file.
"""

from __future__ import annotations

import mmap
import os
import threading
import zlib
from typing import Callable, Iterator

from kxen_agent.errors import KxenError

from ..fsio import OS_IO, FileIO
from ..objects import CorruptObject, ObjectId, RawObject, parse_object
from .compress import Decompressor
from .format import (
    _CRC_COVERED,
    _ENTRY,
    _U32,
    _U64,
    END_SIZE,
    ENTRY_HEADER_SIZE,
    ENTRY_MAGIC,
    MAX_RAW_SIZE,
    METHOD_STORED,
    METHOD_ZSTD,
    METHOD_ZSTD_DICT,
    BadPack,
    Entry,
    check_entry_crc,
    parse_end,
    parse_entry_header,
    parse_index,
    parse_pack_layout,
    scan_entries,
    verify_index,
    verify_pack_trailer,
)

__all__ = ["BrokenPack", "PackReader"]

#: A reader builds an id -> position dict after this many lookups (a
#: binary search over the mapped index costs ~4 us in Python, a dict
#: lookup ~0.1 us) ...
_DICT_AFTER = 256
#: ... if the pack holds at most this many objects (the dict costs ~110
#: bytes per object: at most ~30 MB; bigger packs keep the binary search).
_DICT_MAX = 1 << 18


def _map(io: FileIO, path: str) -> "mmap.mmap | bytes":
    # The mapping stays valid even if the file is unlinked (gc) or replaced.
    m = io.map_file(path)
    if len(m) == 0:
        raise BadPack(path, "empty file")
    return m


class PackReader:
    """One committed pack, read through ``mmap``: O(log n) lookup, no whole-file read.

    Implements the store's ``ObjectSource`` protocol. Structural checks of
    the index happen at open; :meth:`verify` checks every checksum; every
    object read is rehashed against its id, as loose objects are. ``io``
    maps the pack (and, in :meth:`open`, the index) and answers
    :meth:`mtime`.
    """

    def __init__(self, pack_path: str, index: "bytes | mmap.mmap", *, check_name: bool = True,
                 idx_path: str | None = None, io: FileIO = OS_IO) -> None:
        self.path = pack_path
        self.idx_path = idx_path or "<index in memory>"
        self.io = io
        self._idx = index
        self._pack = _map(io, pack_path)
        self._closed = False
        self._tls = threading.local()
        # id -> position in the index, built once this reader has answered
        # _DICT_AFTER lookups (a long load, an export, fsck), so that a
        # one-shot command never pays for it; None until then.
        self._pos: dict[bytes, int] | None = None
        self._lookups = 0
        try:
            self._check_structure(check_name)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, base: str, *, io: FileIO = OS_IO) -> "PackReader":
        """Open ``<base>.pack`` with ``<base>.idx``; FileNotFoundError if either is gone.

        An index whose pack is missing while the index is still there is
        :class:`BadPack`, not gone: gc removes the index first and a writer
        renames the pack in first (§12.6), so no step of kxen-agent leaves
        that pair, and fsck must name it (§12.4) rather than skip it.
        """
        idx = _map(io, base + ".idx")
        try:
            return cls(base + ".pack", idx, idx_path=base + ".idx", io=io)
        except FileNotFoundError:
            if isinstance(idx, mmap.mmap):
                idx.close()
            if io.exists(base + ".idx"):  # gone meanwhile too: gc removed the pair, which is no damage
                raise BadPack(base + ".idx", "index without its pack (a pack is removed only after its index): "
                              "move the index out of objects/pack/") from None
            raise
        except BaseException:
            if isinstance(idx, mmap.mmap):
                idx.close()
            raise

    # -- structure

    def _check_structure(self, check_name: bool) -> None:
        layout = parse_index(self._idx, self.idx_path)
        self._layout = layout
        self._fan = layout.fan
        self.count = layout.count
        self._ids_at = layout.ids_at
        self._crcs_at = layout.crcs_at
        self._offs_at = layout.offs_at
        self.trailer = layout.trailer
        self.name = self.trailer.hex()
        pack = parse_pack_layout(self._pack, self.path, self.trailer, self.idx_path, check_name=check_name)
        self.dictionary = pack.dictionary
        self.data_start = pack.data_start
        self.entries_end = pack.entries_end
        self.size = pack.size
        # Load the dictionary now: an unusable one makes the whole pack
        # broken at open (fsck names it, gc skips it) rather than failing
        # later inside an object read that callers expect CorruptObject from.
        try:
            self._tls.d = Decompressor(self.dictionary)
        except BadPack as e:
            raise BadPack(self.path, e.reason) from None

    def _decompressor(self) -> Decompressor:
        d = getattr(self._tls, "d", None)
        if d is None:
            d = self._tls.d = Decompressor(self.dictionary)
        return d

    # -- lookup

    def _id_at(self, i: int) -> bytes:
        at = self._ids_at + 32 * i
        return self._idx[at : at + 32]

    def _find(self, oid: ObjectId) -> int:
        pos = self._pos
        if pos is not None:
            return pos.get(oid, -1)
        self._lookups += 1
        if self._lookups == _DICT_AFTER and self.count <= _DICT_MAX:
            ids = bytes(self._idx[self._ids_at : self._ids_at + 32 * self.count])
            self._pos = {ids[32 * i : 32 * i + 32]: i for i in range(self.count)}
            return self._pos.get(oid, -1)
        first = oid[0]
        lo = self._fan[first - 1] if first else 0
        hi = self._fan[first]
        while lo < hi:
            mid = (lo + hi) >> 1
            cur = self._id_at(mid)
            if cur < oid:
                lo = mid + 1
            elif cur > oid:
                hi = mid
            else:
                return mid
        return -1

    def _locate(self, oid: ObjectId) -> tuple[int, int] | None:
        """(offset, crc) of ``oid``'s entry, or None."""
        if self._closed or len(oid) != 32:
            return None
        try:
            i = self._find(oid)
            if i < 0:
                return None
            return _U64.unpack_from(self._idx, self._offs_at + 8 * i)[0], _U32.unpack_from(self._idx, self._crcs_at + 4 * i)[0]
        except ValueError:  # mapping closed by another thread's reload
            return None

    def has(self, oid: ObjectId) -> bool:
        return self._locate(oid) is not None

    def entry(self, oid: ObjectId) -> tuple[Entry, bytes, bytes] | None:
        """The checked entry of ``oid``: (header fields, header bytes, stored bytes)."""
        loc = self._locate(oid)
        if loc is None:
            return None
        off, crc = loc
        where = f"{self.path}:{oid.hex()}"
        if off < self.data_start or off + ENTRY_HEADER_SIZE > self.entries_end:
            raise CorruptObject(where, f"index offset {off} is outside the pack's entries")
        try:
            head = self._pack[off : off + ENTRY_HEADER_SIZE]
        except ValueError:  # mapping closed by another thread's reload
            return None
        try:
            e = parse_entry_header(head, off, self.path, has_dict=self.dictionary is not None)
        except BadPack as ex:
            raise CorruptObject(where, ex.reason) from None
        if e.id != oid:
            raise CorruptObject(where, f"index points at offset {off}, which holds object {e.id.hex()}")
        if e.crc != crc:
            raise CorruptObject(where, "entry checksum differs from the index's")
        if e.end > self.entries_end:
            raise CorruptObject(where, "entry runs past the pack's entries")
        try:
            stored = self._pack[off + ENTRY_HEADER_SIZE : e.end]
        except ValueError:
            return None
        try:
            check_entry_crc(head, stored, e, self.path)
        except BadPack as ex:
            raise CorruptObject(where, ex.reason) from None
        return e, head, stored

    def read_raw(self, oid: ObjectId) -> RawObject | None:
        # The hot path of every packed read (a load, an export, fsck): the
        # checks of entry(), with the header parsed to a tuple, the CRC
        # computed in place and error texts built only for an error. Any
        # failed check goes through entry(), which raises the precise error.
        pos = self._pos
        if pos is not None and not self._closed:  # a long load: the lookup of _locate, inline
            i = pos.get(oid, -1)
            if i < 0:
                return None
            try:
                off = _U64.unpack_from(self._idx, self._offs_at + 8 * i)[0]
                crc = _U32.unpack_from(self._idx, self._crcs_at + 4 * i)[0]
            except ValueError:  # mapping closed by another thread's reload
                return None
        else:
            loc = self._locate(oid)
            if loc is None:
                return None
            off, crc = loc
        pack = self._pack
        try:
            if self.data_start <= off and off + ENTRY_HEADER_SIZE <= self.entries_end:
                head = pack[off : off + ENTRY_HEADER_SIZE]
                magic, method, eid, raw_len, stored_len, ecrc = _ENTRY.unpack_from(head)
                end = off + ENTRY_HEADER_SIZE + stored_len
                if (
                    magic == ENTRY_MAGIC
                    and eid == oid
                    and ecrc == crc
                    and end <= self.entries_end
                    and raw_len <= MAX_RAW_SIZE
                    and stored_len <= raw_len
                    and (method == METHOD_ZSTD or (method == METHOD_ZSTD_DICT and self.dictionary is not None)
                         or (method == METHOD_STORED and stored_len == raw_len))
                ):
                    stored = pack[off + ENTRY_HEADER_SIZE : end]
                    if zlib.crc32(stored, zlib.crc32(head[:_CRC_COVERED])) == crc:
                        try:
                            raw = self._decompressor().decompress_raw(method, raw_len, stored, "")
                            return parse_object(raw, "", expect_id=oid)
                        except CorruptObject as e:  # named here: the name costs more than the read
                            raise CorruptObject(f"{self.path}:{oid.hex()}", e.reason) from None
        except ValueError:  # mapping closed by another thread's reload
            return None
        found = self.entry(oid)  # raises the precise error (or None: closed meanwhile)
        if found is None:
            return None
        e, _head, stored = found  # pragma: no cover - the checks above agree with entry()'s
        where = f"{self.path}:{oid.hex()}"
        raw = self._decompressor().decompress(e, stored, where)
        return parse_object(raw, where, expect_id=oid)

    def iter_ids(self) -> Iterator[ObjectId]:
        for i in range(self.count):
            if self._closed:
                return
            yield bytes(self._id_at(i))

    def with_prefix(self, hexprefix: str) -> list[ObjectId]:
        if self._closed or not hexprefix:
            return []
        lo_key = bytes.fromhex(hexprefix + "0" * (len(hexprefix) % 2))
        lo, hi = 0, self.count
        while lo < hi:  # first id >= lo_key
            mid = (lo + hi) >> 1
            if self._id_at(mid) < lo_key:
                lo = mid + 1
            else:
                hi = mid
        out = []
        for i in range(lo, self.count):
            oid = bytes(self._id_at(i))
            if not oid.hex().startswith(hexprefix):
                break
            out.append(oid)
        return out

    def mtime(self) -> float:
        return self.io.stat(self.path).st_mtime

    # -- checking

    def verify(self, progress: Callable[[int], None] | None = None) -> None:
        """Check every checksum and that index and pack agree entry by entry."""
        verify_index(self._idx, self._layout, self.idx_path)
        pack, pwhere = self._pack, self.path
        verify_pack_trailer(pack, self.trailer, pwhere)
        seen = 0
        for e in scan_entries(pack, self.data_start, self.entries_end, pwhere, has_dict=self.dictionary is not None):
            loc = self._locate(e.id)
            if loc is None:
                raise BadPack(pwhere, f"object {e.id.hex()} is in the pack but not in its index", e.offset)
            if loc != (e.offset, e.crc):
                raise BadPack(pwhere, f"index disagrees with the pack about object {e.id.hex()}", e.offset)
            seen += 1
            if progress:
                progress(1)
        count = parse_end(pack[self.entries_end : self.entries_end + END_SIZE], self.entries_end, pwhere)
        if count != seen or count != self.count:
            raise BadPack(pwhere, f"end record counts {count} entries, the pack holds {seen}, the index {self.count}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for m in (self._pack, self._idx):
            if isinstance(m, mmap.mmap):
                m.close()

    def __repr__(self) -> str:
        return f"PackReader({self.path!r}, {self.count} objects)"


class BrokenPack:
    """Stands in for a pack whose index or frame cannot be opened, so fsck can name it.

    Its entries are still read one by one (``objects_spec.md`` §18): the
    first lookup scans the pack for entries whose CRC checks (once), and
    :meth:`read_raw` serves those, rehashed against their ids as every read
    is. A damaged trailer or index thus loses no object that still reads.
    :meth:`verify` raises the error met at open.
    """

    def __init__(self, path: str, error: KxenError, io: FileIO = OS_IO) -> None:
        self.path = path
        self.error = error
        self.name = os.path.basename(path)
        self.count = 0
        self.io = io
        self.dictionary = None
        self._good: dict[ObjectId, tuple[int, int, int, int, int]] | None = None
        self._data = b""
        self._dec: Decompressor | None = None
        self._mu = threading.Lock()

    def _entries(self) -> dict[ObjectId, tuple[int, int, int, int, int]]:
        with self._mu:
            if self._good is None:
                from ..salvage import salvage_pack  # salvage reads packs through this package: imported late

                try:
                    sal = salvage_pack(self.io, self.path)
                    self._data = self.io.read(self.path) if sal.good else b""
                    try:
                        self._dec = Decompressor(sal.dictionary)
                    except BadPack:  # a damaged dictionary: the entries that need none still read
                        self._dec = Decompressor(None)
                    self._good = sal.good
                except (KxenError, OSError):
                    self._good = {}
                self.count = len(self._good)
            return self._good

    def has(self, oid: ObjectId) -> bool:
        return oid in self._entries()

    def read_raw(self, oid: ObjectId) -> RawObject | None:
        hit = self._entries().get(oid)
        if hit is None or self._dec is None:
            return None
        _off, method, raw_len, s0, end = hit
        where = f"{self.path}:{oid.hex()}"
        raw = self._dec.decompress_raw(method, raw_len, self._data[s0:end], where)
        return parse_object(raw, where, expect_id=oid)

    def iter_ids(self) -> Iterator[ObjectId]:
        return iter(list(self._entries()))

    def with_prefix(self, hexprefix: str) -> list[ObjectId]:
        return sorted(o for o in self._entries() if o.hex().startswith(hexprefix)) if hexprefix else []

    def mtime(self) -> float:
        return self.io.stat(self.path).st_mtime

    def verify(self, progress=None) -> None:
        raise self.error

    def close(self) -> None:
        pass
