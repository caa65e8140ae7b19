"""The search index: every session's message texts in one file per session, so ``session grep`` reads a few
files instead of every message object.

A derived cache (``objects_spec.md`` §11a.2, kind :data:`GREP`,
``cache/grep/sessions/<ses>``): never needed — :func:`search` brings each
file up to date from the objects before it reads it, and a file that is
missing, damaged (its digest) or does not join the session's head is
written anew from the history. Never fsynced (temp file and rename).

What a file holds: the searchable text of each message of the session's
history from ``seq`` *base* + 1 to its head — the content, then one line
``<tool name> <arguments>`` per tool call — each followed by a newline,
with a table of entries (message id, role, date, ``seq``, a checksum of
the text). A fork's file starts after its fork point when its parent's
chain of files holds that point: the messages it shares with its parent
are held, and searched, once, in the parent's file, and a hit there is
reported with every session whose history holds it. The date of a message
is the start of the run that wrote it (a message holds no time, §14.4); 0
(shown ``-``) without one.
A file also holds what a search needs of its session's metadata object
(parent, creation time) and that object's id: while the id is the
session's ``meta`` ref, a search reads the session's refs and its file,
and no object (:class:`Listed`).

Trust: the digest (BLAKE3 of the header, the offsets and the table) is
checked on every read, and an entry's checksum (CRC-32 of its text) before
a line of it is reported or the entry kept: a search reads the whole text
but hashes only the entries it reports (hashing the whole text took about
as long as searching it, bench/README.md). A file whose entry fails its
checksum is written anew and searched again. Damage that hides a match is
not seen by a search, only by fsck, which checks every entry. A file's
last entry must be the session's head and its base point must be its base
session's entry at that ``seq``, so a file that describes other objects
is never used. That the texts are the objects' texts is the writer's care
and fsck's check (:func:`verify_grep`).

Every file call goes through the store's ``FileIO``.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from kxen_agent.errors import KxenError
from kxen_agent.store.caches import CacheKind, replace_cache_file

from .ids import UnknownSession

__all__ = ["GREP", "MAGIC", "Hit", "IndexFile", "Listed", "encode_index", "parse_index", "search", "verify_grep"]

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
NS = "sessions"


def _verify_store(store: Any) -> tuple[list[tuple[str, str]], list[str]]:
    return verify_grep(store)


#: The search index as a kind of derived cache (§11a.2): removed with its session, checked by fsck.
GREP = CacheKind("grep", verify=_verify_store, problem="grep-index", title="search index")


class BadIndex(ValueError):
    """A search index file that does not parse (the reader writes it anew)."""


@dataclass
class IndexFile:
    """One session's search index, parsed: ``text`` and the entries' offsets into it."""

    ses: str
    base_ses: str | None
    base_seq: int  # -1: the file starts at seq 0
    base_id: bytes
    head_id: bytes
    meta_id: bytes  # the session's metadata object this file was written with; then its createdNs and parentId
    created_ns: int
    parent: str | None
    buf: Any  # the file's bytes (a read-only mapping): the text is buf[t0:t0 + offsets[-1]]
    t0: int
    offsets: array  # n + 1 offsets into the text
    table: bytes  # n records of _REC
    _view: Any = None  # memoryview of buf, made by the first check

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
            return self.table[i * _REC.size:i * _REC.size + 32]
        return None

    def entries(self) -> Iterator[tuple[bytes, int, int, str, bytes]]:
        """Every entry with its text, each checked (:class:`BadIndex` at the first that fails)."""
        t0 = self.t0
        for i in range(self.count):
            self.check(i)
            yield (*self.record(i), bytes(self.buf[t0 + self.offsets[i]:t0 + self.offsets[i + 1]]))


def _blake3(data: Iterable[bytes]) -> bytes:
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
    head = _HEAD.pack(len(entries), len(text), base_seq, (base_ses or "").encode("ascii"), base_id or bytes(32),
                      head_id or bytes(32), meta_id or bytes(32), created_ns, (parent or "").encode("ascii")) + b"\n"
    body = (offs.tobytes(), table)
    return MAGIC + _blake3((head, *body)) + head + text + b"".join(body)


def parse_index(ses: str, data: bytes) -> IndexFile:
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
    if _blake3((view[_H0:start], offs, table)) != digest:
        raise BadIndex("digest does not match")
    offsets = array("Q")
    offsets.frombytes(offs)
    if sys.byteorder != "little":  # pragma: no cover
        offsets.byteswap()
    if offsets[0] != 0 or offsets[-1] != tlen:
        raise BadIndex("offsets do not span the text")
    name = bses.rstrip(b"\0").decode("ascii", "replace") or None
    up = parent.rstrip(b"\0").decode("ascii", "replace") or None
    # The text stays in ``data`` (a mapping of the file: no copy); find/rfind/regex work on it in place.
    return IndexFile(ses, name, base_seq, base_id, head_id, meta_id, created_ns, up, data, start, offsets,
                     bytes(table))


def _text_of(m: Any) -> bytes:
    parts = [m.content or ""]
    for c in m.tool_calls or ():
        parts.append(f"{c.get('name')} {c.get('arguments')}")
    text = "\n".join(p for p in parts if p) if any(parts) else ""
    return text.encode("utf-8", "surrogatepass") + b"\n"


class Listed(NamedTuple):
    """A session as a search needs it: its id, head, metadata object and, of that, ``parentId`` and
    ``createdNs`` (in ``meta``: taken from its index file when it names that object, else read whole)."""

    id: str
    head: bytes | None
    meta_oid: bytes
    meta: dict
    whole: bool  # ``meta`` is the metadata object read, not the two fields an index file holds

    @property
    def group(self) -> str:
        return f"{NS}/{self.id}"


@dataclass
class _Builder:
    """Writes and reads the index files of one state dir (the disk store's ``io`` and caches)."""

    store: Any  # the disk Store (a Repository with caches and io)
    runs: dict[str, int] | None = None
    written: int = 0
    loaded: dict[str, IndexFile | None] = field(default_factory=dict)
    parsed: dict[str, IndexFile | None] = field(default_factory=dict)  # each file read once
    _sessions: Any = None

    @property
    def sessions(self) -> Any:
        """The SessionStore, made when a search must read objects (imported then: the lean start's cost)."""
        if self._sessions is None:
            from .sessions import SessionStore

            self._sessions = SessionStore(self.store)
        return self._sessions

    def listing(self, on_damaged: Callable[[str, KxenError], None]) -> list[Listed]:
        """Every session not deleted, as ``SessionStore.list`` finds them (a group that does not read as a
        session to ``on_damaged``), but a session's metadata object is read only when its index file does
        not name the one its ``meta`` ref does: then the file holds what a search takes of it."""
        out = []
        for group in self.store.refs.groups(NS):
            ses = group.split("/", 1)[1]
            f = self.read(ses)
            if f is not None:
                try:
                    state = self.store.refs.read(group)
                except KxenError as e:
                    on_damaged(group, e)  # what SessionStore.get raises for it
                    continue
                if state.refs.get("meta") == f.meta_id:
                    if state.deleted_ns is None:
                        meta = {"parentId": f.parent, "createdNs": f.created_ns}
                        out.append(Listed(ses, state.refs.get("head"), f.meta_id, meta, False))
                    continue
            try:
                info = self.sessions.get(ses)
            except UnknownSession:
                continue  # no metadata, or deleted: passed over, as SessionStore.list does
            except KxenError as e:
                on_damaged(group, e)
                continue
            out.append(Listed(ses, info.head, info.meta_oid, info.meta, True))
        out.sort(key=lambda i: (i.meta["createdNs"], i.id))
        return out

    def path(self, ses: str) -> str:
        return self.store.caches.path(GREP, f"{NS}/{ses}")

    def run_dates(self) -> dict[str, int]:
        # Every run of every session: a history's messages may come from its ancestors' runs.
        if self.runs is None:
            from .schema import read

            self.runs = {}
            for info in self.sessions.list(include_deleted=True, on_damaged=lambda g, e: None):
                for run, oid in info.runs.items():
                    try:
                        self.runs[run] = read(self.store, oid, "run").get("startedNs", 0) or 0
                    except KxenError:
                        continue
        return self.runs

    def read(self, ses: str) -> IndexFile | None:
        if ses not in self.parsed:
            try:
                self.parsed[ses] = parse_index(ses, self.store.io.map_file(self.path(ses)))
            except (OSError, BadIndex, KxenError):  # KxenError: not a group's name (a session's get says so)
                self.parsed[ses] = None
        return self.parsed[ses]

    def chain_id(self, ses: str | None, seq: int, depth: int = 0) -> bytes | None:
        """The id of the message of ``seq`` in the history ``ses``'s chain of files holds."""
        f = self.loaded.get(ses) if ses is not None else None
        if f is None or depth > 10_000:
            return None
        if seq >= f.first_seq:
            return f.id_at_seq(seq)
        if f.base_ses is not None and seq <= f.base_seq:
            return self.chain_id(f.base_ses, seq, depth + 1)
        return None

    def ensure(self, info: Any, *, anew: bool = False) -> IndexFile:
        """``info``'s file, brought up to date with its head (its base session's must be loaded first);
        ``anew``: written from the history whatever the file holds (an entry failed its checksum)."""
        f = None if anew else self.read(info.id)
        head = info.head
        if f is not None and f.head_id == (head or bytes(32)) and self._base_ok(f) and f.meta_id == info.meta_oid:
            self.loaded[info.id] = f
            return f
        if not info.whole:
            info = self._whole(info)
        # Join: the file's last entry an ancestor of the head (a run added messages): keep its entries.
        keep: list = []
        base = (f.base_ses, f.base_seq, f.base_id) if f is not None and self._base_ok(f) else None
        new: list = []
        cur = head
        stop_seq = f.first_seq + f.count - 1 if base is not None and f is not None else None
        joined = False
        while cur is not None and stop_seq is not None:
            m = self.sessions.read_message(cur)
            if stop_seq is not None and m.seq == stop_seq:
                joined = f is not None and m.oid == f.head_id
                break
            if stop_seq is not None and m.seq < stop_seq:
                break
            new.append(m)
            cur = m.parent
        if joined and f is not None:
            try:
                keep = list(f.entries())
            except BadIndex:
                joined = False  # an entry's text is damaged: the whole history after all
        if not joined:
            base, new = self._fresh_base(info), []
            cur = head
            while cur is not None:
                m = self.sessions.read_message(cur)
                if base is not None and m.seq == base[1]:
                    if m.oid != base[2]:
                        base, cur = None, head  # not the fork point: the whole history after all
                        new = []
                        continue
                    break
                new.append(m)
                cur = m.parent
        dates = self.run_dates()
        entries = keep + [(m.oid, dates.get(m.run or "", 0), m.seq, m.role, _text_of(m)) for m in reversed(new)]
        data = encode_index(entries, base_ses=base[0] if base else None, base_seq=base[1] if base else -1,
                            base_id=base[2] if base else None, head_id=head, meta_id=info.meta_oid,
                            created_ns=info.meta["createdNs"], parent=info.meta.get("parentId"))
        self._write(info.id, data)
        f = parse_index(info.id, data)
        self.loaded[info.id] = f
        return f

    def _whole(self, info: Listed) -> Listed:
        """``info`` with its metadata object read (a file to write needs its fork point)."""
        whole = self.sessions.get(info.id)
        return Listed(info.id, info.head, whole.meta_oid, whole.meta, True)

    def _base_ok(self, f: IndexFile) -> bool:
        if f.base_ses is None:
            return f.base_seq == -1
        return self.chain_id(f.base_ses, f.base_seq) == f.base_id

    def _fresh_base(self, info: Any) -> tuple[str, int, bytes] | None:
        """(parent, fork point's seq, its id) when the parent's chain of files holds the fork point."""
        parent, point = info.meta.get("parentId"), info.meta.get("forkPoint")
        if parent is None or point is None or parent not in self.loaded:
            return None
        oid = bytes.fromhex(point[4:])
        try:
            seq = self.sessions.read_message(oid).seq
        except KxenError:
            return None
        return (parent, seq, oid) if self.chain_id(parent, seq) == oid else None

    def _write(self, ses: str, data: bytes) -> None:
        io = self.store.io
        path = self.path(ses)
        try:
            replace_cache_file(io, path, data)  # no fsync: a cache (§11a)
            self.written += 1
        except OSError:
            pass  # unwritable: searched from memory this time, written by the next search


class Hit(NamedTuple):
    """One matching line: the message, the sessions whose history holds it, its role, date and line."""

    message: bytes
    sessions: tuple[str, ...]
    role: str
    date_ns: int
    seq: int
    line_no: int  # 1-based, within the message's text
    line: str


def _family_order(infos: list[Any]) -> list[Any]:
    """Parents before their forks (a fork's file may start after its parent's)."""
    by_id = {i.id: i for i in infos}
    out: list[Any] = []
    seen: set[str] = set()

    def visit(i: Any, depth: int = 0) -> None:
        if i.id in seen:
            return
        seen.add(i.id)
        p = by_id.get(i.meta.get("parentId"))
        if p is not None and depth < 10_000:
            visit(p, depth + 1)
        out.append(i)

    for i in sorted(infos, key=lambda i: (i.meta["createdNs"], i.id)):
        visit(i)
    return out


def search(store: Any, match: Callable[[Any, int, int], int], *, only: set[str] | None = None,
           roles: set[str] | None = None, since_ns: int | None = None, sessions_only: bool = False,
           on_damaged: Callable[[str, KxenError], None] | None = None) -> tuple[list[Hit], dict[str, int]]:
    """Every line of every session's messages that ``match`` finds, each message once with its sessions.

    ``match(buf, pos, end)``: where the first match in ``buf[pos:end]`` begins (an offset into ``buf``), or
    -1; called from the start of the text and then from the line after each matching line;
    ``only``: session ids to search (a message shared with others is
    reported with these only). ``sessions_only``: a file is left as soon as
    every session it serves has a hit (``-l``: the hits are then the first
    of each). Returns the hits, oldest session's first, and
    figures (``files``, ``written``, ``bytes``). ``store``: the disk Store
    (its caches); a warm search reads each session's refs and index file,
    and no object.
    """
    b = _Builder(store)
    infos = _family_order(b.listing(on_damaged or (lambda g, e: None)))
    if only is not None:
        # A fork's file may lean on its ancestors': load the chain, search only what ``only`` holds.
        by_id = {i.id: i for i in infos}
        need: set[str] = set()
        for ses in only:
            cur, depth = by_id.get(ses), 0
            while cur is not None and cur.id not in need and depth < 10_000:
                need.add(cur.id)
                cur, depth = by_id.get(cur.meta.get("parentId")), depth + 1
        infos = [i for i in infos if i.id in need]
    files: dict[str, IndexFile] = {}
    for info in infos:
        try:
            files[info.id] = b.ensure(info)
        except KxenError as e:
            if on_damaged is not None:
                on_damaged(info.group, e)
    by_id = {i.id: i for i in infos}
    for _round in range(len(files) + 1):
        try:
            hits, total = _scan(files, match, only=only, roles=roles, since_ns=since_ns, sessions_only=sessions_only)
            break
        except _Damaged as e:
            # An entry failed its checksum: its file written anew from the history, and every file searched
            # again (a fork's file may lean on it). A file so written holds what it was made of: no second round.
            files[e.ses] = b.ensure(by_id[e.ses], anew=True)
    else:  # pragma: no cover - each round writes another file anew
        raise KxenError("the search index keeps failing its checksums; `kxen-agent fsck` checks the state dir")
    return _merged(hits), {"files": len(files), "written": b.written, "bytes": total}


class _Damaged(Exception):
    """An entry of ``ses``'s file failed its checksum during a scan."""

    def __init__(self, ses: str) -> None:
        super().__init__(ses)
        self.ses = ses


def _scan(files: dict[str, IndexFile], match: Callable[[Any, int, int], int], *, only: set[str] | None,
          roles: set[str] | None, since_ns: int | None, sessions_only: bool) -> tuple[list[Hit], int]:
    """The hits in ``files`` (a message held by two files once from each) and the bytes of text searched."""
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
    total = 0
    unpack, size = _REC.unpack_from, _REC.size
    for ses, f in files.items():
        served = cover[ses]
        if not served:
            continue
        every, below = tuple(s for s, _lim in served), min(lim for _s, lim in served)
        unseen = set(every)
        buf, t0, offsets, table = f.buf, f.t0, f.offsets, f.table
        t1 = t0 + offsets[-1]
        total += t1 - t0
        checked = -1  # the entry whose checksum was checked last (matches come in file order)
        pos = t0
        # One match per line: after a matching line, the search resumes at the next line.
        while pos < t1 and (start := match(buf, pos, t1)) >= 0:
            ls = buf.rfind(b"\n", pos, start) + 1 or pos
            le = buf.find(b"\n", start, t1)  # every text ends with an LF (unless damaged: its check says so)
            if le < 0:
                le = t1
            pos = le + 1
            i = bisect_right(offsets, ls - t0) - 1
            oid, date, seq, _crc, role_no = unpack(table, i * size)
            role = ROLES[role_no] if role_no < len(ROLES) else "?"
            if roles is not None and role not in roles:
                continue
            if since_ns is not None and date < since_ns:
                continue
            owners = every if seq <= below else tuple(s for s, lim in served if seq <= lim)
            if not owners:
                continue
            if sessions_only and unseen.isdisjoint(owners):
                continue
            if i != checked:
                # Before a line of it is reported: a line that damage made is never shown (one that damage
                # hid is fsck's to find). The entry holds the whole line: its last byte is an LF, checked too.
                try:
                    f.check(i)
                except BadIndex:
                    raise _Damaged(ses) from None
                checked = i
            e0 = t0 + offsets[i]
            line_no = 1 if ls == e0 else bytes(buf[e0:ls]).count(b"\n") + 1
            hits.append(Hit(oid, owners, role, date, seq, line_no, bytes(buf[ls:le]).decode("utf-8", "replace")))
            if sessions_only:
                unseen.difference_update(owners)
                if not unseen:
                    break
    return hits, total


def _merged(hits: list[Hit]) -> list[Hit]:
    """A message held by two files (a fork whose parent's files could not serve it when its file was
    written, e.g. a parent deleted then) is still reported once, with all its sessions."""
    merged: dict[tuple[bytes, int], Hit] = {}
    for h in hits:
        key = (h.message, h.line_no)
        prev = merged.get(key)
        merged[key] = h if prev is None else Hit(h.message, prev.sessions + tuple(
            s for s in h.sessions if s not in prev.sessions), h.role, h.date_ns, h.seq, h.line_no, h.line)
    return list(merged.values())


def verify_grep(store: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """fsck's check (§11a.2): each file's digest, every entry's checksum, and its text, role and seq against its
    message.

    A file that does not parse is a problem ``grep-index`` (delete it; the
    next search writes it again); so is an entry whose message says
    otherwise, or a head or base that is not the session's. A file for a
    session whose head moved on since is information (the next search
    brings it up to date), as is an entry naming a message gc pruned.
    """
    from .schema import read
    from .sessions import SessionStore

    problems: list[tuple[str, str]] = []
    notes: list[str] = []
    sessions = SessionStore(store)
    caches = getattr(store, "caches", None)
    if caches is None:
        return problems, notes
    for path in caches.files(GREP, NS):
        ses = os.path.basename(path)
        try:
            f = parse_index(ses, store.io.read(path))
        except BadIndex as e:
            problems.append((path, f"search index does not parse ({e}); delete it: the next search writes it again"))
            continue
        except OSError as e:
            problems.append((path, f"cannot read the search index: {e.strerror}"))
            continue
        try:
            refs = store.refs.read(f"{NS}/{ses}").refs
        except KxenError:
            refs = {}
        if refs.get("head") != (f.head_id if f.head_id != bytes(32) else None):
            notes.append(f"search index {path} is behind its session's head (the next search brings it up to date)")
        if refs.get("meta") != f.meta_id:
            notes.append(f"search index {path} was written with older metadata of its session (the next search "
                         "writes it again)")
        try:
            meta = read(store, f.meta_id, "session")
        except KxenError:
            notes.append(f"search index {path} names metadata {f.meta_id.hex()[:16]}, which is not here (pruned?)")
        else:
            if meta.get("createdNs") != f.created_ns or meta.get("parentId") != f.parent:
                problems.append((path, f"search index's parent or creation time is not its metadata "
                                       f"{f.meta_id.hex()[:16]}'s; delete it: the next search writes it again"))
        prev_seq = f.base_seq
        try:
            for oid, _date, seq, role, text in f.entries():  # each entry's checksum checked first
                try:
                    m = sessions.read_message(oid)
                except KxenError:
                    notes.append(f"search index {path} names message {oid.hex()[:16]}, which is not here (pruned?)")
                    break
                if m.seq != seq or m.seq != prev_seq + 1 or m.role != role or _text_of(m) != text:
                    problems.append((path, f"search index entry for msg_{oid.hex()} (seq {seq}) does not match the "
                                           "message; delete the file: the next search writes it again"))
                    break
                prev_seq = seq
        except BadIndex as e:
            problems.append((path, f"search index {e}; delete it: the next search writes it again"))
    return problems, notes
