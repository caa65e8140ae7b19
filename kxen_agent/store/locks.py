"""Cross-process, cross-thread locks on lock files: group locks and the store lock.

POSIX ``fcntl`` locks belong to a (process, file) pair: a second thread of
the same process "gets" a lock its sibling already holds, and closing *any*
descriptor of the file drops the lock. So every lock file is opened once
per process, by one ``fasteners`` lock object that keeps its descriptor
open across holds (:class:`_KeptLock`, :class:`_KeptReaderWriterLock`:
``fasteners``' own classes, whose open and close at each hold were most of
a step's locking time, with the close deferred), paired with a
process-wide :class:`threading.Lock` per file; nothing else in kxen-agent
opens a lock file that exists (``objects_spec.md`` §8; the seam creating a
missing one is below). A holder that dies loses its ``fcntl`` lock with its
process, so a crash never leaves a lock held; the lock file itself staying
behind is harmless.

:class:`FileLock` (:func:`lock_for`, :func:`file_lock`) is the exclusive
lock of §8.1 (a ref group's, a run lease's, gc's); :class:`StoreLock`
(:func:`store_lock`) is the store-wide reader/writer lock of §8.2.

Kept open, checked at each hold (§8.1). A lock file is found by the
device and inode one ``stat`` of its path names (a :class:`_LockFile`
each), so every path of one file (a state dir reached through a symlink)
finds the same thread lock and descriptor. The descriptor is used only
while the path still names the file it was opened on: exact, since an
inode with an open descriptor is never reused, so a lock file replaced by
hand is opened anew rather than locked through the old descriptor. A
process keeps at most :data:`KEEP_OPEN` lock files open; past that it
closes the least recently used ones no thread holds (closing drops
nothing then). A child made by ``fork`` inherits no ``fcntl`` lock: it
starts with empty registries (:func:`_after_fork`), never closing what it
inherited (the descriptors are the parent's open files too, but closing
one in the child would only drop the child's own locks, of which it has
none; they are left to ``exec``, which closes them: ``O_CLOEXEC``).

Lock files and the I/O seam. A missing lock file (and its directory, if
that is missing too) is created through the store's :class:`~.fsio.FileIO`
(:meth:`~.fsio.FileIO.ensure_file`: a ``create`` operation that tracing
and fault injection see), under a process-wide guard so two threads never
both create it; the ``stat`` at each hold goes through the seam too.
``fasteners`` itself opens the file, once, since the ``fcntl`` lock lives
on the descriptor it keeps. What stays outside the seam is harmless: that
open, of a file that exists (so it changes nothing on disk), and, only if
the file or its directory is removed by hand between the seam's check and
the open (the store removes neither), ``fasteners`` making them again
itself. A lock file carries nothing (§8.1: empty, never fsynced, never
deleted), which is also why the crash simulator leaves lock files out of
its model. The seam opens a lock file only to create it, when nothing is
at its path, so this process cannot hold a lock on that file, which
closing the seam's descriptor would drop. This module never removes a
lock file and never writes into one.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator


from kxen_agent.errors import KxenError

from .fsio import OS_IO, FileIO

__all__ = ["FileLock", "GATE_WAIT_S", "KEEP_OPEN", "LockBusy", "StoreLock", "file_lock", "lock_for",
           "store_lock"]


class LockBusy(KxenError):
    """Another process (or thread) holds the lock and the wait ran out."""

    exit_code = 75

    def __init__(self, path: str, waited: float) -> None:
        super().__init__(
            f"lock {path} is held by another process (waited {waited:.1f}s); "
            "retry when it finishes — a crashed holder releases it automatically"
        )
        self.path = path


# ------------------------------------------------------------------ fasteners, kept open

_kept_classes: tuple[type, type] | None = None


def _fasteners() -> tuple[type, type]:
    """The two kept ``fasteners`` lock classes (made at first use: a command that takes no lock
    does not pay for the import)."""
    global _kept_classes
    if _kept_classes is None:
        import fasteners
        from fasteners.process_mechanism import _interprocess_reader_writer_mechanism as rw_mechanism

        class _Kept:
            """A ``fasteners`` lock whose lock file stays open between holds (mixed into both kinds).

            ``fasteners`` opens the file (making its directory) at every
            acquire and closes it at every release; here the first acquire
            opens it and the release leaves it open (:meth:`close_kept`
            closes it, when no thread of this process holds it).
            """

            lockfile: Any

            def _do_open(self) -> None:
                if self.lockfile is None or self.lockfile.closed:
                    super()._do_open()  # type: ignore[misc]

            def _do_close(self) -> None:
                pass  # kept: closing any descriptor of the file would drop this process's locks on it anyway

            def close_kept(self) -> None:
                super()._do_close()  # type: ignore[misc]

        class _KeptLock(_Kept, fasteners.InterProcessLock):
            """``fasteners.InterProcessLock``, its file kept open."""

        class _KeptReaderWriterLock(_Kept, fasteners.InterProcessReaderWriterLock):
            """``fasteners.InterProcessReaderWriterLock``, its file kept open."""

            def try_once(self, exclusive: bool) -> bool:
                """One attempt without waiting, by the mechanism ``fasteners`` retries (its stopwatch and
                backoff are for a lock that is busy: :meth:`StoreLock._take` goes to them then)."""
                self._do_open()
                return rw_mechanism.trylock(self.lockfile, exclusive)

            def unlock_kept(self) -> None:
                rw_mechanism.unlock(self.lockfile)

        _kept_classes = (_KeptLock, _KeptReaderWriterLock)
    return _kept_classes


def _open_kept(ipl: Any, key: tuple[int, int], io: FileIO) -> bool:
    """Open ``ipl``'s file if it is not open; False if the file opened is not the one ``key`` names.

    The path was ``stat``-ed to find ``key``; a file replaced by hand in
    between is not this one: its descriptor goes to :data:`_strays`, since
    this process may hold a lock on that file through another descriptor.
    """
    f = ipl.lockfile
    if f is not None and not f.closed:
        return True
    ipl._do_open()
    st = io.fstat(ipl.lockfile)
    if (st.st_dev, st.st_ino) != key:
        _strays.append(ipl.lockfile)
        ipl.lockfile = None
        return False
    return True


# ------------------------------------------------------------------ lock files of this process

_registry_guard = threading.Lock()
#: Serialises the seam's creation of a missing lock file among this process's threads: two
#: threads creating it at once could have one close its descriptor while the other holds the lock.
_create_guard = threading.Lock()
_registry: dict[str, "FileLock"] = {}
#: The open lock files of this process, by (device, inode): see :class:`_LockFile`.
_files: dict[tuple[int, int], "_LockFile"] = {}
#: Files opened on a lock file replaced between a ``stat`` and the open (by
#: hand: the store never replaces a lock file). Never closed: this process
#: may hold a lock on that file through another descriptor.
_strays: list[Any] = []
#: How many lock files a process keeps open before it closes idle ones
#: (a process that writes many groups must not run out of descriptors).
KEEP_OPEN = 64
_tick = [0]


class _LockFile:
    """One lock file of this process, by (device, inode): its thread lock and its kept ``fasteners`` lock."""

    __slots__ = ("key", "thread_lock", "ipl", "held", "used")

    def __init__(self, key: tuple[int, int], path: str) -> None:
        self.key = key
        self.thread_lock = threading.Lock()
        self.ipl = _fasteners()[0](path)
        self.held = False
        self.used = 0  # a tick of the last hold: the least recently used idle file is closed first

    @property
    def is_open(self) -> bool:
        f = self.ipl.lockfile
        return f is not None and not f.closed


def _stat_key(path: str, io: FileIO) -> tuple[int, int]:
    """(device, inode) of the file at ``path``, created through ``io`` if nothing is there."""
    try:
        st = io.stat(path)
    except FileNotFoundError:
        with _create_guard:
            # Nothing at the path: this process holds no lock on a file
            # there, so the seam's descriptor may close (see the module doc).
            io.ensure_file(path)
        st = io.stat(path)
    return st.st_dev, st.st_ino


def _find(path: str, io: FileIO) -> _LockFile:
    """The :class:`_LockFile` of the file at ``path`` (created through ``io`` if missing)."""
    key = _stat_key(path, io)
    with _registry_guard:
        lf = _files.get(key)
        if lf is None:
            if len(_files) >= KEEP_OPEN:
                _close_idle()
            lf = _files[key] = _LockFile(key, path)
        _tick[0] += 1
        lf.used = _tick[0]
        return lf


def _close_idle() -> None:
    """Close the older half of the idle lock files (called under the registry guard).

    Idle: no thread of this process holds it (its thread lock taken here,
    without waiting, so none can start to meanwhile), hence no ``fcntl``
    lock of this process on it, which is what closing would drop.
    """
    idle = sorted((f for f in _files.values() if not f.held), key=lambda f: f.used)
    for f in idle[:len(idle) // 2 + 1]:
        if f.thread_lock.acquire(blocking=False):
            try:
                if not f.held:
                    f.ipl.close_kept()
                    del _files[f.key]
            finally:
                f.thread_lock.release()


def _try_once(ipl: Any) -> bool:
    """One attempt at ``ipl`` (a kept ``fasteners.InterProcessLock``) without waiting, by its own
    ``trylock``; True if taken. The uncontended hold, nearly every hold, skips the stopwatch, backoff
    and log lines of ``fasteners``' ``acquire``, which a busy lock still goes through."""
    try:
        ipl.trylock()
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    ipl.acquired = True
    return True


