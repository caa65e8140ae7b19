"""The one seam through which the store touches the file system.

Every durable step of the store (``objects_spec.md`` §9) is a sequence of
calls on a :class:`FileIO`: write a temporary file and fsync it, rename it
into place, fsync the directory. Routing them through one small object lets
tests count fsyncs, record a trace for crash simulation, or fail the N-th
operation, without touching the code that decides *what* to write.

Operations are the mutating primitives ``create`` (a temp file, or a
missing lock file: :meth:`FileIO.ensure_file`), ``write``, ``fsync``,
``rename``, ``fsync_dir``, ``unlink``, ``append``, ``truncate``, ``mkdir``,
``utime`` (the times gc's grace period is judged by) and ``chmod`` (closing
an old state dir's root, §10.4).
:attr:`FileIO.hook` sees each one *before* it happens (it may raise to
simulate a failing disk); :meth:`FileIO._did` is told of each one *after*
it happened, with its data.

Reads and metadata queries go through the seam too: ``read``, ``open``,
``mmap``, ``stat`` (also ``exists``, ``isdir``, ``islink``, ``getsize``)
and ``listdir`` (also ``scandir``, ``walk``), the kinds in
:data:`READ_OPS`. They have a channel of their own, so that the numbering
of mutating operations (what a fault's N and a crash point count) does
not depend on how often the store looks: :attr:`FileIO.read_hook` sees
each one before it happens (it may raise, as a dying disk fails reads
too), :attr:`FileIO.read_count` counts them. No other module of the store
calls ``os`` (or ``open``, or ``mmap``) on a file: ``tests/store/test_seam.py``
checks it. Two subclasses ship here, as trio ships its test helpers in the
library:

- :class:`TracingIO` records every operation (with the bytes written) as a
  :class:`TraceOp`; ``tests/reliability/crashsim.py`` replays prefixes of
  such a trace to build the states a power loss could leave;
- :class:`FaultyIO` raises ``OSError(ENOSPC or EIO)`` at the N-th
  operation, once or from then on (a full or dying disk).

``KXEN_AGENT_IO_FAULT=ENOSPC@N`` (or ``EIO@N``; a trailing ``+`` makes it
persistent: ``EIO@N+``) makes the process-wide :data:`OS_IO` a
:class:`FaultyIO`, so the same faults can be injected into the installed
CLI. Unset, :data:`OS_IO` is a plain :class:`FileIO`. Reads are not
operations: they change nothing.

Modes (``objects_spec.md`` §10.4). Every file the seam creates is 0600 and
every directory 0700, whatever the umask (which can only take bits away
from those): a transcript is its owner's alone, and another local user
cannot open a lock file to hold a lock on it. A state dir in the shared
mode (:meth:`FileIO.share`) gets 0660 files and 0770 directories with the
set-group-id bit, set with ``fchmod``/``chmod`` after creation since the
umask would otherwise take the group's write bit.
"""

from __future__ import annotations

import errno as _errno
import mmap
import os
import re
import threading
from dataclasses import dataclass
from typing import IO, BinaryIO, Callable, Iterator

__all__ = sorted(
    [
        "FaultyIO",
        "FileIO",
        "PRIVATE_DIR_MODE",
        "PRIVATE_FILE_MODE",
        "SHARED_DIR_MODE",
        "SHARED_FILE_MODE",
        "IOFaultSpecError",
        "IO_FAULT_ENV",
        "MUTATING_OPS",
        "OS_IO",
        "READ_OPS",
        "TraceOp",
        "TracingIO",
        "parse_fault_spec",
    ]
)

#: Every operation name a hook can see.
MUTATING_OPS = ("create", "write", "fsync", "rename", "fsync_dir", "unlink", "append", "truncate", "mkdir", "utime",
                "chmod")

#: Every read or metadata operation a ``read_hook`` can see.
READ_OPS = ("read", "open", "mmap", "stat", "listdir")

#: The environment variable that injects I/O faults into :data:`OS_IO`.
IO_FAULT_ENV = "KXEN_AGENT_IO_FAULT"


#: Modes of what the seam creates (§10.4): private by default, group-shared
#: under a root given to :meth:`FileIO.share` (set-group-id directories, so
#: that every file takes the state dir's group).
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
SHARED_FILE_MODE = 0o660
SHARED_DIR_MODE = 0o2770

