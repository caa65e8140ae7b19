"""The one seam through which the store touches the file system.

Every durable step of the store (``objects_spec.md`` §9) is a sequence of
calls on a :class:`FileIO`: write a temporary file and fsync it, rename it
into place, fsync the directory. Routing them through one small object lets
tests count fsyncs, record a trace for crash simulation, or fail the N-th
operation, without touching the code that decides *what* to write.
"""

from __future__ import annotations

import os
import secrets
from typing import Callable

__all__ = ["FileIO", "OS_IO"]


class FileIO:
    """Durable file primitives over ``os``; subclass to trace or inject faults."""

    def __init__(self) -> None:
        self.fsyncs = 0
        self.hook: Callable[[str, str], None] | None = None

    def _op(self, op: str, path: str) -> None:
        # A test hook sees every operation before it happens: it may record
        # it, or raise OSError(ENOSPC/EIO) to simulate a failing disk.
        if self.hook is not None:
            self.hook(op, path)

    # -- reading (not traced: reads change nothing)
    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    # -- writing
    def write_tmp(self, directory: str, data: bytes, *, sync: bool = True, prefix: str = "tmp_") -> str:
        """Create a new uniquely named file in ``directory`` holding ``data``."""
        path = os.path.join(directory, f"{prefix}{secrets.token_hex(8)}")
        self._op("create", path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                self._op("write", path)
                n = os.write(fd, view)
                view = view[n:]
            if sync:
                self._op("fsync", path)
                os.fsync(fd)
                self.fsyncs += 1
        except BaseException:
            os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass
            raise
        os.close(fd)
        return path

    def fsync_path(self, path: str) -> None:
        self._op("fsync", path)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            self.fsyncs += 1
        finally:
            os.close(fd)

    def fsync_dir(self, directory: str) -> None:
        self._op("fsync_dir", directory)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
            self.fsyncs += 1
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        self._op("rename", dst)
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        self._op("unlink", path)
        os.unlink(path)

    def append(self, path: str, data: bytes, *, sync: bool = True) -> int:
        """Append ``data`` to ``path`` (created if missing); return the new size."""
        self._op("append", path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if sync:
                self._op("fsync", path)
                os.fsync(fd)
                self.fsyncs += 1
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def truncate(self, path: str, size: int) -> None:
        self._op("truncate", path)
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            self._op("fsync", path)
            os.fsync(fd)
            self.fsyncs += 1
        finally:
            os.close(fd)

    def makedirs(self, path: str) -> None:
        """Create ``path`` and missing parents, each made durable in its parent."""
        if os.path.isdir(path):
            return
        parent = os.path.dirname(path.rstrip(os.sep)) or "."
        self.makedirs(parent)
        self._op("mkdir", path)
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            return
        self.fsync_dir(parent)

    def write_durable(self, path: str, data: bytes) -> None:
        """Replace ``path`` atomically and durably: temp, fsync, rename, fsync dir."""
        directory = os.path.dirname(path)
        tmp = self.write_tmp(directory, data)
        try:
            self.rename(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self.fsync_dir(directory)


OS_IO = FileIO()
