"""Strict deterministic CBOR: the byte format of every structured object.

Pure functions over bytes: nothing here touches a file. The rules (normative
text in ``objects_spec.md`` §2) are RFC 8949 §4.2.1 core deterministic
encoding, tightened in the spirit of DAG-CBOR (but it is not DAG-CBOR: a link
is a plain 32-byte byte string, never tag 42):

- major types 0-5 and the simple values false, true, null only: no tags,
  no floats, no undefined, no other simple values;
- definite lengths only, every integer and length in its shortest form;
- map keys are text strings, unique, sorted by encoded length then bytewise
  (for text keys that is: by UTF-8 length, then bytewise);
- integers in [-2**64, 2**64 - 1];
- at most :data:`MAX_DEPTH` nested arrays and maps, and at most
  :data:`MAX_ITEMS` elements in any one array or map.

The encoder refuses any value outside that model (:class:`EncodeError`).
The decoder never trusts a declared length: a length is checked against the
bytes that remain before anything is allocated, nesting is bounded, and
the first rule broken is reported with its byte offset (:class:`DecodeError`).
"""

from __future__ import annotations

import struct
from typing import Any

from kxen_agent.errors import KxenError

__all__ = [
    "DecodeError",
    "EncodeError",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "decode",
    "encode",
]

#: Deepest nesting of arrays and maps accepted, on encode and decode.
MAX_DEPTH = 64

#: Most elements in one array or entries in one map, on encode and decode
#: (§2.7): the encoder refuses what a decoder would refuse, so that every
#: store can read what any writer wrote.
MAX_ITEMS = 1 << 24

_UINT64_MAX = (1 << 64) - 1


class EncodeError(KxenError, ValueError):
    """A value cannot be represented in the store's CBOR subset."""


