"""The search index's bytes (``objects_spec.md`` §11a.2): one session's file parsed and encoded, the chain of
files a fork leans on, and the scan of the texts; nothing here opens a file or imports the store.

:mod:`.grep_index` keeps the files up to date from the objects (through the
store); :mod:`.grep_stamp` searches them without the store when its stamp
says the refs have not changed. Both search with :func:`scan`, so the hits,
their order and the checks made before a line is reported are one code.
Kept free of the store package on purpose: importing it costs a ``session
grep`` more than its search does (bench/grep.py).
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from bisect import bisect_right
from collections import namedtuple

#: typing's own value at run time: this module is on ``session grep``'s lean start, where importing typing (and
#: the ``re`` it imports) costs more than the modules themselves. Annotations are strings (``__future__``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Iterator, Mapping

__all__ = ["MAGIC", "NS", "ROLES", "BadIndex", "Damaged", "Hit", "IndexFile", "base_ok", "chain_id", "encode_index",
           "family_order", "merged", "parse_index", "scan"]

#: The file's first bytes (§11a.2). Version 1 (a digest of the whole text) is read as damage: written anew.
MAGIC = b"kxen-grep 2\n"
#: After the magic: the digest; entries, text bytes, base seq (-1: none), base session (NUL-padded), base id,
#: head id; the session's metadata the file was written with: its id, createdNs, parentId (NUL-padded).
_DIGEST = struct.Struct("<32s")
_HEAD = struct.Struct("<IQq48s32s32s32sq48s")
#: Where the header the digest covers begins, and where the text begins (after an LF).
_H0 = len(MAGIC) + _DIGEST.size
_T0 = _H0 + _HEAD.size + 1
#: One entry of the table: message id, date (ns), seq, CRC-32 of its text, role.
_REC = struct.Struct("<32sqIIB3x")
ROLES = ("user", "assistant", "tool", "compaction")
_ROLE = {r: i for i, r in enumerate(ROLES)}
#: The ref namespace of sessions (``kxen_agent.session.sessions.NS``), whose groups the index serves.
NS = "sessions"
_NO_ID = bytes(32)


class BadIndex(ValueError):
    """A search index file that does not parse (the reader writes it anew)."""


class IndexFile:
    """One session's search index, parsed: ``text`` and the entries' offsets into it."""

    __slots__ = ("ses", "base_ses", "base_seq", "base_id", "head_id", "meta_id", "created_ns", "parent", "buf", "t0",
                 "offsets", "table", "_view")

    def __init__(self, ses: str, base_ses: str | None, base_seq: int, base_id: bytes, head_id: bytes, meta_id: bytes,
                 created_ns: int, parent: str | None, buf: Any, t0: int, offsets: Any, table: Any) -> None:
        self.ses = ses
        self.base_ses = base_ses
        self.base_seq = base_seq  # -1: the file starts at seq 0
        self.base_id = base_id
        self.head_id = head_id
        self.meta_id = meta_id  # the session's metadata object this file was written with; its createdNs, parentId
        self.created_ns = created_ns
        self.parent = parent
        self.buf = buf  # the file's bytes (a read-only mapping): the text is buf[t0:t0 + offsets[-1]]
        self.t0 = t0
        self.offsets = offsets  # n + 1 offsets into the text (a view of the file's, or an array)
        self.table = table  # n records of _REC (a view of the file's bytes)
        self._view: Any = None  # memoryview of buf, made by the first check

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    @property
    def first_seq(self) -> int:
        return self.base_seq + 1

    def record(self, i: int) -> tuple[bytes, int, int, str]:
        """(message id, date ns, seq, role) of entry ``i``."""
        oid, date, seq, _crc, role = _REC.unpack_from(self.table, i * _REC.size)
        return oid, date, seq, ROLES[role] if role < len(ROLES) else "?"

    def check(self, i: int) -> None:
        """:class:`BadIndex` unless entry ``i``'s text is the one its checksum was made of."""
        crc = _REC.unpack_from(self.table, i * _REC.size)[3]
        if self._view is None:
            self._view = memoryview(self.buf)  # slices of it are not copies
        if zlib.crc32(self._view[self.t0 + self.offsets[i]:self.t0 + self.offsets[i + 1]]) != crc:
            raise BadIndex(f"entry {i} (seq {self.first_seq + i}) does not match its checksum")

    def id_at_seq(self, seq: int) -> bytes | None:
        i = seq - self.first_seq
        if 0 <= i < self.count:
            return bytes(self.table[i * _REC.size:i * _REC.size + 32])
        return None

    def entries(self) -> Iterator[tuple[bytes, int, int, str, bytes]]:
        """Every entry with its text, each checked (:class:`BadIndex` at the first that fails)."""
        t0 = self.t0
        for i in range(self.count):
            self.check(i)
            yield (*self.record(i), bytes(self.buf[t0 + self.offsets[i]:t0 + self.offsets[i + 1]]))


