"""Cross-process, cross-thread exclusive locks on lock files.

POSIX ``fcntl`` locks belong to a (process, file) pair: a second thread of
the same process "gets" a lock its sibling already holds, and closing *any*
descriptor of the file drops the lock. So every lock here is the pair of a
process-wide :class:`threading.Lock` per path and one ``fasteners``
inter-process lock object per path, and nothing else in kxen-agent opens a
lock file (``objects_spec.md`` §8). A holder that dies loses its ``fcntl``
lock with its process, so a crash never leaves a lock held; the lock file
itself staying behind is harmless.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import fasteners

from kxen_agent.errors import KxenError

__all__ = ["FileLock", "LockBusy", "file_lock", "lock_for"]


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
        self._ipl = fasteners.InterProcessLock(path)

    def acquire(self, timeout: float | None = None) -> None:
        """Take the lock; ``timeout=0`` fails at once, ``None`` waits forever."""
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
    # realpath: a state dir reached through a symlink must map to the same
    # lock object, or two threads could both "hold" one fcntl lock.
    path = os.path.realpath(path)
    with _registry_guard:
        lock = _registry.get(path)
        if lock is None:
            lock = _registry[path] = FileLock(path)
        return lock


@contextmanager
def file_lock(path: str, timeout: float | None = 30.0) -> Iterator[FileLock]:
    """Hold the exclusive lock on ``path`` (created if missing) for a block."""
    lock = lock_for(path)
    lock.acquire(timeout)
    try:
        yield lock
    finally:
        lock.release()
