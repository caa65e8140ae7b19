"""Step logs: a ref group's durable steps, each its new objects and its ref change in one record.

A *step log* (``objects_spec.md`` §6.8) is an append-only file per ref
group, ``steps/<ns>/<id>``. One record carries a transaction's updates,
fence, deleted-marker action and reason together with the objects it
made, each as the same zstd frame a loose file holds. A version-2 record
(the one written) starts with a small header — its length and its own
offset in the file, checked by a hash bound to the log's header line —
and ends in a BLAKE3 checksum of itself and a copy of the header (the
trailer): a reader knows at each position whether a record is real, so a
committed record is never taken for a torn tail, nor a torn tail for
damage, and the committed end is found in linear time. Appending a record and ``fsync``-ing the file
is the transaction's commit point: one fsync for a durable step, where a
loose object costs two and a ref file three.

A group's committed state is its ref file (the *base*; none: the empty
group) with the committed records of its step log applied in order. The
ref file names the log's *generation* (``steps N``); a log whose header
names another generation holds nothing of the group's (a checkpoint
folded it in). A *checkpoint* folds the log into the ref file and starts
a new generation, once its objects are durable elsewhere (a pack).

This module is split as the store is: pure byte formats
(:func:`encode_record`, :func:`scan`, the header) first, then
:class:`StepLogs`, the I/O and the in-memory index of the objects the
logs hold. Every file-system call goes through the store's
:class:`~.fsio.FileIO`.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

import blake3

from kxen_agent.errors import KxenError

from . import codec
from .fsio import FileIO
from .objects import ObjectId, RawObject, compress_loose, decompress_loose, parse_object
from .refformat import clean_reason
from .steps_tail import _candidates  # noqa: F401  (salvage imports it from here)

__all__ = [
    "RECORD_MAGIC", "StepLogs", "StepRecord", "StepTx", "TxUpdate", "TRAILER_MAGIC", "VERSION",
    "encode_body", "encode_header", "encode_record", "encode_record_v1", "frame_body", "parse_header",
    "read_header", "scan",
]

#: Marks each record's start (§6.8).
RECORD_MAGIC = b"STEP"
#: Marks each version-2 record's trailer (§6.8): the magic, reversed.
TRAILER_MAGIC = b"PETS"
#: The step-log version this module writes (§6.8); version 1 is still read.
VERSION = 2
_HEADER_RE = re.compile(rb"kxen-steps ([12]) ([A-Za-z0-9_][A-Za-z0-9_.-]{0,63}/[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}) "
                        rb"(0|[1-9][0-9]{0,18})\n")
#: Longest header: the words, a group of two 64-byte segments, 19 digits.
MAX_HEADER = 14 + 129 + 1 + 19 + 1
#: A record's body is at most this long (its length field is 4 bytes):
#: objects are at most 64 MiB each, and a step makes a handful.
MAX_BODY = (1 << 32) - 1
_PREFIX = 8  # version 1: magic + body length
_SUM = 32
_HEAD = 32  # version 2: magic, B, P, HC
_FRAME = 96  # version 2: head, checksum, trailer
#: Step logs a process keeps open after appending to them (a run appends to a few groups, again and again).
PINS = 8


class CorruptSteps(KxenError):
    """A step log that cannot be read (as CorruptRef: run fsck)."""


@dataclass(frozen=True)
class TxUpdate:
    name: str
    old: bytes | None
    new: bytes | None


@dataclass(frozen=True)
class StepTx:
    """The ref side of a record: what a reflog line says, for each update, and the group's changes.

    ``fence``: the fence the transaction carried (or the group's resulting
    one), as reflog lines record it; ``new_fence``: the group's new fence,
    if raised; ``deleted``: ``"leave"``, ``None`` (unmark) or a time (mark).
    """

    time_ns: int
    reason: str
    fence: int
    new_fence: int | None
    deleted: int | None | str
    updates: tuple[TxUpdate, ...]


@dataclass(frozen=True)
class StepRecord:
    """One committed record: where it lies, its transaction, and its objects' frames (id, offset, length)."""

    offset: int
    end: int
    tx: StepTx
    objects: tuple[tuple[ObjectId, int, int], ...]


# ------------------------------------------------------------------ formats


def encode_header(group: str, gen: int, version: int = VERSION) -> bytes:
    """The header line ``L`` of a log of ``group`` and generation ``gen`` (version 1 only to build old logs)."""
    return b"kxen-steps %d %s %d\n" % (version, group.encode("ascii"), gen)


