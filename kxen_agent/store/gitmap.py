"""The Git image of kxen objects and ref groups (``objects_spec.md`` §16): bytes in, bytes out.

A ref group travels through an ordinary Git remote as Git objects that any
Git host accepts and ``git fsck --strict`` finds clean:

- every kxen object is one Git **blob** holding exactly its object bytes
  (§3: header and body), so ``git cat-file blob X | b3sum`` prints its kxen
  id;
- the objects new in one push hang under one parentless **objects commit**
  whose tree fans out like the loose store (§5.1): a subtree per first two
  hex digits of the kxen id, in it one entry per object named by the other
  62;
- the group itself is a **group commit** whose tree holds one blob, ``refs``
  (the group's refs and its remote fence), and whose parents are the
  group's previous commit, the objects commit and any base it builds on;
  its message carries a summary for listings;
- a remote run lease is a **lease commit** whose tree holds one blob,
  ``lease`` (the holder record, given by the caller).

Git's own reachability therefore carries the closure: fetching a group
commit fetches every object its refs reach, and pushing one sends only
what the remote lacks. This module only encodes and parses (strictly: a
reader refuses anything a writer of this version would not produce) and
hashes with SHA-1 as Git does; it never runs ``git``, opens a file or
knows what a session is (``kxen_agent/session/remote.py`` does the I/O).
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from kxen_agent.errors import KxenError

from .objects import RawObject
from .refs import BadRefName, validate_group, validate_ref_name

__all__ = [
    "BadGitImage",
    "Commit",
    "GIT_TYPE_CODES",
    "GitObject",
    "GroupImage",
    "IDENT",
    "LEASE_ENTRY",
    "REFS_ENTRY",
    "TreeEntry",
    "encode_commit",
    "encode_group_blob",
    "encode_indexed_pack",
    "encode_pack",
    "encode_pack_index",
    "encode_tree",
    "git_object",
    "group_commit",
    "group_tree_blob",
    "hex40",
    "kxen_id_of_path",
    "lease_commit",
    "lease_tree_blob",
    "object_blob",
    "objects_commit",
    "pack_entry_header",
    "parse_commit",
    "parse_group_blob",
    "parse_group_commit",
    "parse_lease_commit",
    "parse_objects_commit",
    "parse_objects_root",
    "parse_objects_subtree",
    "parse_tree",
]

#: The author and committer of every commit of a Git image (no person wrote them).
IDENT = b"kxen-agent <kxen-agent@localhost>"
#: The one entry of a group commit's tree, and of a lease commit's.
REFS_ENTRY = b"refs"
LEASE_ENTRY = b"lease"
_GROUP_MAGIC = b"kxen-git-group 1\n"
_BLOB_MODE = b"100644"
_TREE_MODE = b"40000"
_HEX40 = re.compile(rb"[0-9a-f]{40}")
_HEX = re.compile(rb"[0-9a-f]+")
_DECIMAL = rb"(0|[1-9][0-9]*)"
_SUMMARY_KEY = re.compile(rb"[a-z][a-z0-9-]{0,31}")
#: Git's object type codes in a pack entry's header (gitformat-pack).
GIT_TYPE_CODES = {"commit": 1, "tree": 2, "blob": 3, "tag": 4}


class BadGitImage(KxenError):
    """Git objects that should be the image of kxen objects are not one (``where`` names the Git object)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"bad Git image {where}: {reason}")
        self.where = where
        self.reason = reason


@dataclass(frozen=True, slots=True)
class GitObject:
    """One Git object: its type, its body (what ``git cat-file TYPE`` prints) and its SHA-1 id."""

    type: str
    body: bytes
    oid: bytes

    @property
    def hex(self) -> str:
        return self.oid.hex()


def git_object(type_: str, body: bytes) -> GitObject:
    """The Git object of ``type_`` with ``body``: id = SHA-1 of ``"<type> <len>\\0" + body``."""
    if type_ not in GIT_TYPE_CODES:
        raise ValueError(f"unknown Git object type {type_!r}")
    h = hashlib.sha1(b"%s %d\x00" % (type_.encode("ascii"), len(body)))
    h.update(body)
    return GitObject(type_, body, h.digest())


def object_blob(raw: bytes) -> GitObject:
    """The image of one kxen object: a blob of its object bytes, unchanged."""
    return git_object("blob", raw)


