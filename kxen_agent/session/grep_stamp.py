"""The search index's stamp (``objects_spec.md`` §11a.2, ``cache/grep/stamp``): what the session refs said when a
search last read them, keyed by their files' stats, so that a search of a state dir where nothing changed
reads no ref and imports no store.

``session grep`` is measured as a whole process against ``rg`` (issue #30,
``bench/grep.py``); once the search index is up to date, importing the
store package and reading every session's ref file and step log cost more
than the search. The stamp records, for every name in ``refs/sessions/``
and ``steps/sessions/``, the stats of its ref file and step log (inode,
size, modification and change times) and, for each session a search
served, its ``head`` and ``meta`` refs; and the stats of ``FORMAT`` and of
the two directories. :func:`lean_search` trusts it only when every one of
those files still has exactly the stats recorded, none of them changed in
the clock tick the stamp was begun in (``m0``: a change in that tick could
keep every stat), and every session's index file is the one a search would
use as it is (its head and metadata the stamp's, its base point in its
parent's chain); anything else returns None and the search goes the long
way, through the store (:func:`.grep_index.search`), which writes the
stamp again. So a session changed since the stamp was written is always
seen: a ref file rewritten is a new inode and a changed directory, a step
log appended to is a new size, and a change made in place and its times
set back is a new change time.

The reads here go straight to ``os`` (not the store's ``FileIO``): they
only read, and ``KXEN_AGENT_IO_FAULT`` (the seam's fault injection) sends
``session grep`` the long way before this module is reached. The writer
is :mod:`.grep_index`, through the store's seam; the format is pure
(:func:`encode_stamp`, :func:`parse_stamp`). Imports nothing of the store.
"""

from __future__ import annotations

import mmap
import os
import stat as _stat
import struct
from collections import namedtuple

TYPE_CHECKING = False  # typing's own value at run time: not imported on the lean start (see grep_format.py)
if TYPE_CHECKING:
    from typing import Any, Callable

from kxen_agent.statedir import default_state_dir

from .grep_format import NS, Damaged, Hit, IndexFile, base_ok, blake3_digest, family_order, \
    parse_index, scan

__all__ = ["ABSENT", "STAMP_MAGIC", "BadStamp", "FileStat", "GroupStamp", "Stamp", "encode_stamp", "file_stat",
           "group_paths", "lean_search", "parse_stamp", "stamp_path", "state_dir", "top_paths"]

STAMP_MAGIC = b"kxen-grep-stamp 1\n"
_DIGEST = struct.Struct("<32s")
#: After the digest: m0 (signed ns), the names, 4 zero bytes.
_HEAD = struct.Struct("<qI4x")
#: A file's stats: kind (0 absent, 1 a file, 2 a directory, 3 anything else), inode, size, mtime, ctime (ns).
_STAT = struct.Struct("<B7xQQqq")
#: One name: the name (NUL-padded), its ref file's and step log's stats, flags (1: searched), head, meta.
_NAME = struct.Struct("<64s40s40sB7x32s32s")
_S0 = len(STAMP_MAGIC) + _DIGEST.size
_TOPS = 3
_N0 = _S0 + _HEAD.size + _TOPS * _STAT.size
_NO_ID = bytes(32)
_SEARCHED = 1


class BadStamp(ValueError):
    """A stamp that does not parse (a search goes the long way and writes it again)."""


FileStat = namedtuple("FileStat", "kind ino size mtime_ns ctime_ns")
FileStat.__doc__ = """What the stamp keeps of a file's stats: kind (0 absent, 1 a regular file, 2 a directory, 3
anything else), inode, size, modification and change times (ns)."""


ABSENT = FileStat(0, 0, 0, 0, 0)