def read_header(data: bytes | memoryview, where: str) -> tuple[int, str, int, int]:
    """(version, group, generation, header length) of a step log's first bytes; CorruptSteps if they are not one."""
    head = bytes(data[:MAX_HEADER])
    m = _HEADER_RE.match(head)
    if m is None:
        raise CorruptSteps(f"step log {where} is damaged at offset 0: it does not begin with 'kxen-steps <1 or 2> "
                           "<group> <generation>' and a newline; no writer touches it: run fsck")
    return int(m.group(1)), m.group(2).decode("ascii"), int(m.group(3)), m.end()


def parse_header(data: bytes | memoryview, where: str) -> tuple[str, int, int]:
    """(group, generation, header length) of a step log's first bytes; CorruptSteps if they are not one."""
    return read_header(data, where)[1:]


def _tx_value(tx: StepTx) -> dict[str, Any]:
    v: dict[str, Any] = {
        "time": tx.time_ns,
        "reason": tx.reason,
        "fence": tx.fence,
        "updates": [[u.name, u.old, u.new] for u in tx.updates],
    }
    if tx.new_fence is not None:
        v["newFence"] = tx.new_fence
    if tx.deleted != "leave":
        v["deleted"] = tx.deleted
    return v


def encode_body(tx: StepTx, objects: list[tuple[ObjectId, bytes]]) -> bytes:
    """A record's body (the same in both versions): ``objects`` are (id, zstd frame) pairs, in the order given."""
    txb = codec.encode(_tx_value(tx))
    parts = [len(txb).to_bytes(4, "big"), txb]
    for oid, frame in objects:
        parts += [oid, len(frame).to_bytes(4, "big"), frame]
    body = b"".join(parts)
    if len(body) > MAX_BODY:
        raise ValueError(f"a step of {len(body)} bytes exceeds the record limit ({MAX_BODY})")
    return body


def _check16(line: bytes, field: bytes) -> bytes:
    """HC or TC: the first 16 bytes of BLAKE3(L ‖ the 16 bytes before it), binding it to this log's header line."""
    return blake3.blake3(line + field).digest()[:16]


def frame_body(body: bytes, at: int, line: bytes) -> bytes:
    """The version-2 record of ``body`` starting at file offset ``at`` of the log whose header line is ``line``."""
    lp = len(body).to_bytes(4, "big") + at.to_bytes(8, "big")
    head = RECORD_MAGIC + lp
    head += _check16(line, head)
    tail = TRAILER_MAGIC + lp
    return b"".join((head, body, blake3.blake3(head + body).digest(), tail, _check16(line, tail)))


def encode_record(tx: StepTx, objects: list[tuple[ObjectId, bytes]], at: int, line: bytes) -> bytes:
    """The bytes of one version-2 record, to lie at file offset ``at`` of the log whose header line is ``line``."""
    return frame_body(encode_body(tx, objects), at, line)


def encode_record_v1(tx: StepTx, objects: list[tuple[ObjectId, bytes]]) -> bytes:
    """The bytes of one version-1 record (never written by the store now: for tests and old logs' vectors)."""
    body = encode_body(tx, objects)
    head = RECORD_MAGIC + len(body).to_bytes(4, "big")
    return head + body + blake3.blake3(head + body).digest()


def _id_or_none(v: Any, where: str) -> bytes | None:
    if v is None:
        return None
    if type(v) is not bytes or len(v) != 32 or v == b"\x00" * 32:
        raise CorruptSteps(f"{where}: a ref value is not a 32-byte id or null")
    return v


def _parse_tx(data: memoryview, where: str) -> StepTx:
    try:
        v = codec.decode(data)
    except codec.DecodeError as e:
        raise CorruptSteps(f"{where}: transaction is not canonical CBOR: {e}") from None
    keys = {"time", "reason", "fence", "updates"}
    if (type(v) is not dict or not keys <= v.keys() or not set(v) <= keys | {"newFence", "deleted"}
            or type(v["time"]) is not int or type(v["reason"]) is not str or type(v["fence"]) is not int
            or v["fence"] < 0 or v["time"] < 0 or type(v["updates"]) is not list
            or type(v.get("newFence", 0)) is not int or v.get("newFence", 0) < 0
            or ("deleted" in v and v["deleted"] is not None and (type(v["deleted"]) is not int or v["deleted"] < 0))):
        raise CorruptSteps(f"{where}: transaction map does not have the fields of §6.8")
    if clean_reason(v["reason"]) != v["reason"]:
        raise CorruptSteps(f"{where}: the reason holds a control character or uncollapsed whitespace")
    ups = []
    for u in v["updates"]:
        if type(u) is not list or len(u) != 3 or type(u[0]) is not str:
            raise CorruptSteps(f"{where}: an update is not [name, old, new]")
        ups.append(TxUpdate(u[0], _id_or_none(u[1], where), _id_or_none(u[2], where)))
    return StepTx(v["time"], v["reason"], v["fence"], v.get("newFence"), v["deleted"] if "deleted" in v else "leave",
                  tuple(ups))