#: Read size of :meth:`FileIO.read`: most loose objects fit in one read.
_READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class TraceOp:
    """One completed file-system operation, as :class:`TracingIO` records it.

    ``data`` and ``offset``: the bytes a ``write``/``append`` put in the file
    and where; ``size``: the length a ``truncate`` left; ``dst``: a
    ``rename``'s target (``path`` is its source).
    """

    kind: str
    path: str
    data: bytes = b""
    offset: int = 0
    size: int = 0
    dst: str | None = None


class FileIO:
    """Durable file primitives over ``os``; subclass to trace or inject faults."""

    def __init__(self) -> None:
        self.fsyncs = 0
        #: Operations started (hooked) so far: what a fault's N counts.
        self.op_count = 0
        self.hook: Callable[[str, str], None] | None = None
        #: Read and metadata operations started so far (not counted in ``op_count``).
        self.read_count = 0
        self.read_hook: Callable[[str, str], None] | None = None
        # Roots of state dirs in the shared mode (absolute, each ending in
        # os.sep): almost always none, so a creation pays one empty loop.
        self._shared_roots: tuple[str, ...] = ()

    # -- modes (§10.4)
    def share(self, root: str) -> None:
        """Create files 0660 and directories 02770 at and under ``root`` (a shared state dir)."""
        root = os.path.join(os.path.abspath(root), "")
        if root not in self._shared_roots:
            self._shared_roots += (root,)

    def is_shared(self, path: str) -> bool:
        """Whether ``path`` is a shared state dir given to :meth:`share`, or under one."""
        if not self._shared_roots:
            return False
        path = os.path.join(os.path.abspath(path), "")
        return any(path.startswith(r) for r in self._shared_roots)

    def _new_file(self, path: str, flags: int) -> int:
        """``os.open`` with ``O_CREAT``, in the mode of where ``path`` is (whatever the umask)."""
        if not self.is_shared(path):
            return os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
        fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, SHARED_FILE_MODE)
        try:
            st = os.fstat(fd)
            # The umask took the group's bits (of a file this user owns: one
            # another member made is theirs to set, and it is set already).
            if st.st_mode & 0o777 != SHARED_FILE_MODE and st.st_uid == os.geteuid():
                os.fchmod(fd, SHARED_FILE_MODE)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _new_dir(self, path: str) -> None:
        """``os.mkdir`` in the mode of where ``path`` is (``FileExistsError`` if it exists)."""
        if not self.is_shared(path):
            os.mkdir(path, PRIVATE_DIR_MODE)
            return
        os.mkdir(path, SHARED_DIR_MODE)
        os.chmod(path, SHARED_DIR_MODE)  # mkdir drops set-group-id, the umask the group's bits

    def _read_op(self, op: str, path: str) -> None:
        self.read_count += 1
        if self.read_hook is not None:
            self.read_hook(op, path)

    def _op(self, op: str, path: str) -> None:
        # A test hook sees every operation before it happens: it may record
        # it, or raise OSError(ENOSPC/EIO) to simulate a failing disk.
        self.op_count += 1
        if self.hook is not None:
            self.hook(op, path)

    def _did(self, op: str, path: str, *, data: bytes | memoryview = b"", offset: int = 0, size: int = 0,
             dst: str | None = None) -> None:
        """Called after each operation completed (:class:`TracingIO` records it)."""

    def _fsync_fd(self, fd: int) -> None:
        os.fsync(fd)
        self.fsyncs += 1

    def _discard(self, path: str) -> None:
        """Best-effort removal of a temp file after a failed step.

        It is an ``unlink`` like any other (a disk that keeps failing fails
        it too, and the temp file stays: a stray file fsck lists and gc
        removes), and its error never hides the one being raised.
        """
        try:
            self.unlink(path)
        except OSError:
            pass

    # -- reading and metadata (seen by read_hook; never in the trace: they change nothing)
    def read(self, path: str) -> bytes:
        # os.open/os.read, not open(): no buffered-reader object per call,
        # about half the cost for the small files that loose objects are.
        self._read_op("read", path)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, _READ_CHUNK)
            if not data:
                return b""
            more = os.read(fd, _READ_CHUNK)
            if not more:
                return data
            chunks = [data, more]
            while more:
                more = os.read(fd, _READ_CHUNK)
                chunks.append(more)
            return b"".join(chunks)
        except OSError as e:
            # os.read's errors carry no path (a directory where a file belongs: EISDIR).
            raise OSError(e.errno, e.strerror, path) from None
        finally:
            os.close(fd)

    def open_read(self, path: str) -> BinaryIO:
        """A buffered binary reader of ``path`` (for streams too large to read whole)."""
        self._read_op("open", path)
        return open(path, "rb")

    def map_file(self, path: str) -> "mmap.mmap | bytes":
        """``path`` mapped read-only (``b""`` for an empty file, which mmap refuses).

        The mapping stays valid after the file is unlinked or replaced.
        """
        self._read_op("mmap", path)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size == 0:
                return b""
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)

    def stat(self, path: str, *, follow_symlinks: bool = True) -> os.stat_result:
        self._read_op("stat", path)
        return os.stat(path, follow_symlinks=follow_symlinks)

    def lstat(self, path: str) -> os.stat_result:
        return self.stat(path, follow_symlinks=False)

    def fstat(self, f: "int | IO[bytes]") -> os.stat_result:
        """Metadata of an open file (a descriptor or a file object)."""
        fd = f if isinstance(f, int) else f.fileno()
        self._read_op("stat", f"<fd {fd}>")
        return os.fstat(fd)

    def exists(self, path: str) -> bool:
        self._read_op("stat", path)
        return os.path.exists(path)

    def lexists(self, path: str) -> bool:
        """Whether anything is at ``path``, a dangling symlink included."""
        self._read_op("stat", path)
        return os.path.lexists(path)

    def isdir(self, path: str) -> bool:
        self._read_op("stat", path)
        return os.path.isdir(path)

    def islink(self, path: str) -> bool:
        self._read_op("stat", path)
        return os.path.islink(path)

    def realpath(self, path: str) -> str:
        """``path`` with every symlink resolved (lstat and readlink of each part)."""
        self._read_op("stat", path)
        return os.path.realpath(path)

    def getsize(self, path: str) -> int:
        return self.stat(path).st_size

    def listdir(self, path: str) -> list[str]:
        self._read_op("listdir", path)
        return os.listdir(path)

    def scandir(self, path: str, *, limit: int | None = None) -> list[os.DirEntry[str]]:
        """The entries of ``path`` (a list: the directory handle is closed on return).

        ``limit``: stop listing after that many entries (a caller that only
        needs to know whether a directory is small reads no more of a large one).
        """
        self._read_op("listdir", path)
        with os.scandir(path) as it:
            if limit is None:
                return list(it)
            out = []
            for entry in it:
                if len(out) >= limit:
                    break
                out.append(entry)
            return out

    def walk(self, root: str, onerror: Callable[[OSError], None] | None = None
             ) -> Iterator[tuple[str, list[str], list[str]]]:
        """``os.walk`` (top-down, symlinks not followed), each directory listing seen by the seam."""
        self._read_op("listdir", root)
        for dirpath, dirnames, filenames in os.walk(root, onerror=onerror):
            yield dirpath, dirnames, filenames
            for d in dirnames:
                self._read_op("listdir", os.path.join(dirpath, d))

    # -- writing
    def ensure_file(self, path: str) -> bool:
        """Create ``path`` empty if nothing is there (a lock file); True if this call created it.

        A ``create`` operation, seen by the hooks only when the file is
        missing; not fsynced, since a lock file carries nothing
        (``objects_spec.md`` §8.1). The descriptor is closed at once, which
        would drop an ``fcntl`` lock this process held on the file: callers
        (:mod:`.locks`) ensure a lock file only while this process holds
        no lock on it.
        """
        if self.lexists(path):
            return False
        parent = os.path.dirname(path)
        if parent and not self.isdir(parent):
            # A lock directory removed by hand: made again, durably, where
            # fasteners would have made it without a barrier.
            self.makedirs(parent)
        self._op("create", path)
        os.close(self._new_file(path, os.O_WRONLY))
        self._did("create", path)
        return True

    def utime(self, path: str, times: tuple[float, float] | None = None) -> None:
        """Set ``path``'s access and modification times (now, by default).

        gc's grace period reads object ages from mtimes, so an mtime the
        store sets is a mutating operation like any other.
        """
        self._op("utime", path)
        os.utime(path, times)
        self._did("utime", path)

    def chmod(self, path: str, mode: int) -> None:
        """Set ``path``'s permission bits (a state dir made 0755 before §10.4, closed to 0700)."""
        self._op("chmod", path)
        os.chmod(path, mode)
        self._did("chmod", path)

    def write_tmp(self, directory: str, data: bytes, *, sync: bool = True, prefix: str = "tmp_") -> str:
        """Create a new uniquely named file in ``directory`` holding ``data``."""
        # os.urandom, not secrets.token_hex: the secrets module costs every command's start-up.
        path = os.path.join(directory, f"{prefix}{os.urandom(8).hex()}")
        self._op("create", path)
        fd = self._new_file(path, os.O_WRONLY | os.O_EXCL)
        self._did("create", path)
        try:
            view = memoryview(data)
            offset = 0
            while view:
                self._op("write", path)
                n = os.write(fd, view)
                self._did("write", path, data=view[:n], offset=offset)
                offset += n
                view = view[n:]
            if sync:
                self._op("fsync", path)
                self._fsync_fd(fd)
                self._did("fsync", path)
        except BaseException:
            os.close(fd)
            self._discard(path)
            raise
        os.close(fd)
        return path

    def fsync_path(self, path: str) -> None:
        self._op("fsync", path)
        fd = os.open(path, os.O_RDONLY)
        try:
            self._fsync_fd(fd)
        finally:
            os.close(fd)
        self._did("fsync", path)

    def fsync_dir(self, directory: str) -> None:
        self._op("fsync_dir", directory)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._fsync_fd(fd)
        finally:
            os.close(fd)
        self._did("fsync_dir", directory)

    def rename(self, src: str, dst: str) -> None:
        self._op("rename", dst)
        os.rename(src, dst)
        self._did("rename", src, dst=dst)

    def unlink(self, path: str) -> None:
        self._op("unlink", path)
        os.unlink(path)
        self._did("unlink", path)

    def append(self, path: str, data: bytes, *, sync: bool = True) -> int:
        """Append ``data`` to ``path`` (created if missing); return the new size."""
        self._op("append", path)
        fd = self._new_file(path, os.O_WRONLY | os.O_APPEND)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            size = os.fstat(fd).st_size
            self._did("append", path, data=data, offset=size - len(data))
            if sync:
                self._op("fsync", path)
                self._fsync_fd(fd)
                self._did("fsync", path)
            return size
        finally:
            os.close(fd)

    def truncate(self, path: str, size: int) -> None:
        self._op("truncate", path)
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            self._did("truncate", path, size=size)
            self._op("fsync", path)
            self._fsync_fd(fd)
            self._did("fsync", path)
        finally:
            os.close(fd)

    def mkdir(self, path: str) -> bool:
        """Create one directory, *not* yet durable; False if it exists.

        For building many directories under one barrier (the state dir's
        skeleton, §10.3): the caller fsyncs each parent afterwards.
        """
        self._op("mkdir", path)
        try:
            self._new_dir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
            return False
        self._did("mkdir", path)
        return True

    def makedirs(self, path: str, _outer: bool | None = None) -> None:
        """Create ``path`` and missing parents, each made durable in its parent.

        The parents of a shared state dir that are outside it are made as
        ``mkdir -p`` would (0755 less the umask): 0700 would shut the group out.
        """
        if self.isdir(path):
            return
        outer = self.is_shared(path) if _outer is None else _outer
        parent = os.path.dirname(path.rstrip(os.sep)) or "."
        self.makedirs(parent, outer)
        self._op("mkdir", path)
        try:
            if outer and not self.is_shared(path):
                os.mkdir(path, 0o755)
            else:
                self._new_dir(path)
        except FileExistsError:
            return
        self._did("mkdir", path)
        self.fsync_dir(parent)

    def rename_into_place(self, tmp: str, dst: str) -> None:
        """Rename temp file ``tmp`` onto ``dst``; if that fails, remove ``tmp`` (§9.3 rule 10)."""
        try:
            self.rename(tmp, dst)
        except BaseException:
            self._discard(tmp)
            raise

    def write_durable(self, path: str, data: bytes) -> None:
        """Replace ``path`` atomically and durably: temp, fsync, rename, fsync dir."""
        directory = os.path.dirname(path)
        self.rename_into_place(self.write_tmp(directory, data), path)
        self.fsync_dir(directory)