# ---------------------------------------------------------------- trees


@dataclass(frozen=True, slots=True)
class TreeEntry:
    mode: bytes  # b"100644" (a blob) or b"40000" (a tree)
    name: bytes
    oid: bytes


def _sort_key(e: TreeEntry) -> bytes:
    # Git orders entries as if a tree's name ended in "/".
    return e.name + b"/" if e.mode == _TREE_MODE else e.name


def encode_tree(entries: Iterable[TreeEntry]) -> bytes:
    """A tree's body: ``<mode> SP <name> NUL <20-byte id>`` per entry, in Git's order."""
    out = bytearray()
    for e in sorted(entries, key=_sort_key):
        out += e.mode + b" " + e.name + b"\x00" + e.oid
    return bytes(out)


def parse_tree(body: bytes, where: str) -> list[TreeEntry]:
    """The entries of a tree this module would write: modes 100644 and 40000 only, sorted, unique."""
    out: list[TreeEntry] = []
    pos = 0
    prev: bytes | None = None
    while pos < len(body):
        sp = body.find(b" ", pos, pos + 7)
        nul = body.find(b"\x00", pos)
        if sp < 0 or nul < 0 or nul < sp or nul + 21 > len(body):
            raise BadGitImage(where, f"truncated tree entry at byte {pos}")
        mode, name, oid = body[pos:sp], body[sp + 1 : nul], body[nul + 1 : nul + 21]
        if mode not in (_BLOB_MODE, _TREE_MODE):
            raise BadGitImage(where, f"tree entry mode {mode.decode('ascii', 'replace')!r} at byte {pos} "
                              "(a Git image has only 100644 blobs and 40000 trees)")
        if not name or b"/" in name or name in (b".", b".."):
            raise BadGitImage(where, f"bad tree entry name {name!r} at byte {pos}")
        e = TreeEntry(mode, name, oid)
        key = _sort_key(e)
        if prev is not None and key <= prev:
            raise BadGitImage(where, f"tree entries out of order or repeated at byte {pos}")
        prev = key
        out.append(e)
        pos = nul + 21
    return out


def _fanout(objects: Iterable[tuple[bytes, bytes]]) -> tuple[list[GitObject], GitObject]:
    """The subtrees and the root tree of an objects tree, from (kxen id, blob id) pairs."""
    groups: dict[bytes, list[TreeEntry]] = {}
    for kid, blob in objects:
        h = kid.hex().encode("ascii")
        groups.setdefault(h[:2], []).append(TreeEntry(_BLOB_MODE, h[2:], blob))
    subtrees = {k: git_object("tree", encode_tree(v)) for k, v in groups.items()}
    root = git_object("tree", encode_tree(TreeEntry(_TREE_MODE, k, t.oid) for k, t in subtrees.items()))
    return [subtrees[k] for k in sorted(subtrees)], root


def kxen_id_of_path(path: bytes) -> bytes | None:
    """The kxen id an objects tree names by ``path`` (``ab/cdef…``, as ``git rev-list --objects`` prints it), or None."""
    if len(path) != 65 or path[2:3] != b"/":
        return None
    h = path[:2] + path[3:]
    return bytes.fromhex(h.decode("ascii")) if _HEX.fullmatch(h) else None


# ---------------------------------------------------------------- commits


@dataclass(frozen=True, slots=True)
class Commit:
    """A commit of a Git image: tree, parents, time (seconds, UTC) and message; the identity is :data:`IDENT`."""

    tree: bytes
    parents: tuple[bytes, ...]
    time: int
    message: bytes


def encode_commit(c: Commit) -> bytes:
    if c.time < 0:
        raise ValueError("a commit time is a non-negative number of seconds")
    if not c.message.endswith(b"\n") or b"\x00" in c.message:
        raise ValueError("a commit message ends with LF and holds no NUL")
    lines = [b"tree " + c.tree.hex().encode("ascii")]
    lines += [b"parent " + p.hex().encode("ascii") for p in c.parents]
    stamp = b" %d +0000" % c.time
    lines += [b"author " + IDENT + stamp, b"committer " + IDENT + stamp]
    return b"\n".join(lines) + b"\n\n" + c.message


