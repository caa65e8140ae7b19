"""Bundles: ref groups and every object reachable from them, in one verifiable file.

A bundle is self-contained (no prerequisites, like ``git bundle create
--all`` of a closed set): it imports into an empty state dir. Two forms
(normative text: ``objects_spec.md`` §12.5-§12.7):

- *pack form*: ``KXBUNDLE``, the format version, a strict-CBOR header (the
  capabilities, the refs with their ids, the object count and size) with a
  CRC-32, then exactly a pack (:mod:`.pack`) of the objects, then a
  BLAKE3-256 trailer over every byte before it;
- *JSON form*: one JSON document with the same header fields and each
  object's id, kind and canonical bytes (base64), for people who read
  bundles with ``jq``; a ``digest`` ties the refs to the object ids.

Objects come parents first: each object follows an object that links to
it or is the target of a ref. So one streaming pass, remembering only ids,
checks that the bundle holds exactly the closure of its refs — nothing
missing, nothing extra, nothing twice.

Bundles carry objects reachable from the named refs and nothing else: no
environment, no configuration, no credentials (the store holds none).

Export, verification and import stream: memory holds ids, about one
object's bytes (twice, while it is read or compressed), a read-ahead or
write buffer of a MiB and, for export, a constant budget of small objects
the closure walk keeps for the dictionary and the writer
(:data:`EXPORT_KEEP_BUDGET`, so that each is read once; the others are read
again). Import verifies everything while staging the new
objects into a temporary pack, then checks the refs (fast-forward only),
then commits the pack's index, then moves the refs, one transaction per
group. A bundle that fails any check leaves no ref, no object and no pack.
Every rejection is one :class:`BadBundle` naming the first problem.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import json
import os
import io
import re
import stat
import struct
import zlib
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO, Callable, Iterator, Mapping

import blake3

from kxen_agent.errors import KxenError, UsageError

from . import codec
from .fsio import FileIO
from .loose import LooseNames
from .objects import (CorruptObject, ObjectId, RawObject, Schema, SchemaViolation, a_kind, decode_body, decode_stored,
                      links_of, parse_object)
from .pack import (
    DICT_SAMPLE_BUDGET,
    DICT_SAMPLE_MAX_OBJECT,
    END_MAGIC,
    END_SIZE,
    ENTRY_HEADER_SIZE,
    MAX_RAW_SIZE,
    PACK_PREFIX_SIZE,
    TRAILER_SIZE,
    BadPack,
    Decompressor,
    PackStream,
    PackWriter,
    check_pack_header,
    crc32,
    parse_end,
    parse_entry_fields,
    parse_pack_header_prefix,
    sample_dictionary,
)
from .refs import BadRefName, RefUpdate, validate_group, validate_ref_name
from .repo import MissingObject, Store

__all__ = [
    "BUNDLE_MAGIC",
    "BUNDLE_VERSION",
    "BadBundle",
    "BundleInfo",
    "BundleRefused",
    "BundleWriteError",
    "ImportResult",
    "NoSuchGroup",
    "export_bundle",
    "format_for_path",
    "import_bundle",
    "iter_bundle_objects",
    "verify_bundle",
    "verify_bundle_with_ref_targets",
]

BUNDLE_MAGIC = b"KXBUNDLE"
BUNDLE_VERSION = 1
#: Capabilities a version-1 reader understands; any other is refused.
CAP_ZSTD_DICT = "zstd-dict"  # entries may use the pack's zstd dictionary
KNOWN_CAPABILITIES = frozenset({CAP_ZSTD_DICT})
JSON_FORMAT_NAME = "kxen-bundle"
MAX_HEADER_SIZE = 16 << 20

_PREFIX = struct.Struct(">8sII")  # magic, version, header length
_U32 = struct.Struct(">I")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_JSON_KEYS = ("format", "version", "capabilities", "refs", "objectCount", "objectBytes", "objects", "digest")
_JSON_DIGEST_PREFIX = b"kxen-bundle-json 1\n"
# The longest canonical base64 of the longest object bytes.
_MAX_B64 = 4 * ((MAX_RAW_SIZE + 2) // 3)
#: Export keeps the small objects its closure walk reads (those of at most
#: DICT_SAMPLE_MAX_OBJECT bytes, the dictionary's audience), up to this many
#: object bytes, and writes them from memory; the others are read again.
#: A constant, whatever the bundle's size (a session of ~15,000 messages fits).
EXPORT_KEEP_BUDGET = 16 << 20
# What keeping an object costs beyond its bytes (RawObject, bytes header, id, dict slot), about.
_KEPT_OVERHEAD = 200
# Entry header bytes covered by the entry's CRC (all but the CRC itself).
_ENTRY_CRC_COVERED = ENTRY_HEADER_SIZE - 4

Progress = Callable[[int], None]


class BadBundle(KxenError):
    """A bundle file breaks the format or fails a check; nothing was imported."""

    def __init__(self, where: str, reason: str, offset: int | None = None, unit: str = "byte") -> None:
        at = f" (at {unit} {offset})" if offset is not None else ""
        super().__init__(f"bad bundle {where}: {reason}{at}")
        self.where = where
        self.reason = reason
        self.offset = offset


class BundleRefused(KxenError):
    """Import would move a local ref backwards or sideways; nothing was imported."""

    def __init__(self, group: str, ref: str, local: bytes, bundle: bytes | None, why: str) -> None:
        theirs = "has no such ref" if bundle is None else f"has {bundle.hex()[:16]}"
        super().__init__(
            f"import refused: ref {group}/{ref} is {local.hex()[:16]} here and the bundle {theirs}: {why}; "
            "nothing was imported (fork or delete the local one first)"
        )
        self.group = group
        self.ref = ref
        self.local = local
        self.bundle = bundle


class BundleWriteError(KxenError):
    """The bundle file could not be written (nothing is left behind)."""


class NoSuchGroup(UsageError):
    """An export named a ref group that does not exist (or has no refs, or is deleted)."""


@dataclass(frozen=True)
class BundleInfo:
    """What a bundle holds, as verified."""

    path: str
    format: str  # "pack" | "json"
    version: int
    capabilities: tuple[str, ...]
    refs: Mapping[str, Mapping[str, bytes]]
    objects: int
    object_bytes: int  # sum of the canonical object sizes
    pack_bytes: int  # the pack section (pack form), 0 for JSON
    file_bytes: int
    digest: str  # the trailer (pack form) or the digest (JSON form), hex
    kinds: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "format": self.format,
            "version": self.version,
            "capabilities": list(self.capabilities),
            "refs": {g: {n: v.hex() for n, v in sorted(r.items())} for g, r in sorted(self.refs.items())},
            "objects": self.objects,
            "objectBytes": self.object_bytes,
            "packBytes": self.pack_bytes,
            "fileBytes": self.file_bytes,
            "digest": self.digest,
            "kinds": dict(sorted(self.kinds.items())),
        }


@dataclass(frozen=True)
class ImportResult:
    info: BundleInfo
    new_objects: int
    pack: str | None  # the pack written, None when every object was already here
    groups: Mapping[str, str]  # group -> "created" | "updated" | "unchanged" | "restored"
    refs: Mapping[str, Mapping[str, bytes]]  # as written (after ``transform``)

    def to_json(self) -> dict:
        return {
            "bundle": self.info.to_json(),
            "newObjects": self.new_objects,
            "pack": self.pack,
            "groups": dict(self.groups),
            "refs": {g: {n: v.hex() for n, v in sorted(r.items())} for g, r in sorted(self.refs.items())},
        }


def format_for_path(path: str, fmt: str | None = None) -> str:
    """``fmt`` if given, else ``json`` for a ``.json`` file name, else ``pack``."""
    if fmt is not None:
        if fmt not in ("pack", "json"):
            raise UsageError(f"unknown bundle format {fmt!r}: use 'pack' or 'json'")
        return fmt
    return "json" if str(path).lower().endswith(".json") else "pack"


def _set_total(progress: Progress | None, n: int) -> None:
    # Duck-typed: the CLI's Progress shows a percentage once it knows the total.
    if progress is not None and hasattr(progress, "total") and getattr(progress, "total") is None:
        try:
            progress.total = n  # type: ignore[attr-defined]
        except AttributeError:
            pass


# ================================================================== header


@dataclass(frozen=True)
class _Header:
    capabilities: tuple[str, ...]
    refs: dict[str, dict[str, bytes]]
    objects: int
    size: int

    def cbor(self) -> bytes:
        return codec.encode(
            {"capabilities": list(self.capabilities), "objects": self.objects, "refs": self.refs, "size": self.size},
            links_only=True,
        )


def _check_refs(refs: Any, where: str, offset: int | None, unit: str = "byte") -> dict[str, dict[str, bytes]]:
    def bad(reason: str) -> BadBundle:
        return BadBundle(where, reason, offset, unit)

    if type(refs) is not dict or not refs:
        raise bad("refs must be a non-empty map of ref groups")
    out: dict[str, dict[str, bytes]] = {}
    for group, names in refs.items():
        try:
            validate_group(group)
        except BadRefName as e:
            raise bad(str(e)) from None
        if type(names) is not dict or not names:
            raise bad(f"ref group {group!r} must map at least one ref name to an id")
        out[group] = {}
        for name, oid in names.items():
            try:
                validate_ref_name(name)
            except BadRefName as e:
                raise bad(f"in ref group {group}: {e}") from None
            if type(oid) is not bytes or len(oid) != 32:
                raise bad(f"ref {group}/{name} is not a 32-byte object id")
            out[group][name] = oid
    return out


def _check_header(value: Any, where: str, offset: int) -> _Header:
    if type(value) is not dict:
        raise BadBundle(where, "header is not a map", offset)
    keys = {"capabilities", "objects", "refs", "size"}
    if set(value) != keys:
        extra = sorted(set(value) - keys)
        missing = sorted(keys - set(value))
        raise BadBundle(where, f"header keys: unknown {extra}, missing {missing}", offset)
    caps = value["capabilities"]
    if type(caps) is not list or any(type(c) is not str for c in caps):
        raise BadBundle(where, "capabilities must be a list of strings", offset)
    for c in caps:
        if c not in KNOWN_CAPABILITIES:
            raise BadBundle(where, f"unknown capability {c!r} (this kxen-agent knows {sorted(KNOWN_CAPABILITIES)}); upgrade kxen-agent", offset)
    if caps != sorted(set(caps)):
        raise BadBundle(where, "capabilities must be sorted and unique", offset)
    n, size = value["objects"], value["size"]
    if type(n) is not int or n < 0 or type(size) is not int or size < 0:
        raise BadBundle(where, "object count and size must be non-negative integers", offset)
    return _Header(tuple(caps), _check_refs(value["refs"], where, offset), n, size)


# ================================================================== verification


class _Closure:
    """Checks, in one pass, that the objects are exactly the closure of the refs."""

    def __init__(self, hdr: _Header, where: str) -> None:
        self.where = where
        self.hdr = hdr
        # id -> who asked for it: "ref G/R", or the id of the linking object
        self.pending: dict[ObjectId, str | bytes] = {}
        for g in sorted(hdr.refs):
            for name, oid in sorted(hdr.refs[g].items()):
                self.pending.setdefault(oid, f"ref {g}/{name}")
        self.seen: set[ObjectId] = set()
        self.count = 0
        self.bytes = 0
        self.kinds: dict[str, int] = {}
        self.schema: Schema | None = None

    def use_schema(self, schema: Schema) -> None:
        """Also check every object's shape and the kind each link and ref names (before any object)."""
        self.schema = schema
        self.kind_of: dict[ObjectId, str] = {}
        # id -> (kind it must be, who says so)
        self.expect: dict[ObjectId, tuple[str, str | bytes]] = {}
        for g in sorted(self.hdr.refs):
            for name, oid in sorted(self.hdr.refs[g].items()):
                k = schema.ref_kind(g, name)
                if k is not None:
                    self._expect(oid, k, f"ref {g}/{name}", None, "byte")

    def add(self, obj: RawObject, offset: int | None, unit: str = "byte") -> None:
        where = self.where
        if obj.id in self.seen:
            raise BadBundle(where, f"object {obj.hex} appears twice (duplicate entry)", offset, unit)
        if self.pending.pop(obj.id, None) is None:
            raise BadBundle(
                where,
                f"object {obj.hex} is not reachable from the refs at this point "
                "(each object must follow an object that links to it)",
                offset, unit,
            )
        if self.count >= self.hdr.objects:
            raise BadBundle(where, f"more objects than the {self.hdr.objects} the header declares", offset, unit)
        kind = obj.kind
        self.seen.add(obj.id)
        self.count += 1
        self.bytes += len(obj.raw)
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if self.schema is not None:
            self.kind_of[obj.id] = kind
            want = self.expect.pop(obj.id, None)
            if want is not None and want[0] != kind:
                raise BadBundle(where, f"{self._who(want[1])} must name {a_kind(want[0])} object, "
                                f"but object {obj.hex} is {a_kind(kind)}", offset, unit)
        if kind == "blob":  # raw bytes: nothing to decode, no links
            return
        try:
            value = decode_body(obj)
        except CorruptObject as e:
            raise BadBundle(where, f"object {obj.hex}: {e.reason}", offset, unit) from None
        seen, pending = self.seen, self.pending
        for child in links_of(kind, value):
            if child not in seen and child not in pending:
                # who asked for it: the linking object's id (named in an error only)
                pending[child] = obj.id
        if self.schema is not None:
            try:
                typed = self.schema.check(kind, value)
            except SchemaViolation as e:
                raise BadBundle(where, f"object {obj.hex} ({kind}): {e}", offset, unit) from None
            for child, k in typed:
                self._expect(child, k, obj.id, offset, unit)

    def _expect(self, oid: ObjectId, kind: str, who: str | bytes, offset: int | None, unit: str) -> None:
        seen_kind = self.kind_of.get(oid)
        if seen_kind is None:
            self.expect.setdefault(oid, (kind, who))
            if self.expect[oid][0] != kind:
                raise BadBundle(self.where, f"object {oid.hex()} must be {a_kind(self.expect[oid][0])} for "
                                f"{self._who(self.expect[oid][1])} and {a_kind(kind)} for {self._who(who)}", offset, unit)
        elif seen_kind != kind:
            raise BadBundle(self.where, f"{self._who(who)} must name {a_kind(kind)} object, "
                            f"but object {oid.hex()} is {a_kind(seen_kind)}", offset, unit)

    def _who(self, who: str | bytes) -> str:
        return who if isinstance(who, str) else f"object {who.hex()}"

    def finish(self, offset: int | None, unit: str = "byte") -> None:
        if self.pending:
            oid, asker = next(iter(self.pending.items()))
            who = self._who(asker)
            verb = "points to" if who.startswith("ref ") else "links to"
            raise BadBundle(self.where, f"{who} {verb} object {oid.hex()}, which the bundle does not contain", offset, unit)
        if self.count != self.hdr.objects:
            raise BadBundle(self.where, f"header declares {self.hdr.objects} objects, the bundle holds {self.count}", offset, unit)
        if self.bytes != self.hdr.size:
            raise BadBundle(self.where, f"header declares {self.hdr.size} object bytes, the objects hold {self.bytes}", offset, unit)