class TracingIO(FileIO):
    """A :class:`FileIO` that records every completed operation in :attr:`trace`.

    ``sync=False`` skips the fsync system calls (they are still hooked,
    counted and recorded): a crash simulator models durability from the
    trace, so the real barriers only cost time.
    """

    def __init__(self, *, sync: bool = True) -> None:
        super().__init__()
        self.sync = sync
        self.trace: list[TraceOp] = []
        self._trace_lock = threading.Lock()  # a lease renewer thread may write too

    def _did(self, op: str, path: str, *, data: bytes | memoryview = b"", offset: int = 0, size: int = 0,
             dst: str | None = None) -> None:
        rec = TraceOp(op, path, bytes(data), offset, size, dst)
        with self._trace_lock:
            self.trace.append(rec)

    def _fsync_fd(self, fd: int) -> None:
        if self.sync:
            os.fsync(fd)
        self.fsyncs += 1

    def mark(self) -> int:
        """The number of operations recorded so far (a crash point)."""
        with self._trace_lock:
            return len(self.trace)


class IOFaultSpecError(ValueError):
    """An I/O fault spec (``KXEN_AGENT_IO_FAULT``) that does not parse.

    Not :class:`kxen_agent.runtime.faults.FaultSpecError`, which is the
    runtime's (``KXEN_AGENT_FAULT``, crash points of the run loop).
    """