_COMMIT_RE = re.compile(
    rb"tree ([0-9a-f]{40})\n((?:parent [0-9a-f]{40}\n)*)author " + re.escape(IDENT) + rb" " + _DECIMAL
    + rb" \+0000\ncommitter " + re.escape(IDENT) + rb" " + _DECIMAL + rb" \+0000\n\n", re.S)


def parse_commit(body: bytes, where: str) -> Commit:
    """A commit this module would write (its identity, UTC, one time), else :class:`BadGitImage`."""
    m = _COMMIT_RE.match(body)
    if m is None:
        raise BadGitImage(where, "not a commit of a kxen Git image (header lines, identity or time zone differ)")
    if m.group(3) != m.group(4):
        raise BadGitImage(where, "author and committer times differ")
    message = body[m.end():]
    if not message.endswith(b"\n") or b"\x00" in message:
        raise BadGitImage(where, "commit message does not end with LF, or holds NUL")
    parents = tuple(bytes.fromhex(p[7:].decode("ascii")) for p in m.group(2).splitlines())
    if len(set(parents)) != len(parents):
        raise BadGitImage(where, "a parent is named twice")
    return Commit(bytes.fromhex(m.group(1).decode("ascii")), parents, int(m.group(3)), message)


def objects_commit(objects: Sequence[RawObject], time: int) -> list[GitObject]:
    """The Git objects of an objects commit holding the kxen ``objects``.

    Blobs (in the order given), subtrees, the root tree, then the commit
    (last). An object given twice is held once. ``objects`` must not be
    empty.
    """
    if not objects:
        raise ValueError("an objects commit holds at least one object")
    blobs: dict[bytes, GitObject] = {}
    for obj in objects:
        if obj.id not in blobs:
            blobs[obj.id] = object_blob(obj.raw)
    subtrees, root = _fanout((k, b.oid) for k, b in blobs.items())
    commit = git_object("commit", encode_commit(Commit(root.oid, (), time, b"kxen objects %d\n" % len(blobs))))
    return list(blobs.values()) + subtrees + [root, commit]


_OBJECTS_MESSAGE = re.compile(rb"kxen objects " + _DECIMAL + rb"\n")
_HEX2 = re.compile(rb"[0-9a-f]{2}")
_HEX62 = re.compile(rb"[0-9a-f]{62}")


def parse_objects_commit(commit_body: bytes, where: str) -> tuple[Commit, int]:
    """Check an objects commit's own bytes (§16.3, §16.5): no parents, message ``kxen objects <n>`` LF, n >= 1.

    Returns the commit and ``n``; its tree is checked by :func:`parse_objects_root`
    and :func:`parse_objects_subtree`, and the count by the caller (``n`` must
    equal the entries of all the subtrees).
    """
    c = parse_commit(commit_body, where)
    m = _OBJECTS_MESSAGE.fullmatch(c.message)
    if m is None:
        raise BadGitImage(where, "message is not 'kxen objects <n>' (an objects commit, objects_spec.md §16.3)")
    if c.parents:
        raise BadGitImage(where, f"an objects commit has no parents, this one has {len(c.parents)} "
                          "(objects_spec.md §16.3)")
    n = int(m.group(1))
    if n < 1:
        raise BadGitImage(where, "an objects commit holds at least one object, this one says 0")
    return c, n


def parse_objects_root(tree_body: bytes, where: str) -> list[tuple[bytes, bytes]]:
    """(two hex digits, subtree id) of each entry of an objects commit's root tree: all subtrees, at least one."""
    entries = parse_tree(tree_body, where)
    if not entries:
        raise BadGitImage(where, "an objects tree holds at least one subtree, this one is empty")
    out = []
    for e in entries:
        if e.mode != _TREE_MODE or not _HEX2.fullmatch(e.name):
            raise BadGitImage(where, f"root entry {e.name[:70]!r} (mode {e.mode.decode('ascii')}) is not a "
                              "subtree named by two lower-case hex digits (objects_spec.md §16.3)")
        out.append((e.name, e.oid))
    return out


