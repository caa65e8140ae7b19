"""The history index: a session's history in one file, so that a resume does not read every message object.

A resume needs the whole history in the provider's form. Read from the
object store, every message costs an index lookup, a zstd frame, a BLAKE3
hash, a CBOR decode and a shape check — about three times the parse of a
JSONL session file at 100,000 messages. This file is to the history what
Git's ``commit-graph`` is to commits: a *derived* file, written by kxen-agent
from objects it had verified, protected by checksums, never needed (delete
it and the next resume reads the objects, the next run writes it again),
and checked against the objects by fsck (the store's cache kind
:data:`HISTORY`, whose hook fsck runs). Its byte format is
``objects_spec.md`` §14.12.

How it is trusted: each segment carries the BLAKE3 hash of its bytes and
the id of the message before its first (its *base*), which must be the
previous segment's last; a reader takes the longest prefix of whole, good,
chained segments and ignores the rest (a torn append, damage, a segment a
stale writer added). What it holds is joined to the Session's head by id,
exactly as :class:`~kxen_agent.runtime.history.RunHistory` joins what it
holds: walking back from the head to a message whose parent is the entry at
the position before. A message id is its content's hash, so an index whose
entries were written from those objects can only describe that history.

Who writes it: the runner, after each run, appending one or more segments
for what the run added (O(messages added)); the whole file is rewritten
(temp file and rename) only when its tail is not the run's history (a
fork's first run, a rewind, a torn tail). It is never fsynced: a cache that
a crash tears is cut off at its last good segment, and nothing acknowledged
depends on it.

Pure byte functions (:func:`encode_segment`, :func:`parse_index`) are kept
apart from the file functions, which go through the store's ``FileIO``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import blake3
import zstandard

from kxen_agent.session.grep_index import GREP
from kxen_agent.session.positions import POSITIONS
from kxen_agent.session.positions import sync as sync_positions
from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.store import codec
from kxen_agent.store.caches import CacheKind, Caches, replace_cache_file

from .answer_check import safe_provider_message
from kxen_agent.store.objects import MAX_OBJECT_SIZE, CorruptObject, check_frame_parameters

__all__ = [
    "Entry",
    "INDEX_MIN_MESSAGES",
    "MAGIC",
    "NO_BASE",
    "ParsedIndex",
    "encode_entries",
    "encode_segment",
    "encode_segments",
    "parse_index",
    "read_index",
    "verify_indexes",
    "write_index",
]

#: The file's first bytes (§14.12).
MAGIC = b"kxen-history 1\n"
#: Each segment's first bytes.
SEGMENT_MAGIC = b"HSEG"
#: magic, entry count, base (the id before the first entry; zeros: none), frame length.
_SEG = struct.Struct(">4sI32sI")
_SUM = 32
#: The id of "no message": the base of a segment that starts at the history's first message.
NO_BASE = bytes(32)
#: A writer closes a segment once its CBOR passes this size (the fast decoder's whole-body limit).
SEGMENT_TARGET = codec.MAX_BODY_ITEMS
#: A reader refuses a segment that declares more (a message body is at most this much too).
SEGMENT_MAX = MAX_OBJECT_SIZE
#: Sessions with fewer messages get no index: a resume reads them from objects in under ~15 ms.
INDEX_MIN_MESSAGES = 512

_ROLES = ("user", "assistant", "tool", "compaction")
_KEYS = frozenset(("id", "role", "content", "toolCalls", "toolCallId", "through"))

#: One message as the index holds it: (id, provider form, ``through`` of a compaction message or None).
Entry = tuple[bytes, dict[str, Any], "bytes | None"]


def _verify_store(store: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """fsck's hook for :data:`HISTORY`: :func:`verify_indexes` over the store's sessions."""
    return verify_indexes(SessionStore(store))


#: The history index as a kind of derived cache of the store (§11a): ``cache/history/sessions/<ses>``,
#: removed with its session's group, checked by fsck (a store given it: ``Store(root, caches=CACHES)``).
HISTORY = CacheKind("history", verify=_verify_store, problem="history-index", title="history index")
#: The kinds of cache the run loop keeps: what a store opened for this program is given (the session
#: layer's message positions, §11a.1, among them).
CACHES = (HISTORY, POSITIONS, GREP)


# ---------------------------------------------------------------- bytes


def encode_entries(entries: Iterable[Entry]) -> list[dict[str, Any]]:
    """The CBOR values of ``entries``: the message's own field names (§14.4), its content resolved; each
    map's keys in canonical order (§2.3: shorter first), so that the fast encoder writes canonical bytes."""
    out = []
    for oid, p, through in entries:
        v: dict[str, Any] = {"id": oid, "role": p["role"], "content": p.get("content")}
        if through is not None:
            v["through"] = through
        if p.get("tool_calls"):
            v["toolCalls"] = [{k: c[k] for k in sorted(c, key=_key_order)} for c in p["tool_calls"]]
        if p.get("tool_call_id") is not None:
            v["toolCallId"] = p["tool_call_id"]
        out.append(v)
    return out