def _parse_body(view: memoryview, b0: int, body_end: int, pos: int, end: int, at: str) -> StepRecord:
    """The record whose body is ``view[b0:body_end]`` (its checksums already matched); CorruptSteps if it does not parse."""
    if body_end - b0 < 4:
        raise CorruptSteps(f"{at}: record too short for its transaction length")
    tlen = int.from_bytes(view[b0:b0 + 4], "big")
    q = b0 + 4 + tlen
    if q > body_end:
        raise CorruptSteps(f"{at}: transaction runs past the record")
    tx = _parse_tx(view[b0 + 4:q], at)
    objs = []
    while q < body_end:
        if q + 36 > body_end:
            raise CorruptSteps(f"{at}: object entry runs past the record")
        oid = bytes(view[q:q + 32])
        flen = int.from_bytes(view[q + 32:q + 36], "big")
        if q + 36 + flen > body_end:
            raise CorruptSteps(f"{at}: object frame runs past the record")
        objs.append((oid, q + 36, flen))
        q += 36 + flen
    return StepRecord(pos, end, tx, tuple(objs))


def _damage(where: str, at: int, what: str, last: tuple[int, int] | None) -> CorruptSteps:
    """The one-line refusal of a damaged log: the file, the offset (from the file's start), the last committed record."""
    if last is None:
        held = "no record before it is committed"
    else:
        held = f"the last committed record is the one at offset {last[0]} (ending at {last[1]})"
    e = CorruptSteps(f"step log {where} is damaged at offset {at}: {what}; {held}; no writer cuts it: "
                     f"`kxen-agent fsck` names every record that still checks, `kxen-agent repair` keeps them "
                     f"(the session's other commands: `session export --salvage`, `session delete --force`)")
    e.offset = at  # type: ignore[attr-defined]
    return e


def scan(data: bytes | memoryview, start: int, where: str, *, line: bytes | None = None, base: int = 0,
         last: tuple[int, int] | None = None) -> tuple[list[StepRecord], int]:
    """The committed records of ``data`` from ``start`` (a record boundary), and where they end.

    ``data[i]`` is the file's byte ``base + i``; ``line`` is the log's
    header line (default: ``data[:start]``, for a whole file), whose
    version picks the rule; ``last``: (offset, end) of the committed
    record before ``start``, for messages. What follows the committed
    records is either an uncommitted tail (readers ignore it, the next
    writer cuts it) or damage: :class:`CorruptSteps`, naming the file
    offset (§6.8 states the rule once; :func:`_scan_v2` follows it).
    """
    if line is None:
        line = bytes(data[:start])
    version = read_header(line, where)[0]
    if version == 1:
        return _scan_v1(data, start, where, base, last)
    return _scan_v2(bytes(data), start, where, line, base, last)


def _real_header(buf: bytes, q: int, line: bytes, base: int) -> int | None:
    """B, if a real version-2 record header lies at ``buf[q]``: magic, its P naming this position, HC matching."""
    if q + _HEAD > len(buf) or buf[q:q + 4] != RECORD_MAGIC:
        return None
    if int.from_bytes(buf[q + 8:q + 16], "big") != base + q:
        return None  # cheap first: a copy from elsewhere names another position
    if _check16(line, buf[q:q + 16]) != buf[q + 16:q + 32]:
        return None
    return int.from_bytes(buf[q + 4:q + 8], "big")


def _real_trailer(buf: bytes, t: int, line: bytes, base: int) -> tuple[int, int] | None:
    """(B, P), if a real version-2 trailer lies at ``buf[t]``: magic, P + 64 + B naming this position, TC matching."""
    if t + 32 > len(buf) or buf[t:t + 4] != TRAILER_MAGIC:
        return None
    blen = int.from_bytes(buf[t + 4:t + 8], "big")
    p = int.from_bytes(buf[t + 8:t + 16], "big")
    if p + 64 + blen != base + t:
        return None
    if _check16(line, buf[t:t + 16]) != buf[t + 16:t + 32]:
        return None
    return blen, p


