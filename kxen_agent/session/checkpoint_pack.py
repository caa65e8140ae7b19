"""A checkpoint's commit object and its pack, written here rather than by two more ``git`` processes.

A checkpoint (``objects_spec.md`` §14.14) ends with a few new objects in its quarantine — the blobs
``update-index`` hashed and the trees ``write-tree`` made, loose — and one commit. Git's ``commit-tree``
and ``pack-objects`` would be two more processes (a checkpoint of one changed file on a 10,000-file
repository: ~7 ms of their CPU and more of wall time, against a budget of 1.5 times ``git stash create``),
for work that is a few lines of Git's documented formats (``gitformat-pack``): :func:`commit_object`
builds the commit, :func:`write_pack` packs it with the quarantine's loose objects — each object whole,
no deltas, a version-2 pack and its version-2 index — and makes both durable the way Git does: each
fsynced before its rename, the pack named before its index (a reader finds a pack through its index).

Nothing here decides what a checkpoint holds: the objects are Git's (hashed by Git, read back and checked
against their ids), and ``update-ref`` reads the commit from the new pack before any ref names it.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import time
import zlib
from typing import Iterable, Sequence

from kxen_agent.store.gitmap import GIT_TYPE_CODES, encode_pack_index, git_object, pack_entry_header

__all__ = ["commit_object", "write_pack"]

_CHUNK = 1 << 20


def commit_object(tree: str, parents: Sequence[str], ident: str, message: bytes,
                  when: float | None = None) -> tuple[str, bytes]:
    """(id, body) of the commit ``git commit-tree TREE -p P... -F -`` would write with ``ident`` (``Name
    <email>``) as author and committer, at ``when`` (now) in the local time zone, the message as given."""
    secs = int(time.time() if when is None else when)
    off = time.localtime(secs).tm_gmtoff
    zone = f"{'-' if off < 0 else '+'}{abs(off) // 3600:02d}{abs(off) % 3600 // 60:02d}"
    lines = [f"tree {tree}"] + [f"parent {p}" for p in parents]
    lines += [f"author {ident} {secs} {zone}", f"committer {ident} {secs} {zone}"]
    body = ("\n".join(lines) + "\n\n").encode() + message
    return git_object("commit", body).hex, body


class _PackFile:
    """A pack being written: its bytes hashed as they go, each entry's offset and CRC-32 kept for the index."""

    def __init__(self, fd: int, count: int) -> None:
        self.f = os.fdopen(fd, "wb")
        self.sha = hashlib.sha1()
        self.offset = 0
        self.entries: list[tuple[bytes, int, int]] = []  # (binary id, crc32, offset)
        self._put(b"PACK" + struct.pack(">II", 2, count))

    def _put(self, data: bytes) -> None:
        self.f.write(data)
        self.sha.update(data)
        self.offset += len(data)

    def add(self, oid: bytes, kind: int, size: int, chunks: Iterable[bytes]) -> None:
        start = self.offset
        head = pack_entry_header(kind, size)
        crc = zlib.crc32(head)
        self._put(head)
        z = zlib.compressobj(1)
        for chunk in chunks:
            out = z.compress(chunk)
            if out:
                crc = zlib.crc32(out, crc)
                self._put(out)
        out = z.flush()
        crc = zlib.crc32(out, crc)
        self._put(out)
        self.entries.append((oid, crc, start))

    def finish(self) -> bytes:
        digest = self.sha.digest()
        self.f.write(digest)
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        return digest


def _loose(path: str, oid: str) -> tuple[int, int, Iterable[bytes]]:
    """(type, size, chunks of the content) of the loose object at ``path``, checked against ``oid`` as read."""
    f = open(path, "rb")
    d = zlib.decompressobj()
    buf = b""
    while b"\0" not in buf:
        raw = f.read(4096)
        if not raw:
            f.close()
            raise ValueError(f"loose object {oid} is truncated")
        buf += d.decompress(raw)
    head, _, rest = buf.partition(b"\0")
    kind_name, _, size_text = head.partition(b" ")
    kind = GIT_TYPE_CODES.get(kind_name.decode("ascii", "replace"))
    if kind is None or not size_text.isdigit():
        f.close()
        raise ValueError(f"loose object {oid} has no valid header")
    size = int(size_text)
    sha = hashlib.sha1(head + b"\0")

    def chunks() -> Iterable[bytes]:
        n = 0
        try:
            data = rest
            while True:
                if data:
                    n += len(data)
                    sha.update(data)
                    yield data
                raw = f.read(_CHUNK)
                if not raw:
                    data = d.flush()
                    if data:
                        n += len(data)
                        sha.update(data)
                        yield data
                    break
                data = d.decompress(raw)
        finally:
            f.close()
        if n != size or sha.hexdigest() != oid:
            raise ValueError(f"loose object {oid} does not match its id")

    return kind, size, chunks()


def write_pack(loose_dir: str, ids: Sequence[str], extra: Sequence[tuple[str, str, bytes]], pack_dir: str) -> str:
    """Pack the loose objects ``ids`` of the object directory ``loose_dir`` and the ``extra`` objects
    ``(id, type, body)`` into ``pack_dir``: ``pack-<hash>.pack`` and its ``.idx``, each written to a temporary
    file and fsynced, then renamed pack first. The caller fsyncs ``pack_dir``. Returns the pack's path."""
    mode = _mode_like([os.path.join(loose_dir, oid[:2], oid[2:]) for oid in ids[:1]], pack_dir)
    fd, tmp_pack = tempfile.mkstemp(prefix="tmp_pack_", dir=pack_dir)
    tmp_idx = ""
    pack = _PackFile(fd, len(ids) + len(extra))
    try:
        for oid in ids:
            kind, size, chunks = _loose(os.path.join(loose_dir, oid[:2], oid[2:]), oid)
            pack.add(bytes.fromhex(oid), kind, size, chunks)
        for oid, kind_name, body in extra:
            pack.add(bytes.fromhex(oid), GIT_TYPE_CODES[kind_name], len(body), [body])
        digest = pack.finish()
        idx = encode_pack_index(pack.entries, digest)
        fd, tmp_idx = tempfile.mkstemp(prefix="tmp_idx_", dir=pack_dir)
        with os.fdopen(fd, "wb") as f:
            f.write(idx)
            f.flush()
            os.fsync(f.fileno())
        for tmp in (tmp_pack, tmp_idx):
            os.chmod(tmp, mode)
        base = os.path.join(pack_dir, "pack-" + digest.hex())
        os.replace(tmp_pack, base + ".pack")
        os.replace(tmp_idx, base + ".idx")
        return base + ".pack"
    finally:
        pack.f.close()
        for tmp in (tmp_pack, tmp_idx):
            if tmp and os.path.exists(tmp):
                os.unlink(tmp)


def _mode_like(loose: Sequence[str], pack_dir: str) -> int:
    """The mode Git gives its object files here (read-only; the umask and ``core.sharedRepository`` applied):
    that of a loose object Git just wrote, else of a pack already there, else ``0444``."""
    candidates = list(loose)
    try:
        candidates += [os.path.join(pack_dir, n) for n in os.listdir(pack_dir) if n.endswith(".pack")][:1]
    except OSError:
        pass
    for path in candidates:
        try:
            return os.stat(path).st_mode & 0o444
        except OSError:
            continue
    return 0o444