def _key_order(key: str) -> tuple[int, bytes]:
    """§2.5's map key order: shorter UTF-8 first, then bytewise."""
    b = key.encode("utf-8")
    return len(b), b


def encode_segment(base: bytes | None, entries: Sequence[Entry]) -> bytes:
    """One segment holding ``entries``, which follow the message ``base`` (None: the first message)."""
    body = codec.encode_ordered(encode_entries(entries))
    frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(body)
    head = _SEG.pack(SEGMENT_MAGIC, len(entries), base or NO_BASE, len(frame))
    return head + frame + blake3.blake3(head + frame).digest()


def encode_segments(base: bytes | None, entries: Sequence[Entry]) -> bytes:
    """``entries`` as consecutive segments of about :data:`SEGMENT_TARGET` CBOR bytes each."""
    out = bytearray()
    start, size = 0, 0
    for i, (_oid, p, _t) in enumerate(entries):
        size += 96 + len(p.get("content") or "") * 2 + sum(len(c["arguments"]) + 64 for c in p.get("tool_calls") or ())
        if size >= SEGMENT_TARGET // 2 or i == len(entries) - 1:
            out += encode_segment(base, entries[start:i + 1])
            base = entries[i][0]
            start, size = i + 1, 0
    return bytes(out)


@dataclass
class ParsedIndex:
    """The longest good prefix of an index file."""

    entries: list[Entry] = field(default_factory=list)
    #: Bytes of the file that prefix spans (the header included; 0: not even the header is good).
    good_bytes: int = 0
    #: Why the rest was not taken (None: the file is whole).
    stopped: str | None = None


def parse_index(data: bytes) -> ParsedIndex:
    """The good prefix of the bytes of an index file; never raises for bad bytes (they end the prefix)."""
    view = memoryview(data)
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        chunk = bytes(view[pos:pos + n])
        pos += len(chunk)
        return chunk

    return _parse(take)


def _parse(take: Callable[[int], bytes], limit: int | None = None) -> ParsedIndex:
    """The good prefix of the index whose bytes ``take(n)`` gives in order (fewer than n: the end);
    with ``limit``, no segment is read after one that reaches ``limit`` entries (the rest is not
    looked at: ``stopped`` says so)."""
    out = ParsedIndex()
    if take(len(MAGIC)) != MAGIC:
        out.stopped = "the file does not start with 'kxen-history 1'"
        return out
    out.good_bytes = len(MAGIC)
    last, entries = NO_BASE, out.entries
    while True:
        head = take(_SEG.size)
        if not head:
            return out
        why = _segment(head, take, last, entries)
        if why is not None:
            out.stopped = f"segment at byte {out.good_bytes}: {why}"
            return out
        out.good_bytes += len(head) + _SEG.unpack(head)[3] + _SUM
        last = entries[-1][0]
        if limit is not None and len(entries) >= limit:
            if take(1):
                out.stopped = f"not read past entry {len(entries)} (the head's history has {limit})"
            return out


def _segment(head: bytes, take: Callable[[int], bytes], last: bytes, entries: list[Entry]) -> str | None:
    """Append the entries of the segment whose first bytes are ``head``; None, or why it is not good
    (then nothing was appended)."""
    if len(head) < _SEG.size:
        return "shorter than a segment (a torn append)"
    magic, count, base, flen = _SEG.unpack(head)
    if magic != SEGMENT_MAGIC:
        return "no segment magic"
    if flen > SEGMENT_MAX:
        return f"its frame of {flen} bytes is over the limit"
    frame = take(flen)
    digest = take(_SUM)
    if len(frame) != flen or len(digest) != _SUM:
        return "it runs past the end of the file (a torn append)"
    h = blake3.blake3(head)
    h.update(frame)
    if h.digest() != digest:
        return "checksum mismatch"
    if base != last:
        return "its base is not the previous segment's last message"
    if count == 0:
        return "no entries"
    try:
        params = zstandard.get_frame_parameters(frame)
        if params.content_size > SEGMENT_MAX or params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
            return "its frame declares no size, or more than the limit"
        check_frame_parameters(params, "history index")
        body = zstandard.ZstdDecompressor().decompress(frame, allow_extra_data=False)
        values = codec.decode_admitted(body)
    except (zstandard.ZstdError, CorruptObject, codec.DecodeError) as e:
        return f"its frame does not hold CBOR ({e})"
    if type(values) is not list or len(values) != count:
        return "its frame does not hold an array of its entry count"
    start = len(entries)
    for v in values:
        e = _entry(v)
        if e is None:
            del entries[start:]
            return "an entry is not a message of the shape of §14.12"
        entries.append(e)
    return None


def _entry(v: Any) -> Entry | None:
    if type(v) is not dict or not _KEYS.issuperset(v):
        return None
    oid, role, content = v.get("id"), v.get("role"), v.get("content", 0)
    if type(oid) is not bytes or len(oid) != 32 or role not in _ROLES or type(role) is not str:
        return None
    if content is not None and type(content) is not str:
        return None
    p: dict[str, Any] = {"role": role, "content": content}
    calls = v.get("toolCalls")
    if calls is not None:
        if type(calls) is not list or not calls or role != "assistant":
            return None
        for c in calls:
            if not (type(c) is dict and type(c.get("id")) is str and type(c.get("name")) is str
                    and type(c.get("arguments")) is str):
                return None
        p["tool_calls"] = calls
    tcid = v.get("toolCallId")
    if tcid is not None:
        if type(tcid) is not str:
            return None
        p["tool_call_id"] = tcid
    through = v.get("through")
    if through is not None and (role != "compaction" or type(through) is not bytes or len(through) != 32):
        return None
    return oid, p, through