class DecodeError(KxenError, ValueError):
    """Bytes are not strict deterministic CBOR; ``offset`` is where it broke."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} (at byte {offset})")
        self.reason = reason
        self.offset = offset


# --------------------------------------------------------------------- encode


def _head(major: int, n: int, out: bytearray) -> None:
    mt = major << 5
    if n < 24:
        out.append(mt | n)
    elif n < 0x100:
        out.append(mt | 24)
        out.append(n)
    elif n < 0x10000:
        out.append(mt | 25)
        out += n.to_bytes(2, "big")
    elif n < 0x100000000:
        out.append(mt | 26)
        out += n.to_bytes(4, "big")
    else:
        out.append(mt | 27)
        out += n.to_bytes(8, "big")


def _key_bytes(key: str) -> bytes:
    raw = key.encode("utf-8")
    buf = bytearray()
    _head(3, len(raw), buf)
    buf += raw
    return bytes(buf)


def _enc(value: Any, out: bytearray, depth: int, links_only: bool) -> None:
    # bool before int: bool is a subclass of int in Python.
    if value is False:
        out.append(0xF4)
    elif value is True:
        out.append(0xF5)
    elif value is None:
        out.append(0xF6)
    elif type(value) is int:
        if value >= 0:
            if value > _UINT64_MAX:
                raise EncodeError(f"integer {value} is larger than 2**64-1")
            _head(0, value, out)
        else:
            n = -1 - value
            if n > _UINT64_MAX:
                raise EncodeError(f"integer {value} is smaller than -2**64")
            _head(1, n, out)
    elif type(value) is str:
        raw = value.encode("utf-8", "strict")
        _head(3, len(raw), out)
        out += raw
    elif type(value) is bytes:
        if links_only and len(value) != 32:
            raise EncodeError(
                f"byte string of length {len(value)} in a structured object: "
                "byte strings are links and must be 32-byte object ids; put data in a blob"
            )
        _head(2, len(value), out)
        out += value
    elif type(value) is list or type(value) is tuple:
        if depth >= MAX_DEPTH:
            raise EncodeError(f"nesting deeper than {MAX_DEPTH}")
        if len(value) > MAX_ITEMS:
            raise EncodeError(f"array of {len(value)} elements, more than the limit {MAX_ITEMS}")
        _head(4, len(value), out)
        for item in value:
            _enc(item, out, depth + 1, links_only)
    elif type(value) is dict:
        if depth >= MAX_DEPTH:
            raise EncodeError(f"nesting deeper than {MAX_DEPTH}")
        if len(value) > MAX_ITEMS:
            raise EncodeError(f"map of {len(value)} entries, more than the limit {MAX_ITEMS}")
        items = []
        for k, v in value.items():
            if type(k) is not str:
                raise EncodeError(f"map key {k!r} is not a text string")
            items.append((_key_bytes(k), v))
        # Length-first then bytewise on the encoded key; for text keys the
        # head grows with the length, so comparing (len, bytes) is exact.
        items.sort(key=lambda kv: (len(kv[0]), kv[0]))
        _head(5, len(items), out)
        for kb, v in items:
            out += kb
            _enc(v, out, depth + 1, links_only)
    elif isinstance(value, float):
        raise EncodeError("floats are not allowed in objects; use integers (e.g. milliseconds)")
    else:
        raise EncodeError(f"cannot encode a value of type {type(value).__name__}")


def encode(value: Any, *, links_only: bool = False) -> bytes:
    """Return the one canonical encoding of ``value``.

    ``links_only`` enforces the structured-object rule that every byte string
    is a 32-byte object id (``objects_spec.md`` §3).
    """
    out = bytearray()
    try:
        _enc(value, out, 0, links_only)
    except RecursionError:  # pragma: no cover - MAX_DEPTH keeps us far from it
        raise EncodeError(f"nesting deeper than {MAX_DEPTH}") from None
    except UnicodeEncodeError as e:
        raise EncodeError(f"text is not valid UTF-8 ({e.reason})") from None
    return bytes(out)


# --------------------------------------------------------------------- decode

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class _Decoder:
    __slots__ = ("data", "n", "links_only", "max_items")

    def __init__(self, data: bytes, links_only: bool, max_items: int) -> None:
        self.data = data
        self.n = len(data)
        self.links_only = links_only
        self.max_items = max_items

    def head(self, pos: int) -> tuple[int, int, int]:
        """Return (major, argument, next position), enforcing shortest form."""
        data = self.data
        if pos >= self.n:
            raise DecodeError("unexpected end of data", pos)
        ib = data[pos]
        major = ib >> 5
        info = ib & 0x1F
        if info < 24:
            return major, info, pos + 1
        if info == 24:
            if pos + 2 > self.n:
                raise DecodeError("unexpected end of data", pos)
            arg = data[pos + 1]
            if arg < 24:
                raise DecodeError("non-minimal integer or length", pos)
            return major, arg, pos + 2
        if info == 25:
            if pos + 3 > self.n:
                raise DecodeError("unexpected end of data", pos)
            arg = _U16.unpack_from(data, pos + 1)[0]
            if arg < 0x100:
                raise DecodeError("non-minimal integer or length", pos)
            return major, arg, pos + 3
        if info == 26:
            if pos + 5 > self.n:
                raise DecodeError("unexpected end of data", pos)
            arg = _U32.unpack_from(data, pos + 1)[0]
            if arg < 0x10000:
                raise DecodeError("non-minimal integer or length", pos)
            return major, arg, pos + 5
        if info == 27:
            if pos + 9 > self.n:
                raise DecodeError("unexpected end of data", pos)
            arg = _U64.unpack_from(data, pos + 1)[0]
            if arg < 0x100000000:
                raise DecodeError("non-minimal integer or length", pos)
            return major, arg, pos + 9
        if info == 31:
            raise DecodeError("indefinite length is not allowed", pos)
        raise DecodeError(f"reserved additional information {info}", pos)

    def item(self, pos: int, depth: int) -> tuple[Any, int]:
        start = pos
        if pos < self.n:
            ib = self.data[pos]
            if ib >= 0xC0:  # majors 6 and 7 are judged on the initial byte
                if ib == 0xF4:
                    return False, pos + 1
                if ib == 0xF5:
                    return True, pos + 1
                if ib == 0xF6:
                    return None, pos + 1
                if ib < 0xE0:
                    raise DecodeError("tags are not allowed", pos)
                if ib in (0xF9, 0xFA, 0xFB):
                    raise DecodeError("floats are not allowed", pos)
                if ib == 0xFF:
                    raise DecodeError("unexpected break code", pos)
                raise DecodeError(f"simple value 0x{ib:02x} is not allowed", pos)
        major, arg, pos = self.head(pos)
        if major == 0:
            return arg, pos
        if major == 1:
            return -1 - arg, pos
        if major == 2 or major == 3:
            end = pos + arg
            if end > self.n:
                raise DecodeError(f"string of {arg} bytes runs past the end", start)
            raw = self.data[pos:end]
            if major == 2:
                if self.links_only and arg != 32:
                    raise DecodeError(
                        f"byte string of length {arg} (links must be 32-byte ids)", start
                    )
                return raw, end
            try:
                return raw.decode("utf-8"), end
            except UnicodeDecodeError:
                raise DecodeError("text string is not valid UTF-8", start) from None
        if major == 4:
            if depth >= MAX_DEPTH:
                raise DecodeError(f"nesting deeper than {MAX_DEPTH}", start)
            # Every element takes at least one byte: a declared length past
            # the remaining bytes is refused before any list is grown.
            if arg > self.n - pos:
                raise DecodeError(f"array declares {arg} elements, more than the data can hold", start)
            if arg > self.max_items:
                raise DecodeError(f"array declares {arg} elements, more than the limit {self.max_items}", start)
            out = []
            for _ in range(arg):
                v, pos = self.item(pos, depth + 1)
                out.append(v)
            return out, pos
        if major == 5:
            if depth >= MAX_DEPTH:
                raise DecodeError(f"nesting deeper than {MAX_DEPTH}", start)
            if 2 * arg > self.n - pos:
                raise DecodeError(f"map declares {arg} entries, more than the data can hold", start)
            if arg > self.max_items:
                raise DecodeError(f"map declares {arg} entries, more than the limit {self.max_items}", start)
            d: dict[str, Any] = {}
            prev: bytes | None = None
            data = self.data
            for _ in range(arg):
                kpos = pos
                kmajor, klen, p2 = self.head(pos)
                if kmajor != 3:
                    raise DecodeError("map key is not a text string", kpos)
                kend = p2 + klen
                if kend > self.n:
                    raise DecodeError(f"string of {klen} bytes runs past the end", kpos)
                kb = data[kpos:kend]
                if prev is not None:
                    if len(kb) < len(prev) or (len(kb) == len(prev) and kb <= prev):
                        if kb == prev:
                            raise DecodeError("duplicate map key", kpos)
                        raise DecodeError("map keys are not in canonical order", kpos)
                prev = kb
                try:
                    key = data[p2:kend].decode("utf-8")
                except UnicodeDecodeError:
                    raise DecodeError("text string is not valid UTF-8", kpos) from None
                v, pos = self.item(kend, depth + 1)
                d[key] = v
            return d, pos
        raise AssertionError("unreachable")  # majors 6 and 7 handled above


def decode(data: bytes, *, links_only: bool = False, max_items: int | None = None) -> Any:
    """Decode exactly one strict deterministic CBOR item filling ``data``.

    Raises :class:`DecodeError` on the first rule broken: non-minimal heads,
    indefinite lengths, tags, floats, unsorted or duplicate keys, invalid
    UTF-8, nesting past :data:`MAX_DEPTH`, lengths past the data, arrays or
    maps of more than ``max_items`` (default :data:`MAX_ITEMS`) elements, and
    trailing bytes. Whatever is accepted re-encodes to ``data`` exactly
    (a property the tests check).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("decode() takes bytes")
    data = bytes(data)
    dec = _Decoder(data, links_only, MAX_ITEMS if max_items is None else max_items)
    value, pos = dec.item(0, 0)
    if pos != len(data):
        raise DecodeError(f"{len(data) - pos} trailing bytes after the item", pos)
    return value
