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
- at most :data:`MAX_DEPTH` nested arrays and maps, at most
  :data:`MAX_ITEMS` elements in any one array or map, and at most
  :data:`MAX_BODY_ITEMS` data items in one body, at every depth together:
  the decode budget, which bounds what decoding any input can allocate.

The encoder refuses any value outside that model (:class:`EncodeError`).
The strict decoder (:func:`decode_strict`) never trusts a declared length: a
length is checked against the bytes that remain before anything is allocated,
a container's elements are charged to the decode budget when its head is
read (before any element is decoded), nesting is bounded, and the first rule
broken is reported with its byte offset (:class:`DecodeError`). It reads the
input in place (a ``memoryview``): a text string is decoded straight from
the input, never copied first, so a body costs its bytes once, plus its
value.

:func:`decode` is the strict decoder with a fast path in front, because
strict decoding in pure Python was ~30-45 % of load, import, export and fsck
time (``bench/README.md``). The fast path lets cbor2's C decoder build the
value, then accepts it only if:

1. cbor2 decoded it with every tag refused (so no shared values, string
   references, bignums or any other tag can make the value differ from the
   bytes) and nesting capped;
2. :func:`_fits_model` holds: every node has one of the model's exact types
   (``bool`` is told from ``int``), integers are in range, byte strings are
   32 bytes under ``links_only``, keys are text in canonical order, nesting
   and element counts are within the limits exactly as the strict decoder
   counts them, and no more elements than ``data`` has bytes (a tree);
3. ``cbor2.dumps(value) == data``. For values that pass 2, cbor2's plain
   (insertion-ordered) encoding is byte for byte :func:`encode` (shortest
   heads, definite lengths; the tests check it), so this says ``data`` is
   *the* encoding of the value: no non-minimal head, indefinite length,
   duplicate key (cbor2 keeps the last) or trailing byte (cbor2 ignores
   them) survives it. Tags, floats, simple values and non-text keys are
   already out after 1 and 2.