def _scan_v2(buf: bytes, start: int, where: str, line: bytes, base: int,
             last: tuple[int, int] | None) -> tuple[list[StepRecord], int]:
    view = memoryview(buf)
    n = len(buf)
    out: list[StepRecord] = []
    p = start
    while p < n:
        blen = _real_header(buf, p, line, base)
        if blen is None or p + _FRAME + blen > n:
            break
        e = p + _FRAME + blen
        s = e - 64
        if blake3.blake3(view[p:s]).digest() != buf[s:s + 32]:
            raise _damage(where, base + p, f"the record there ({e - p} bytes, all present) does not match its "
                          f"checksum (at offset {base + s})", last)
        if _real_trailer(buf, e - 32, line, base) != (blen, base + p):
            raise _damage(where, base + e - 32, f"the trailer of the record at offset {base + p} does not match "
                          "its header", last)
        try:
            rec = _parse_body(view, p + _HEAD, s, p, e, f"step log {where} at offset {base + p}")
        except CorruptSteps as err:
            raise _damage(where, base + p, f"the record there checks but does not parse ({err})", last) from None
        out.append(rec)
        last = (base + p, base + e)
        p = e
    if p < n:
        if buf[p:p + 4] == RECORD_MAGIC and p + _HEAD <= n and int.from_bytes(buf[p + 8:p + 16], "big") == base + p:
            # Its own position, all its bytes present, its checksum good:
            # a whole record whose header check alone fails — the header
            # line it is bound to (a generation digit) or the check itself
            # was damaged. One hash, at the committed end only.
            e = p + _FRAME + int.from_bytes(buf[p + 4:p + 8], "big")
            if e <= n and blake3.blake3(view[p:e - 64]).digest() == buf[e - 64:e - 32]:
                raise _damage(where, base + p, "a whole record lies there whose header check does not match (the "
                              "log's header line or the check was damaged)", last)
        bad = _tail_damage(buf, p, line, base)
        if bad is not None:
            raise _damage(where, base + bad[0], f"{bad[1]} follows the committed records' end (offset "
                          f"{base + p}), and the bytes between are not a whole record: not a torn append", last)
    return out, p


def _tail_damage(buf: bytes, p: int, line: bytes, base: int) -> tuple[int, str] | None:
    """Where the bytes ``buf[p:]`` past the committed records show damage, if they do (§6.8).

    Damage: a real header after ``p`` (a later record), or a real trailer
    in ``[p, n)`` naming a record at or after ``p`` (a whole record whose
    header no longer checks). Candidates are found by one regular-expression
    pass that already asks their offset field to name a position in the
    tail (zeros or a copy from before ``p`` do not); each then costs an
    integer comparison, and a short hash only when its position matches:
    linear in the tail.
    """
    n = len(buf)
    if n - p < 32:
        return None
    hash_ = blake3.blake3
    for q in _candidates(buf, RECORD_MAGIC, p + 1, base + p + 1, base + n - 32):
        # _real_header, inlined: a crafted tail can make this run once per 16 bytes.
        if (q + _HEAD <= n and buf[q + 8:q + 16] == (base + q).to_bytes(8, "big")
                and hash_(line + buf[q:q + 16]).digest()[:16] == buf[q + 16:q + 32]):
            return q, "a record header"
    for t in _candidates(buf, TRAILER_MAGIC, p, base + p, base + n - 96):
        got = _real_trailer(buf, t, line, base)
        if got is not None and got[1] >= base + p:
            return t, f"the trailer of a record at offset {got[1]}"
    return None


def _scan_v1(data: bytes | memoryview, start: int, where: str, base: int,
             last: tuple[int, int] | None) -> tuple[list[StepRecord], int]:
    """Version 1's rule (§6.8.1): records end at the first that fails; a valid one after that is damage."""
    view = memoryview(data)
    n = len(view)
    out: list[StepRecord] = []
    pos = start
    while pos + _PREFIX <= n:
        if view[pos:pos + 4] != RECORD_MAGIC:
            break
        blen = int.from_bytes(view[pos + 4:pos + 8], "big")
        end = pos + _PREFIX + blen + _SUM
        if end > n:
            break
        if blake3.blake3(view[pos:end - _SUM]).digest() != view[end - _SUM:end]:
            break
        try:
            rec = _parse_body(view, pos + _PREFIX, end - _SUM, pos, end, f"step log {where} at offset {base + pos}")
        except CorruptSteps as err:
            raise _damage(where, base + pos, f"the record there checks but does not parse ({err})", last) from None
        out.append(rec)
        last = (base + pos, base + end)
        pos = end
    if pos < n:
        # A torn record may carry anything, a record's bytes among them (a
        # blob holding a copy of a log): look for committed records only
        # past the length it claims.
        after = pos + 1
        if view[pos:pos + 4] == RECORD_MAGIC and pos + _PREFIX <= n:
            after = max(after, pos + _PREFIX + int.from_bytes(view[pos + 4:pos + 8], "big") + _SUM)
        bad = _later_record_v1(view, after - 1)
        if bad is not None:
            raise _damage(where, base + pos, f"the bytes there are not a record, yet a committed record follows "
                          f"at offset {base + bad} (not a torn append)", last)
    return out, pos


