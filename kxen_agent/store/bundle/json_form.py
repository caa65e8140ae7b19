"""The JSON form of a bundle (``objects_spec.md`` §12.7): a streaming reader and the writer.

One JSON document with the header's fields, each object's id, kind and
canonical bytes (base64), and a ``digest`` tying the refs to the object
ids, for people who read bundles with ``jq``. Owns the incremental JSON
tokenizer (:class:`_JsonStream`: ``json``'s C scanner fed just enough
text, every value bounded before more is read), the strict reading of the
fields and objects (no duplicate keys, no floats, canonical base64 only),
:class:`_JsonBundleReader`, and :func:`write_json_bundle`.

It must never open a file: it reads the binary stream it is given (and
rewinds it when the header fields follow the objects), writes to the sink
it is given, and asks the file's size through the
:class:`~kxen_agent.store.fsio.FileIO` it is given.
"""

from __future__ import annotations

import base64
import codecs
import json
import re
import struct
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from kxen_agent.errors import UsageError

from ..fsio import FileIO
from ..objects import MAX_OBJECT_SIZE, CorruptObject, RawObject, parse_object
from ..pack import MAX_RAW_SIZE
from .closure import _Closure, _Item
from .hashing_reader import stream_size
from .header import (
    BUNDLE_VERSION,
    CAP_GIT_CHECKPOINTS,
    CAP_ZSTD_DICT,
    GIT_SECTION_MAGIC,
    KNOWN_CAPABILITIES,
    MAX_HEADER_SIZE,
    MIN_JSON_OBJECT_CHARS,
    BadBundle,
    BundleInfo,
    BundleLimits,
    _check_refs,
    _Header,
    check_header_fits,
    check_header_limits,
)

__all__ = ["JSON_FORMAT_NAME", "write_json_bundle"]

JSON_FORMAT_NAME = "kxen-bundle"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_JSON_KEYS = ("format", "version", "capabilities", "refs", "objectCount", "objectBytes", "objects", "checkpoints",
              "digest")
