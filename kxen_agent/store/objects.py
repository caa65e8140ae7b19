"""Object bytes: the kind-and-length header, ids, links and the loose frame.

Pure functions over bytes, no I/O (``objects_spec.md`` §3-§5):

- the *object bytes* are ``b"<kind> <decimal length>\\0"`` followed by the
  body; the id is BLAKE3-256 of the object bytes;
- a ``blob`` body is raw bytes; every other kind's body is one strict
  deterministic CBOR item (:mod:`.codec`) in which every byte string is a
  link: the 32-byte id of another object;
- a loose object file is one zstd frame of exactly the object bytes, with
  the content size in the frame header.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Iterator, NamedTuple, Protocol

import blake3
import zstandard

from kxen_agent.errors import KxenError

from . import codec

__all__ = [
    "CorruptObject",
    "KINDS",
    "MAX_OBJECT_SIZE",
    "MAX_WINDOW",
    "ObjectId",
    "RawObject",
    "Schema",
    "SchemaViolation",
    "a_kind",
    "check_frame_parameters",
    "compress_loose",
    "decode_body",
    "decode_kind",
    "decode_stored",
    "decompress_loose",
    "encode_object",
    "hash_bytes",
    "links_of",
    "parse_object",
]

#: The kinds a store accepts. ``blob`` has a raw body; the others are CBOR.
KINDS = ("blob", "message", "agent", "session", "run", "journal")

#: Largest body accepted anywhere (write, read, pack, bundle).
MAX_OBJECT_SIZE = 64 * 1024 * 1024

#: Longest legal header: the longest kind, a space, 8 digits of length, NUL.
_MAX_HEADER = 7 + 1 + 8 + 1
# The header is matched within a wider window than the longest legal one, so
# that an over-long length is refused as "exceeds the limit" (what is wrong
# with it) rather than as a malformed header; 20 digits cover 2**64.
_HEADER_SCAN = 16 + 1 + 20 + 1
_HEADER_RE = re.compile(rb"([a-z]{1,16}) (0|[1-9][0-9]{0,19})\x00")

ObjectId = bytes  # always exactly 32 bytes; shown as 64 lower-case hex digits


class CorruptObject(KxenError):
    """Bytes that claim to be an object are not a valid one.

    ``where`` names the object (an id, a path or a pack entry) and ``reason``
    says what rule was broken.
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"corrupt object {where}: {reason}")
        self.where = where
        self.reason = reason


def a_kind(kind: str) -> str:
    """``"a message"``, ``"an agent"``: a kind with its article, for messages."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


class SchemaViolation(ValueError):
    """A well-formed object whose value breaks a layer above's rules (raised by a :class:`Schema`)."""


class Schema(Protocol):
    """What a layer above knows of its objects' shapes, for the readers that verify them whole.

    The bundle reader and fsck call it: this layer knows no session, yet
    an import must refuse, and fsck report, an object whose bytes are fine
    but whose value the session layer cannot read. It governs the objects
    reachable from the ref groups it claims (:meth:`governs`), no others.
    """

    def governs(self, group: str) -> bool:
        """Whether the objects ref group ``group`` reaches must follow this schema."""
        ...

    def check(self, kind: str, value: Any) -> list[tuple[ObjectId, str]]:
        """Raise :class:`SchemaViolation`, or return (link, kind it must name) pairs."""
        ...

    def ref_kind(self, group: str, name: str) -> str | None:
        """The kind ref ``group/name`` must name, or None."""
        ...


class RawObject(NamedTuple):
    """One object's canonical bytes, split: ``raw = header + body``.

    A named tuple, not a frozen dataclass: every read makes one, and a
    tuple is made in a third of the time (a resume reads every message).
    """

    id: ObjectId
    kind: str
    raw: bytes
    body_offset: int

    @property
    def body(self) -> bytes:
        return self.raw[self.body_offset :]

    @property
    def hex(self) -> str:
        return self.id.hex()


def hash_bytes(raw: bytes) -> ObjectId:
    return blake3.blake3(raw).digest()


