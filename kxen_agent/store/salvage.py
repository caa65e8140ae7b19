"""Reading what a damaged file still holds: a pack entry by entry, a step log record by record.

``objects_spec.md`` §18 (Damage and repair) says what a reader must do
with damage: a pack is judged entry by entry (its trailer, end record or
index being wrong loses no entry that still checks), and a step log record
by record (every record whose own checks pass, before and after the
damage, is kept). This module finds those entries and records and names
the damaged byte ranges; it never writes. fsck reports from it and repair
acts on it.

Every object found is rehashed against its id (as every read is); every
record found passes its own checksum and trailer checks, bound to the
log's header line. Nothing here trusts a length or an offset that no
check covers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import blake3

from kxen_agent.errors import KxenError

from .fsio import FileIO
from .objects import CorruptObject, ObjectId, RawObject, parse_object
from .steps import (
    _FRAME,
    RECORD_MAGIC,
    CorruptSteps,
    StepRecord,
    _candidates,
    _later_record_v1,
    _parse_body,
    _real_header,
    _real_trailer,
    encode_header,
    read_header,
    scan,
)

__all__ = ["DamagedEntry", "LogSalvage", "PackSalvage", "salvage_log", "salvage_pack"]


@dataclass(frozen=True)
class DamagedEntry:
    """One object of a pack that does not read: its id (None when no check names it), offset, why."""

    oid: ObjectId | None
    offset: int
    reason: str


@dataclass
class PackSalvage:
    """What one pack holds that reads, and what does not.

    ``good``: id -> (offset, method, raw length, stored start, stored end)
    of every entry whose CRC and rehash pass; ``damaged``: the entries
    that do not (named by the index when the entry's own header is gone);
    ``frame``: what is wrong with the pack's header, end record, trailer or
    index beyond its entries (empty: nothing).
    """

    path: str
    idx_path: str
    dictionary: bytes | None = None
    good: dict[ObjectId, tuple[int, int, int, int, int]] = field(default_factory=dict)
    kinds: dict[ObjectId, str] = field(default_factory=dict)
    damaged: list[DamagedEntry] = field(default_factory=list)
    frame: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.damaged and not self.frame


def _read_all(io: FileIO, path: str) -> bytes | None:
    try:
        return io.read(path)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError:
        return None


def salvage_pack(io: FileIO, pack_path: str, *, keep_raw: bool = False,
                 raws: dict[ObjectId, RawObject] | None = None) -> PackSalvage:
    """Check ``pack_path`` (and its ``.idx``) entry by entry.

    ``raws``: if given, every object that reads is put there too (repair
    re-packs them). Reading whole files is fine here: this runs on damage
    only, never on the hot path.
    """
    # The pack code, imported only here: a store opens (and a step log is salvaged) without it.
    from .pack.compress import Decompressor
    from .pack.format import (
        _ENTRY,
        END_SIZE,
        ENTRY_HEADER_SIZE,
        PACK_PREFIX_SIZE,
        TRAILER_SIZE,
        BadPack,
        parse_index,
        parse_pack_header_prefix,
        scan_entries,
        verify_index,
        verify_pack_trailer,
    )

    idx_path = pack_path[: -len(".pack")] + ".idx"
    out = PackSalvage(pack_path, idx_path)
    pack = _read_all(io, pack_path)
    idx = _read_all(io, idx_path)
    # What the index says (if it parses): id -> (offset, crc).
    indexed: dict[ObjectId, int] = {}
    layout = None
    index_ok = False  # its own checksum matches: what it names is what was written
    if idx is None:
        out.frame.append(f"index {idx_path} is missing or unreadable")
    else:
        try:
            layout = parse_index(idx, idx_path)
            for i in range(layout.count):
                oid = bytes(idx[layout.ids_at + 32 * i: layout.ids_at + 32 * i + 32])
                indexed[oid] = int.from_bytes(idx[layout.offs_at + 8 * i: layout.offs_at + 8 * i + 8], "big")
            verify_index(idx, layout, idx_path)
            index_ok = True
        except BadPack as e:
            out.frame.append(f"index {idx_path}: {e.reason}")
    if pack is None:
        out.frame.append(f"pack {pack_path} is missing or unreadable")
        out.damaged.extend(DamagedEntry(oid, off, "the pack file is missing or unreadable")
                           for oid, off in sorted(indexed.items(), key=lambda x: x[1]))
        return out
    start = PACK_PREFIX_SIZE
    dictionary: bytes | None = None
    try:
        dlen = parse_pack_header_prefix(pack[:PACK_PREFIX_SIZE], pack_path)
        if PACK_PREFIX_SIZE + dlen + 4 <= len(pack):
            start = PACK_PREFIX_SIZE + dlen + 4
            dictionary = bytes(pack[PACK_PREFIX_SIZE: PACK_PREFIX_SIZE + dlen]) or None
    except BadPack as e:
        out.frame.append(f"pack header: {e.reason}")
    out.dictionary = dictionary
    try:
        # A damaged dictionary is tried all the same: every object is rehashed.
        dec = Decompressor(dictionary)
    except BadPack:
        out.frame.append("the pack's zstd dictionary is damaged: its entries that use it do not read")
        dec = Decompressor(None)
    limit = max(start, len(pack) - TRAILER_SIZE - END_SIZE)
    skipped: list[tuple[int, int, str]] = []
    for e in scan_entries(pack, start, limit, pack_path, has_dict=True, resync=True,
                          skipped=lambda a, b, why: skipped.append((a, b, why))):
        where = f"{pack_path}:{e.id.hex()}"
        s0 = e.offset + ENTRY_HEADER_SIZE
        try:
            raw = dec.decompress(e, pack[s0:e.end], where)
            obj = parse_object(raw, where, expect_id=e.id)
        except CorruptObject as ex:
            skipped.append((e.offset, e.end, ex.reason))
            continue
        if e.id in out.good:
            continue
        out.good[e.id] = (e.offset, e.method, e.raw_len, s0, e.end)
        out.kinds[e.id] = obj.kind
        if raws is not None:
            raws[e.id] = obj
    named: set[ObjectId] = set()
    for a, b, why in skipped:
        ids = [oid for oid, off in indexed.items() if a <= off < b and oid not in out.good]
        if not ids and a + ENTRY_HEADER_SIZE <= len(pack):
            cand = bytes(_ENTRY.unpack_from(pack, a)[2])
            if cand not in out.good and (not indexed or cand in indexed):
                ids = [cand]
        for oid in ids:
            named.add(oid)
            out.damaged.append(DamagedEntry(oid, indexed.get(oid, a), why))
        if not ids:
            out.damaged.append(DamagedEntry(None, a, why))
    phantom = 0
    for oid, off in sorted(indexed.items(), key=lambda x: x[1]):
        if oid not in out.good and oid not in named:
            if not index_ok:
                phantom += 1  # a damaged index names an id no entry holds: the index's damage, not an object's
                continue
            out.damaged.append(DamagedEntry(oid, off, "the index names it, but no entry that checks holds it"))
    if phantom:
        out.frame.append(f"the damaged index names {phantom} id(s) that no entry holds")
    out.damaged.sort(key=lambda d: d.offset)
    # The frame: the end record's count and the trailer (checked only if the entries leave them unexplained).
    try:
        verify_pack_trailer(pack, pack[-TRAILER_SIZE:], pack_path)
    except BadPack as e:
        if not out.damaged:
            out.frame.append(e.reason)
    if layout is not None and idx is not None and pack[-TRAILER_SIZE:] != layout.trailer:
        if not out.damaged:
            out.frame.append("the pack's trailer does not match its index's")
    if layout is not None and set(out.good) - set(indexed):
        extra = len(set(out.good) - set(indexed))
        out.frame.append(f"{extra} object(s) in the pack are not in its index")
    return out


# ------------------------------------------------------------------ step logs


@dataclass
class LogSalvage:
    """The records of a damaged step log that still check, and the damaged ranges between them.

    ``line``: the header line the records are bound to (None: the header
    is damaged and no guess made a record check); ``damage``: (start,
    end, why) byte ranges, file offsets; ``before``: how many of
    ``records`` lie before the first damage.
    """

    path: str
    group: str
    gen: int | None
    version: int
    line: bytes | None
    records: list[StepRecord]
    damage: list[tuple[int, int, str]]
    before: int
    data: bytes

    @property
    def after(self) -> int:
        return len(self.records) - self.before


def salvage_log(io: FileIO, path: str, group: str, gens: tuple[int, ...] = (0, 1)) -> LogSalvage | None:
    """Every record of the step log at ``path`` that checks; None if the file is gone or reads clean.

    ``gens``: generations to try when the header line itself is damaged
    (the ref file's ``steps N``, and 0), since version 2's record checks
    are bound to that line: the one that makes a record check is it.
    """
    data = _read_all(io, path)
    if data is None:
        return None
    try:
        version, group_in, gen, hlen = read_header(data, path)
        line: bytes | None = data[:hlen]
        header_ok = group_in == group
    except CorruptSteps:
        version, gen, line, header_ok = 2, None, None, False
    if header_ok:
        try:
            scan(data, hlen, path, line=line)
            return None  # reads clean (maybe with an uncommitted tail)
        except CorruptSteps:
            pass
    damage: list[tuple[int, int, str]] = []
    if not header_ok:
        line, gen, version = None, None, 2
        for g in gens:
            cand = encode_header(group, g)
            if _first_real(data, 1, cand) is not None:
                line, gen = cand, g
                break
        end_hdr = data.find(b"\n")
        hlen = end_hdr + 1 if 0 <= end_hdr < 200 else 0
        if line is not None:
            hlen = min(len(line), len(data))
        damage.append((0, hlen, "the log's header line is damaged"))
        if line is None:
            damage = [(0, len(data), "the log's header line is damaged and no record can be checked without it")]
            return LogSalvage(path, group, None, 2, None, [], damage, 0, data)
    assert line is not None
    if version == 1:
        recs, dmg = _salvage_v1(data, hlen, path)
    else:
        recs, dmg = _salvage_v2(data, hlen, path, line)
    damage += dmg
    first = damage[0][0] if damage else len(data)
    before = sum(1 for r in recs if r.end <= first)
    return LogSalvage(path, group, gen, version, line, recs, damage, before, data)


def _record_at(buf: bytes, p: int, line: bytes, path: str) -> StepRecord | None:
    """The version-2 record at ``p``, if every check of it passes (header, checksum, trailer, body)."""
    blen = _real_header(buf, p, line, 0)
    if blen is None or p + _FRAME + blen > len(buf):
        return None
    e = p + _FRAME + blen
    s = e - 64
    if blake3.blake3(buf[p:s]).digest() != buf[s:s + 32]:
        return None
    if _real_trailer(buf, e - 32, line, 0) != (blen, p):
        return None
    try:
        return _parse_body(memoryview(buf), p + 32, s, p, e, f"step log {path} at offset {p}")
    except CorruptSteps:
        return None


def _first_real(buf: bytes, start: int, line: bytes) -> int | None:
    """Where the first whole, checking version-2 record at or after ``start`` begins."""
    for q in _candidates(buf, RECORD_MAGIC, start, start, max(start, len(buf) - 32)):
        if _record_at(buf, q, line, "") is not None:
            return q
    return None


def _salvage_v2(buf: bytes, p: int, path: str, line: bytes) -> tuple[list[StepRecord], list[tuple[int, int, str]]]:
    recs: list[StepRecord] = []
    damage: list[tuple[int, int, str]] = []
    n = len(buf)
    while p < n:
        rec = _record_at(buf, p, line, path)
        if rec is not None:
            recs.append(rec)
            p = rec.end
            continue
        q = _first_real(buf, p + 1, line)
        if q is None:
            # Nothing that checks follows: a torn tail (the normal rule) or damage reaching the end.
            try:
                scan(buf[p:], 0, path, line=line, base=p)
                break  # an uncommitted tail: not damage
            except CorruptSteps as e:
                damage.append((p, n, _why(e)))
                break
        damage.append((p, q, "bytes that are no record that checks"))
        p = q
    return recs, damage


def _salvage_v1(buf: bytes, p: int, path: str) -> tuple[list[StepRecord], list[tuple[int, int, str]]]:
    """Version 1 (§6.8.1): a record is its magic, length, body and checksum; after damage, the next one that checks."""
    recs: list[StepRecord] = []
    damage: list[tuple[int, int, str]] = []
    view = memoryview(buf)
    n = len(buf)
    while p < n:
        if buf[p:p + 4] == RECORD_MAGIC and p + 8 <= n:
            end = p + 8 + int.from_bytes(buf[p + 4:p + 8], "big") + 32
            if end <= n and blake3.blake3(view[p:end - 32]).digest() == buf[end - 32:end]:
                try:
                    recs.append(_parse_body(view, p + 8, end - 32, p, end, f"step log {path} at offset {p}"))
                    p = end
                    continue
                except CorruptSteps:
                    pass
        nxt = _later_record_v1(view, p)
        if nxt is None:
            break  # nothing that checks follows: an uncommitted tail, as version 1's rule reads it
        damage.append((p, nxt, "bytes that are no record that checks"))
        p = nxt
    return recs, damage


def _why(e: KxenError) -> str:
    text = str(e)
    head, _, rest = text.partition(": ")
    return rest.split("; ")[0] if rest else text


def pack_base(path: str) -> str:
    return path[: -len(".pack")] if path.endswith(".pack") else os.path.splitext(path)[0]