def file_stat(st: os.stat_result) -> FileStat:
    mode = st.st_mode
    kind = 1 if _stat.S_ISREG(mode) else 2 if _stat.S_ISDIR(mode) else 3
    return FileStat(kind, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stat_of(path: str, stat: Callable[[str], os.stat_result] = os.stat) -> FileStat:
    """``path``'s stats; :data:`ABSENT` when there is nothing there (other errors are raised)."""
    try:
        return file_stat(stat(path))
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT


GroupStamp = namedtuple("GroupStamp", "name ref log searched head meta")
GroupStamp.__doc__ = """One name of ``refs/sessions/`` or ``steps/sessions/``: its ref file's and step log's
:class:`FileStat`, and whether a search served it (``searched``; then its ``head`` (None: none) and ``meta`` refs,
bytes, then)."""


class Stamp(namedtuple("Stamp", "m0 top groups")):
    """``m0``: the file system's clock (ns) before the first stat was taken; ``top``: the stats of
    :func:`top_paths`; ``groups``: a tuple of :class:`GroupStamp`, sorted by name."""

    __slots__ = ()

    def racy(self) -> bool:
        """Whether a file recorded changed at or after ``m0``: a change in that clock tick may have kept its
        stats, so the stamp says nothing of it."""
        m0 = self.m0
        stats = [*self.top, *(g.ref for g in self.groups), *(g.log for g in self.groups)]
        return any(s.kind and (s.mtime_ns >= m0 or s.ctime_ns >= m0) for s in stats)


def top_paths(root: str) -> tuple[str, str, str]:
    """The stamp's three top files: ``FORMAT``, ``refs/sessions``, ``steps/sessions``."""
    return (os.path.join(root, "FORMAT"), os.path.join(root, "refs", NS), os.path.join(root, "steps", NS))


def group_paths(root: str, name: str) -> tuple[str, str]:
    """A name's ref file and step log (``refs/sessions/<name>``, ``steps/sessions/<name>``)."""
    return os.path.join(root, "refs", NS, name), os.path.join(root, "steps", NS, name)


def stamp_path(root: str) -> str:
    return os.path.join(root, "cache", "grep", "stamp")


def index_path(root: str, ses: str) -> str:
    return os.path.join(root, "cache", "grep", NS, ses)


def encode_stamp(stamp: Stamp) -> bytes:
    """The stamp's bytes; ValueError for a name that does not fit (64 bytes of ASCII)."""
    if len(stamp.top) != _TOPS:
        raise ValueError(f"a stamp has {_TOPS} top stats, not {len(stamp.top)}")
    parts = [_HEAD.pack(stamp.m0, len(stamp.groups)), *(_STAT.pack(*s) for s in stamp.top)]
    for g in sorted(stamp.groups):
        name = g.name.encode("ascii")
        if not name or len(name) > 64 or b"\0" in name:
            raise ValueError(f"name {g.name!r} does not fit a stamp")
        parts.append(_NAME.pack(name, _STAT.pack(*g.ref), _STAT.pack(*g.log), _SEARCHED if g.searched else 0,
                                g.head or _NO_ID, g.meta or _NO_ID))
    body = b"".join(parts)
    return STAMP_MAGIC + blake3_digest((body,)) + body


def parse_stamp(data: bytes) -> Stamp:
    """The stamp; :class:`BadStamp` if ``data`` is not one (its magic, length, digest or a field)."""
    if len(data) < _N0 or data[:len(STAMP_MAGIC)] != STAMP_MAGIC:
        raise BadStamp("no stamp header")
    m0, n = _HEAD.unpack_from(data, _S0)
    if len(data) != _N0 + n * _NAME.size:
        raise BadStamp("length does not match the header")
    if blake3_digest((memoryview(data)[_S0:],)) != data[len(STAMP_MAGIC):_S0]:
        raise BadStamp("digest does not match")
    top = tuple(_stat_record(_STAT.unpack_from(data, _S0 + _HEAD.size + i * _STAT.size)) for i in range(_TOPS))
    groups = []
    for i in range(n):
        name, ref, log, flags, head, meta = _NAME.unpack_from(data, _N0 + i * _NAME.size)
        text = name.rstrip(b"\0")
        if not text or b"\0" in text or not text.isascii() or flags & ~_SEARCHED:
            raise BadStamp(f"name record {i} is not one")
        searched = bool(flags & _SEARCHED)
        groups.append(GroupStamp(text.decode("ascii"), _stat_record(_STAT.unpack(ref)),
                                 _stat_record(_STAT.unpack(log)), searched,
                                 head if searched and head != _NO_ID else None, meta if searched else None))
    if [g.name for g in groups] != sorted({g.name for g in groups}):
        raise BadStamp("names are not sorted, or one is there twice")
    return Stamp(m0, top, tuple(groups))


def _stat_record(fields: tuple) -> FileStat:
    s = FileStat(*fields)
    if s.kind > 3 or (s.kind == 0 and s != ABSENT):
        raise BadStamp("a stat record is not one")
    return s


def state_dir() -> str:
    """The state dir, as the store finds it (one rule for both: :mod:`kxen_agent.statedir`)."""
    return default_state_dir()


#: The shared mode's mark on the root (``store/access.py``): set-group-id and the group's rwx.
_SHARED_MARK = _stat.S_ISGID | 0o070


def _usable(root: str) -> bool:
    """Whether the store would open ``root`` without a word (its own user's; ``KXEN_AGENT_SHARED`` agreeing
    with its mode): anything else is the store's to refuse or to accept (``store/access.py``)."""
    try:
        st = os.stat(root)
    except OSError:
        return False
    if not _stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False
    shared = os.environ.get("KXEN_AGENT_SHARED", "").strip()
    return shared in ("", "private") or (shared == "group" and st.st_mode & _SHARED_MARK == _SHARED_MARK)


def _map(path: str) -> Any:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size == 0:
            return b""
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def lean_search(root: str, match: Callable[[Any, int, int], int], *, roles: set[str] | None = None,
                since_ns: int | None = None, sessions_only: bool = False,
                sessions: tuple[str, ...] = ()) -> list[Hit] | None:
    """What :func:`.grep_index.search` would find, when the stamp says nothing changed since a search read the
    refs and every index file is up to date; None otherwise (the long way's to answer). ``sessions``: ``--session``
    values, answered here only when each is the full id of a session the stamp lists as searched (what
    ``SessionStore.resolve_id`` returns as it is); a prefix or a name goes the long way."""
    if not _usable(root):
        return None
    try:
        with open(stamp_path(root), "rb") as fh:
            stamp = parse_stamp(fh.read())
        if stamp.racy():
            return None
        only = None
        if sessions:
            only = {s.strip() for s in sessions}
            searched = {g.name for g in stamp.groups if g.searched}
            if not all(_full_id(s) and s in searched for s in only):
                return None
        for path, want in zip(top_paths(root), stamp.top):
            if _stat_of(path) != want:
                return None
        for g in stamp.groups:
            ref, log = group_paths(root, g.name)
            if _stat_of(ref) != g.ref or _stat_of(log) != g.log:
                return None
        found: list[IndexFile] = []
        for g in stamp.groups:
            if g.searched:
                f = parse_index(g.name, _map(index_path(root, g.name)))
                if f.head_id != (g.head or _NO_ID) or f.meta_id != g.meta:
                    return None
                found.append(f)
    except (OSError, ValueError):  # ValueError: BadStamp, BadIndex, a stat that does not fit
        return None
    # As the long way orders and checks them: oldest first, parents before forks, each base in its parent's chain.
    files: dict[str, IndexFile] = {}
    for f in family_order(found, ident=lambda f: f.ses, parent=lambda f: f.parent, created=lambda f: f.created_ns):
        if not base_ok(files, f):
            return None
        files[f.ses] = f
    try:
        hits, _total = scan(files, match, only=only, roles=roles, since_ns=since_ns, sessions_only=sessions_only)
    except Damaged:
        return None  # the long way writes the file anew and searches again
    return hits



_ID_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyz")


def _full_id(text: str) -> bool:
    """Whether ``text`` is a whole session id (``session.schema.SES_RE``: ``ses_`` and 8 to 40 of [0-9a-z])."""
    return text.startswith("ses_") and 8 <= len(text) - 4 <= 40 and _ID_CHARS.issuperset(text[4:])