def blake3_digest(data: Iterable[Any]) -> bytes:
    """BLAKE3-256 of the pieces of ``data``, in order."""
    import blake3

    h = blake3.blake3()
    for d in data:
        h.update(d)
    return h.digest()


def encode_index(entries: list[tuple[bytes, int, int, str, bytes]], *, base_ses: str | None, base_seq: int,
                 base_id: bytes | None, head_id: bytes | None, meta_id: bytes | None = None, created_ns: int = 0,
                 parent: str | None = None) -> bytes:
    """The file's bytes for ``entries`` (message id, date ns, seq, role, text with its final newline);
    ``meta_id``, ``created_ns``, ``parent``: the session's metadata object and what a search takes of it."""
    text = b"".join(e[4] for e in entries)
    offs = array("Q", [0])
    pos = 0
    for e in entries:
        pos += len(e[4])
        offs.append(pos)
    if sys.byteorder != "little":  # pragma: no cover - the format is little-endian
        offs.byteswap()
    table = b"".join(_REC.pack(e[0], e[1], e[2], zlib.crc32(e[4]), _ROLE.get(e[3], 255)) for e in entries)
    # An LF before the text: a line-anchored pattern (``^``) matches at the first entry's first line too.
    head = _HEAD.pack(len(entries), len(text), base_seq, (base_ses or "").encode("ascii"), base_id or _NO_ID,
                      head_id or _NO_ID, meta_id or _NO_ID, created_ns, (parent or "").encode("ascii")) + b"\n"
    body = (offs.tobytes(), table)
    return MAGIC + blake3_digest((head, *body)) + head + text + b"".join(body)


def parse_index(ses: str, data: Any) -> IndexFile:
    """The parsed file; :class:`BadIndex` if it is not one, or its digest does not match (the entries'
    checksums are :meth:`IndexFile.check`'s)."""
    if len(data) < _T0 or data[:len(MAGIC)] != MAGIC:
        raise BadIndex("no search index header")
    (digest,) = _DIGEST.unpack_from(data, len(MAGIC))
    n, tlen, base_seq, bses, base_id, head_id, meta_id, created_ns, parent = _HEAD.unpack_from(data, _H0)
    start = _T0
    if len(data) != start + tlen + 8 * (n + 1) + _REC.size * n or data[start - 1:start] != b"\n":
        raise BadIndex("length does not match the header")
    view = memoryview(data)
    offs, table = view[start + tlen:start + tlen + 8 * (n + 1)], view[start + tlen + 8 * (n + 1):]
    if blake3_digest((view[_H0:start], offs, table)) != digest:
        raise BadIndex("digest does not match")
    if sys.byteorder == "little":
        offsets: Any = offs.cast("Q")  # in place in the mapping: no copy of 8 bytes an entry (nor of the table)
    else:  # pragma: no cover - the format is little-endian
        offsets = array("Q")
        offsets.frombytes(offs)
        offsets.byteswap()
    if offsets[0] != 0 or offsets[-1] != tlen:
        raise BadIndex("offsets do not span the text")
    name = bses.rstrip(b"\0").decode("ascii", "replace") or None
    up = parent.rstrip(b"\0").decode("ascii", "replace") or None
    # The text stays in ``data`` (a mapping of the file: no copy); find/rfind/regex work on it in place.
    return IndexFile(ses, name, base_seq, base_id, head_id, meta_id, created_ns, up, data, start, offsets, table)