_READ_CHUNK = 256 << 10


class _Input:
    """Exact reads from a binary stream, hashed as they go.

    Reads ahead in pieces of :data:`_READ_CHUNK` bytes and hands out
    slices: most reads cost no system call. A read of a piece or more is
    done at its exact size, without reading ahead: memory stays about
    twice the largest object (the bytes read ahead, the rest, the two
    joined) plus a piece. Consumed
    bytes are hashed in bulk — when the buffer is refilled and whenever a
    digest is taken or the pack hash starts or stops — which hashes exactly
    the bytes consumed, in order, as one update per read would.
    """

    def __init__(self, f: BinaryIO, where: str) -> None:
        self.f = f
        self.where = where
        self.pos = 0  # bytes consumed
        self.buf = b""  # buf[off:] is read ahead, not yet consumed
        self.off = 0
        self.hoff = 0  # buf[hoff:off] is consumed, not yet hashed
        self.hash = blake3.blake3()
        self.pack_hash: Any = None
        try:  # a regular file's size: a length past it is refused before reading
            st = os.fstat(f.fileno())
            self.size: int | None = st.st_size if stat.S_ISREG(st.st_mode) else None
        except (AttributeError, OSError, io.UnsupportedOperation):
            self.size = None

    def _hash_consumed(self) -> None:
        if self.off > self.hoff:
            view = memoryview(self.buf)[self.hoff : self.off]
            self.hash.update(view)
            if self.pack_hash is not None:
                self.pack_hash.update(view)
            self.hoff = self.off

    def start_pack_hash(self) -> None:
        """Hash what is read from here on into :attr:`pack_hash` too."""
        self._hash_consumed()
        self.pack_hash = blake3.blake3()

    def pack_digest(self) -> bytes:
        """The pack hash of what was read since :meth:`start_pack_hash`; stops it."""
        self._hash_consumed()
        d = self.pack_hash.digest()
        self.pack_hash = None
        return d

    def digest(self) -> bytes:
        """The hash of everything read so far."""
        self._hash_consumed()
        return self.hash.digest()

    def read_unless(self, n: int, stop: bytes) -> bytes | None:
        """The next ``n`` bytes if they are read ahead already and do not
        start with ``stop``; else None, and nothing is consumed."""
        off = self.off
        end = off + n
        buf = self.buf
        if end > len(buf) or buf.startswith(stop, off):
            return None
        self.off = end
        self.pos += n
        return buf[off:end]

    def read(self, n: int, what: str | Callable[[], str]) -> bytes:
        """The next ``n`` bytes; ``what`` (text, or a function giving it) names them in an error."""
        off = self.off
        end = off + n
        if end <= len(self.buf):
            self.off = end
            self.pos += n
            return self.buf[off:end]
        return self._refill(n, what)

    def _refill(self, n: int, what: str | Callable[[], str]) -> bytes:
        if self.size is not None and self.pos + n > self.size:
            left = max(0, self.size - self.pos)
            raise BadBundle(self.where, f"truncated: {what if isinstance(what, str) else what()} needs {n} bytes, the file ends after {left}", self.pos)
        self._hash_consumed()
        rest = self.buf[self.off :]
        self.buf = b""
        need = n - len(rest)
        want = need if n >= _READ_CHUNK else _READ_CHUNK
        parts = [rest] if rest else []
        got = 0
        while got < need:
            chunk = self.f.read(want - got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if len(data) < n:
            raise BadBundle(self.where, f"truncated: {what if isinstance(what, str) else what()} needs {n} bytes, the file ends after {len(data)}", self.pos)
        self.buf = data
        self.off = n
        self.hoff = 0
        self.pos += n
        return data if len(data) == n else data[:n]

    def at_eof(self) -> bool:
        return self.off >= len(self.buf) and self.f.read(1) == b""


@dataclass(slots=True)
class _Item:
    obj: RawObject
    head: bytes  # the entry header (pack form), for copying verbatim
    stored: bytes
    offset: int
    crc: int = 0  # the entry's CRC (pack form), checked over head and stored


class _PackBundleReader:
    """Parse and verify a pack-form bundle as a stream.

    Construction reads the header and the pack header; iterating yields
    every verified object; the end of the iteration checks the end record,
    both trailers, the closure and that nothing follows. Only after the
    iteration completed is :attr:`info` set.
    """

    def __init__(self, f: BinaryIO, where: str, path: str) -> None:
        self.inp = _Input(f, where)
        self.where = where
        self.path = path
        self.info: BundleInfo | None = None
        inp = self.inp
        magic, version, hlen = _PREFIX.unpack(inp.read(_PREFIX.size, "the bundle prefix"))
        if magic != BUNDLE_MAGIC:
            raise BadBundle(where, f"not a kxen bundle (magic {magic!r})", 0)
        if version != BUNDLE_VERSION:
            raise BadBundle(where, f"unknown bundle version {version} (this kxen-agent reads version {BUNDLE_VERSION}); upgrade kxen-agent", 8)
        if hlen > MAX_HEADER_SIZE:
            raise BadBundle(where, f"header of {hlen} bytes exceeds the {MAX_HEADER_SIZE}-byte limit", 12)
        raw_header = inp.read(hlen, "the header")
        (crc,) = _U32.unpack(inp.read(4, "the header checksum"))
        if crc32(_PREFIX.pack(magic, version, hlen), raw_header) != crc:
            raise BadBundle(where, "header checksum mismatch", _PREFIX.size)
        try:
            value = codec.decode(raw_header, links_only=True)
        except codec.DecodeError as e:
            raise BadBundle(where, f"header is not strict CBOR: {e.reason}", _PREFIX.size + e.offset) from None
        self.header = _check_header(value, where, _PREFIX.size)
        self.closure = _Closure(self.header, where)

        self.pack_start = inp.pos
        inp.start_pack_hash()
        prefix = inp.read(PACK_PREFIX_SIZE, "the pack header")
        try:
            dlen = parse_pack_header_prefix(prefix, where, self.pack_start)
            dictionary = inp.read(dlen, "the pack dictionary")
            (pcrc,) = _U32.unpack(inp.read(4, "the pack header checksum"))
            check_pack_header(prefix, dictionary, pcrc, where, self.pack_start)
        except BadPack as e:
            raise BadBundle(where, e.reason, e.offset) from None
        if bool(dictionary) != (CAP_ZSTD_DICT in self.header.capabilities):
            raise BadBundle(where, "the pack's dictionary and the zstd-dict capability disagree", self.pack_start)
        self.dictionary = dictionary or None
        try:
            self.decompressor = Decompressor(self.dictionary)
        except BadPack as e:  # pragma: no cover - libzstd loads dictionaries lazily
            raise BadBundle(where, e.reason, self.pack_start) from None

    def __iter__(self) -> Iterator[_Item]:
        inp, where = self.inp, self.where
        has_dict = self.dictionary is not None
        decompress = self.decompressor.decompress_raw
        add = self.closure.add
        read, read_unless = inp.read, inp.read_unless
        count = 0
        while True:
            at = inp.pos
            # The whole header is read ahead (always, but near the end): take
            # it in one slice, unless it is the end record. Otherwise read as
            # the format reads, magic first, so a cut file is named the same.
            head = read_unless(ENTRY_HEADER_SIZE, END_MAGIC)
            if head is None:
                magic = inp.read(4, "an entry or the end record")
                if magic == END_MAGIC:
                    break
                head = magic + inp.read(ENTRY_HEADER_SIZE - 4, "an entry header")
            try:
                method, oid, raw_len, stored_len, crc = parse_entry_fields(head, at, where, has_dict=has_dict)
            except BadPack as ex:
                raise BadBundle(where, ex.reason, ex.offset) from None
            stored = read(stored_len, lambda: f"object {oid.hex()}")
            if zlib.crc32(stored, zlib.crc32(head[:_ENTRY_CRC_COVERED])) != crc:
                raise BadBundle(where, f"entry checksum mismatch for object {oid.hex()}", at)
            h = oid.hex()
            try:
                obj = parse_object(decompress(method, raw_len, stored, h), h, expect_id=oid)
            except CorruptObject as ex:
                raise BadBundle(where, f"object {ex.where}: {ex.reason}", at) from None
            add(obj, at)
            count += 1
            yield _Item(obj, head, stored, at, crc)
        end_at = inp.pos - 4
        try:
            n = parse_end(END_MAGIC + inp.read(END_SIZE - 4, "the end record"), end_at, where)
        except BadPack as ex:  # pragma: no cover - the magic was just matched
            raise BadBundle(where, ex.reason, ex.offset) from None
        if n != count:
            raise BadBundle(where, f"end record counts {n} entries, the pack holds {count}", end_at)
        pack_digest = inp.pack_digest()
        if inp.read(TRAILER_SIZE, "the pack trailer") != pack_digest:
            raise BadBundle(where, "pack trailer checksum mismatch", inp.pos - TRAILER_SIZE)
        pack_bytes = inp.pos - self.pack_start
        digest = inp.digest()
        if inp.read(TRAILER_SIZE, "the bundle trailer") != digest:
            raise BadBundle(where, "bundle trailer checksum mismatch", inp.pos - TRAILER_SIZE)
        if not inp.at_eof():
            raise BadBundle(where, "trailing garbage after the bundle trailer", inp.pos)
        self.closure.finish(None)
        c = self.closure
        self.info = BundleInfo(self.path, "pack", BUNDLE_VERSION, self.header.capabilities, self.header.refs,
                               c.count, c.bytes, pack_bytes, inp.pos, digest.hex(), dict(c.kinds))


# ------------------------------------------------------------------ JSON form


class _Reject(Exception):
    pass


def _no_dup_pairs(pairs: list[tuple[str, Any]]) -> dict:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise _Reject(f"duplicate JSON key {k!r}")
        d[k] = v
    return d


def _no_float(s: str) -> Any:
    raise _Reject(f"number {s[:20]!r} is not an integer")


def _no_constant(s: str) -> Any:
    raise _Reject(f"{s} is not allowed")


_WS = re.compile(r"[ \t\n\r]*")


class _JsonStream:
    """Incremental reading of one JSON document, a value at a time.

    ``json``'s C scanner parses each value; this only feeds it enough text.
    A value longer than its limit is refused before more is read.
    """

    CHUNK = 1 << 20

    def __init__(self, f: BinaryIO, where: str) -> None:
        self.f = f
        self.where = where
        self.text = codecs.getincrementaldecoder("utf-8")("strict")
        self.buf = ""
        self.pos = 0
        self.base = 0
        self.eof = False
        self.dec = json.JSONDecoder(object_pairs_hook=_no_dup_pairs, parse_float=_no_float, parse_constant=_no_constant)

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def bad(self, reason: str, offset: int | None = None) -> BadBundle:
        return BadBundle(self.where, reason, self.offset if offset is None else offset, "character")

    def _more(self, n: int) -> bool:
        if self.eof:
            return False
        data = self.f.read(n)
        try:
            text = self.text.decode(data, final=not data)
        except UnicodeDecodeError:
            raise self.bad("not UTF-8 text") from None
        if not data:
            self.eof = True
        if self.pos:
            self.base += self.pos
            self.buf = self.buf[self.pos :]
            self.pos = 0
        self.buf += text
        return bool(data)

    def skip_ws(self) -> None:
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self._more(self.CHUNK):
                return

    def peek(self) -> str:
        self.skip_ws()
        return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def expect(self, ch: str) -> None:
        c = self.peek()
        if c != ch:
            raise self.bad(f"expected {ch!r}, found {c!r}" if c else f"truncated: expected {ch!r}, the file ends")
        self.pos += 1

    def value(self, limit: int) -> Any:
        self.skip_ws()
        want = self.CHUNK
        while True:
            try:
                v, end = self.dec.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:  # a number at the end might go on
                    self.pos = end
                    return v
            except json.JSONDecodeError as e:
                if self.eof:
                    cut = e.msg.startswith("Unterminated") or e.pos >= len(self.buf.rstrip())
                    what = "truncated: the JSON ends early" if cut else "invalid JSON"
                    raise self.bad(f"{what}: {e.msg}", self.base + e.pos) from None
            except _Reject as e:
                raise self.bad(str(e)) from None
            except RecursionError:
                raise self.bad("JSON nested too deeply") from None
            except ValueError as e:  # e.g. an integer with too many digits
                raise self.bad(f"invalid JSON value: {e}") from None
            if len(self.buf) - self.pos > limit:
                raise self.bad(f"a JSON value longer than {limit} characters")
            self._more(want)
            want = min(want * 2, 64 << 20)

    def at_eof(self) -> bool:
        self.skip_ws()
        return self.pos >= len(self.buf) and self.eof


def _json_header(fields: dict, where: str) -> _Header:
    def bad(reason: str) -> BadBundle:
        return BadBundle(where, reason)

    missing = [k for k in _JSON_KEYS if k not in fields and k not in ("objects", "digest")]
    if missing:
        raise bad(f"the JSON bundle lacks {missing}")
    if fields["format"] != JSON_FORMAT_NAME:
        raise bad(f"not a kxen bundle (format {fields['format']!r})")
    v = fields["version"]
    if type(v) is not int or v != BUNDLE_VERSION:
        raise bad(f"unknown bundle version {v!r} (this kxen-agent reads version {BUNDLE_VERSION}); upgrade kxen-agent")
    caps = fields["capabilities"]
    if type(caps) is not list or any(type(c) is not str for c in caps):
        raise bad("capabilities must be a list of strings")
    for c in caps:
        if c not in KNOWN_CAPABILITIES or c == CAP_ZSTD_DICT:
            raise bad(f"unknown capability {c!r} for a JSON bundle; upgrade kxen-agent")
    refs = fields["refs"]
    if type(refs) is not dict:
        raise bad("refs must be a map")
    conv: dict[str, Any] = {}
    for g, names in refs.items():
        if type(names) is not dict:
            conv[g] = names
            continue
        conv[g] = {}
        for n, h in names.items():
            if type(h) is not str or not _HEX64.fullmatch(h):
                raise bad(f"ref {g}/{n} is not 64 lower-case hex digits")
            conv[g][n] = bytes.fromhex(h)
    n, size = fields["objectCount"], fields["objectBytes"]
    if type(n) is not int or n < 0 or type(size) is not int or size < 0:
        raise bad("objectCount and objectBytes must be non-negative integers")
    return _Header(tuple(caps), _check_refs(conv, where, None), n, size)


def _json_object(el: Any, js: _JsonStream, at: int) -> RawObject:
    if type(el) is not dict or set(el) != {"id", "kind", "bytes"}:
        raise js.bad("each object must be {\"id\", \"kind\", \"bytes\"}", at)
    h, kind, b64 = el["id"], el["kind"], el["bytes"]
    if type(h) is not str or not _HEX64.fullmatch(h):
        raise js.bad("object id is not 64 lower-case hex digits", at)
    if type(kind) is not str or type(b64) is not str:
        raise js.bad(f"object {h}: kind and bytes must be strings", at)
    if len(b64) > _MAX_B64:
        raise js.bad(f"object {h}: {len(b64)} base64 characters exceed the object size limit", at)
    try:
        raw = base64.b64decode(b64, validate=True)
    except ValueError:
        raise js.bad(f"object {h}: bytes are not base64", at) from None
    if base64.b64encode(raw).decode("ascii") != b64:  # one spelling only: a flipped bit cannot hide
        raise js.bad(f"object {h}: bytes are not canonical base64", at)
    try:
        obj = parse_object(raw, h, expect_id=bytes.fromhex(h))
    except CorruptObject as e:
        raise js.bad(f"object {h}: {e.reason}", at) from None
    if obj.kind != kind:
        raise js.bad(f"object {h}: kind says {kind!r}, the bytes say {obj.kind!r}", at)
    return obj


class _JsonBundleReader:
    """Parse and verify a JSON-form bundle; iterating yields verified objects.

    Header fields may come in any order (``jq -S`` sorts them); when the
    ``objects`` list comes before them, the file is read twice (it must not
    change in between: the second reading is checked against the first).
    """

    def __init__(self, f: BinaryIO, where: str, path: str) -> None:
        self.f = f
        self.where = where
        self.path = path
        self.info: BundleInfo | None = None
        self.dictionary = None
        self._gen = self._scan(stream=True)
        _tag, fields = next(self._gen)  # runs up to the objects list
        if all(k in fields for k in _JSON_KEYS if k not in ("objects", "digest")):
            self.fields = fields
        else:
            self._gen.close()
            self.f.seek(0)
            self.fields = _drain(self._scan(stream=False))
            self.f.seek(0)
            self._gen = self._scan(stream=True)
            next(self._gen)
        self.header = _json_header(self.fields, where)
        self.closure = _Closure(self.header, where)

    def _scan(self, *, stream: bool) -> Iterator[tuple]:
        """Generator: yields ("start", fields so far) at the objects list, then
        ("object", element, stream, offset) for each element; returns all fields."""
        js = _JsonStream(self.f, self.where)
        fields: dict[str, Any] = {}
        js.expect("{")
        while True:
            at = js.offset
            key = js.value(64)
            if type(key) is not str:
                raise js.bad("object keys must be strings", at)
            if key not in _JSON_KEYS:
                raise js.bad(f"unknown key {key!r}", at)
            if key in fields:
                raise js.bad(f"duplicate JSON key {key!r}", at)
            js.expect(":")
            if key == "objects":
                fields["objects"] = None
                if stream:
                    yield ("start", {k: v for k, v in fields.items() if k != "objects"})
                js.expect("[")
                if js.peek() == "]":
                    js.pos += 1
                else:
                    while True:
                        at = js.offset
                        el = js.value(_MAX_B64 + 4096)
                        if stream:
                            yield ("object", el, js, at)
                        c = js.peek()
                        if c == ",":
                            js.pos += 1
                        elif c == "]":
                            js.pos += 1
                            break
                        else:
                            raise js.bad(f"expected ',' or ']', found {c!r}" if c else "truncated: the file ends inside the objects list")
            else:
                fields[key] = js.value(MAX_HEADER_SIZE)
            c = js.peek()
            if c == ",":
                js.pos += 1
            elif c == "}":
                js.pos += 1
                break
            else:
                raise js.bad(f"expected ',' or '}}', found {c!r}" if c else "truncated: the file ends inside the document")
        if not js.at_eof():
            raise js.bad("trailing garbage after the JSON document")
        if "objects" not in fields:
            raise js.bad("the JSON bundle has no objects list")
        self.file_chars = js.offset
        fields.pop("objects")
        return fields

    def __iter__(self) -> Iterator[_Item]:
        digest = blake3.blake3(_JSON_DIGEST_PREFIX + self.header.cbor())
        while True:
            try:
                ev = next(self._gen)
            except StopIteration as stop:
                final = stop.value
                break
            _tag, el, js, at = ev
            obj = _json_object(el, js, at)
            self.closure.add(obj, at, "character")
            digest.update(obj.id)
            yield _Item(obj, b"", b"", at)
        for k, v in self.fields.items():
            if final.get(k) != v:
                raise BadBundle(self.where, f"{k!r} changed while the bundle was being read")
        d = final.get("digest")
        if type(d) is not str or not _HEX64.fullmatch(d):
            raise BadBundle(self.where, "digest is missing or not 64 lower-case hex digits")
        if digest.hexdigest() != d:
            raise BadBundle(self.where, "digest mismatch: the refs or the list of objects were altered")
        self.closure.finish(None)
        c = self.closure
        size = os.fstat(self.f.fileno()).st_size
        self.info = BundleInfo(self.path, "json", BUNDLE_VERSION, self.header.capabilities, self.header.refs,
                               c.count, c.bytes, 0, size, d, dict(c.kinds))


def _drain(gen: Iterator[Any]) -> Any:
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


# ------------------------------------------------------------------ opening


def _open_reader(path: str, f: BinaryIO):
    where = str(path)
    head = f.read(len(BUNDLE_MAGIC))
    f.seek(0)
    if head == BUNDLE_MAGIC:
        return _PackBundleReader(f, where, where)
    if not head:
        raise BadBundle(where, "empty file")
    if BUNDLE_MAGIC.startswith(head):
        raise BadBundle(where, f"truncated: the file ends after {len(head)} bytes, inside the magic", 0)
    stripped = head.lstrip(b" \t\r\n")
    if stripped[:1] == b"{" or (not stripped and head):
        return _JsonBundleReader(f, where, where)
    raise BadBundle(where, f"not a kxen bundle (starts with {head!r})", 0)


@contextlib.contextmanager
def _reading(path: str, schema: Schema | None = None) -> Iterator[Any]:
    try:
        f = open(path, "rb")
    except OSError as e:
        raise BadBundle(str(path), f"cannot open: {e.strerror}") from None
    with f:
        r = _open_reader(path, f)
        # A bundle is checked against the schema when every group it holds is
        # one the schema governs (a session bundle); one that mixes in other
        # groups is checked byte by byte only (and a session import refuses it).
        if schema is not None and all(schema.governs(g) for g in r.header.refs):
            r.closure.use_schema(schema)
        yield r


def verify_bundle(path: str, *, progress: Progress | None = None, schema: Schema | None = None) -> BundleInfo:
    """Check a bundle completely without a state dir; its refs, object count and sizes.

    Raises :class:`BadBundle` naming the first problem. With ``schema``,
    every object's shape and the kind each link and ref names are checked too.
    """
    with _reading(path, schema) as r:
        _set_total(progress, r.header.objects)
        for _item in r:
            if progress:
                progress(1)
        assert r.info is not None
        return r.info


def verify_bundle_with_ref_targets(path: str, *, progress: Progress | None = None, schema: Schema | None = None
                                   ) -> tuple[BundleInfo, dict[ObjectId, RawObject]]:
    """:func:`verify_bundle`, also keeping the objects the bundle's refs name.

    So a caller can judge the refs (a session's binding) before it touches
    a state dir: an import refused then writes nothing, not even a state dir.
    """
    with _reading(path, schema) as r:
        _set_total(progress, r.header.objects)
        wanted = {oid for refs in r.header.refs.values() for oid in refs.values()}
        kept: dict[ObjectId, RawObject] = {}
        for item in r:
            if item.obj.id in wanted:
                kept[item.obj.id] = item.obj
            if progress:
                progress(1)
        assert r.info is not None
        return r.info, kept


def iter_bundle_objects(path: str) -> Iterator[RawObject]:
    """Every object of a bundle, verified, decompressed, in bundle order.

    The bundle is fully checked by the time the iteration ends; a problem
    raises :class:`BadBundle` (possibly after some objects were yielded).
    """
    with _reading(path) as r:
        for item in r:
            yield item.obj


# ================================================================== export


def _export_roots(store: Store, groups: list[str]) -> dict[str, dict[str, bytes]]:
    if not groups:
        raise UsageError("name at least one ref group to export")
    refs: dict[str, dict[str, bytes]] = {}
    for g in sorted(set(groups)):
        validate_group(g)
        state = store.refs.read(g)
        if not state.exists or not state.refs:
            raise NoSuchGroup(f"ref group {g} does not exist in {store.root} (or has no refs); nothing exported")
        if state.deleted_ns is not None:
            raise NoSuchGroup(f"ref group {g} is marked deleted; nothing exported")
        refs[g] = dict(state.refs)
    return refs


def _closure_order(
    store: Store, refs: dict[str, dict[str, bytes]], keep: dict[ObjectId, RawObject] | None = None,
    keep_budget: int = DICT_SAMPLE_BUDGET,
) -> tuple[list[ObjectId], int, list[ObjectId], int, dict[str, int]]:
    """Every reachable id, parents first (DFS pre-order), with the total size,
    the small objects (a dictionary's audience) and their size, and the kinds.

    ``keep``, if given, receives the verified small objects met first, up to
    ``keep_budget`` bytes of them, so that the dictionary sample and the
    writer need not read them again (memory bounded by the budget)."""
    kept = 0
    roots = [(oid, f"ref {g}/{n}") for g in sorted(refs) for n, oid in sorted(refs[g].items())]
    # (id, who asked for it): "ref G/R", or the linking object's id (named in an error only)
    stack: list[tuple[ObjectId, str | bytes]] = list(reversed(roots))
    seen: set[ObjectId] = set()
    order: list[ObjectId] = []
    total = small = 0
    smalls: list[ObjectId] = []
    kinds: dict[str, int] = {}
    read_raw = store.read_raw
    while stack:
        oid, who = stack.pop()
        if oid in seen:
            continue
        try:
            obj = read_raw(oid)
        except MissingObject:
            who = who if isinstance(who, str) else f"object {who.hex()}"
            raise MissingObject(oid.hex(), f"{store.root} (reached from {who}); nothing exported, run 'kxen-agent fsck'") from None
        kind = obj.kind
        size = len(obj.raw)
        seen.add(oid)
        order.append(oid)
        total += size
        if size <= DICT_SAMPLE_MAX_OBJECT:
            small += size
            smalls.append(oid)
            if keep is not None and kept + size + _KEPT_OVERHEAD <= keep_budget:
                keep[oid] = obj
                kept += size + _KEPT_OVERHEAD
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind != "blob":  # a blob has no links and no structure to check
            links = links_of(kind, decode_stored(obj))
            for child in reversed(links):
                if child not in seen:
                    stack.append((child, oid))
    return order, total, smalls, small, kinds


def _export_target(path: str) -> str:
    """The file an export to ``path`` replaces: ``path``, or the file a symlink there names.

    As ``git bundle create`` does (its lock file follows symlinks), a
    symlink is followed and its target replaced, the link kept; a target
    that does not exist yet is created. Anything there that is not a
    regular file — a directory, a device (``/dev/full``), a FIFO, a socket,
    a symlink loop — is refused before anything is written: renaming the
    temp file over it would replace it (as root, turn ``/dev/full`` into a
    regular file). Raises :class:`BundleWriteError`.
    """
    target = os.path.realpath(path)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return target  # a new file (a missing directory fails when the temp file is made)
    except OSError as e:
        raise BundleWriteError(f"cannot write bundle {path}: {e.strerror}; nothing was written") from None
    if stat.S_ISREG(st.st_mode):
        return target
    if stat.S_ISDIR(st.st_mode):
        what = "a directory"
    elif stat.S_ISLNK(st.st_mode):
        what = "a symbolic link that does not resolve (a loop)"
    else:
        what = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
                stat.S_IFSOCK: "a socket"}.get(stat.S_IFMT(st.st_mode), "not a regular file")
    via = f" (the target of symlink {path})" if os.path.islink(path) and target != os.path.abspath(path) else ""
    raise BundleWriteError(
        f"cannot write bundle {path}: {target if via else 'it'} is {what}{via}, not a regular file; "
        "nothing was written — give the path of a new file or of a regular file to replace"
    )


