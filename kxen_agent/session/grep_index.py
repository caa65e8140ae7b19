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

The bytes of a file, the chain of files and the scan are
:mod:`.grep_format`'s (no store in it). Each search that reads the refs
also writes the stamp (:mod:`.grep_stamp`, ``cache/grep/stamp``): the
stats of every session's ref file and step log, taken before they were
read, and what the refs said; while those stats hold, a search reads no
ref (``session grep``'s lean start). Every file call here goes through
the store's ``FileIO``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from kxen_agent.errors import KxenError
from kxen_agent.store.caches import CacheKind, replace_cache_file

from .grep_format import (MAGIC, NS, ROLES, BadIndex, Damaged, Hit, IndexFile, base_ok, chain_id, encode_index,
                          family_order, parse_index, scan)
from .grep_stamp import (ABSENT, BadStamp, FileStat, GroupStamp, Stamp, encode_stamp, file_stat, group_paths,
                         parse_stamp, stamp_path, top_paths)
from .ids import UnknownSession

__all__ = ["GREP", "MAGIC", "NS", "ROLES", "Hit", "IndexFile", "Listed", "encode_index", "parse_index", "search",
           "verify_grep"]


def _verify_store(store: Any) -> tuple[list[tuple[str, str]], list[str]]:
    return verify_grep(store)


#: The search index as a kind of derived cache (§11a.2): removed with its session, checked by fsck.
GREP = CacheKind("grep", verify=_verify_store, problem="grep-index", title="search index", files=("stamp",))


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
    stamped: bool = False
    loaded: dict[str, IndexFile] = field(default_factory=dict)
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

    def ensure(self, info: Any, *, anew: bool = False) -> IndexFile:
        """``info``'s file, brought up to date with its head (its base session's must be loaded first);
        ``anew``: written from the history whatever the file holds (an entry failed its checksum)."""
        f = None if anew else self.read(info.id)
        head = info.head
        if (f is not None and f.head_id == (head or bytes(32)) and base_ok(self.loaded, f)
                and f.meta_id == info.meta_oid):
            self.loaded[info.id] = f
            return f
        if not info.whole:
            info = self._whole(info)
        # Join: the file's last entry an ancestor of the head (a run added messages): keep its entries.
        keep: list = []
        base = (f.base_ses, f.base_seq, f.base_id) if f is not None and base_ok(self.loaded, f) else None
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
        return (parent, seq, oid) if chain_id(self.loaded, parent, seq) == oid else None

    def _write(self, ses: str, data: bytes) -> None:
        io = self.store.io
        path = self.path(ses)
        try:
            replace_cache_file(io, path, data)  # no fsync: a cache (§11a)
            self.written += 1
        except OSError:
            pass  # unwritable: searched from memory this time, written by the next search


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
    figures (``files``, ``written``, ``bytes``, ``stamped``: 1 if it wrote
    the stamp). ``store``: the disk Store (its caches); a warm search reads
    each session's refs and index file, and no object. The stamp's stats are
    taken before the refs are read (:class:`_StampTaker`).
    """
    b = _Builder(store)
    damaged: list[str] = []

    def note(group: str, e: KxenError) -> None:
        damaged.append(group)
        if on_damaged is not None:
            on_damaged(group, e)

    taker = _StampTaker.begin(store)  # before the refs are read: their stats as they were, or older
    try:
        listed = b.listing(note)
        infos = family_order(listed, ident=_ident, parent=_parent, created=_created)
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
                note(info.group, e)
        by_id = {i.id: i for i in infos}
        for _round in range(len(files) + 1):
            try:
                hits, total = scan(files, match, only=only, roles=roles, since_ns=since_ns,
                                   sessions_only=sessions_only)
                break
            except Damaged as e:
                # An entry failed its checksum: its file written anew from the history, and every file searched
                # again (a fork's file may lean on it). A file so written holds what it was made of: no second
                # round.
                files[e.ses] = b.ensure(by_id[e.ses], anew=True)
        else:  # pragma: no cover - each round writes another file anew
            raise KxenError("the search index keeps failing its checksums; `kxen-agent fsck` checks the state dir")
        if taker is not None and not damaged:
            b.stamped = taker.commit(listed)  # what the refs said, for a search that reads none (grep_stamp.py)
    finally:
        if taker is not None:
            taker.discard()
    return hits, {"files": len(files), "written": b.written, "bytes": total, "stamped": int(b.stamped)}


def _ident(i: Listed) -> str:
    return i.id


def _parent(i: Listed) -> str | None:
    return i.meta.get("parentId")


def _created(i: Listed) -> int:
    return i.meta["createdNs"]


class _StampTaker:
    """The stamp of one search (§11a.2, :mod:`.grep_stamp`), taken in the order that makes it safe: a temp file
    made first (its modification time is ``m0``, the clock before any stat), then the stats of the top files
    and of every name's ref file and step log, then (the search) the refs read; written only if the search
    met no damage and no file recorded changed in ``m0``'s tick."""

    def __init__(self, store: Any, tmp: str, stamp: Stamp) -> None:
        self.store, self.tmp, self.stamp = store, tmp, stamp

    @classmethod
    def begin(cls, store: Any) -> "_StampTaker | None":
        io, root = store.io, store.root
        path = stamp_path(root)
        tmp = None
        try:
            if not store.exists:
                return None
            io.makedirs(os.path.dirname(path))
            tmp = io.write_tmp(os.path.dirname(path), b"", sync=False)
            m0 = io.stat(tmp).st_mtime_ns
            top = []
            for p in top_paths(root):
                top.append(_io_stat(io, p))
            names: set[str] = set()
            for d, st in zip(top_paths(root)[1:], top[1:]):
                if st.kind == 2:
                    try:
                        names.update(io.listdir(d))
                    except (FileNotFoundError, NotADirectoryError):
                        pass
            groups = []
            for name in sorted(names):
                ref, log = group_paths(root, name)
                groups.append(GroupStamp(name, _io_stat(io, ref), _io_stat(io, log), False, None, None))
        except OSError:
            if tmp is not None:
                _unlink(io, tmp)
            return None
        return cls(store, tmp, Stamp(m0, tuple(top), tuple(groups)))

    def commit(self, listed: list[Listed]) -> bool:
        """Write the stamp with ``listed`` (what the search read of the refs) as the sessions searched."""
        served = {i.id: i for i in listed}
        stamp = self.stamp
        if not served.keys() <= {g.name for g in stamp.groups}:
            return False  # a session came after the names were listed: the next search stamps
        stamp = stamp._replace(groups=tuple(
            g._replace(searched=True, head=served[g.name].head, meta=served[g.name].meta_oid) if g.name in served
            else g for g in stamp.groups))
        if stamp.racy():
            return False  # a file changed in m0's tick: the next search stamps
        try:
            data = encode_stamp(stamp)
        except ValueError:
            return False  # a name that no group has (fsck names it): no stamp for this state dir
        io = self.store.io
        try:
            io.append(self.tmp, data, sync=False)
            io.rename(self.tmp, stamp_path(self.store.root))  # no fsync: a cache (§11a)
        except OSError:
            return False
        self.tmp = None
        return True

    def discard(self) -> None:
        if self.tmp is not None:
            _unlink(self.store.io, self.tmp)
            self.tmp = None


def _io_stat(io: Any, path: str) -> FileStat:
    try:
        return file_stat(io.stat(path))
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT


def _unlink(io: Any, path: str) -> None:
    try:
        io.unlink(path)
    except OSError:
        pass


def verify_grep(store: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """fsck's check (§11a.2): each file's digest, every entry's checksum, and its text, role and seq against its
    message.

    A file that does not parse is a problem ``grep-index`` (delete it; the
    next search writes it again); so is an entry whose message says
    otherwise, or a head or base that is not the session's. A file for a
    session whose head moved on since is information (the next search
    brings it up to date), as is an entry naming a message gc pruned.
    The stamp (:func:`verify_stamp`) is checked too.
    """
    from .schema import read
    from .sessions import SessionStore

    problems: list[tuple[str, str]] = []
    notes: list[str] = []
    sessions = SessionStore(store)
    caches = getattr(store, "caches", None)
    if caches is None:
        return problems, notes
    verify_stamp(store, problems, notes)
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


def verify_stamp(store: Any, problems: list[tuple[str, str]], notes: list[str]) -> None:
    """fsck's check of the stamp (§11a.2): one that does not parse is a problem ``grep-index``, and so is one
    that a search would trust (every file's stats as recorded, none in ``m0``'s tick) but that says other than
    the refs (a session's ``head`` or ``meta``, or a session it passes over); a stamp behind the state dir is
    information (the next search that reads the refs writes it again)."""
    io, root = store.io, store.root
    path = stamp_path(root)
    try:
        stamp = parse_stamp(io.read(path))
    except FileNotFoundError:
        return
    except BadStamp as e:
        problems.append((path, f"search index stamp does not parse ({e}); delete it: the next search writes it "
                               "again"))
        return
    except OSError as e:
        problems.append((path, f"cannot read the search index stamp: {e.strerror}"))
        return
    current = [_io_stat(io, p) for p in top_paths(root)]
    for g in stamp.groups:
        current += [_io_stat(io, p) for p in group_paths(root, g.name)]
    recorded = [*stamp.top, *(s for g in stamp.groups for s in (g.ref, g.log))]
    if current != recorded or stamp.racy():
        notes.append(f"search index stamp {path} is behind the state dir (the next search writes it again)")
        return
    for g in stamp.groups:
        try:
            state = store.refs.read(f"{NS}/{g.name}")
        except KxenError:
            state = None
        live = state is not None and state.deleted_ns is None and "meta" in state.refs  # as SessionStore.get
        if g.searched != live or (live and (state.refs.get("head"), state.refs.get("meta")) != (g.head, g.meta)):
            problems.append((path, f"search index stamp says other than the refs of {NS}/{g.name}; delete it: the "
                                   "next search writes it again"))
            return