def encode_object(kind: str, value: Any) -> RawObject:
    """Build the canonical object bytes of ``value`` as an object of ``kind``.

    ``value`` is ``bytes`` for a blob, otherwise a CBOR-model value whose
    byte strings are 32-byte links. Raises :class:`codec.EncodeError`.
    """
    if kind not in KINDS:
        raise codec.EncodeError(f"unknown object kind {kind!r} (known: {', '.join(KINDS)})")
    if kind == "blob":
        if not isinstance(value, (bytes, bytearray)):
            raise codec.EncodeError("a blob's value must be bytes")
        body = bytes(value)
    else:
        body = codec.encode(value, links_only=True)
    if len(body) > MAX_OBJECT_SIZE:
        raise codec.EncodeError(
            f"{kind} object of {len(body)} bytes exceeds the {MAX_OBJECT_SIZE}-byte limit"
        )
    header = b"%s %d\x00" % (kind.encode("ascii"), len(body))
    raw = header + body
    return RawObject(hash_bytes(raw), kind, raw, len(header))


def parse_object(raw: bytes, where: str, expect_id: ObjectId | None = None) -> RawObject:
    """Check the header and (when given) the id of object bytes.

    Does not decode the body; :func:`decode_body` does, strictly.
    """
    # Every read comes here: a header already judged good (kinds and
    # lengths repeat) is found in a small table instead of re-parsed.
    nul = raw.find(b"\0", 0, _HEADER_SCAN)
    known = _GOOD_HEADERS.get(raw[: nul + 1]) if nul > 0 else None
    if known is None:
        known = _parse_header(raw, where)
    kind, length = known
    if len(raw) - nul - 1 != length:
        raise CorruptObject(where, f"header declares {length} body bytes but {len(raw) - nul - 1} follow")
    oid = blake3.blake3(raw).digest()
    if expect_id is not None and oid != expect_id:
        raise CorruptObject(where, f"content hashes to {oid.hex()}, not to its id")
    return RawObject(oid, kind, raw, nul + 1)


#: Headers judged good by :func:`_parse_header` -> (kind, body length); emptied when full.
_GOOD_HEADERS: dict[bytes, tuple[str, int]] = {}
_GOOD_HEADERS_MAX = 4096


def _parse_header(raw: bytes, where: str) -> tuple[str, int]:
    m = _HEADER_RE.match(raw, 0, _HEADER_SCAN)
    if m is None:
        raise CorruptObject(where, "bad header (expected '<kind> <length>\\0')")
    kind = m.group(1).decode("ascii")
    if kind not in KINDS:
        raise CorruptObject(where, f"unknown kind {kind!r}")
    length = int(m.group(2))
    if length > MAX_OBJECT_SIZE:
        raise CorruptObject(where, f"declared length {length} exceeds the limit {MAX_OBJECT_SIZE}")
    if len(_GOOD_HEADERS) >= _GOOD_HEADERS_MAX:
        _GOOD_HEADERS.clear()
    _GOOD_HEADERS[raw[: m.end()]] = kind, length
    return kind, length


def decode_body(obj: RawObject) -> Any:
    """The object's value: ``bytes`` for a blob, else the strictly decoded CBOR."""
    if obj.kind == "blob":
        return obj.body
    try:
        # A view, not a slice: a body of up to 64 MiB is not copied to be read.
        return codec.decode(memoryview(obj.raw)[obj.body_offset :], links_only=True)
    except codec.DecodeError as e:
        raise CorruptObject(obj.hex, f"body is not strict CBOR: {e}") from None


def decode_stored(obj: RawObject) -> Any:
    """The value of an object read back from the store (its id just verified).

    Decoded without re-proving the canonical form the store admitted it in
    (:func:`codec.decode_admitted`; ``objects_spec.md`` §5.4 step 5):
    reads, loads, exports and gc use this; fsck and imports use the strict
    :func:`decode_body`.
    """
    raw, at = obj.raw, obj.body_offset
    if obj.kind == "blob":
        return raw[at:]
    try:
        # A small body is copied (cbor2 reads bytes faster than a view, and
        # the copy costs less than the difference); a big one is not.
        return codec.decode_admitted(raw[at:] if len(raw) - at <= 65536 else memoryview(raw)[at:])
    except codec.DecodeError as e:
        raise CorruptObject(obj.hex, f"body is not strict CBOR: {e}") from None


def decode_kind(obj: RawObject, kind: str | None) -> Any:
    """:func:`decode_stored`, refusing an object of another kind than ``kind`` (None: any kind):
    what every store's ``get`` returns."""
    if kind is not None and obj.kind != kind:
        raise CorruptObject(obj.hex, f"is a {obj.kind} object, expected a {kind}")
    return decode_stored(obj)