_ERRNOS = {"ENOSPC": _errno.ENOSPC, "EIO": _errno.EIO, "EROFS": _errno.EROFS, "EACCES": _errno.EACCES}
_SPEC = re.compile(r"(ENOSPC|EIO|EROFS|EACCES)@([1-9][0-9]*)(\+?)")


class FaultyIO(FileIO):
    """A disk that fails: operation number ``fail_at`` (1-based) raises ``OSError(err)``.

    ``persistent``: every operation after it fails too (a full disk stays
    full); otherwise only that one (a transient error). :meth:`heal` makes
    the disk good again ("space returns"). ``faults`` counts the errors
    raised. ``sync=False`` skips the fsync system calls, as in
    :class:`TracingIO`. ``reads=True`` counts and fails read and metadata
    operations (:data:`READ_OPS`, numbered by ``read_count``) instead of
    mutating ones: a disk whose reads fail.
    """

    def __init__(self, fail_at: int | None, err: int = _errno.ENOSPC, *, persistent: bool = False,
                 sync: bool = True, reads: bool = False) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.err = err
        self.persistent = persistent
        self.sync = sync
        self.reads = reads
        self.faults = 0

    def _maybe_fail(self, n: int, path: str) -> None:
        at = self.fail_at
        if at is not None and (n == at or (self.persistent and n > at)):
            self.faults += 1
            raise OSError(self.err, os.strerror(self.err), path)

    def _op(self, op: str, path: str) -> None:
        super()._op(op, path)
        if not self.reads:
            self._maybe_fail(self.op_count, path)

    def _read_op(self, op: str, path: str) -> None:
        super()._read_op(op, path)
        if self.reads:
            self._maybe_fail(self.read_count, path)

    def _fsync_fd(self, fd: int) -> None:
        if self.sync:
            os.fsync(fd)
        self.fsyncs += 1

    def heal(self) -> None:
        self.fail_at = None