#: Members a reader may meet after the ``objects`` list (the writer puts them there).
_LATE_KEYS = ("objects", "checkpoints", "digest")
# The longest canonical base64 of the longest object bytes.
_MAX_B64 = 4 * ((MAX_RAW_SIZE + 2) // 3)
#: The largest Git bundle of checkpoints the JSON form carries (§12.7a): the reader holds the member whole,
#: so it is bounded as one object is; a larger one travels in the pack form, which streams it.
MAX_JSON_CHECKPOINT_BYTES = MAX_OBJECT_SIZE
_MAX_CKP_B64 = 4 * ((MAX_JSON_CHECKPOINT_BYTES + 2) // 3)
_GIT_BUNDLE_V2 = b"# v2 git bundle\n"
_U64 = struct.Struct(">Q")


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
                    if end - self.pos > limit:
                        # Judged on the value, not on how much was read: the
                        # same document is refused whatever the read sizes.
                        raise self.bad(f"a JSON value longer than {limit} characters")
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

    missing = [k for k in _JSON_KEYS if k not in fields and k not in _LATE_KEYS]
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
    if len(set(caps)) != len(caps):
        raise bad("capabilities name one twice")
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

    def __init__(self, f: BinaryIO, where: str, path: str, io: FileIO, limits: BundleLimits | None = None) -> None:
        self.f = f
        self.where = where
        self.path = path
        self.io = io
        self.info: BundleInfo | None = None
        self.dictionary = None
        self.checkpoints_at = 0  # where the checkpoints member's value starts (character offset)
        self._gen = self._scan(stream=True)
        _tag, fields = next(self._gen)  # runs up to the objects list
        if all(k in fields for k in _JSON_KEYS if k not in _LATE_KEYS):
            self.fields = fields
        else:
            self._gen.close()
            self.f.seek(0)
            self.fields = _drain(self._scan(stream=False))
            self.f.seek(0)
            self._gen = self._scan(stream=True)
            next(self._gen)
        self.header = _json_header(self.fields, where)
        # Characters <= bytes: the file's size bounds the characters it holds.
        size = stream_size(self.io, self.f)
        check_header_fits(self.header, where, size, MIN_JSON_OBJECT_CHARS, None, "character")
        check_header_limits(self.header, where, size, limits or BundleLimits(), None, "character")
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
            elif key == "checkpoints":  # base64 of a Git bundle (§12.7a), bounded before it is held
                self.checkpoints_at = js.offset
                fields[key] = js.value(_MAX_CKP_B64 + 2)
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
        while True:
            try:
                ev = next(self._gen)
            except StopIteration as stop:
                final = stop.value
                break
            _tag, el, js, at = ev
            obj = _json_object(el, js, at)
            self.closure.add(obj, at, "character")
            yield _Item(obj, b"", b"", at)
        for k, v in self.fields.items():
            if final.get(k) != v:
                raise BadBundle(self.where, f"{k!r} changed while the bundle was being read")
        d = final.get("digest")
        if type(d) is not str or not _HEX64.fullmatch(d):
            raise BadBundle(self.where, "digest is missing or not 64 lower-case hex digits")
        # The digest is the content digest (§12.7), then, with checkpoints, their section's bytes (§12.7a).
        git = self._checkpoints(final)
        digest = self.closure.content.copy()
        if git is not None:
            digest.update(GIT_SECTION_MAGIC + _U64.pack(len(git)) + git)
            if digest.hexdigest() != d:
                raise BadBundle(self.where, "digest mismatch: the refs, the list of objects or the checkpoints "
                                "were altered")
        elif digest.hexdigest() != d:
            raise BadBundle(self.where, "digest mismatch: the refs or the list of objects were altered")
        self.closure.finish(None)
        c = self.closure
        size = self.io.fstat(self.f).st_size
        self.info = BundleInfo(self.path, "json", BUNDLE_VERSION, self.header.capabilities, self.header.refs,
                               c.count, c.bytes, 0, size, d, dict(c.kinds), c.content.hexdigest(),
                               (self.checkpoints_at, len(git)) if git is not None else None, git)

    def _checkpoints(self, final: dict) -> bytes | None:
        """The ``checkpoints`` member decoded (§12.7a): present exactly with the capability, a version-2 Git bundle."""
        b64 = final.get("checkpoints")
        declared = CAP_GIT_CHECKPOINTS in self.header.capabilities
        if b64 is None:
            if declared:
                raise BadBundle(self.where, "the git-checkpoints capability is declared but the bundle has no "
                                "checkpoints member")
            return None
        if not declared:
            raise BadBundle(self.where, "a checkpoints member without the git-checkpoints capability")
        if type(b64) is not str:
            raise BadBundle(self.where, "checkpoints must be a string (base64 of a Git bundle)")
        if len(b64) > _MAX_CKP_B64:  # (the reader met the bound first; a caller's own fields meet it here)
            raise BadBundle(self.where, f"checkpoints: {len(b64)} base64 characters exceed the limit of "
                            f"{_MAX_CKP_B64} (a Git bundle of {MAX_JSON_CHECKPOINT_BYTES} bytes)")
        try:
            git = base64.b64decode(b64, validate=True)
        except ValueError:
            raise BadBundle(self.where, "checkpoints are not base64") from None
        if base64.b64encode(git).decode("ascii") != b64:
            raise BadBundle(self.where, "checkpoints are not canonical base64")
        if not git.startswith(_GIT_BUNDLE_V2):
            raise BadBundle(self.where, "the checkpoint section is not a Git bundle (version 2)")
        return git


def _drain(gen: Iterator[Any]) -> Any:
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


def write_json_bundle(hdr: _Header, objects: Iterable[RawObject], write: Callable[[bytes], None],
                      git_section: tuple[BinaryIO, int] | None = None) -> tuple[str, int | None]:
    """Write a JSON-form bundle of ``objects`` (in closure order) to ``write``.

    Returns its digest in hex and, with ``git_section`` (a Git bundle's file and length, at most
    :data:`MAX_JSON_CHECKPOINT_BYTES`, the ``git-checkpoints`` capability in ``hdr``), the character
    offset of the ``checkpoints`` member's value (§12.7a), else None.
    """
    written = 0

    def put(b: bytes) -> None:
        nonlocal written
        write(b)
        written += len(b)

    digest = hdr.content_digest()
    head = {
        "format": JSON_FORMAT_NAME,
        "version": BUNDLE_VERSION,
        "capabilities": list(hdr.capabilities),
        "refs": {g: {n: v.hex() for n, v in sorted(r.items())} for g, r in sorted(hdr.refs.items())},
        "objectCount": hdr.objects,
        "objectBytes": hdr.size,
    }
    put(json.dumps(head, separators=(",", ":"))[:-1].encode() + b',"objects":[')
    for i, obj in enumerate(objects):
        digest.update(obj.id)
        el = {"id": obj.hex, "kind": obj.kind, "bytes": base64.b64encode(obj.raw).decode("ascii")}
        put((",\n" if i else "\n").encode() + json.dumps(el, separators=(",", ":")).encode())
    put(b"\n]")
    at = None
    if git_section is not None:
        # After the objects (a reader streams them before it must hold this member), under the digest.
        f, n = git_section
        digest.update(GIT_SECTION_MAGIC + _U64.pack(n))
        put(b',"checkpoints":')
        at = written
        put(b'"')
        left = n
        while left:
            chunk = f.read(min(left, 3 << 18))  # a multiple of 3: the pieces' base64 joins into one
            if not chunk:
                raise UsageError("the checkpoints' Git bundle ended early while it was copied; nothing was written")
            digest.update(chunk)
            put(base64.b64encode(chunk))
            left -= len(chunk)
        put(b'"')
    d = digest.hexdigest()
    put(b',"digest":"' + d.encode() + b'"}\n')
    return d, at