def parse_objects_subtree(prefix: bytes, tree_body: bytes, where: str) -> list[tuple[bytes, bytes]]:
    """(kxen id, blob id) of each entry of the subtree ``prefix``: all ``100644`` entries named by 62 hex digits."""
    entries = parse_tree(tree_body, where)
    if not entries:
        raise BadGitImage(where, f"subtree {prefix.decode('ascii')} is empty (objects_spec.md §16.3)")
    out = []
    for e in entries:
        if e.mode != _BLOB_MODE or not _HEX62.fullmatch(e.name):
            raise BadGitImage(where, f"entry {prefix.decode('ascii')}/{e.name[:70].decode('ascii', 'replace')} "
                              f"(mode {e.mode.decode('ascii')}) is not a 100644 entry named by 62 lower-case hex "
                              "digits (objects_spec.md §16.3)")
        out.append((bytes.fromhex((prefix + e.name).decode("ascii")), e.oid))
    return out


# ---------------------------------------------------------------- ref groups


@dataclass(frozen=True, slots=True)
class GroupImage:
    """What a group commit says: the group, its refs (name -> kxen id), its remote fence and summary."""

    group: str
    fence: int
    refs: dict[str, bytes]
    summary: tuple[tuple[str, str], ...]
    commit: Commit


def encode_group_blob(group: str, fence: int, refs: dict[str, bytes]) -> bytes:
    """The ``refs`` blob: magic, ``group``, ``fence``, then ``<64 hex> <name>`` per ref, sorted by name."""
    validate_group(group)
    if fence < 0:
        raise ValueError("a fence is a non-negative integer")
    out = [_GROUP_MAGIC, b"group %s\n" % group.encode("ascii"), b"fence %d\n" % fence]
    for name in sorted(refs, key=lambda n: n.encode("ascii")):
        validate_ref_name(name)
        oid = refs[name]
        if len(oid) != 32 or oid == b"\x00" * 32:
            raise ValueError(f"ref {name}: not a kxen id")
        out.append(b"%s %s\n" % (oid.hex().encode("ascii"), name.encode("ascii")))
    return b"".join(out)


_GROUP_HEAD = re.compile(_GROUP_MAGIC + rb"group ([!-~]+)\nfence " + _DECIMAL + rb"\n")
_REF_LINE = re.compile(rb"([0-9a-f]{64}) ([!-~]+)\n")


def parse_group_blob(data: bytes, where: str) -> tuple[str, int, dict[str, bytes]]:
    """(group, fence, refs) of a ``refs`` blob, strictly (what :func:`encode_group_blob` writes)."""
    m = _GROUP_HEAD.match(data)
    if m is None:
        raise BadGitImage(where, "not a kxen-git-group 1 refs blob (magic, group or fence line)")
    group = m.group(1).decode("ascii")
    try:
        validate_group(group)
    except BadRefName as e:
        raise BadGitImage(where, str(e)) from None
    refs: dict[str, bytes] = {}
    pos = m.end()
    prev = b""
    while pos < len(data):
        r = _REF_LINE.match(data, pos)
        if r is None:
            raise BadGitImage(where, f"bad ref line at byte {pos}")
        name = r.group(2)
        if refs and name <= prev:
            raise BadGitImage(where, f"refs out of order or repeated at byte {pos}")
        try:
            validate_ref_name(name.decode("ascii"))
        except BadRefName as e:
            raise BadGitImage(where, str(e)) from None
        oid = bytes.fromhex(r.group(1).decode("ascii"))
        if oid == b"\x00" * 32:
            raise BadGitImage(where, f"ref {name.decode('ascii')} names the all-zero id")
        refs[name.decode("ascii")] = oid
        prev = name
        pos = r.end()
    return group, int(m.group(2)), refs


def _summary_lines(summary: Iterable[tuple[str, str]]) -> bytes:
    out = []
    for key, value in summary:
        k, v = key.encode("ascii"), value.encode("utf-8")
        if not _SUMMARY_KEY.fullmatch(k) or any(c < 0x20 or c == 0x7F for c in v):
            raise ValueError(f"summary line {key!r}: a key is [a-z][a-z0-9-]*, a value one line of text")
        out.append(k + b": " + v + b"\n")
    return b"".join(out)


def group_commit(group: str, fence: int, refs: dict[str, bytes], parents: Sequence[bytes], time: int,
                 summary: Iterable[tuple[str, str]] = ()) -> list[GitObject]:
    """The ``refs`` blob, the tree and the group commit (last) of ``group`` at ``refs``.

    ``parents``: the group's previous commit first (if any), then the
    objects commit of the new objects (if any), then any base; each once.
    ``summary``: ``(key, value)`` lines for listings (informative).
    """
    if len(set(parents)) != len(parents):
        raise ValueError("a parent is named twice")
    blob = git_object("blob", encode_group_blob(group, fence, refs))
    tree = git_object("tree", encode_tree([TreeEntry(_BLOB_MODE, REFS_ENTRY, blob.oid)]))
    message = b"kxen group " + group.encode("ascii") + b"\n"
    lines = _summary_lines(summary)
    if lines:
        message += b"\n" + lines
    return [blob, tree, git_object("commit", encode_commit(Commit(tree.oid, tuple(parents), time, message)))]


