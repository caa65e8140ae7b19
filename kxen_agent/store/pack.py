"""Packs: many objects in one file, and an index for O(log n) lookup.

Normative text: ``objects_spec.md`` §12 (drafted in ``docs/pack_spec_draft.md``).
In brief, a pack ``objects/pack/pack-<hex>.pack`` is

- a header: magic ``KXPK``, version, an optional zstd dictionary trained on
  the pack's own objects, and a CRC-32 of the header;
- entries, each: a 4-byte magic (so a scanner can resynchronise after a
  corrupt length, as borg's segments allow), the compression method, the
  32-byte object id, the object's length, the stored length, a CRC-32 over
  the entry header and the stored bytes (so an entry can be copied to
  another pack without decompressing or rehashing), then the stored bytes:
  the canonical object bytes of :mod:`.objects`, raw or as one zstd frame;
- an end record (magic and entry count) and a trailer: BLAKE3-256 of every
  byte before it. The pack is named by that trailer.

The index ``pack-<hex>.idx`` holds a 256-entry fanout, the sorted ids,
their CRCs and 64-bit offsets, the pack's trailer and its own BLAKE3
trailer. It is renamed into place after the pack: the index is the commit
point, a pack without one does not exist.

This module owns the byte format (pure functions over bytes, which the
fuzz and property tests drive), :class:`PackReader` (lookup by binary
search over an ``mmap`` of the index: nothing reads a whole pack) and
:class:`PackWriter` (temp file, fsync, rename, index last, every step
through :class:`~.fsio.FileIO`). It knows nothing of refs, gc or bundles.

Every declared size is checked against :data:`~.objects.MAX_OBJECT_SIZE`
before anything is allocated, and a zstd frame must declare exactly the
entry's length: a pack cannot make a reader allocate more than one object.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import sys
import threading
import zlib
from array import array
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import blake3
import zstandard

from kxen_agent.errors import KxenError

from .fsio import FileIO
from .objects import MAX_OBJECT_SIZE, CorruptObject, ObjectId, RawObject, parse_object

__all__ = [
    "BadPack",
    "BrokenPack",
    "DICT_MAX_SIZE",
    "DICT_SAMPLE_BUDGET",
    "DICT_SAMPLE_MAX_OBJECT",
    "Entry",
    "ENTRY_HEADER_SIZE",
    "MAX_RAW_SIZE",
    "METHOD_STORED",
    "METHOD_ZSTD",
    "METHOD_ZSTD_DICT",
    "PackInfo",
    "PackReader",
    "PackStream",
    "PackWriter",
    "SealedPack",
    "Decompressor",
    "choose_dictionary",
    "crc32",
    "sample_dictionary",
    "encode_end",
    "encode_entry",
    "encode_index",
    "encode_pack_header",
    "parse_end",
    "parse_entry_fields",
    "parse_entry_header",
    "parse_pack_header_prefix",
    "scan_entries",
]

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

#: A reader builds an id -> position dict after this many lookups (a
#: binary search over the mapped index costs ~4 us in Python, a dict
#: lookup ~0.1 us) ...
_DICT_AFTER = 256
#: ... if the pack holds at most this many objects (the dict costs ~110
#: bytes per object: at most ~30 MB; bigger packs keep the binary search).
_DICT_MAX = 1 << 18
PACK_PREFIX_SIZE = _PACK_PREFIX.size  # 12
END_SIZE = _END.size  # 12
TRAILER_SIZE = 32
IDX_HEADER_SIZE = _IDX_PREFIX.size + _FANOUT.size  # 1032
_IDX_PER_OBJECT = 32 + 4 + 8

COMPRESSION_LEVEL = 3
_PACK_NAME = re.compile(r"pack-([0-9a-f]{64})")


class BadPack(KxenError):
    """A pack or its index breaks the format (§12); ``where`` names the file."""

    def __init__(self, where: str, reason: str, offset: int | None = None) -> None:
        at = f" (at byte {offset})" if offset is not None else ""
        super().__init__(f"bad pack {where}: {reason}{at}; run 'kxen-agent fsck', then 'kxen-agent gc' to rewrite packs")
        self.where = where
        self.reason = reason
        self.offset = offset


# ------------------------------------------------------------------ pure format


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


class Decompressor:
    """Bounded decompression of entries, with the pack's dictionary if any.

    Not shared between threads: zstd contexts are not thread-safe.
    """

    def __init__(self, dictionary: bytes | None) -> None:
        self._plain = zstandard.ZstdDecompressor()
        self._dict = None
        if dictionary:
            try:
                zd = zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_FULLDICT)
                self._dict = zstandard.ZstdDecompressor(dict_data=zd)
            except zstandard.ZstdError as e:
                raise BadPack("dictionary", f"unusable zstd dictionary ({e})") from None

    def decompress(self, e: Entry, stored: bytes | memoryview, where: str) -> bytes:
        return self.decompress_raw(e.method, e.raw_len, stored, where)

    def decompress_raw(self, method: int, raw_len: int, stored: bytes | memoryview, where: str) -> bytes:
        """:meth:`decompress` for an entry given by its method and ``raw_len`` (checked headers only)."""
        if method == METHOD_STORED:
            return bytes(stored)
        # The frame must declare exactly the entry's length, which was
        # already checked against the limit: the one allocation below is
        # bounded, and a frame that would expand further fails in libzstd.
        try:
            params = zstandard.get_frame_parameters(stored)
        except zstandard.ZstdError as ex:
            raise CorruptObject(where, f"stored bytes are not a zstd frame ({ex})") from None
        if params.content_size != raw_len:
            size = "no size" if params.content_size == zstandard.CONTENTSIZE_UNKNOWN else f"{params.content_size} bytes"
            raise CorruptObject(where, f"zstd frame declares {size}, the entry {raw_len}")
        dctx = self._dict if method == METHOD_ZSTD_DICT else self._plain
        if dctx is None:
            raise CorruptObject(where, "entry needs a dictionary the pack does not have")
        try:
            out = dctx.decompress(stored, allow_extra_data=False)
        except zstandard.ZstdError as ex:
            raise CorruptObject(where, f"zstd frame does not decompress ({ex})") from None
        if len(out) != raw_len:  # pragma: no cover - libzstd enforces the declared size
            raise CorruptObject(where, f"zstd frame holds {len(out)} bytes, the entry declares {raw_len}")
        return out


class Compressor:
    """Per-entry zstd, with the pack's dictionary if any; raw when that is smaller."""

    def __init__(self, dictionary: bytes | None, level: int = COMPRESSION_LEVEL) -> None:
        self.has_dict = bool(dictionary)
        if dictionary:
            zd = zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_FULLDICT)
            zd.precompute_compress(level=level)
            self._cctx = zstandard.ZstdCompressor(
                dict_data=zd, write_content_size=True, write_checksum=False, write_dict_id=False
            )
        else:
            self._cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)

    def compress(self, raw: bytes) -> tuple[int, bytes]:
        frame = self._cctx.compress(raw)
        if len(frame) >= len(raw):
            return METHOD_STORED, raw
        return (METHOD_ZSTD_DICT if self.has_dict else METHOD_ZSTD), frame

    def compress_many(self, raws: Sequence[bytes]) -> list[tuple[int, bytes]]:
        """:meth:`compress` of each of ``raws``, in order: the same bytes, faster.

        Several objects are compressed in one call, in parallel threads, by
        python-zstandard's ``multi_compress_to_buffer``: each input is still
        one frame, made with this compressor's parameters and dictionary by
        the same one-shot call as :meth:`compress`, so the frames are byte for
        byte those of :meth:`compress` (whatever the thread count; the tests
        check it). Falls back to a loop where that API is missing (the CFFI
        backend) or for a handful of objects.
        """
        if len(raws) < _MULTI_MIN or not _MULTI_OK:
            return [self.compress(r) for r in raws]
        # Threads only for small objects: each thread's context is sized for
        # its largest input, and for large ones they cost memory (and time)
        # that the parallelism does not pay back.
        threads = _compress_threads() if max(map(len, raws)) <= _THREADED_MAX_OBJECT else 1
        frames = self._cctx.multi_compress_to_buffer(raws, threads=threads)
        method = METHOD_ZSTD_DICT if self.has_dict else METHOD_ZSTD
        out = []
        for raw, seg in zip(raws, frames):
            if len(seg) >= len(raw):
                out.append((METHOD_STORED, raw))
            else:
                out.append((method, seg.tobytes()))
        if len(out) != len(raws):  # pragma: no cover - one frame per input
            raise RuntimeError("zstd returned fewer frames than inputs")
        return out