# ---------------------------------------------------------------- files


def read_index(io: Any, path: str, limit: int | None = None) -> ParsedIndex | None:
    """The good prefix of the index at ``path``, read a segment at a time, up to the segment that
    reaches ``limit`` entries; None if there is none (or it cannot be read)."""
    try:
        with io.open_read(path) as f:
            return _parse(f.read, limit)
    except OSError:
        return None


def write_index(io: Any, path: str, entries: Sequence[Entry], *, keep: int = 0, keep_bytes: int = 0) -> int:
    """Make the index at ``path`` hold ``entries``.

    ``keep``/``keep_bytes``: the file's first ``keep`` entries, spanning its
    first ``keep_bytes`` bytes, are ``entries[:keep]`` and nothing follows
    them (the caller read it so): only the rest is appended. Otherwise the
    whole file is written anew beside it and renamed over it. No fsync
    either way (the module docstring says why). The file's new size;
    raises OSError.
    """
    sync_positions_beside(io, path, [e[0] for e in entries])
    if keep and keep_bytes:
        if keep >= len(entries):
            return keep_bytes
        return io.append(path, encode_segments(entries[keep - 1][0], entries[keep:]), sync=False)
    data = MAGIC + encode_segments(None, entries)
    replace_cache_file(io, path, data)
    return len(data)


def sync_positions_beside(io: Any, path: str, ids: Sequence[bytes]) -> None:
    """Bring the session's message positions (§11a.1) up to date from the ids of the same history (oldest
    first), when ``path`` is a history index in its cache dir (``cache/history/<ns>/<id>``): ``fork --at``
    after a run then reads no message, nor does the next run's walk past its view's bound. A cache beside
    a cache: never an error of the run's."""
    ns_dir = os.path.dirname(path)
    kind_dir = os.path.dirname(ns_dir)
    if os.path.basename(kind_dir) != HISTORY.name:
        return
    other = os.path.join(os.path.dirname(kind_dir), POSITIONS.name, os.path.basename(ns_dir), os.path.basename(path))
    try:
        sync_positions(io, other, ids)
    except OSError:
        pass


# ---------------------------------------------------------------- fsck


def verify_indexes(sessions: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """Check every history index of the state dir of ``sessions`` (a SessionStore) against the objects.

    Returns (problems, notes): a problem is an entry that is not the message
    its id names at its position (wrong content, wrong chain), which a
    resume would send the model; a note is what is normal for a cache (a
    torn or damaged tail, which readers cut off; entries whose messages gc
    has pruned after a rewind, which a resume drops). Each as (path, text).
    """
    from kxen_agent.errors import KxenError
    from kxen_agent.store import MissingObject

    store = sessions.store
    problems: list[tuple[str, str]] = []
    notes: list[str] = []
    for path in Caches(store.root, store.io).files(HISTORY, NS):
        parsed = read_index(store.io, path)
        if parsed is None:
            problems.append((path, "cannot be read"))
            continue
        if parsed.stopped is not None:
            notes.append(f"{path}: {len(parsed.entries)} good entries, then {parsed.stopped} "
                         "(ignored by readers; the next run of the session rewrites it)")
        prev: bytes | None = None
        for i, (oid, p, through) in enumerate(parsed.entries):
            try:
                m = sessions.read_message(oid)
            except MissingObject:
                notes.append(f"{path}: entry {i} names message {oid.hex()}, which is gone (pruned after a "
                             "rewind): readers drop it and what follows")
                break
            except KxenError:
                kind = _kind_of(store, oid)
                if kind is not None and kind != "message":
                    # A good object of another kind: no message at all, whatever the index says (§14.12).
                    problems.append((path, f"entry {i} names object {oid.hex()}, a {kind} object, not a message: "
                                     "delete the file (the next run writes it again)"))
                break  # else a damaged or misshapen message: fsck reports the object itself
            if m.seq != i or m.parent != prev:
                problems.append((path, f"entry {i} names message {oid.hex()}, which is message {m.seq} of "
                                 "another history: delete the file (the next run writes it again)"))
                break
            # The index holds the form the history loader sends (answer_check: a pre-door bad value refused).
            if safe_provider_message(m.to_provider()) != p or (m.through if m.role == "compaction" else None) != through:
                problems.append((path, f"entry {i} holds other content than message {oid.hex()}: "
                                 "delete the file (the next run writes it again)"))
                break
            prev = oid
    return problems, notes


def _kind_of(store: Any, oid: bytes) -> str | None:
    """The kind of object ``oid`` if it reads (its bytes hash to its id), else None."""
    from kxen_agent.errors import KxenError

    try:
        return store.read_raw(oid).kind
    except KxenError:
        return None