class _Sink:
    """Buffered writes to a file object or, through a FileIO, a temp file renamed at the end.

    A path is resolved by :func:`_export_target` (symlinks followed, only a
    regular file or a new one accepted); the temp file is made next to the
    target, so the final rename stays in one directory.
    """

    def __init__(self, out: str | os.PathLike | BinaryIO, io: FileIO) -> None:
        self.io = io
        self.size = 0
        self.buf = bytearray()
        self.f: IO[bytes] | None = None
        self.tmp: str | None = None
        if hasattr(out, "write"):
            self.f = out  # type: ignore[assignment]
            self.path = getattr(out, "name", "<stream>")
        else:
            self.path = os.fspath(out)
            self.target = _export_target(self.path)
            self.tmp = io.write_tmp(os.path.dirname(self.target), b"", sync=False, prefix=".kxen-bundle-tmp-")

    def write(self, b: bytes | memoryview) -> None:
        self.size += len(b)
        if not self.buf and len(b) >= 1 << 20:  # a whole piece already (the pack writer's): no copy
            self._put(b)
            return
        self.buf += b
        if len(self.buf) >= 1 << 20:
            self.flush()

    def _put(self, data: bytes | memoryview) -> None:
        if self.f is not None:
            self.f.write(data)
        else:
            self.io.append(self.tmp, data, sync=False)

    def flush(self) -> None:
        if not self.buf:
            return
        data = bytes(self.buf)
        self.buf.clear()
        self._put(data)

    def commit(self) -> None:
        self.flush()
        if self.f is not None:
            self.f.flush()
            return
        self.io.fsync_path(self.tmp)
        # Again, just before the rename: something not a regular file may have appeared there meanwhile.
        if _export_target(self.path) != self.target:
            raise BundleWriteError(f"cannot write bundle {self.path}: a symlink there was made, changed or "
                                   "removed while the bundle was written; nothing was written — retry")
        self.io.rename(self.tmp, self.target)
        self.tmp = None
        self.io.fsync_dir(os.path.dirname(self.target))

    def abort(self) -> None:
        if self.tmp is not None:
            try:
                self.io.unlink(self.tmp)
            except FileNotFoundError:
                pass
            self.tmp = None


