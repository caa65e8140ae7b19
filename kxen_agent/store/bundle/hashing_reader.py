"""Exact, hashed reads from a bundle stream: :class:`_Input`, the buffered hashing reader.

Owns the read-ahead buffer a pack-form bundle is parsed from, the running
BLAKE3 of every byte consumed (the bundle trailer) and of the pack section
(the pack trailer), and the "truncated: ... needs N bytes" errors that name
what was being read.

It must never open a file or ask the file system anything: it reads the
binary stream it is given, and its caller tells it the file's size
(:func:`stream_size`, through the :class:`~kxen_agent.store.fsio.FileIO` seam).
"""

from __future__ import annotations

import stat
from typing import Any, BinaryIO, Callable

import blake3

from ..fsio import FileIO
from .header import BadBundle

__all__: list[str] = []  # private to the bundle package

_READ_CHUNK = 256 << 10


def stream_size(io: FileIO, f: BinaryIO) -> int | None:
    """The size of ``f`` if it is a regular file (a length past it is refused before reading), else None."""
    try:
        st = io.fstat(f)
    except (AttributeError, OSError):  # no fileno(), or io.UnsupportedOperation (an OSError)
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


class _Input:
    """Exact reads from a binary stream, hashed as they go.

    Reads ahead in pieces of :data:`_READ_CHUNK` bytes and hands out
    slices: most reads cost no system call. A read of a piece or more is
    done at its exact size, without reading ahead: memory stays about
    twice the largest object (the bytes read ahead, the rest, the two
    joined) plus a piece. Consumed bytes are hashed in bulk — when the buffer is refilled and whenever a
    digest is taken or the pack hash starts or stops — which hashes exactly
    the bytes consumed, in order, as one update per read would.
    """

    def __init__(self, f: BinaryIO, where: str, size: int | None) -> None:
        self.f = f
        self.where = where
        self.pos = 0  # bytes consumed
        self.buf = b""  # buf[off:] is read ahead, not yet consumed
        self.off = 0
        self.hoff = 0  # buf[hoff:off] is consumed, not yet hashed
        self.hash = blake3.blake3()
        self.pack_hash: Any = None
        # The file's size (None: not a regular file), from stream_size().
        self.size = size

    def _hash_consumed(self) -> None:
        if self.off > self.hoff:
            view = memoryview(self.buf)[self.hoff : self.off]
            self.hash.update(view)
            if self.pack_hash is not None:
                self.pack_hash.update(view)
            self.hoff = self.off

    def start_pack_hash(self) -> None:
        """Hash what is read from here on into :attr:`pack_hash` too."""
        self._hash_consumed()
        self.pack_hash = blake3.blake3()

    def pack_digest(self) -> bytes:
        """The pack hash of what was read since :meth:`start_pack_hash`; stops it."""
        self._hash_consumed()
        d = self.pack_hash.digest()
        self.pack_hash = None
        return d

    def digest(self) -> bytes:
        """The hash of everything read so far."""
        self._hash_consumed()
        return self.hash.digest()

    def read_unless(self, n: int, stop: bytes) -> bytes | None:
        """The next ``n`` bytes if they are read ahead already and do not
        start with ``stop``; else None, and nothing is consumed."""
        off = self.off
        end = off + n
        buf = self.buf
        if end > len(buf) or buf.startswith(stop, off):
            return None
        self.off = end
        self.pos += n
        return buf[off:end]

    def read(self, n: int, what: str | Callable[[], str]) -> bytes:
        """The next ``n`` bytes; ``what`` (text, or a function giving it) names them in an error."""
        off = self.off
        end = off + n
        if end <= len(self.buf):
            self.off = end
            self.pos += n
            return self.buf[off:end]
        return self._refill(n, what)

    def _refill(self, n: int, what: str | Callable[[], str]) -> bytes:
        if self.size is not None and self.pos + n > self.size:
            left = max(0, self.size - self.pos)
            raise BadBundle(self.where, f"truncated: {what if isinstance(what, str) else what()} needs {n} bytes, the file ends after {left}", self.pos)
        self._hash_consumed()
        rest = self.buf[self.off :]
        self.buf = b""
        need = n - len(rest)
        want = need if n >= _READ_CHUNK else _READ_CHUNK
        parts = [rest] if rest else []
        got = 0
        while got < need:
            chunk = self.f.read(want - got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if len(data) < n:
            raise BadBundle(self.where, f"truncated: {what if isinstance(what, str) else what()} needs {n} bytes, the file ends after {len(data)}", self.pos)
        self.buf = data
        self.off = n
        self.hoff = 0
        self.pos += n
        return data if len(data) == n else data[:n]

    def at_eof(self) -> bool:
        return self.off >= len(self.buf) and self.f.read(1) == b""