#: Batches smaller than this are compressed one call at a time.
_MULTI_MIN = 8
#: Batches with an object larger than this are compressed in one thread.
_THREADED_MAX_OBJECT = 64 << 10
_MULTI_OK = hasattr(zstandard.ZstdCompressor, "multi_compress_to_buffer") and getattr(zstandard, "backend", "cext") == "cext"


def _compress_threads() -> int:
    """Threads for batch compression: the CPUs this process may use, at most 4."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(4, n))


# -------------------------------------------------------------- dictionary

#: Objects sampled for training: at most this many bytes.
DICT_SAMPLE_BUDGET = 8 << 20
#: Only objects up to this size are sampled (and counted): a dictionary helps
#: small objects, larger ones compress well on their own.
DICT_SAMPLE_MAX_OBJECT = 64 << 10
_DICT_MIN_SAMPLE_BYTES = 64 << 10
_DICT_MIN_SAMPLES = 32


def dictionary_size_for(total_bytes: int) -> int:
    """About 1/64 of the data, between 4 KiB and zstd's default 110 KiB (measured, §12.4)."""
    return max(4096, min(112640, total_bytes // 64))


def choose_dictionary(samples: Sequence[bytes], total_bytes: int, level: int = COMPRESSION_LEVEL) -> bytes | None:
    """Train a dictionary on ``samples``; return it only if it pays for itself.

    ``total_bytes`` is the size of everything the pack will hold; the
    saving measured on the samples is scaled to it and must exceed the
    dictionary's own size. Deterministic for given samples (one thread).
    """
    return _choose_dictionary(samples, total_bytes, level)[0]


def _choose_dictionary(
    samples: Sequence[bytes], total_bytes: int, level: int
) -> tuple[bytes | None, int, list[tuple[int, bytes]]]:
    """:func:`choose_dictionary`, and what its estimate compressed: the probe's
    step (every k-th sample) and each probed sample as :meth:`Compressor.compress`
    with the dictionary at ``level`` gives it (empty without a dictionary)."""
    sample_bytes = sum(len(s) for s in samples)
    if sample_bytes < _DICT_MIN_SAMPLE_BYTES or len(samples) < _DICT_MIN_SAMPLES:
        return None, 1, []
    size = dictionary_size_for(total_bytes)
    try:
        zd = zstandard.train_dictionary(size, list(samples), k=1024, d=8, steps=0, level=level, threads=1)
    except zstandard.ZstdError:
        return None, 1, []  # too little or too uniform data to train on
    d = zd.as_bytes()
    plain = Compressor(None, level)
    with_d = Compressor(d, level)
    # Estimate on at most ~2 MiB of the samples (every k-th), scaled up.
    step = max(1, sample_bytes // (2 << 20))
    probe = samples[::step]
    probe_bytes = sum(len(s) for s in probe)
    with_frames = with_d.compress_many(probe)
    saving = sum(len(f) for _m, f in plain.compress_many(probe)) - sum(len(f) for _m, f in with_frames)
    saving = saving * total_bytes // max(1, probe_bytes)
    if saving > len(d):
        return d, step, with_frames
    return None, 1, []


def sample_dictionary(
    read: Callable[[ObjectId], RawObject],
    small: Sequence[ObjectId],
    small_total: int,
    compressed: dict[ObjectId, tuple[int, bytes]] | None = None,
) -> bytes | None:
    """A dictionary for a pack, trained on a sample of its small objects.

    ``small`` lists the pack's objects of at most :data:`DICT_SAMPLE_MAX_OBJECT`
    bytes (``small_total`` bytes together); every k-th is read, at most
    :data:`DICT_SAMPLE_BUDGET` bytes in all — a constant, whatever the pack's
    size. None when a dictionary would not pay for itself.

    ``compressed``, if given, receives the objects that the choice already
    compressed with the dictionary it returns (about 2 MiB of them), as
    ``id -> (method, stored bytes)``: what :class:`PackStream` with that
    dictionary would make of them, for :meth:`PackStream.add_many`'s
    ``precompressed``.
    """
    if small_total < _DICT_MIN_SAMPLE_BYTES or len(small) < _DICT_MIN_SAMPLES:
        return None
    mean = small_total / len(small)
    step = max(1, int(len(small) * mean / DICT_SAMPLE_BUDGET) + 1) if small_total > DICT_SAMPLE_BUDGET else 1
    samples: list[bytes] = []
    ids: list[ObjectId] = []
    budget = DICT_SAMPLE_BUDGET
    for oid in small[::step]:
        raw = read(oid).raw
        if len(raw) > budget:
            break
        samples.append(raw)
        ids.append(oid)
        budget -= len(raw)
    d, probe_step, frames = _choose_dictionary(samples, small_total, COMPRESSION_LEVEL)
    if d is not None and compressed is not None:
        compressed.update(zip(ids[::probe_step], frames))
    return d


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


# ------------------------------------------------------------------ scanning


def scan_entries(
    buf: bytes | memoryview | mmap.mmap,
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


def _find(buf, needle: bytes, start: int, limit: int) -> int:
    i = buf.find(needle, start, limit)
    return limit if i < 0 else i


# ------------------------------------------------------------------ writing


@dataclass(frozen=True)
class PackInfo:
    """A committed pack: its name (the trailer in hex) and its files."""

    name: str
    pack_path: str
    idx_path: str
    count: int
    size: int


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
        :meth:`Compressor.compress_many`. An object found in
        ``precompressed`` (``id -> (method, stored)``, as
        :func:`sample_dictionary` gives for this stream's dictionary at this
        stream's level) is not compressed again; its item is removed.
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
        with :func:`parse_entry_fields` (against a pack with this pack's
        dictionary: same ``has_dict``), giving ``oid``, ``raw_len`` and
        ``crc``, and whose CRC it verified (an import, which verifies each
        bundle entry and then stages it): parsing and CRC-ing the same bytes
        again would find nothing new, so this does not.
        """
        if oid in self._seen:
            return False
        self._append(head, stored, oid, raw_len, crc)
        return True

    def _append_new(self, method: int, oid: ObjectId, raw_len: int, stored: bytes) -> None:
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

    def reader(self) -> "PackReader":
        """Read the sealed pack before it is committed (import checks refs with it)."""
        return PackReader(self.tmp, self.index, check_name=False)

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


# ------------------------------------------------------------------ reading


def _map(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise BadPack(path, "empty file")
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)  # the mapping stays valid, even if the file is unlinked


class PackReader:
    """One committed pack, read through ``mmap``: O(log n) lookup, no whole-file read.

    Implements the store's ``ObjectSource`` protocol. Structural checks of
    the index happen at open; :meth:`verify` checks every checksum; every
    object read is rehashed against its id, as loose objects are.
    """

    def __init__(self, pack_path: str, index: bytes | mmap.mmap, *, check_name: bool = True, idx_path: str | None = None) -> None:
        self.path = pack_path
        self.idx_path = idx_path or "<index in memory>"
        self._idx = index
        self._pack = _map(pack_path)
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
    def open(cls, base: str) -> "PackReader":
        """Open ``<base>.pack`` with ``<base>.idx``; FileNotFoundError if either is gone."""
        idx = _map(base + ".idx")
        try:
            return cls(base + ".pack", idx, idx_path=base + ".idx")
        except BaseException:
            idx.close()
            raise

    # -- structure

    def _check_structure(self, check_name: bool) -> None:
        idx, where = self._idx, self.idx_path
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
        self._fan = fan
        self.count = n
        self._ids_at = IDX_HEADER_SIZE
        self._crcs_at = IDX_HEADER_SIZE + 32 * n
        self._offs_at = self._crcs_at + 4 * n
        self.trailer = bytes(idx[n_bytes - 2 * TRAILER_SIZE : n_bytes - TRAILER_SIZE])
        self.name = self.trailer.hex()

        pack, pwhere = self._pack, self.path
        size = len(pack)
        if size < PACK_PREFIX_SIZE + 4 + END_SIZE + TRAILER_SIZE:
            raise BadPack(pwhere, f"pack of {size} bytes is too short")
        if pack[size - TRAILER_SIZE :] != self.trailer:
            raise BadPack(pwhere, f"trailer does not match index {where}")
        if check_name:
            m = _PACK_NAME.fullmatch(os.path.basename(pwhere)[:-5])
            if not m or m.group(1) != self.name:
                raise BadPack(pwhere, f"file name does not match the pack's trailer {self.name}")
        dlen = parse_pack_header_prefix(pack[:PACK_PREFIX_SIZE], pwhere)
        start = PACK_PREFIX_SIZE + dlen + 4
        if start + END_SIZE + TRAILER_SIZE > size:
            raise BadPack(pwhere, "pack header runs past the end")
        self.dictionary = bytes(pack[PACK_PREFIX_SIZE : PACK_PREFIX_SIZE + dlen]) or None
        check_pack_header(pack[:PACK_PREFIX_SIZE], self.dictionary or b"", _U32.unpack_from(pack, start - 4)[0], pwhere)
        self.data_start = start
        self.entries_end = size - TRAILER_SIZE - END_SIZE
        self.size = size
        # Load the dictionary now: an unusable one makes the whole pack
        # broken at open (fsck names it, gc skips it) rather than failing
        # later inside an object read that callers expect CorruptObject from.
        try:
            self._tls.d = Decompressor(self.dictionary)
        except BadPack as e:
            raise BadPack(pwhere, e.reason) from None

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
                        where = f"{self.path}:{oid.hex()}"
                        raw = self._decompressor().decompress_raw(method, raw_len, stored, where)
                        return parse_object(raw, where, expect_id=oid)
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
        return os.stat(self.path).st_mtime

    # -- checking

    def verify(self, progress: Callable[[int], None] | None = None) -> None:
        """Check every checksum and that index and pack agree entry by entry."""
        idx, where = self._idx, self.idx_path
        n = len(idx)
        if blake3.blake3(idx[: n - TRAILER_SIZE]).digest() != idx[n - TRAILER_SIZE :]:
            raise BadPack(where, "index trailer checksum mismatch")
        prev = b""
        for i in range(self.count):
            oid = bytes(self._id_at(i))
            if oid <= prev:
                raise BadPack(where, f"ids not sorted or duplicated at {oid.hex()}", self._ids_at + 32 * i)
            lo = self._fan[oid[0] - 1] if oid[0] else 0
            if not lo <= i < self._fan[oid[0]]:
                raise BadPack(where, f"fanout disagrees with id {oid.hex()}")
            prev = oid
        pack, pwhere = self._pack, self.path
        h = blake3.blake3()
        end = self.size - TRAILER_SIZE
        for at in range(0, end, 8 << 20):
            h.update(pack[at : min(end, at + (8 << 20))])
        if h.digest() != self.trailer:
            raise BadPack(pwhere, "pack trailer checksum mismatch")
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
    """Stands in for a pack whose index cannot be opened, so fsck can name it.

    Holds no objects; :meth:`verify` raises the error met at open.
    """

    def __init__(self, path: str, error: KxenError) -> None:
        self.path = path
        self.error = error
        self.name = os.path.basename(path)
        self.count = 0

    def has(self, oid: ObjectId) -> bool:
        return False

    def read_raw(self, oid: ObjectId) -> RawObject | None:
        return None

    def iter_ids(self) -> Iterator[ObjectId]:
        return iter(())

    def with_prefix(self, hexprefix: str) -> list[ObjectId]:
        return []

    def verify(self, progress=None) -> None:
        raise self.error

    def close(self) -> None:
        pass