def chain_id(loaded: Mapping[str, IndexFile], ses: str | None, seq: int) -> bytes | None:
    """The id of the message of ``seq`` in the history ``ses``'s chain of files (``loaded``) holds."""
    depth = 0
    while ses is not None and depth <= 10_000:
        f = loaded.get(ses)
        if f is None:
            return None
        if seq >= f.first_seq:
            return f.id_at_seq(seq)
        if f.base_ses is None or seq > f.base_seq:
            return None
        ses, depth = f.base_ses, depth + 1
    return None


def base_ok(loaded: Mapping[str, IndexFile], f: IndexFile) -> bool:
    """Whether ``f``'s base point is its base session's entry at that seq in ``loaded`` (or it has none)."""
    if f.base_ses is None:
        return f.base_seq == -1
    return chain_id(loaded, f.base_ses, f.base_seq) == f.base_id


def family_order(items: list[Any], *, ident: Callable[[Any], str], parent: Callable[[Any], str | None],
                 created: Callable[[Any], int]) -> list[Any]:
    """``items`` oldest first (``created``, then ``ident``), parents before their forks (a fork's file may start
    after its parent's)."""
    by_id = {ident(i): i for i in items}
    out: list[Any] = []
    seen: set[str] = set()

    def visit(i: Any, depth: int = 0) -> None:
        if ident(i) in seen:
            return
        seen.add(ident(i))
        p = by_id.get(parent(i))  # type: ignore[arg-type]
        if p is not None and depth < 10_000:
            visit(p, depth + 1)
        out.append(i)

    for i in sorted(items, key=lambda i: (created(i), ident(i))):
        visit(i)
    return out


# (collections.namedtuple, not typing.NamedTuple: see TYPE_CHECKING above)
Hit = namedtuple("Hit", "message sessions role date_ns seq line_no line")
Hit.__doc__ = """One matching line: the message (its id, bytes), the sessions whose history holds it (a tuple), its
role, date (ns, 0: none), ``seq``, line number (1-based, within the message's text) and the line (str)."""


class Damaged(Exception):
    """An entry of ``ses``'s file failed its checksum during a scan."""

    def __init__(self, ses: str) -> None:
        super().__init__(ses)
        self.ses = ses