def parse_fault_spec(spec: str) -> tuple[int, int, bool]:
    """``ENOSPC@N``, ``EIO@N``, with ``+`` for persistent: (errno, N, persistent)."""
    m = _SPEC.fullmatch(spec.strip())
    if m is None:
        raise IOFaultSpecError(
            f"{IO_FAULT_ENV}={spec!r} is not ENOSPC@N, EIO@N, EROFS@N or EACCES@N (N >= 1, a trailing '+' keeps failing "
            f"from the N-th operation on); unset it to run normally"
        )
    return _ERRNOS[m.group(1)], int(m.group(2)), m.group(3) == "+"


def _os_io_from_env() -> FileIO:
    spec = os.environ.get(IO_FAULT_ENV, "")
    if not spec:
        return FileIO()
    try:
        err, at, persistent = parse_fault_spec(spec)
    except IOFaultSpecError as e:
        # Refuse at the first write (not at import, which would be a
        # traceback): a misspelt spec must not silently run a fault-free test.
        from kxen_agent.errors import UsageError

        message = str(e)
        io = FileIO()

        def refuse(op: str, path: str) -> None:
            raise UsageError(message)

        io.hook = refuse
        return io
    return FaultyIO(at, err, persistent=persistent)


#: The process-wide FileIO: a plain one unless ``KXEN_AGENT_IO_FAULT`` is set.
OS_IO = _os_io_from_env()
