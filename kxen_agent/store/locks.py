"""Cross-process, cross-thread locks on lock files: group locks and the store lock.

POSIX ``fcntl`` locks belong to a (process, file) pair: a second thread of
the same process "gets" a lock its sibling already holds, and closing *any*
descriptor of the file drops the lock. So every lock here is the pair of a
process-wide :class:`threading.Lock` per path and one ``fasteners``
inter-process lock object per path, and nothing else in kxen-agent opens a
lock file that exists (``objects_spec.md`` §8; the seam creating a missing
one is below). A holder that dies loses its ``fcntl``
lock with its process, so a crash never leaves a lock held; the lock file
itself staying behind is harmless.

:class:`FileLock` (:func:`lock_for`, :func:`file_lock`) is the exclusive
lock of §8.1 (a ref group's, a run lease's, gc's); :class:`StoreLock`
(:func:`store_lock`) is the store-wide reader/writer lock of §8.2.

Lock files and the I/O seam. A missing lock file (and its directory, if
that is missing too) is created through the store's :class:`~.fsio.FileIO`
(:meth:`~.fsio.FileIO.ensure_file`: a ``create`` operation that tracing
and fault injection see) before ``fasteners`` opens it. ``fasteners``
itself opens the file, since the ``fcntl`` lock lives on the descriptor it
keeps. What stays outside the seam is harmless: that open, of a file that
exists (so it changes nothing on disk), and, only if the file or its
directory is removed by hand between the seam's check and the open (the
store removes neither), ``fasteners`` making them again itself. A lock file
carries nothing (§8.1: empty, never fsynced, never deleted), which is also
why the crash simulator leaves lock files out of its model. The seam opens
a lock file only to create it, when nothing is at its path, so this
process cannot hold a lock on that file, which closing the seam's
descriptor would drop; it also does so only where no thread of this
process holds the lock (under the per-path thread lock, or as the store
lock's first taker in the process). This module never removes a lock file
and never writes into one.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator


from kxen_agent.errors import KxenError

from .fsio import OS_IO, FileIO

__all__ = ["FileLock", "GATE_WAIT_S", "LockBusy", "StoreLock", "file_lock", "lock_for", "store_lock"]


class LockBusy(KxenError):
    """Another process (or thread) holds the lock and the wait ran out."""

    exit_code = 75

    def __init__(self, path: str, waited: float) -> None:
        super().__init__(
            f"lock {path} is held by another process (waited {waited:.1f}s); "
            "retry when it finishes — a crashed holder releases it automatically"
        )
        self.path = path


_registry_guard = threading.Lock()
_registry: dict[str, "FileLock"] = {}


class FileLock:
    """One exclusive lock per path per process; get it with :func:`file_lock`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._thread_lock = threading.Lock()
        import fasteners  # here: a command that takes no lock does not pay for its import

        self._ipl = fasteners.InterProcessLock(path)

    def acquire(self, timeout: float | None = None, io: FileIO | None = None) -> None:
        """Take the lock; ``timeout=0`` fails at once, ``None`` waits forever.

        ``io``: the seam that creates a missing lock file (default: the
        process-wide :data:`~.fsio.OS_IO`).
        """
        start = time.monotonic()
        if timeout is None:
            got = self._thread_lock.acquire()
        elif timeout <= 0:
            got = self._thread_lock.acquire(blocking=False)
        else:
            got = self._thread_lock.acquire(timeout=timeout)
        if not got:
            raise LockBusy(self.path, time.monotonic() - start)
        try:
            # Under the thread lock: no thread of this process holds the
            # fcntl lock, which closing the seam's descriptor would drop.
            (OS_IO if io is None else io).ensure_file(self.path)
            remaining = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
            ok = self._ipl.acquire(
                blocking=remaining is None or remaining > 0,
                delay=0.002,
                max_delay=0.05,
                timeout=remaining,
            )
            if not ok:
                raise LockBusy(self.path, time.monotonic() - start)
        except BaseException:
            self._thread_lock.release()
            raise

    def release(self) -> None:
        self._ipl.release()
        self._thread_lock.release()

    @property
    def held(self) -> bool:
        return self._ipl.acquired


def lock_for(path: str) -> FileLock:
    """The process's one :class:`FileLock` for the lock file ``path``."""
    # realpath: a state dir reached through a symlink must map to the same
    # lock object, or two threads could both "hold" one fcntl lock.
    path = OS_IO.realpath(path)
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

    ``locks/gc.lock`` is a ``fasteners`` reader/writer (``fcntl``) lock.
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
        import fasteners

        self._ipl = fasteners.InterProcessReaderWriterLock(path)
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
                    self._ipl.release_read_lock()
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
                self._ipl.release_write_lock()
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
            (OS_IO if io is None else io).ensure_file(self.path)
            rem = remaining()
            ok = (self._ipl.acquire_write_lock if exclusive else self._ipl.acquire_read_lock)(
                blocking=rem is None or rem > 0, delay=0.002, max_delay=0.05, timeout=rem
            )
        finally:
            if gated:
                self._gate.release()
        if not ok:
            raise LockBusy(self.path, time.monotonic() - start)


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