def export_bundle(
    store: Store,
    groups: list[str],
    out: str | os.PathLike | BinaryIO,
    *,
    fmt: str = "pack",
    progress: Progress | None = None,
) -> BundleInfo:
    """Write one bundle of ``groups``' refs and every object reachable from them.

    ``out`` is a path (written to a temp file, fsynced and renamed into
    place: a failed export leaves nothing; a symlink is followed, and a path
    that holds anything but a regular file is refused, see
    :func:`_export_target`) or a binary file object.
    Objects shared by several groups are written once. Raises
    :class:`NoSuchGroup` and :class:`MissingObject` before writing anything.
    """
    fmt = format_for_path("", fmt)
    if not hasattr(out, "write"):
        _export_target(os.fspath(out))  # a device or FIFO there is refused before the closure walk
    refs = _export_roots(store, groups)
    kept: dict[ObjectId, RawObject] = {}
    compressed: dict[ObjectId, tuple[int, bytes]] = {}
    order, total, smalls, small, kinds = _closure_order(store, refs, kept if fmt == "pack" else None, EXPORT_KEEP_BUDGET)
    _set_total(progress, len(order))
    if fmt == "pack":
        # The sample reads what the walk kept (already verified), the rest from the store;
        # the objects its choice compressed with the dictionary are not compressed again.
        dictionary = sample_dictionary(lambda oid: kept.get(oid) or store.read_raw(oid), smalls, small, compressed)
    else:
        dictionary = None
    caps = (CAP_ZSTD_DICT,) if dictionary else ()
    hdr = _Header(caps, refs, len(order), total)
    try:
        sink = _Sink(out, store.io)
    except OSError as e:
        where = f" in {os.path.dirname(e.filename)}" if e.filename else ""
        raise BundleWriteError(f"cannot write bundle {os.fspath(out) if not hasattr(out, 'write') else '<stream>'}: "
                               f"cannot create a file{where}: {e.strerror}; nothing was written — check that "
                               "the directory exists and is writable") from None
    try:
        if fmt == "pack":
            digest, pack_bytes = _write_pack_bundle(store, hdr, order, dictionary, sink, progress, kept, compressed)
        else:
            digest, pack_bytes = _write_json_bundle(store, hdr, order, sink, progress), 0
        sink.commit()
    except OSError as e:
        sink.abort()
        raise BundleWriteError(f"cannot write bundle {sink.path}: {e.strerror or e}; nothing was written") from None
    except BaseException:
        sink.abort()
        raise
    return BundleInfo(sink.path, fmt, BUNDLE_VERSION, caps, refs, len(order), total, pack_bytes, sink.size, digest, kinds)


