"""The pack and index byte formats (``objects_spec.md`` §12), as pure functions over bytes.

Owns the layout of a pack (header, entries, end record, trailer) and of its
index (fanout, sorted ids, CRCs, offsets, trailers): the constants, the
encoders, and the parsers, each taking a buffer (``bytes``, a
``memoryview`` or an ``mmap``) and a position and returning values or
raising :class:`BadPack` with the byte offset. The fuzz and property tests
drive these functions directly.

It must never open, map or stat a file, nor compress anything: the reader
(:mod:`.reader`) hands it mapped bytes, the writer (:mod:`.writer`) takes
the bytes it returns, and zstd lives in :mod:`.compress`. A ``where``
argument is only a name for error messages.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import blake3

from kxen_agent.errors import KxenError

from ..objects import MAX_OBJECT_SIZE, ObjectId

__all__ = sorted(
    [
        "BadPack",
        "DICT_MAX_SIZE",
        "END_MAGIC",
        "END_SIZE",
        "ENTRY_HEADER_SIZE",
        "ENTRY_MAGIC",
        "Entry",
        "IDX_HEADER_SIZE",
        "IDX_MAGIC",
        "IDX_VERSION",
        "IndexLayout",
        "MAX_RAW_SIZE",
        "METHOD_STORED",
        "METHOD_ZSTD",
        "METHOD_ZSTD_DICT",
        "PACK_MAGIC",
        "PACK_PREFIX_SIZE",
        "PACK_VERSION",
        "PackLayout",
        "TRAILER_SIZE",
        "check_entry_crc",
        "check_pack_header",
        "crc32",
        "encode_end",
        "encode_entry",
        "encode_entry_header",
        "encode_index",
        "encode_pack_header",
        "parse_end",
        "parse_entry_fields",
        "parse_entry_header",
        "parse_index",
        "parse_pack_header_prefix",
        "parse_pack_layout",
        "scan_entries",
        "verify_index",
        "verify_pack_trailer",
    ]
)

PACK_MAGIC = b"KXPK"
PACK_VERSION = 1
ENTRY_MAGIC = b"\x8bKXE"
END_MAGIC = b"\x8bKXZ"
IDX_MAGIC = b"\xffKXI"
IDX_VERSION = 1

METHOD_STORED = 0  # the object bytes as they are
METHOD_ZSTD = 1  # one zstd frame, no dictionary
METHOD_ZSTD_DICT = 2  # one zstd frame compressed with the pack's dictionary

#: Longest object bytes: the longest body plus the longest header (§3).
MAX_RAW_SIZE = MAX_OBJECT_SIZE + 17
#: Largest dictionary a pack may carry (zstd's trainer defaults to 110 KiB).
DICT_MAX_SIZE = 1 << 20
#: zstd dictionaries in the format zstd's trainer writes start with this.
_ZDICT_MAGIC = b"\x37\xa4\x30\xec"

_PACK_PREFIX = struct.Struct(">4sII")  # magic, version, dictionary length
_ENTRY = struct.Struct(">4sB32sQQI")  # magic, method, id, raw length, stored length, crc
_ENTRY_COVERED = struct.Struct(">4sB32sQQ")  # the same without the crc: what the CRC covers first
_END = struct.Struct(">4sQ")  # magic, entry count
_IDX_PREFIX = struct.Struct(">4sI")
_FANOUT = struct.Struct(">256I")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

ENTRY_HEADER_SIZE = _ENTRY.size  # 57
_CRC_COVERED = ENTRY_HEADER_SIZE - 4  # the CRC covers the header up to itself

PACK_PREFIX_SIZE = _PACK_PREFIX.size  # 12
END_SIZE = _END.size  # 12
TRAILER_SIZE = 32
IDX_HEADER_SIZE = _IDX_PREFIX.size + _FANOUT.size  # 1032
_IDX_PER_OBJECT = 32 + 4 + 8

_PACK_NAME = re.compile(r"pack-([0-9a-f]{64})")

Buffer = bytes | memoryview | mmap.mmap


class BadPack(KxenError):
    """A pack or its index breaks the format (§12); ``where`` names the file."""

    def __init__(self, where: str, reason: str, offset: int | None = None) -> None:
        at = f" (at byte {offset})" if offset is not None else ""
        super().__init__(f"bad pack {where}: {reason}{at}; run 'kxen-agent fsck', then 'kxen-agent gc' to rewrite packs")
        self.where = where
        self.reason = reason
        self.offset = offset


# ------------------------------------------------------------------ pack header


def crc32(*parts: bytes | memoryview) -> int:
    """CRC-32/ISO-HDLC (zlib's) over the concatenation of ``parts``."""
    c = 0
    for p in parts:
        c = zlib.crc32(p, c)
    return c


def encode_pack_header(dictionary: bytes | None) -> bytes:
    d = dictionary or b""
    if len(d) > DICT_MAX_SIZE:
        raise ValueError(f"dictionary of {len(d)} bytes exceeds {DICT_MAX_SIZE}")
    head = _PACK_PREFIX.pack(PACK_MAGIC, PACK_VERSION, len(d)) + d
    return head + _U32.pack(crc32(head))


def parse_pack_header_prefix(prefix: bytes, where: str, base: int = 0) -> int:
    """Check the 12-byte pack prefix; return the dictionary length that follows."""
    if len(prefix) < PACK_PREFIX_SIZE:
        raise BadPack(where, "truncated pack header", base)
    magic, version, dlen = _PACK_PREFIX.unpack_from(prefix)
    if magic != PACK_MAGIC:
        raise BadPack(where, f"not a pack (magic {magic!r}, expected {PACK_MAGIC!r})", base)
    if version != PACK_VERSION:
        raise BadPack(where, f"unknown pack version {version} (this kxen-agent reads version {PACK_VERSION})", base + 4)
    if dlen > DICT_MAX_SIZE:
        raise BadPack(where, f"dictionary of {dlen} bytes exceeds the {DICT_MAX_SIZE}-byte limit", base + 8)
    return dlen


def check_pack_header(prefix: bytes, dictionary: bytes, crc: int, where: str, base: int = 0) -> None:
    if crc32(prefix, dictionary) != crc:
        raise BadPack(where, "pack header checksum mismatch", base)
    if dictionary and dictionary[:4] != _ZDICT_MAGIC:
        raise BadPack(where, "dictionary is not a zstd dictionary", base + PACK_PREFIX_SIZE)


# ------------------------------------------------------------------ entries


@dataclass(frozen=True, slots=True)
class Entry:
    """One parsed entry header; ``offset`` is where the entry starts."""

    offset: int
    method: int
    id: ObjectId
    raw_len: int
    stored_len: int
    crc: int

    @property
    def end(self) -> int:
        return self.offset + ENTRY_HEADER_SIZE + self.stored_len


def encode_entry_header(method: int, oid: ObjectId, raw_len: int, stored: bytes | memoryview) -> bytes:
    head = _ENTRY_COVERED.pack(ENTRY_MAGIC, method, oid, raw_len, len(stored))
    return head + _U32.pack(zlib.crc32(stored, zlib.crc32(head)))


def encode_entry(method: int, oid: ObjectId, raw_len: int, stored: bytes) -> bytes:
    return encode_entry_header(method, oid, raw_len, stored) + stored


def parse_entry_header(buf: bytes | memoryview, offset: int, where: str, *, has_dict: bool) -> Entry:
    """Check one 57-byte entry header (not its CRC, which needs the stored bytes)."""
    if len(buf) < ENTRY_HEADER_SIZE:
        raise BadPack(where, "truncated entry header", offset)
    magic, method, oid, raw_len, stored_len, crc = _ENTRY.unpack_from(buf)
    if magic != ENTRY_MAGIC:
        raise BadPack(where, f"bad entry magic {bytes(magic)!r}", offset)
    if method > METHOD_ZSTD_DICT:
        raise BadPack(where, f"unknown compression method {method}", offset + 4)
    if method == METHOD_ZSTD_DICT and not has_dict:
        raise BadPack(where, "entry uses the pack dictionary but the pack has none", offset + 4)
    if raw_len > MAX_RAW_SIZE:
        raise BadPack(where, f"entry declares a {raw_len}-byte object, more than the {MAX_RAW_SIZE}-byte limit", offset + 37)
    # A writer stores an object raw when compression does not make it
    # smaller, so stored bytes never exceed the object: this bounds every read.
    if stored_len > raw_len or (method == METHOD_STORED and stored_len != raw_len):
        raise BadPack(where, f"entry stores {stored_len} bytes for a {raw_len}-byte object", offset + 45)
    return Entry(offset, method, bytes(oid), raw_len, stored_len, crc)


def check_entry_crc(head: bytes | memoryview, stored: bytes | memoryview, e: Entry, where: str) -> None:
    if crc32(head[:_CRC_COVERED], stored) != e.crc:
        raise BadPack(where, f"entry checksum mismatch for object {e.id.hex()}", e.offset)


def parse_entry_fields(head: bytes | memoryview, offset: int, where: str, *, has_dict: bool) -> tuple[int, ObjectId, int, int, int]:
    """:func:`parse_entry_header`'s checks, as a tuple ``(method, id, raw_len, stored_len, crc)``.

    The same rules and the same errors (a header that fails any check is
    handed to :func:`parse_entry_header`, which raises), without building an
    :class:`Entry`: for loops over every entry of a stream.
    """
    if len(head) >= ENTRY_HEADER_SIZE:
        magic, method, oid, raw_len, stored_len, crc = _ENTRY.unpack_from(head)
        if (
            magic == ENTRY_MAGIC
            and method <= METHOD_ZSTD_DICT
            and (has_dict or method != METHOD_ZSTD_DICT)
            and raw_len <= MAX_RAW_SIZE
            and stored_len <= raw_len
            and (method != METHOD_STORED or stored_len == raw_len)
        ):
            return method, oid, raw_len, stored_len, crc
    e = parse_entry_header(head, offset, where, has_dict=has_dict)  # raises the precise error
    return e.method, e.id, e.raw_len, e.stored_len, e.crc  # pragma: no cover - the checks above agree


def encode_end(count: int) -> bytes:
    return _END.pack(END_MAGIC, count)


def parse_end(buf: bytes | memoryview, offset: int, where: str) -> int:
    if len(buf) < END_SIZE:
        raise BadPack(where, "truncated end record", offset)
    magic, count = _END.unpack_from(buf)
    if magic != END_MAGIC:
        raise BadPack(where, f"bad end record magic {bytes(magic)!r}", offset)
    return count


def scan_entries(
    buf: Buffer,
    start: int,
    limit: int,
    where: str,
    *,
    has_dict: bool,
    resync: bool = False,
    skipped: Callable[[int, int, str], None] | None = None,
) -> Iterator[Entry]:
    """Yield the entries in ``buf[start:limit]`` in file order, CRC-checked.

    With ``resync``, an entry that does not parse or whose CRC fails is
    reported to ``skipped(offset, next_offset, reason)`` and the scan
    continues at the next entry magic — what a salvage tool needs after a
    corrupt length. Without it, the first problem raises :class:`BadPack`.
    """
    pos = start
    while pos < limit:
        try:
            e = parse_entry_header(buf[pos : pos + ENTRY_HEADER_SIZE], pos, where, has_dict=has_dict)
            if e.end > limit:
                raise BadPack(where, f"entry of {e.stored_len} stored bytes runs past the entries", pos)
            check_entry_crc(buf[pos : pos + ENTRY_HEADER_SIZE], buf[pos + ENTRY_HEADER_SIZE : e.end], e, where)
        except BadPack as ex:
            if not resync:
                raise
            nxt = _find(buf, ENTRY_MAGIC, pos + 1, limit)
            if skipped is not None:
                skipped(pos, nxt, ex.reason)
            pos = nxt
            continue
        yield e
        pos = e.end


def _find(buf: Buffer, needle: bytes, start: int, limit: int) -> int:
    i = buf.find(needle, start, limit)
    return limit if i < 0 else i


# ------------------------------------------------------------------ the whole pack


@dataclass(frozen=True, slots=True)
class PackLayout:
    """Where a pack's parts are, as :func:`parse_pack_layout` found them."""

    dictionary: bytes | None
    data_start: int  # the first entry
    entries_end: int  # the end record
    size: int


def parse_pack_layout(pack: Buffer, where: str, trailer: bytes, index_where: str, *, check_name: bool) -> PackLayout:
    """Check a whole pack's frame against its index's ``trailer``; where its entries are.

    ``where`` is the pack's path: with ``check_name``, its file name must be
    ``pack-<trailer in hex>.pack`` (a string check; nothing is opened). The
    header's checksum and dictionary magic are checked; the entries are not
    (:func:`scan_entries` and :func:`verify_pack_trailer` do that).
    """
    size = len(pack)
    if size < PACK_PREFIX_SIZE + 4 + END_SIZE + TRAILER_SIZE:
        raise BadPack(where, f"pack of {size} bytes is too short")
    if pack[size - TRAILER_SIZE :] != trailer:
        raise BadPack(where, f"trailer does not match index {index_where}")
    if check_name:
        name = trailer.hex()
        m = _PACK_NAME.fullmatch(os.path.basename(where)[:-5])
        if not m or m.group(1) != name:
            raise BadPack(where, f"file name does not match the pack's trailer {name}")
    dlen = parse_pack_header_prefix(pack[:PACK_PREFIX_SIZE], where)
    start = PACK_PREFIX_SIZE + dlen + 4
    if start + END_SIZE + TRAILER_SIZE > size:
        raise BadPack(where, "pack header runs past the end")
    dictionary = bytes(pack[PACK_PREFIX_SIZE : PACK_PREFIX_SIZE + dlen]) or None
    check_pack_header(pack[:PACK_PREFIX_SIZE], dictionary or b"", _U32.unpack_from(pack, start - 4)[0], where)
    return PackLayout(dictionary, start, size - TRAILER_SIZE - END_SIZE, size)


def verify_pack_trailer(pack: Buffer, trailer: bytes, where: str) -> None:
    """The pack's BLAKE3 trailer over every byte before it, hashed 8 MiB at a time."""
    h = blake3.blake3()
    end = len(pack) - TRAILER_SIZE
    for at in range(0, end, 8 << 20):
        h.update(pack[at : min(end, at + (8 << 20))])
    if h.digest() != trailer:
        raise BadPack(where, "pack trailer checksum mismatch")


# ------------------------------------------------------------------ index


def encode_index(ids: Sequence[ObjectId], crcs: Sequence[int], offsets: Sequence[int], pack_trailer: bytes) -> bytes:
    """The index bytes for entries given in any order (sorted here)."""
    n = len(ids)
    order = sorted(range(n), key=ids.__getitem__)
    fan = [0] * 256
    for oid in ids:
        fan[oid[0]] += 1
    total = 0
    for b in range(256):
        total += fan[b]
        fan[b] = total
    out = bytearray(_IDX_PREFIX.pack(IDX_MAGIC, IDX_VERSION))
    out += _FANOUT.pack(*fan)
    prev = None
    for i in order:
        oid = ids[i]
        if oid == prev:
            raise ValueError(f"duplicate id {oid.hex()} in index")
        prev = oid
        out += oid
    out += _big_endian(array("I", [crcs[i] for i in order]))
    out += _big_endian(array("Q", [offsets[i] for i in order]))
    out += pack_trailer
    out += blake3.blake3(out).digest()
    return bytes(out)


def _big_endian(a: array) -> bytes:
    if sys.byteorder == "little":
        a.byteswap()
    return a.tobytes()


@dataclass(frozen=True, slots=True)
class IndexLayout:
    """An index's fanout and where its tables are, as :func:`parse_index` found them."""

    fan: tuple[int, ...]
    count: int
    ids_at: int  # count sorted 32-byte ids
    crcs_at: int  # count big-endian u32 CRCs
    offs_at: int  # count big-endian u64 offsets
    trailer: bytes  # the pack's trailer: its name


def parse_index(idx: Buffer, where: str) -> IndexLayout:
    """Check an index's header, fanout and size; where its tables are.

    The structural checks a reader makes at open (cheap: no hashing);
    :func:`verify_index` checks the rest.
    """
    n_bytes = len(idx)
    if n_bytes < IDX_HEADER_SIZE + 2 * TRAILER_SIZE:
        raise BadPack(where, f"index of {n_bytes} bytes is too short")
    magic, version = _IDX_PREFIX.unpack_from(idx, 0)
    if magic != IDX_MAGIC:
        raise BadPack(where, f"not a pack index (magic {magic!r})", 0)
    if version != IDX_VERSION:
        raise BadPack(where, f"unknown index version {version}", 4)
    fan = _FANOUT.unpack_from(idx, _IDX_PREFIX.size)
    if any(fan[i] > fan[i + 1] for i in range(255)):
        raise BadPack(where, "fanout table is not monotonic", _IDX_PREFIX.size)
    n = fan[255]
    if n_bytes != IDX_HEADER_SIZE + n * _IDX_PER_OBJECT + 2 * TRAILER_SIZE:
        raise BadPack(where, f"index of {n_bytes} bytes does not fit its {n} objects")
    crcs_at = IDX_HEADER_SIZE + 32 * n
    trailer = bytes(idx[n_bytes - 2 * TRAILER_SIZE : n_bytes - TRAILER_SIZE])
    return IndexLayout(fan, n, IDX_HEADER_SIZE, crcs_at, crcs_at + 4 * n, trailer)


def verify_index(idx: Buffer, layout: IndexLayout, where: str) -> None:
    """Check an index's own trailer, that its ids are sorted and unique, and its fanout."""
    n = len(idx)
    if blake3.blake3(idx[: n - TRAILER_SIZE]).digest() != idx[n - TRAILER_SIZE :]:
        raise BadPack(where, "index trailer checksum mismatch")
    fan, ids_at = layout.fan, layout.ids_at
    prev = b""
    for i in range(layout.count):
        at = ids_at + 32 * i
        oid = bytes(idx[at : at + 32])
        if oid <= prev:
            raise BadPack(where, f"ids not sorted or duplicated at {oid.hex()}", at)
        lo = fan[oid[0] - 1] if oid[0] else 0
        if not lo <= i < fan[oid[0]]:
            raise BadPack(where, f"fanout disagrees with id {oid.hex()}")
        prev = oid