class FileLock:
    """One exclusive lock per path per process; get it with :func:`file_lock`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: _LockFile | None = None  # the file held, while held

    def acquire(self, timeout: float | None = None, io: FileIO | None = None) -> None:
        """Take the lock; ``timeout=0`` fails at once, ``None`` waits forever.

        ``io``: the seam that stats the lock file and creates it if missing
        (default: the process-wide :data:`~.fsio.OS_IO`).
        """
        start = time.monotonic()
        deadline = None if timeout is None else start + max(0.0, timeout)
        io = OS_IO if io is None else io
        while True:
            lf = _find(self.path, io)
            if deadline is None:
                got = lf.thread_lock.acquire()
            else:
                rem = deadline - time.monotonic()
                got = lf.thread_lock.acquire(blocking=False) if rem <= 0 else lf.thread_lock.acquire(timeout=rem)
            if not got:
                raise LockBusy(self.path, time.monotonic() - start)
            try:
                if _files.get(lf.key) is not lf or not _open_kept(lf.ipl, lf.key, io):
                    lf.thread_lock.release()  # closed meanwhile, or replaced by hand: look again
                    continue
                if not _try_once(lf.ipl):
                    rem2 = None if deadline is None else max(0.0, deadline - time.monotonic())
                    if not lf.ipl.acquire(blocking=rem2 is None or rem2 > 0, delay=0.002, max_delay=0.05,
                                          timeout=rem2):
                        raise LockBusy(self.path, time.monotonic() - start)
            except BaseException:
                lf.thread_lock.release()
                raise
            lf.held = True
            self._file = lf
            return

    def release(self) -> None:
        lf, self._file = self._file, None
        if lf is None:
            raise RuntimeError(f"lock {self.path} released but not held")
        try:
            lf.ipl.unlock()  # fasteners' own unlock; its release() would only add a log line and the
            lf.ipl.acquired = False  # (kept: no-op) close
        finally:
            lf.held = False
            lf.thread_lock.release()

    @property
    def held(self) -> bool:
        return self._file is not None


def lock_for(path: str) -> FileLock:
    """The process's one :class:`FileLock` for the lock file ``path``.

    Two paths of one file (a state dir reached through a symlink) are two
    objects here but one :class:`_LockFile` underneath, found by inode at
    each hold: they exclude each other, threads included.
    """
    with _registry_guard:
        lock = _registry.get(path)
        if lock is None:
            lock = _registry[path] = FileLock(path)
        return lock


@contextmanager
def file_lock(path: str, timeout: float | None = 30.0, io: FileIO | None = None) -> Iterator[FileLock]:
    """Hold the exclusive lock on ``path`` (created through ``io`` if missing) for a block."""
    lock = lock_for(path)
    lock.acquire(timeout, io)
    try:
        yield lock
    finally:
        lock.release()


# ------------------------------------------------------------------ the store lock (§8.2)

#: How long a writer defers to a gc waiting at the gate before going ahead.
#: The gate gives gc a turn among back-to-back writers; bounding the wait
#: keeps it from deadlocking a writer that holds a ref-group lock while gc
#: waits for another writer that wants that group lock.
GATE_WAIT_S = 1.0


class StoreLock:
    """The store-wide reader/writer lock: writers share it, gc's pruning holds it alone.

    ``locks/gc.lock`` is a ``fasteners`` reader/writer (``fcntl``) lock,
    its file kept open across holds (:class:`_KeptReaderWriterLock`).
    ``fcntl`` locks belong to the process, so a second thread asking for the
    exclusive side would silently convert the process's shared lock: the
    in-process state here (a condition with a count of sharing threads and
    the exclusive owner) decides first, and the file lock is only taken
    when the first thread of this process enters and released when the
    last leaves. Shared holds are re-entrant per thread; a thread holding
    the exclusive side may also enter the shared side (gc writes objects).

    Writer preference: gc takes ``locks/gc-gate.lock`` while it waits for
    the exclusive side, and a writer entering first passes through the gate
    (waiting at most :data:`GATE_WAIT_S`), so a stream of back-to-back
    writers cannot starve gc. One instance per path per process
    (:func:`store_lock`).
    """

    def __init__(self, path: str, gate_path: str) -> None:
        self.path = path
        # The kept fasteners lock of the file now at the path, and that
        # file's (device, inode); made at the first take (see _open).
        self._ipl: Any = None
        self._key: tuple[int, int] | None = None
        self._gate = FileLock(gate_path)  # only this object opens the gate file
        self._cond = threading.Condition()
        self._sharing = 0  # threads of this process inside the shared side
        self._owner: int | None = None  # thread holding the exclusive side
        self._busy = False  # a thread is taking the file lock
        self._local = threading.local()

    def _wait_idle(self, start: float, deadline: float | None, exclusive: bool) -> None:
        # Called with the condition held: wait for the other threads of this process.
        while self._owner is not None or self._busy or (exclusive and self._sharing):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise LockBusy(self.path, time.monotonic() - start)
            self._cond.wait(remaining)

    @contextmanager
    def shared(self, timeout: float | None, io: FileIO | None = None) -> Iterator[None]:
        """Hold the shared side (a writer); ``io`` creates a missing lock file (see the module doc)."""
        me = threading.get_ident()
        depth = getattr(self._local, "depth", 0)
        if depth or self._owner == me:
            self._local.depth = depth + 1
            try:
                yield
            finally:
                self._local.depth = depth
            return
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        with self._cond:
            self._wait_idle(start, deadline, exclusive=False)
            if self._sharing:
                self._sharing += 1
                first = False
            else:
                self._busy = True
                first = True
        if first:
            try:
                self._take(deadline, exclusive=False, start=start, io=io)
            except BaseException:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
                raise
            with self._cond:
                self._busy = False
                self._sharing = 1
                self._cond.notify_all()
        self._local.depth = 1
        try:
            yield
        finally:
            self._local.depth = 0
            with self._cond:
                self._sharing -= 1
                if self._sharing == 0:
                    self._ipl.unlock_kept()
                self._cond.notify_all()

    @contextmanager
    def exclusive(self, timeout: float | None, io: FileIO | None = None) -> Iterator[None]:
        """Hold the exclusive side (gc's prune): no other thread or process is inside the shared side."""
        if getattr(self._local, "depth", 0):
            raise RuntimeError("the store's exclusive lock cannot be taken inside a step or "
                               "Store.shared_lock() (it would wait for itself)")
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        with self._cond:
            self._wait_idle(start, deadline, exclusive=True)
            self._busy = True
        try:
            self._take(deadline, exclusive=True, start=start, io=io)
        except BaseException:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
            raise
        with self._cond:
            self._busy = False
            self._owner = threading.get_ident()
        try:
            yield
        finally:
            with self._cond:
                self._owner = None
                self._ipl.unlock_kept()
                self._cond.notify_all()

    def _take(self, deadline: float | None, *, exclusive: bool, start: float, io: FileIO | None) -> None:
        def remaining() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        gate_wait = remaining()
        if not exclusive:
            gate_wait = GATE_WAIT_S if gate_wait is None else min(gate_wait, GATE_WAIT_S)
        try:
            self._gate.acquire(gate_wait, io)
            gated = True
        except LockBusy:
            if exclusive:
                raise
            gated = False  # gc has waited at the gate long: go ahead (see GATE_WAIT_S)
        try:
            # No thread of this process holds the fcntl lock now (this one
            # is the process's first taker): the seam's descriptor may close.
            self._open(OS_IO if io is None else io)
            ok = self._ipl.try_once(exclusive)
            if not ok:
                rem = remaining()
                ok = (self._ipl.acquire_write_lock if exclusive else self._ipl.acquire_read_lock)(
                    blocking=rem is None or rem > 0, delay=0.002, max_delay=0.05, timeout=rem
                )
        finally:
            if gated:
                self._gate.release()
        if not ok:
            raise LockBusy(self.path, time.monotonic() - start)

    def _open(self, io: FileIO) -> None:
        """Have :attr:`_ipl` open on the file now at :attr:`path` (opened once; anew if it was replaced by hand)."""
        while True:
            key = _stat_key(self.path, io)
            if self._ipl is not None and key == self._key:
                return  # open on the very file at the path: an inode in use is not reused
            if self._ipl is not None and self._ipl.lockfile is not None:
                # Replaced by hand: another StoreLock of this file (another path to it) may hold
                # a lock through the old file, which closing this descriptor would drop.
                _strays.append(self._ipl.lockfile)
            self._ipl = _fasteners()[1](self.path)
            self._key = key
            if _open_kept(self._ipl, key, io):
                return
            self._ipl = self._key = None


_store_locks_guard = threading.Lock()
_store_locks: dict[str, StoreLock] = {}


def store_lock(root: str) -> StoreLock:
    """The process's one :class:`StoreLock` for the state dir ``root``."""
    path = os.path.join(os.path.abspath(root), "locks", "gc.lock")
    with _store_locks_guard:
        lock = _store_locks.get(path)
        if lock is None:
            lock = _store_locks[path] = StoreLock(path, os.path.join(os.path.dirname(path), "gc-gate.lock"))
        return lock


def _after_fork() -> None:
    """In a child made by ``fork``: no ``fcntl`` lock was inherited, so no registry entry holds.

    The thread locks and in-process counts copied from the parent describe
    the parent's threads (a lock one of them held would never be released
    in the child); the child starts afresh. The inherited descriptors are
    left open (see the module doc).
    """
    global _registry_guard, _create_guard, _store_locks_guard
    _registry_guard = threading.Lock()
    _create_guard = threading.Lock()
    _store_locks_guard = threading.Lock()
    _strays.extend(f.ipl.lockfile for f in _files.values() if f.ipl.lockfile is not None)
    _files.clear()
    _registry.clear()
    _store_locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