def _write_pack_bundle(store, hdr: _Header, order, dictionary, sink: _Sink, progress,
                       kept: dict[ObjectId, RawObject] | None = None,
                       compressed: dict[ObjectId, tuple[int, bytes]] | None = None) -> tuple[str, int]:
    h = blake3.blake3()

    def emit(b: bytes | memoryview) -> None:
        h.update(b)
        sink.write(b)

    raw_header = hdr.cbor()
    if len(raw_header) > MAX_HEADER_SIZE:
        raise UsageError(f"too many refs for one bundle (header of {len(raw_header)} bytes)")
    prefix = _PREFIX.pack(BUNDLE_MAGIC, BUNDLE_VERSION, len(raw_header))
    emit(prefix + raw_header + _U32.pack(crc32(prefix, raw_header)))
    start = sink.size
    stream = PackStream(emit, dictionary)
    kept = {} if kept is None else kept
    read_raw = store.read_raw

    def objects() -> Iterator[RawObject]:
        # The walk's objects from memory (each given up once written), the others read again.
        for oid in order:
            obj = kept.pop(oid, None)
            yield obj if obj is not None else read_raw(oid)
            if progress:
                progress(1)

    stream.add_many(objects(), precompressed=compressed)
    stream.finish()
    pack_bytes = sink.size - start
    digest = h.digest()
    sink.write(digest)
    return digest.hex(), pack_bytes