def _one_entry(tree_body: bytes, name: bytes, where: str) -> bytes:
    entries = parse_tree(tree_body, where)
    if len(entries) != 1 or entries[0].name != name or entries[0].mode != _BLOB_MODE:
        raise BadGitImage(where, f"tree must hold exactly one blob named {name.decode('ascii')!r}")
    return entries[0].oid


def parse_group_commit(commit_body: bytes, tree_body: bytes, blob_body: bytes, where: str) -> GroupImage:
    """Check a group commit with its tree and ``refs`` blob (as read from Git); what it says.

    The caller reads the tree the commit names and the blob the tree names
    (:func:`group_tree_blob` tells which); this checks they are those and
    that the message names the same group as the blob.
    """
    c = parse_commit(commit_body, where)
    if git_object("tree", tree_body).oid != c.tree:
        raise BadGitImage(where, "tree bytes are not the commit's tree")
    if git_object("blob", blob_body).oid != _one_entry(tree_body, REFS_ENTRY, where):
        raise BadGitImage(where, "refs blob bytes are not the tree's")
    group, fence, refs = parse_group_blob(blob_body, where)
    first, _, rest = c.message.partition(b"\n")
    if first != b"kxen group " + group.encode("ascii"):
        raise BadGitImage(where, f"message does not begin 'kxen group {group}'")
    summary: list[tuple[str, str]] = []
    if rest:
        # §16.4: an empty line, then one or more "key: value" LF lines, values without control characters.
        if not rest.startswith(b"\n") or rest == b"\n":
            raise BadGitImage(where, "summary must follow an empty line and hold a line at least")
        for line in rest[1:-1].split(b"\n"):  # the message ends in LF (parse_commit)
            key, sep, value = line.partition(b": ")
            if not sep or not _SUMMARY_KEY.fullmatch(key) or any(c < 0x20 or c == 0x7F for c in value):
                raise BadGitImage(where, f"bad summary line {line[:40]!r}")
            try:
                summary.append((key.decode("ascii"), value.decode("utf-8")))
            except UnicodeDecodeError:
                raise BadGitImage(where, "summary is not UTF-8") from None
    return GroupImage(group, fence, refs, tuple(summary), c)


def group_tree_blob(tree_body: bytes, where: str) -> bytes:
    """The id of the ``refs`` blob a group commit's tree names."""
    return _one_entry(tree_body, REFS_ENTRY, where)


# ---------------------------------------------------------------- leases


def lease_commit(group: str, record: bytes, parent: bytes | None, time: int) -> list[GitObject]:
    """The ``lease`` blob (``record``, the holder record), the tree and the lease commit (last)."""
    validate_group(group)
    blob = git_object("blob", record)
    tree = git_object("tree", encode_tree([TreeEntry(_BLOB_MODE, LEASE_ENTRY, blob.oid)]))
    parents = () if parent is None else (parent,)
    message = b"kxen lease " + group.encode("ascii") + b"\n"
    return [blob, tree, git_object("commit", encode_commit(Commit(tree.oid, parents, time, message)))]


def parse_lease_commit(commit_body: bytes, tree_body: bytes, blob_body: bytes, group: str, where: str) -> Commit:
    """Check a lease commit of ``group`` with its tree and blob; the commit (the record is ``blob_body``)."""
    c = parse_commit(commit_body, where)
    if len(c.parents) > 1:
        raise BadGitImage(where, "a lease commit has at most one parent")
    if c.message != b"kxen lease " + group.encode("ascii") + b"\n":
        raise BadGitImage(where, f"message is not 'kxen lease {group}'")
    if git_object("tree", tree_body).oid != c.tree:
        raise BadGitImage(where, "tree bytes are not the commit's tree")
    if git_object("blob", blob_body).oid != _one_entry(tree_body, LEASE_ENTRY, where):
        raise BadGitImage(where, "lease blob bytes are not the tree's")
    return c