def links_of(kind: str, value: Any) -> list[ObjectId]:
    """Every object id that ``value`` links to (its byte strings), in order.

    A body is mostly one small map (a message: strings, integers, links and
    a short list of small maps): a recursion over the values costs less
    than a general walk's stack of every value; nesting past 32 levels (a
    strict body has at most 64) finishes with the stack walk.
    """
    if kind == "blob":
        return []
    t = type(value)
    if t is bytes:
        return [value]
    out: list[ObjectId] = []
    if t is dict:
        _links_in(value.values(), out, 0)
    elif t is list:
        _links_in(value, out, 0)
    return out


def _links_in(values: Any, out: list[ObjectId], depth: int) -> None:
    for v in values:
        t = type(v)
        if t is bytes:
            out.append(v)
        elif t is dict or t is list:
            if depth >= 32:
                out.extend(_links_deep(v))
            else:
                _links_in(v.values() if t is dict else v, out, depth + 1)


def _links_deep(value: Any) -> Iterator[ObjectId]:
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is bytes:
            yield v
        elif type(v) is dict:
            stack.extend(reversed(list(v.values())))
        elif type(v) is list:
            stack.extend(reversed(v))


# ------------------------------------------------------------------ loose frame

_COMPRESSOR_LEVEL = 3


# zstd contexts are costly to build (~45 µs, a quarter of a small object's
# read) and not thread-safe: one of each per thread.
_ctx = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c = getattr(_ctx, "c", None)
    if c is None:
        c = _ctx.c = zstandard.ZstdCompressor(
            level=_COMPRESSOR_LEVEL, write_content_size=True, write_checksum=False
        )
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_ctx, "d", None)
    if d is None:
        d = _ctx.d = zstandard.ZstdDecompressor()
    return d


#: The largest window a frame may ask for (``objects_spec.md`` §5.1, §12.3):
#: zstd's default decoder limit (2**27); a frame of at most 64 MiB + 17 bytes,
#: single-segment as writers make it, needs its content size and no more.
MAX_WINDOW = 1 << 27


def check_frame_parameters(params: zstandard.FrameParameters, where: str, *, dict_ids: tuple[int, ...] = (0,),
                           why: str = "a loose object uses none") -> None:
    """Refuse a frame that asks for a window over :data:`MAX_WINDOW`, or names a dictionary not in ``dict_ids``.

    Judged on the frame header, before anything is decompressed: a one-shot
    decompression into a buffer of the declared size would not look at the
    window, so without this a frame asking for 2 GiB was accepted.
    """
    if params.window_size > MAX_WINDOW:
        raise CorruptObject(where, f"zstd frame needs a window of {params.window_size} bytes, "
                            f"more than the limit {MAX_WINDOW}")
    if params.dict_id not in dict_ids:
        raise CorruptObject(where, f"zstd frame names dictionary {params.dict_id}; {why}")


def compress_loose(raw: bytes) -> bytes:
    """One zstd frame of ``raw`` with its content size in the frame header."""
    return _compressor().compress(raw)


def decompress_loose(frame: bytes, where: str, limit: int = MAX_OBJECT_SIZE + _MAX_HEADER) -> bytes:
    """Decompress one loose-object frame, refusing before allocating.

    The declared content size must be present and within ``limit``; the
    output must be exactly that size; nothing may follow the frame.
    """
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as e:
        raise CorruptObject(where, f"not a zstd frame ({e})") from None
    size = params.content_size
    if size == zstandard.CONTENTSIZE_UNKNOWN or size == zstandard.CONTENTSIZE_ERROR:
        raise CorruptObject(where, "zstd frame does not declare its content size")
    if size > limit:
        raise CorruptObject(where, f"zstd frame declares {size} bytes, more than the limit {limit}")
    check_frame_parameters(params, where)
    try:
        # One-shot: refuses a truncated frame and any byte after it, and
        # allocates the declared size (checked above) once.
        out = _decompressor().decompress(frame, allow_extra_data=False)
    except zstandard.ZstdError:
        pass  # the stream decompressor below says exactly what is wrong
    else:
        if len(out) == size:
            return out
    dobj = _decompressor().decompressobj()  # a fresh stream: the checks below need it
    try:
        out = dobj.decompress(frame)
    except zstandard.ZstdError as e:
        raise CorruptObject(where, f"zstd frame does not decompress ({e})") from None
    if not dobj.eof:
        raise CorruptObject(where, "zstd frame is truncated")
    if dobj.unused_data:
        raise CorruptObject(where, f"{len(dobj.unused_data)} bytes follow the zstd frame")
    if len(out) != size:
        raise CorruptObject(where, f"zstd frame declares {size} bytes but holds {len(out)}")
    return out