def _write_json_bundle(store, hdr: _Header, order, sink: _Sink, progress) -> str:
    digest = blake3.blake3(_JSON_DIGEST_PREFIX + hdr.cbor())
    head = {
        "format": JSON_FORMAT_NAME,
        "version": BUNDLE_VERSION,
        "capabilities": list(hdr.capabilities),
        "refs": {g: {n: v.hex() for n, v in sorted(r.items())} for g, r in sorted(hdr.refs.items())},
        "objectCount": hdr.objects,
        "objectBytes": hdr.size,
    }
    sink.write(json.dumps(head, separators=(",", ":"))[:-1].encode() + b',"objects":[')
    for i, oid in enumerate(order):
        obj = store.read_raw(oid)
        digest.update(oid)
        el = {"id": obj.hex, "kind": obj.kind, "bytes": base64.b64encode(obj.raw).decode("ascii")}
        sink.write((",\n" if i else "\n").encode() + json.dumps(el, separators=(",", ":")).encode())
        if progress:
            progress(1)
    d = digest.hexdigest()
    sink.write(b'\n],"digest":"' + d.encode() + b'"}\n')
    return d


# ================================================================== import


def _reaches(store: Store, start: ObjectId, target: ObjectId) -> bool:
    """Is ``target`` reachable from ``start`` through links?"""
    stack = [start]
    seen: set[ObjectId] = set()
    while stack:
        oid = stack.pop()
        if oid == target:
            return True
        if oid in seen:
            continue
        seen.add(oid)
        try:
            obj = store.read_raw(oid)
        except MissingObject:
            continue
        if obj.kind == "blob":
            continue
        stack.extend(c for c in links_of(obj.kind, decode_stored(obj)) if c not in seen)
    return False