def _later_record_v1(view: memoryview, pos: int) -> int | None:
    """Where a valid version-1 record starts after ``pos``, if one does."""
    data = view.obj if isinstance(view.obj, bytes) and len(view.obj) == len(view) else bytes(view)
    at = data.find(RECORD_MAGIC, pos + 1)
    while at != -1:
        if at + _PREFIX <= len(data):
            blen = int.from_bytes(data[at + 4:at + 8], "big")
            end = at + _PREFIX + blen + _SUM
            if end <= len(data) and blake3.blake3(data[at:end - _SUM]).digest() == data[end - _SUM:end]:
                return at
        at = data.find(RECORD_MAGIC, at + 1)
    return None


# ------------------------------------------------------------------ the logs


@dataclass
class _Log:
    """What this process has read of one step log: its bytes so far, in chunks, and its records."""

    path: str
    ident: tuple[int, int]  # device, inode
    group: str
    gen: int
    header_len: int
    end: int  # the committed records end here
    size: int  # bytes read (end, plus an uncommitted tail)
    starts: list[int]  # chunk start offsets, ascending
    chunks: list[bytes]
    records: list[StepRecord]
    ids: set = field(default_factory=set)  # the objects its records hold
    version: int = VERSION
    # The bytes after ``end`` as last judged an uncommitted tail: a reader
    # re-reads a group 40 times a turn, and judging a long tail again each
    # time would cost that many passes over it.
    tail: bytes = b""
    # The file kept open by this process (StepLogs._pin), or None: while it
    # is open the inode cannot be reused, so a stat naming it is this file.
    pin: Any = None

    @property
    def line(self) -> bytes:
        """The header line ``L`` (version 2's record checks are bound to it)."""
        return self.chunks[0][:self.header_len]  # the first chunk starts at 0 and holds the header

    @property
    def last(self) -> tuple[int, int] | None:
        """(offset, end) of the last committed record, for messages."""
        return (self.records[-1].offset, self.records[-1].end) if self.records else None

    def slice(self, offset: int, length: int) -> bytes:
        i = bisect.bisect_right(self.starts, offset) - 1
        s = self.starts[i]
        chunk = self.chunks[i]
        if offset - s + length <= len(chunk):
            return chunk[offset - s:offset - s + length]
        return self._join()[offset:offset + length]

    def _join(self) -> bytes:
        if len(self.chunks) > 1:
            self.chunks = [b"".join(self.chunks)]
            self.starts = [0]
        return self.chunks[0]