def scan(files: dict[str, IndexFile], match: Callable[[Any, int, int], int], *, only: set[str] | None,
         roles: set[str] | None, since_ns: int | None, sessions_only: bool) -> tuple[list[Hit], int]:
    """The hits in ``files`` (in order: parents before forks; a message held by two files once, with the sessions
    of both: :func:`merged`) and the bytes of text searched; :class:`Damaged` for a file whose entry fails its
    checksum before a line of it is reported. ``match.literal`` (bytes), when ``match`` has it: the pattern is
    that literal, found with ``find`` itself (no call of ``match`` per line)."""
    # Which sessions each file serves, and up to which seq: its own (all), then each fork leaning on it.
    cover: dict[str, list[tuple[str, int]]] = {s: [] for s in files}
    for ses, f in files.items():
        if only is not None and ses not in only:
            continue
        cover[ses].append((ses, 1 << 62))
        limit, cur, depth = f.base_seq, f, 0
        while cur.base_ses is not None and cur.base_ses in files and depth < 10_000:
            cover[cur.base_ses].append((ses, limit))
            cur = files[cur.base_ses]
            limit, depth = min(limit, cur.base_seq), depth + 1
    hits: list[Hit] = []
    add = hits.append
    new = tuple.__new__  # a Hit without its Python-level __new__: tens of thousands for a common word
    total = 0
    unpack, size = _REC.unpack_from, _REC.size
    nroles = len(ROLES)
    crc32 = zlib.crc32
    lit = getattr(match, "literal", None)
    held: dict[bytes, str] = {}  # message -> the file that reported it first: two files hold it only rarely
    twice = False
    for ses, f in files.items():
        served = cover[ses]
        if not served:
            continue
        every, below = tuple(s for s, _lim in served), min(lim for _s, lim in served)
        unseen = set(every)
        buf, t0, offsets, table = f.buf, f.t0, f.offsets, f.table
        view = memoryview(buf)  # slices of it are not copies (an entry's checksum)
        find, rfind = buf.find, buf.rfind
        t1 = t0 + offsets[-1]
        total += t1 - t0
        # The entry of the last match, and what is known of it: its end, whether its lines are reported (its
        # role, date and sessions pass the filters), its fields, whether its checksum was checked, and the line
        # counted last (matches come in file order: a line number counts only the text since that line).
        cur, cur_end, report, checked = -1, t0, False, False
        oid, date, seq, crc, role, owners = b"", 0, 0, 0, "", every
        counted_at, counted_no = t0, 1
        pos = t0
        # One match per line: after a matching line, the search resumes at the next line.
        while pos < t1:
            start = find(lit, pos, t1) if lit is not None else match(buf, pos, t1)
            if not 0 <= start < t1:
                break  # none (an empty match at the text's very end, after its last LF, is on no line)
            ls = rfind(b"\n", pos, start) + 1 or pos
            le = find(b"\n", start, t1)  # every text ends with an LF (unless damaged: its check says so)
            if le < 0:
                le = t1
            pos = le + 1
            if ls >= cur_end:  # another entry
                cur = bisect_right(offsets, ls - t0, cur + 1) - 1
                counted_at, cur_end = t0 + offsets[cur], t0 + offsets[cur + 1]
                counted_no, checked = 1, False
                oid, date, seq, crc, role_no = unpack(table, cur * size)
                role = ROLES[role_no] if role_no < nroles else "?"
                owners = every if seq <= below else tuple(s for s, lim in served if seq <= lim)
                report = bool(owners) and (roles is None or role in roles) and (since_ns is None or date >= since_ns)
            if not report or (sessions_only and unseen.isdisjoint(owners)):
                pos = max(pos, cur_end)  # no line of this entry is reported: on to the next
                continue
            if not checked:
                # Before a line of it is reported: a line that damage made is never shown (one that damage
                # hid is fsck's to find). The entry holds the whole line: its last byte is an LF, checked too.
                if crc32(view[t0 + offsets[cur]:cur_end]) != crc:
                    raise Damaged(ses)
                checked = True
                if held.setdefault(oid, ses) != ses:
                    twice = True
            if ls != counted_at:
                counted_no += buf[counted_at:ls].count(b"\n")
                counted_at = ls
            add(new(Hit, (oid, owners, role, date, seq, counted_no, buf[ls:le].decode("utf-8", "replace"))))
            if sessions_only:
                unseen.difference_update(owners)
                if not unseen:
                    break
    return (merged(hits) if twice else hits), total


def merged(hits: list[Hit]) -> list[Hit]:
    """A message held by two files (a fork whose parent's files could not serve it when its file was
    written, e.g. a parent deleted then) is still reported once, with all its sessions."""
    out: dict[tuple[bytes, int], Hit] = {}
    for h in hits:
        key = (h.message, h.line_no)
        prev = out.get(key)
        out[key] = h if prev is None else Hit(h.message, prev.sessions + tuple(
            s for s in h.sessions if s not in prev.sessions), h.role, h.date_ns, h.seq, h.line_no, h.line)
    return list(out.values())