def _check_fast_forward(store: Store, group: str, local: Mapping[str, bytes], new: Mapping[str, bytes]) -> None:
    for name in sorted(local):
        lv = local[name]
        nv = new.get(name)
        if nv is None:
            raise BundleRefused(group, name, lv, None, "importing would drop it")
        if nv == lv or _reaches(store, nv, lv):
            continue
        if _reaches(store, lv, nv):
            raise BundleRefused(group, name, lv, nv, "the local history is newer than the bundle's")
        raise BundleRefused(group, name, lv, nv, "the histories diverged")


def _check_transformed(store: Store, group: str, refs: Any) -> dict[str, bytes]:
    if not isinstance(refs, Mapping):
        raise TypeError(f"transform must return a mapping of ref names to ids, not {type(refs).__name__}")
    out = {}
    for name, oid in refs.items():
        validate_ref_name(name)
        if not isinstance(oid, bytes) or len(oid) != 32:
            raise TypeError(f"transform returned a non-id for {group}/{name}")
        if not store.has(oid):
            raise MissingObject(oid.hex(), f"{store.root} (transform's ref {group}/{name})")
        out[name] = oid
    if not out:
        raise TypeError(f"transform returned no refs for {group}")
    return out


Transform = Callable[[str, dict[str, bytes]], Mapping[str, bytes]]