def lease_tree_blob(tree_body: bytes, where: str) -> bytes:
    """The id of the ``lease`` blob a lease commit's tree names."""
    return _one_entry(tree_body, LEASE_ENTRY, where)


# ---------------------------------------------------------------- packs


def encode_pack(objects: Iterable[GitObject], level: int = 1) -> bytes:
    """A Git pack (version 2) of ``objects``, each once and stored whole (no deltas), zlib at ``level``.

    ``git index-pack`` indexes it (and checks every object); Git's own
    pushes then delta and compress what goes over the wire.
    """
    return encode_indexed_pack(objects, level)[0]


def encode_indexed_pack(objects: Iterable[GitObject], level: int = 1,
                        deflate: Callable[[list[GitObject]], Iterable[bytes]] | None = None) -> tuple[bytes, bytes]:
    """A Git pack (version 2) of ``objects`` as :func:`encode_pack` makes it, and its index (``.idx`` version 2).

    ``deflate``: the zlib streams of the (deduplicated) objects' bodies, in
    their order, made otherwise than one by one here (``session/push_pack``
    makes them in two threads); the pack is the same bytes.

    The index is what ``git index-pack`` would write for this pack: the
    magic ``\\377tOc``, version 2, the 256-entry fan-out of first bytes,
    the object ids sorted, the CRC-32 of each entry's bytes, each entry's
    offset (32-bit; past 2 GiB, an index into a table of 64-bit offsets),
    the pack's checksum and the index's own (SHA-1). The objects' ids are
    the ones :func:`git_object` computed from their bodies, so the writer
    of both (the one who made the objects) needs Git only to send them.
    """
    objs = list({o.oid: o for o in objects}.values())  # each object once (an index lists every entry)
    out = bytearray(b"PACK" + struct.pack(">II", 2, len(objs)))
    entries: dict[bytes, tuple[int, int]] = {}  # id -> (offset, crc32)
    bodies = deflate(objs) if deflate is not None else (zlib.compress(o.body, level) for o in objs)
    for o, body in zip(objs, bodies, strict=True):
        at = len(out)
        out += pack_entry_header(GIT_TYPE_CODES[o.type], len(o.body))
        out += body
        entries[o.oid] = (at, zlib.crc32(memoryview(out)[at:]))
    pack_sum = hashlib.sha1(out).digest()
    out += pack_sum
    return bytes(out), encode_pack_index([(oid, crc, at) for oid, (at, crc) in entries.items()], pack_sum)


def pack_entry_header(type_code: int, size: int) -> bytes:
    """A pack entry's header: the type in bits 4-6 of the first byte, the size in 4 + 7n bits, low first."""
    out = bytearray()
    byte = (type_code << 4) | (size & 0x0F)
    size >>= 4
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def encode_pack_index(entries: Iterable[tuple[bytes, int, int]], pack_sum: bytes) -> bytes:
    """The version-2 ``.idx`` of a pack whose entries are ``(20-byte id, CRC-32, offset)`` and whose
    checksum is ``pack_sum``: what ``git index-pack`` writes (see :func:`encode_indexed_pack`)."""
    rows = sorted(entries)
    fanout = [0] * 256
    for oid, _crc, _off in rows:
        fanout[oid[0]] += 1
    total = 0
    for i in range(256):
        total += fanout[i]
        fanout[i] = total
    small, large = [], []
    for _oid, _crc, off in rows:
        if off < 1 << 31:
            small.append(off)
        else:
            small.append((1 << 31) | len(large))
            large.append(off)
    idx = bytearray(b"\377tOc" + struct.pack(">I", 2) + struct.pack(">256I", *fanout))
    idx += b"".join(oid for oid, _crc, _off in rows)
    idx += struct.pack(f">{len(rows)}I", *(crc for _oid, crc, _off in rows))
    idx += struct.pack(f">{len(small)}I", *small)
    idx += struct.pack(f">{len(large)}Q", *large)
    idx += pack_sum
    idx += hashlib.sha1(idx).digest()
    return bytes(idx)


def hex40(text: str) -> bytes | None:
    """The 20-byte id of 40 lower-case hex digits (as ``git`` prints one), else None."""
    b = text.encode("ascii", "replace")
    return bytes.fromhex(text) if _HEX40.fullmatch(b) else None