class StepLogs:
    """The step logs of a state dir: reading (cached), appending, and the index of their objects."""

    def __init__(self, root: str, io: FileIO) -> None:
        self.root = root
        self.io = io
        self._mu = threading.RLock()
        self._logs: dict[str, _Log] = {}  # by path
        self._index: dict[ObjectId, tuple[_Log, int, int]] = {}
        # Step log names (and steps/<ns> dirs) this instance has made durable.
        # Keyed by path, inode and generation: an inode number may be reused.
        self._durable: set[tuple[str, tuple[int, int], int]] = set()
        #: Objects this instance has committed in records (automatic packing counts them).
        self.written = 0
        # (path, inode) of logs whose every byte this instance has fsynced.
        self._synced: dict[tuple[str, tuple[int, int], int], int] = {}
        # Damaged logs whose checking records' objects are indexed: path -> ((size, mtime, inode), log).
        self._salvaged: dict[str, tuple[tuple[int, int, int], _Log]] = {}
        #: Reads a damaged log's records that check (store.salvage.salvage_log, which imports this
        #: module: the store hands it in); None: a damaged log serves nothing.
        self.salvager: Any = None
        self._pins: list[_Log] = []  # logs whose file is kept open, oldest first (see _pin)
        self._paths: dict[str, str] = {}  # group -> its log's path (a pure function of the name)

    def path(self, group: str) -> str:
        path = self._paths.get(group)
        if path is None:
            ns, gid = group.split("/")
            path = os.path.join(self.root, "steps", ns, gid)
            if len(self._paths) >= 4096:
                self._paths.clear()
            self._paths[group] = path
        return path

    # ---------------------------------------------------------------- reading

    def load(self, group: str, *, fresh: bool = False) -> _Log | None:
        """The log of ``group`` as it is now (committed records read, cached), or None if there is none.

        ``fresh``: read every byte again (fsck: the cache trusts the bytes
        it has read, and damage in place would go unseen).
        """
        path = self.path(group)
        io = self.io
        with self._mu:
            old = self._logs.get(path)
            if fresh and old is not None:
                self._forget(old)
                old = None
            if old is not None and old.pin is not None:
                # Pinned: the same inode is the same file (what the header
                # check below proves of an unpinned one), so a stat suffices.
                try:
                    st = io.stat(path)
                except OSError:
                    st = None  # the slow path says what
                if st is not None and (st.st_dev, st.st_ino) == old.ident and st.st_size == old.size == old.end:
                    return old
            try:
                f = io.open_read(path)
            except FileNotFoundError:
                if old is not None:
                    self._forget(old)
                return None
            except OSError as e:
                raise CorruptSteps(f"cannot read step log {path}: {e.strerror}") from None
            with f:
                st = io.fstat(f)
                ident = (st.st_dev, st.st_ino)
                # The same inode number may be a new file (a checkpoint
                # replaced the log and the number was reused): the header,
                # which names the generation, tells them apart.
                if old is not None and old.ident == ident and f.read(old.header_len) == old.chunks[0][:old.header_len]:
                    if st.st_size == old.size == old.end:
                        return old
                    # Grown, or with a tail this process saw: read on from the
                    # committed end (another writer may have cut that tail and
                    # appended a record of the same length since).
                    if st.st_size < old.end:
                        # Cut below what was committed: not what writers do.
                        raise CorruptSteps(f"step log {path} is shorter ({st.st_size} bytes) than its committed "
                                           f"records ({old.end}); run fsck")
                    f.seek(old.end)
                    more = f.read()
                    self._extend(old, more, st.st_size)
                    return old
                if old is not None:
                    self._forget(old)
                f.seek(0)
                data = f.read()
            version, group_in, gen, hlen = read_header(data, path)
            if group_in != group:
                raise CorruptSteps(f"step log {path} names group {group_in}, not {group}")
            log = _Log(path, ident, group, gen, hlen, hlen, hlen, [0], [data[:hlen]], [], version=version)
            self._extend(log, data[hlen:], len(data))
            self._logs[path] = log
            return log

    def _extend(self, log: _Log, more: bytes, size: int) -> None:
        """Read the records in ``more`` (the file's bytes from ``log.end`` on)."""
        if more and more == log.tail:
            return  # the very bytes judged an uncommitted tail last time: the same judgement (a pure function)
        base = log.end
        recs, end = scan(more, 0, log.path, line=log.line, base=base, last=log.last)
        if recs:
            log.starts.append(base)
            log.chunks.append(more[:end])
            self._add(log, [StepRecord(r.offset + base, r.end + base, r.tx,
                                       tuple((o, a + base, n) for o, a, n in r.objects)) for r in recs])
        log.end = base + end
        log.size = size
        log.tail = more[end:]

    def _add(self, log: _Log, recs: list[StepRecord]) -> None:
        log.records.extend(recs)
        for r in recs:
            for oid, at, n in r.objects:
                self._index[oid] = (log, at, n)
                log.ids.add(oid)

    def _pin(self, log: _Log) -> None:
        """Keep ``log``'s file open (the last :data:`PINS` logs this process appended to), under ``_mu``."""
        if log.pin is not None:
            return
        try:
            f = self.io.open_read(log.path)
            st = self.io.fstat(f)
        except OSError:
            return  # a pin only saves time
        if (st.st_dev, st.st_ino) != log.ident:
            f.close()
            return
        log.pin = f
        self._pins.append(log)
        if len(self._pins) > PINS:
            self._unpin(self._pins[0])

    def _unpin(self, log: _Log) -> None:
        if log.pin is not None:
            log.pin.close()
            log.pin = None
            self._pins.remove(log)

    def _forget(self, log: _Log) -> None:
        self._unpin(log)
        self._logs.pop(log.path, None)
        lost = {oid for r in log.records for oid, _, _ in r.objects if self._index.get(oid, (None,))[0] is log}
        for oid in lost:
            del self._index[oid]
        # An object another log holds too (a fork's carried copy, §6.8 writing step 2) stays found there.
        for other in [o for o in self._logs.values() if lost and not lost.isdisjoint(o.ids)]:
            for r in other.records:
                for oid, at, n in r.objects:
                    if oid in lost:
                        self._index.setdefault(oid, (other, at, n))

    def scan_all(self) -> None:
        """Read every step log of the state dir (new ones, and what the known ones have grown by)."""
        io = self.io
        top = os.path.join(self.root, "steps")
        try:
            namespaces = io.listdir(top)
        except (FileNotFoundError, NotADirectoryError):
            return
        for ns in sorted(namespaces):
            d = os.path.join(top, ns)
            try:
                names = io.listdir(d)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for gid in sorted(names):
                if gid.startswith("tmp_"):
                    continue
                try:
                    self.load(f"{ns}/{gid}")
                except (CorruptSteps, ValueError):
                    # fsck names it; its records that check still hold objects other groups may
                    # name (a fork's shared history): those are served, read-only (§18.1).
                    self._salvage(f"{ns}/{gid}")

    def _salvage(self, group: str) -> None:
        """Index the objects of the records of ``group``'s damaged log that check (never its state)."""
        path = self.path(group)
        try:
            st = self.io.stat(path)
        except OSError:
            return
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        with self._mu:
            if self._salvaged.get(path, (None,))[0] == key:
                return
        if self.salvager is None:
            return
        try:
            sal = self.salvager(self.io, path, group)
        except (KxenError, ValueError, OSError):
            return
        if sal is None or not sal.records:
            return
        log = _Log(path, (0, 0), group, sal.gen or 0, 0, len(sal.data), len(sal.data), [0], [sal.data], [])
        with self._mu:
            self._salvaged[path] = (key, log)
            for r in sal.records:
                for oid, at, n in r.objects:
                    self._index.setdefault(oid, (log, at, n))

    # ---------------------------------------------------------------- objects

    def read_raw(self, oid: ObjectId) -> RawObject | None:
        with self._mu:
            hit = self._index.get(oid)
        if hit is None:
            return None
        log, at, n = hit
        where = f"{log.path} at offset {at}"
        return parse_object(decompress_loose(log.slice(at, n), where), where, expect_id=oid)

    def read_frame(self, log: _Log, oid: ObjectId, at: int, n: int) -> RawObject:
        """The object whose frame lies at ``at`` in ``log`` (fsck reads every copy, not only the indexed one)."""
        where = f"{log.path} at offset {at}"
        return parse_object(decompress_loose(log.slice(at, n), where), where, expect_id=oid)

    def make_durable(self, oid: ObjectId, but: _Log | None = None) -> None:
        """Before a ref or a new object names ``oid``: if a log other than ``but`` holds it, make that log durable.

        The record holding it was committed by its append, but its writer
        may have died before the append's fsync (or before the fsync of
        the directory naming a new log): a ref of another group must not
        outlive it (§9.3, as rule 4 for loose objects). Once per log and
        length per process: the log's file, and its directory once.
        """
        log = self.unsynced(oid, but)
        if log is None:
            return
        key = (log.path, log.ident, log.gen)
        try:
            st = self.io.stat(log.path)
        except FileNotFoundError:
            return  # removed with its group (gc) or moved to lost-found/ (repair): its objects were copied
        if (st.st_dev, st.st_ino) != log.ident:
            return  # replaced by a checkpoint: its objects are in a committed pack now
        self.io.fsync_path(log.path)
        self._synced[key] = st.st_size
        if key not in self._durable:
            self.io.fsync_dir(os.path.dirname(log.path))
            self._durable.add(key)

    def unsynced(self, oid: ObjectId, but: _Log | None = None) -> _Log | None:
        """The log other than ``but`` holding ``oid`` in a record no fsync of this instance covers, if one does.

        What :meth:`make_durable` would fsync, or a writer carry instead (§9.3 rule 12).
        """
        hit = self._index.get(oid)
        if hit is None or hit[0] is but or hit[0].ident == (0, 0):
            return None  # (0, 0): a damaged log's record (served read-only, §18.1), committed long before the damage
        log, at, _ = hit
        return None if self._synced.get((log.path, log.ident, log.gen), -1) > at else log

    def record_counts(self) -> dict[str, int]:
        """The committed records of each log this instance has read, by group: what automatic packing's
        checkpoint policy bounds (:mod:`.autopack`), asked between turns, so read from memory only."""
        with self._mu:
            return {log.group: len(log.records) for log in self._logs.values()}

    def has(self, oid: ObjectId) -> bool:
        return oid in self._index

    def where(self, oid: ObjectId) -> _Log | None:
        hit = self._index.get(oid)
        return None if hit is None else hit[0]

    def iter_ids(self) -> Iterator[ObjectId]:
        with self._mu:
            ids = list(self._index)
        return iter(ids)

    def with_prefix(self, hexprefix: str) -> list[ObjectId]:
        with self._mu:
            return [o for o in self._index if o.hex().startswith(hexprefix)]

    # ---------------------------------------------------------------- writing

    def append(self, group: str, gen: int, log: _Log | None, tx: StepTx, objects: list[RawObject]) -> _Log:
        """Commit one record to ``group``'s log of generation ``gen`` (the caller holds the group's lock).

        ``log``: the log as read under the lock (None: no file, or one of
        another generation, which this replaces). One fsync when the file
        exists, is of this generation and version, and this instance has
        made its name durable before; a new file costs its directory's
        fsync too. A version-1 log of this generation is upgraded here: a
        new version-2 log holding its committed records (re-framed, bodies
        unchanged) and this one, by durable replace (§6.8.1).
        """
        io = self.io
        path = self.path(group)
        d = os.path.dirname(path)
        frames = [(o.id, compress_loose(o.raw)) for o in objects]
        self.written += len(frames)
        body = encode_body(tx, frames)
        with self._mu:
            if log is None or log.gen != gen or log.version != VERSION:
                # A new log (the group's first step, the first after a
                # checkpoint that did not get to make its new file, or the
                # upgrade of a version-1 log): made whole under a temp name,
                # then renamed over whatever is there — a stale generation,
                # which holds nothing of the group's, or the same records.
                keep: list[bytes] = []
                if log is not None and log.gen == gen:
                    keep = [log.slice(r.offset + _PREFIX, r.end - _SUM - r.offset - _PREFIX) for r in log.records]
                stale = log if log is not None else self._logs.get(path)
                if stale is not None:
                    self._forget(stale)
                header = encode_header(group, gen)
                parts = [header]
                at = len(header)
                for b in keep + [body]:
                    parts.append(frame_body(b, at, header))
                    at += _FRAME + len(b)
                data = b"".join(parts)
                io.rename_into_place(io.write_tmp(d, data), path)
                io.fsync_dir(d)
                st = io.stat(path)
                self._durable.add((path, (st.st_dev, st.st_ino), gen))
                log = _Log(path, (st.st_dev, st.st_ino), group, gen, len(header), len(header), len(header),
                           [0], [header], [])
                self._logs[path] = log
                self._extend(log, data[len(header):], len(data))
                self._synced[(path, log.ident, gen)] = len(data)  # fsynced before its rename
                self._pin(log)
                return log
            if log.size > log.end:
                io.truncate(path, log.end)  # an uncommitted tail: cut it (fsynced)
                log.size = log.end
                log.tail = b""
            if (path, log.ident, log.gen) not in self._durable:
                # Found, not made here (this very file: a checkpoint
                # elsewhere may have replaced it and died before its
                # directory fsync): its name may not be durable (§9.3 rule 4).
                io.fsync_dir(d)
                self._durable.add((path, log.ident, log.gen))
            rec = frame_body(body, log.end, log.line)
            try:
                size = io.append(path, rec)
            except OSError:
                # A short write leaves a torn record: readers ignore it and
                # the next writer cuts it. Try to cut it now all the same.
                try:
                    io.truncate(path, log.end)
                except OSError:
                    pass
                raise
            if size != log.end + len(rec):
                raise CorruptSteps(f"step log {path} changed under its lock (size {size}, expected "
                                   f"{log.end + len(rec)}); run fsck")
            self._written(log, rec, tx, frames, size)
            return log

    def _written(self, log: _Log, rec: bytes, tx: StepTx, frames: list[tuple[ObjectId, bytes]], size: int) -> None:
        """Index the record ``rec`` just appended at ``log.end`` from what was written, not by reading it back.

        What :meth:`_extend` would find: the record's transaction is ``tx``
        (its body encodes ``tx`` canonically, and decoding gives ``tx`` back)
        and its frames lie where :func:`encode_body` put them.
        """
        base = log.end
        at = base + _HEAD + 4 + int.from_bytes(rec[_HEAD:_HEAD + 4], "big")
        objs = []
        for oid, frame in frames:
            objs.append((oid, at + 36, len(frame)))
            at += 36 + len(frame)
        log.starts.append(base)
        log.chunks.append(rec)
        self._add(log, [StepRecord(base, base + len(rec), tx, tuple(objs))])
        log.end = base + len(rec)
        log.size = size
        log.tail = b""
        self._synced[(log.path, log.ident, log.gen)] = size  # the append fsynced the whole file
        self._pin(log)

    def start_generation(self, group: str, gen: int) -> None:
        """Replace ``group``'s log by an empty one of generation ``gen`` (a checkpoint's last step)."""
        io = self.io
        path = self.path(group)
        d = os.path.dirname(path)
        with self._mu:
            old = self._logs.get(path)
            io.rename_into_place(io.write_tmp(d, encode_header(group, gen)), path)
            io.fsync_dir(d)
            st = io.stat(path)
            self._durable.add((path, (st.st_dev, st.st_ino), gen))
            if old is not None:
                self._forget(old)

    def forget(self, group: str) -> None:
        """Drop what this instance has read of ``group``'s log (after its removal)."""
        with self._mu:
            old = self._logs.get(self.path(group))
            if old is not None:
                self._forget(old)

    def remove(self, group: str) -> None:
        path = self.path(group)
        with self._mu:
            old = self._logs.get(path)
            if old is not None:
                self._forget(old)
        try:
            self.io.unlink(path)
            self.io.fsync_dir(os.path.dirname(path))
        except FileNotFoundError:
            pass

    def groups(self, namespace: str | None = None) -> list[str]:
        """The groups that have a step log (of any generation)."""
        top = os.path.join(self.root, "steps")
        io = self.io
        try:
            nss = [namespace] if namespace else sorted(io.listdir(top))
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for ns in nss:
            try:
                names = io.listdir(os.path.join(top, ns))
            except (FileNotFoundError, NotADirectoryError):
                continue
            out += [f"{ns}/{g}" for g in sorted(names) if not g.startswith("tmp_")]
        return out