def import_bundle(
    store: Store,
    path: str,
    *,
    transform: Transform | None = None,
    progress: Progress | None = None,
    schema: Schema | None = None,
) -> ImportResult:
    """Verify a bundle completely, then add its objects, then its refs.

    Streaming: objects the store lacks are staged, verbatim, into a
    temporary pack while every check runs; the pack's index is committed
    only after the whole bundle verified and every ref update is known to
    be a fast-forward. ``transform(group, refs) -> refs`` may rewrite the
    refs (it may ``store.put`` new objects, and can read the bundle's).
    Then one transaction per group moves its refs (CAS against what was
    checked), so objects are durable before any ref names them.

    Importing the same bundle twice is a no-op. A local ref that the
    bundle's value does not descend from refuses the import
    (:class:`BundleRefused`); a bad bundle raises :class:`BadBundle`. Either
    way no ref, object or pack index is written (``transform`` may have
    left unreferenced objects, which fsck reports as dangling). With
    ``schema``, an object of the wrong shape or kind is a :class:`BadBundle`.
    """
    with _reading(path, schema) as r:
        _set_total(progress, r.header.objects)
        with store.writing():  # gc must not prune (or take our temp pack) meanwhile
            writer: PackWriter | None = None
            try:
                found_dirs: set[str] = set()
                found_packed = False
                loose = LooseNames(store.loose, r.header.objects)
                add_checked = None
                for item in r:
                    oid = item.obj.id
                    if loose.has(oid):
                        found_dirs.add(os.path.dirname(store.loose.path(oid)))
                    elif store.packs and any(p.has(oid) for p in store.packs):
                        found_packed = True
                    else:
                        if writer is None:
                            writer = store.pack_writer(r.dictionary)
                            add_checked = writer.stream.add_checked_entry
                        if item.head:
                            # verified by the reader (header checks and CRC, against this dictionary)
                            add_checked(item.head, item.stored, oid, len(item.obj.raw), item.crc)
                        else:
                            writer.add(item.obj)
                    if progress:
                        progress(1)
                sealed = writer.seal() if writer is not None else None
            except BaseException:
                if writer is not None:
                    writer.abort()
                raise
            info = r.info
            assert info is not None
            # Objects found present are relied on by the refs below, so their
            # names must be durable first (an earlier writer may have failed
            # before its directory fsync).
            for d in sorted(found_dirs):
                store.loose._barrier(d)
            if found_packed:
                store.sync_pack_dir_once()
            try:
                return _apply_refs(store, info, r.header.refs, sealed, transform)
            finally:
                if sealed is not None:
                    sealed.discard()  # a no-op once committed
                store.reload_packs()


def _apply_refs(store: Store, info: BundleInfo, refs, sealed, transform) -> ImportResult:
    with contextlib.ExitStack() as stack:
        if sealed is not None:
            reader = sealed.reader()
            stack.callback(reader.close)
            stack.enter_context(store.pinned_source(reader))
        plan = []
        for group in sorted(refs):
            new = dict(refs[group])
            if transform is not None:
                new = _check_transformed(store, group, transform(group, dict(new)))
            local = store.refs.read(group)
            _check_fast_forward(store, group, local.refs, new)
            plan.append((group, local, new))
        pack = sealed.commit().name if sealed is not None else None
    statuses: dict[str, str] = {}
    written: dict[str, dict[str, bytes]] = {}
    for group, local, new in plan:
        written[group] = new
        if local.exists and local.refs == new and local.deleted_ns is None:
            statuses[group] = "unchanged"
            continue
        updates = [RefUpdate(n, local.refs.get(n), v) for n, v in sorted(new.items()) if local.refs.get(n) != v]
        store.refs.transaction(group, updates, reason=f"import bundle {info.digest[:16]}", deleted_ns=None)
        statuses[group] = "created" if not local.exists else ("restored" if local.refs == new else "updated")
    return ImportResult(info, sealed.count if sealed is not None else 0, pack, statuses, written)