Then ``data == encode(value)`` and the strict decoder, which inverts
:func:`encode` on such values, would return an equal value of the same types:
the fast path's answer is the strict decoder's. Anything else (cbor2 raising,
or a check failing) goes to the strict decoder, which raises the precise
:class:`DecodeError` -- or returns its value, should it accept what the fast
path refused: the fast path only ever accelerates. Without cbor2's C
extension, or if it fails the self-test at import, only the strict decoder is
used. (The canonical mode of ``cbor2.dumps`` sorts keys as we do but is ~3x
slower than the plain mode, so the key order is checked in the walk instead.)
Hostile input is safe on the fast path too: cbor2 >= 6.3's C decoder reads a
declared length in bounded chunks instead of allocating it up front, and it is
only given bodies of at most :data:`MAX_BODY_ITEMS` bytes, which cannot hold
more items than the budget (every item takes at least one byte): cbor2
builds the whole value before the walk could count it, so a larger body
goes to the strict decoder, which charges the budget before it allocates
(a 16 MiB body of 2**24 empty maps made cbor2 take 1.4 GB).
"""

from __future__ import annotations

import struct
from types import BuiltinFunctionType
from typing import Any, Callable, NoReturn

from kxen_agent.errors import KxenError

__all__ = [
    "DecodeError",
    "EncodeError",
    "MAX_BODY_ITEMS",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "decode",
    "decode_admitted",
    "decode_strict",
    "encode",
    "encode_ordered",
]

#: Deepest nesting of arrays and maps accepted, on encode and decode.
MAX_DEPTH = 64

#: Most elements in one array or entries in one map, on encode and decode
#: (§2.7): the encoder refuses what a decoder would refuse, so that every
#: store can read what any writer wrote.
MAX_ITEMS = 1 << 24

#: The decode budget (§2.7): most data items in one body, counting every item
#: at every depth (the top-level item, each array element, each map key and
#: each map value). Decoding any input allocates at most this many values:
#: in CPython about 90 bytes each at worst (an empty map in an array), so
#: ~45 MB, whatever the bytes say. Encoder and decoder apply it alike.
MAX_BODY_ITEMS = 1 << 19

_UINT64_MAX = (1 << 64) - 1
#: Whether :func:`encode` may take its fast path (set once cbor2 passed the check at import).
_fast_encode_ok = False


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


class _NotFast(Exception):
    """The fast encoder cannot vouch for this value: :func:`encode` takes the exact path."""


#: Each map's key tuple seen, in canonical order (bounded: cleared when full).
_KEY_ORDER: dict[tuple[Any, ...], tuple[str, ...]] = {}


def _key_order(keys: tuple[Any, ...]) -> tuple[str, ...]:
    for k in keys:
        if type(k) is not str:
            raise _NotFast
    # The order of :func:`_enc`: encoded length first (the head grows with
    # it), then the UTF-8 bytes.
    order = tuple(sorted(keys, key=lambda k: (len(k.encode("utf-8")), k.encode("utf-8"))))
    if len(_KEY_ORDER) >= 4096:
        _KEY_ORDER.clear()
    _KEY_ORDER[keys] = order
    return order


def _canonical_copy(v: Any, links_only: bool, depth: int) -> Any:
    """``v`` with every map's keys in canonical order, if :func:`_enc` would encode it; else :class:`_NotFast`.

    The same rules as :func:`_enc`, checked on the exact types (``bool`` told
    from ``int``, no subclass): integers in range, byte strings of 32 bytes
    under ``links_only``, text keys, nesting below :data:`MAX_DEPTH`, at most
    :data:`MAX_ITEMS` elements a container. A tuple becomes a list (both are
    arrays). Anything it refuses goes to :func:`_enc`, which says what is wrong.
    """
    t = type(v)
    if t is str or t is bool or v is None:
        return v
    if t is int:
        if _INT_MIN <= v <= _UINT64_MAX:
            return v
        raise _NotFast
    if t is dict:
        if depth >= MAX_DEPTH or len(v) > MAX_ITEMS:
            raise _NotFast
        keys = tuple(v)
        order = _KEY_ORDER.get(keys) or _key_order(keys)
        d = depth + 1
        out = {}
        for k in order:
            x = v[k]
            out[k] = x if type(x) is str else _canonical_copy(x, links_only, d)
        return out
    if t is list or t is tuple:
        if depth >= MAX_DEPTH or len(v) > MAX_ITEMS:
            raise _NotFast
        d = depth + 1
        return [x if type(x) is str else _canonical_copy(x, links_only, d) for x in v]
    if t is bytes:
        if links_only and len(v) != 32:
            raise _NotFast
        return v
    raise _NotFast


def encode(value: Any, *, links_only: bool = False) -> bytes:
    """Return the one canonical encoding of ``value``.

    ``links_only`` enforces the structured-object rule that every byte string
    is a 32-byte object id (``objects_spec.md`` §3). A value of more than
    :data:`MAX_BODY_ITEMS` data items is refused, as a decoder would refuse it.

    Fast path: a copy of the value with its maps' keys put in canonical
    order, made only if every node is one :func:`_enc` encodes, is written
    by cbor2's C encoder, whose plain encoding of a canonically ordered
    value is byte for byte :func:`_enc`'s (checked at import, see
    :func:`_fast_codec`; the module docstring's point 3). Anything else, and
    an encoding longer than :data:`MAX_BODY_ITEMS` (whose items must be
    counted), takes the exact path below.
    """
    if _fast_encode_ok:
        try:
            out = _fast_dumps(_canonical_copy(value, links_only, 0))  # type: ignore[misc]
        except Exception:  # _NotFast, cbor2 refusing (text that is not UTF-8), deep recursion
            out = None
        if out is not None and len(out) <= MAX_BODY_ITEMS:
            return out
    return _encode_exact(value, links_only)


def _encode_exact(value: Any, links_only: bool) -> bytes:
    """:func:`encode` in Python, item by item: the definition the fast path is checked against."""
    out = bytearray()
    try:
        _enc(value, out, 0, links_only)
    except RecursionError:  # pragma: no cover - MAX_DEPTH keeps us far from it
        raise EncodeError(f"nesting deeper than {MAX_DEPTH}") from None
    except UnicodeEncodeError as e:
        raise EncodeError(f"text is not valid UTF-8 ({e.reason})") from None
    # Every item takes at least one byte: a value this short is within the
    # budget, and only a longer one is counted (a cheap walk, no decoding).
    if len(out) > MAX_BODY_ITEMS:
        n = _count_items(value)
        if n > MAX_BODY_ITEMS:
            raise EncodeError(f"value of {n} data items, more than the {MAX_BODY_ITEMS} one object may hold")
    return bytes(out)


def encode_ordered(value: Any) -> bytes:
    """:func:`encode` of a value whose every map already lists its keys in canonical order.

    cbor2's C encoder then writes exactly the canonical bytes (what
    :func:`_fast_codec` checks before using it), ~30 times faster than
    :func:`encode`; without it, or for a value it cannot write, :func:`encode`
    (which also says what is wrong). Nothing is checked on the fast path:
    for values built by code that orders the keys, not for input.
    """
    if _fast_dumps is not None:
        try:
            return _fast_dumps(value)
        except Exception:
            pass
    return encode(value)


def _count_items(value: Any) -> int:
    """Data items of an encodable value: itself, and every element, key and value inside it."""
    n = 0
    stack = [value]
    while stack:
        v = stack.pop()
        n += 1
        if type(v) is dict:
            n += len(v)  # the keys
            stack.extend(v.values())
        elif type(v) is list or type(v) is tuple:
            stack.extend(v)
    return n


# --------------------------------------------------------------------- decode

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class _Decoder:
    __slots__ = ("data", "n", "links_only", "max_items", "items")

    def __init__(self, data: memoryview, links_only: bool, max_items: int) -> None:
        self.data = data
        self.n = len(data)
        self.links_only = links_only
        self.max_items = max_items
        # Items charged to the decode budget so far: the top-level item; then
        # each container's elements, charged at its head (each is an item).
        self.items = 1

    def charge(self, count: int, what: str, start: int) -> None:
        """Charge ``count`` items (a head's elements) before any is decoded."""
        self.items += count
        if self.items > MAX_BODY_ITEMS:
            raise DecodeError(f"{what}, more than the {MAX_BODY_ITEMS} items one object may hold", start)

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
            if major == 2:
                if self.links_only and arg != 32:
                    raise DecodeError(
                        f"byte string of length {arg} (links must be 32-byte ids)", start
                    )
                return bytes(self.data[pos:end]), end
            try:
                return str(self.data[pos:end], "utf-8"), end  # decoded in place: no copy of the bytes
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
            self.charge(arg, f"array declares {arg} elements", start)
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
            self.charge(2 * arg, f"map declares {arg} entries", start)
            d: dict[str, Any] = {}
            prev_len = -1
            prev = ""
            data = self.data
            for _ in range(arg):
                kpos = pos
                kmajor, klen, p2 = self.head(pos)
                if kmajor != 3:
                    raise DecodeError("map key is not a text string", kpos)
                kend = p2 + klen
                if kend > self.n:
                    raise DecodeError(f"string of {klen} bytes runs past the end", kpos)
                # The order is judged before the key's UTF-8 (an invalid key
                # that is also out of order is reported as out of order). Of
                # equal lengths, valid keys compare as text: UTF-8 keeps code
                # point order bytewise, and the key is never copied as bytes.
                if klen < prev_len:
                    raise DecodeError("map keys are not in canonical order", kpos)
                try:
                    key = str(data[p2:kend], "utf-8")
                except UnicodeDecodeError:
                    if klen == prev_len and bytes(data[p2:kend]) <= prev.encode("utf-8"):
                        raise DecodeError("map keys are not in canonical order", kpos) from None
                    raise DecodeError("text string is not valid UTF-8", kpos) from None
                if klen == prev_len and key <= prev:
                    raise DecodeError("duplicate map key" if key == prev else "map keys are not in canonical order", kpos)
                prev_len, prev = klen, key
                v, pos = self.item(kend, depth + 1)
                d[key] = v
            return d, pos
        raise AssertionError("unreachable")  # majors 6 and 7 handled above


def _decode_strict(data: bytes | bytearray | memoryview, links_only: bool, max_items: int) -> Any:
    """The reference decoder: pure Python, every rule checked byte by byte."""
    mv = memoryview(data).cast("B")
    dec = _Decoder(mv, links_only, max_items)
    value, pos = dec.item(0, 0)
    if pos != len(mv):
        raise DecodeError(f"{len(mv) - pos} trailing bytes after the item", pos)
    return value


def decode_strict(data: bytes | bytearray | memoryview, *, links_only: bool = False,
                  max_items: int | None = None) -> Any:
    """:func:`decode` without the fast path: the reference it must agree with."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("decode() takes bytes")
    return _decode_strict(data, links_only, MAX_ITEMS if max_items is None else max_items)


# ------------------------------------------------------------ decode, fast path

_INT_MIN = -(1 << 64)

#: Key tuples already found canonical (all text, strictly in encoded order):
#: objects of one kind share their keys, so most maps skip the per-key loop.
#: Only small key sets are kept (few keys, few bytes) and the set is emptied
#: when full, so hostile input cannot make it hold more than ~1 MB.
_KEYS_SEEN: set[tuple[str, ...]] = set()
_KEYS_SEEN_MAX = 256
_KEYS_SEEN_MAX_KEYS = 64
_KEYS_SEEN_MAX_BYTES = 1024


def _keys_canonical(keys: tuple[Any, ...]) -> bool:
    """All keys text, strictly increasing by (UTF-8 length, code points).

    That is the strict decoder's order on encoded keys: a text key's head
    grows with its length, and UTF-8 preserves code point order bytewise.
    """
    prev_len = -1
    prev = ""
    total = 0
    for k in keys:
        if type(k) is not str:
            return False
        n = len(k) if k.isascii() else len(k.encode("utf-8"))
        if n < prev_len or (n == prev_len and k <= prev):
            return False
        prev_len = n
        prev = k
        total += n
    if len(keys) <= _KEYS_SEEN_MAX_KEYS and total <= _KEYS_SEEN_MAX_BYTES:
        if len(_KEYS_SEEN) >= _KEYS_SEEN_MAX:
            _KEYS_SEEN.clear()
        _KEYS_SEEN.add(keys)  # type: ignore[arg-type]  # all str, checked above
    return True


def _fits_model(value: Any, links_only: bool, max_items: int, budget: int) -> bool:
    """Could the strict decoder have returned ``value`` (cbor2's decoding)?

    Types are compared exactly (``type(x) is``: bool is a subclass of int,
    and cbor2 could return tuples, frozendicts, sets, floats, ...). Nesting is
    walked level by level, iteratively: the containers of ``level`` sit at
    depth ``depth``, where the strict decoder refuses ``depth >= MAX_DEPTH``.
    ``budget`` is the byte count: every element of a value decoded from
    those bytes takes at least one, so more elements means shared subvalues
    (not a tree) and the walk stays linear in the input whatever cbor2 did.
    """
    t = type(value)
    if t is not dict and t is not list:
        if t is str or t is bool or value is None:
            return True
        if t is int:
            return _INT_MIN <= value <= _UINT64_MAX
        if t is bytes:
            return not links_only or len(value) == 32
        return False
    keys_seen = _KEYS_SEEN
    level = [value]
    depth = 0
    while True:
        deeper = []
        for c in level:
            n = len(c)
            if n > max_items:
                return False
            budget -= n
            if budget < 0:
                return False
            if type(c) is dict:
                # A tuple equal to a cached one holds equal keys, and only
                # a str equals a str (cbor2 makes text keys exact str).
                keys = tuple(c)
                if keys not in keys_seen and not _keys_canonical(keys):
                    return False
                c = c.values()
            # One loop per container, the common types tested first; no
            # call per element (this loop is most of the fast path's Python).
            for x in c:
                t = type(x)
                if t is str or t is bool or x is None:
                    continue
                if t is int:
                    if not _INT_MIN <= x <= _UINT64_MAX:
                        return False
                elif t is bytes:
                    if links_only and len(x) != 32:
                        return False
                elif t is list or t is dict:
                    deeper.append(x)
                else:
                    return False
        if not deeper:
            return True
        depth += 1
        if depth >= MAX_DEPTH:
            return False
        level = deeper


class _TagRefused(Exception):
    """Raised inside cbor2 for every tag: the model has none."""


def _refuse_tag(*_args: Any) -> NoReturn:
    raise _TagRefused


#: Tags cbor2 6.3 decodes itself (found by trying every tag below 2**20 and
#: 200,000 random larger ones); every other tag reaches ``tag_hook``. Among
#: them 28/29 (shared values) and 256/25 (string references) would make one
#: object stand for bytes elsewhere, so they must raise, not be resolved.
_CBOR2_BUILTIN_TAGS = (
    0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 36, 37, 52, 54, 100,
    256, 258, 260, 261, 1004, 43000, 55799,
)
_REFUSE_TAGS: dict[int, Callable[..., Any]] = {tag: _refuse_tag for tag in _CBOR2_BUILTIN_TAGS}

_LoadsFn = Callable[..., Any]
_DumpsFn = Callable[[Any], bytes]


def _fast_codec() -> tuple[_LoadsFn, _DumpsFn] | tuple[None, None]:
    """cbor2's C ``loads``/``dumps`` if present and behaving as the fast path assumes."""
    try:
        import cbor2
    except ImportError:  # pragma: no cover - cbor2 is a dependency
        return None, None
    loads = getattr(cbor2, "loads", None)
    dumps = getattr(cbor2, "dumps", None)
    # A pure-Python cbor2 would be slower than the strict decoder.
    if not (isinstance(loads, BuiltinFunctionType) and isinstance(dumps, BuiltinFunctionType)):
        return None, None
    try:
        # Plain dumps of a canonically ordered value is our encoding...
        sample = {
            "a": [0, 23, 24, 255, 256, 65536, 2**32, _UINT64_MAX, -1, -25, _INT_MIN, True, False, None],
            "bb": bytes(32),
            "\u00e9": ["x" * 23, "y" * 24, "z" * 300, {}, []],
        }
        data = _encode_exact(sample, False)
        if dumps(sample) != data:
            return None, None
        back = loads(data, semantic_decoders=_REFUSE_TAGS, tag_hook=_refuse_tag, max_depth=MAX_DEPTH + 1)
        if back != sample or not _fits_model(back, False, MAX_ITEMS, len(data)):
            return None, None
        # ...and every tag is refused: a bignum, a shared value, a string
        # reference, self-describe, and an unknown tag.
        for probe in ("c24101", "82d81c8100d81d00", "d9010063616263", "d9d9f700", "d82a00"):
            try:  # the options decode() passes
                loads(bytes.fromhex(probe), semantic_decoders=_REFUSE_TAGS, tag_hook=_refuse_tag,
                      max_depth=MAX_DEPTH + 1)
            except Exception:
                continue
            return None, None
    except Exception:  # pragma: no cover - any surprise disables the fast path
        return None, None
    return loads, dumps


_fast_loads, _fast_dumps = _fast_codec()


def _check_fast_encode() -> bool:
    """Whether :func:`encode`'s fast path writes :func:`_encode_exact`'s bytes on a sample of every kind of node."""
    if _fast_dumps is None:
        return False
    sample = {"zz": [1, -1, 24, -25, 2**32, _UINT64_MAX, _INT_MIN, True, False, None, ("t", b"\x01" * 32)],
              "a": {"\u00e9": "x" * 300, "b": {}, "aa": [], "ab": "\u00e9" * 30, "\u00e0": 0},
              "bb": bytes(32), "\u00e9": [{"y": 1, "x": 2}] * 3}
    try:
        return all(_fast_dumps(_canonical_copy(v, False, 0)) == _encode_exact(v, False)
                   for v in (sample, [sample, sample], "é", 7, None))
    except Exception:  # pragma: no cover - any surprise disables the fast path
        return False


_fast_encode_ok = _check_fast_encode()


def decode_admitted(data: bytes | memoryview) -> Any:
    """Decode the body of an object this store already holds, its hash just verified.

    What a store holds was admitted in canonical form — written by
    :func:`encode`, or accepted by :func:`decode` when an import checked it
    (``objects_spec.md`` §5.4) — and the hash check on the read shows the
    bytes are those admitted. Re-proving the form on every read would find
    nothing new (as ``git cat-file`` does not re-run ``git fsck``'s checks),
    so this only decodes: cbor2's C decoder with every tag refused.
    Only bytes planted with a matching hash could be non-canonical, and
    whoever can plant those can plant canonical ones as well; fsck and
    imports use :func:`decode`, which proves the form. Anything cbor2
    refuses goes to :func:`decode`, which raises the precise error.
    """
    # A longer body could hold more items than the budget, which cbor2 would
    # build before anyone counted them: the strict decoder charges them first.
    if _fast_loads is not None and len(data) <= MAX_BODY_ITEMS:
        try:
            return _fast_loads(data, semantic_decoders=_REFUSE_TAGS, tag_hook=_refuse_tag, max_depth=MAX_DEPTH + 1)
        except Exception:
            pass
    return decode(data, links_only=True)


def decode(data: bytes | bytearray | memoryview, *, links_only: bool = False, max_items: int | None = None) -> Any:
    """Decode exactly one strict deterministic CBOR item filling ``data``.

    Raises :class:`DecodeError` on the first rule broken: non-minimal heads,
    indefinite lengths, tags, floats, unsorted or duplicate keys, invalid
    UTF-8, nesting past :data:`MAX_DEPTH`, lengths past the data, arrays or
    maps of more than ``max_items`` (default :data:`MAX_ITEMS`) elements, and
    trailing bytes. Whatever is accepted re-encodes to ``data`` exactly
    (a property the tests check). Same answer as :func:`decode_strict`,
    usually faster (the module docstring says why it is the same).
    """
    if type(data) is not bytes:  # the common case skips the isinstance
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("decode() takes bytes")
    limit = MAX_ITEMS if max_items is None else max_items
    # Only a body that cannot hold more items than the budget goes to cbor2,
    # which builds the value before it can be counted (module docstring);
    # a longer one is read in place by the strict decoder, never copied.
    if len(data) > MAX_BODY_ITEMS:
        return _decode_strict(data, links_only, limit)
    if type(data) is not bytes:
        data = bytes(data)
    if _fast_loads is not None and _fast_dumps is not None:
        try:
            # max_depth only stops hostile nesting early inside cbor2 (which
            # counts depth its own way); _fits_model applies the exact limit.
            value = _fast_loads(
                data, semantic_decoders=_REFUSE_TAGS, tag_hook=_refuse_tag, max_depth=MAX_DEPTH + 1
            )
            if _fits_model(value, links_only, limit, len(data)) and _fast_dumps(value) == data:
                return value
        except Exception:
            pass  # cbor2 refused the bytes: the strict decoder says why
    return _decode_strict(data, links_only, limit)
