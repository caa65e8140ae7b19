"""The run lease: at most one active run (or mutation) per Session.

This is the library API that the CLI and any long-running server embedding
kxen-agent must both use (``Lease.acquire``); the rule is in the README's
"Run lease" section and ``objects_spec.md`` §14.

A lease is two things:

1. An exclusive ``fcntl`` lock on ``locks/sessions/<ses>.lease``, held for
   as long as the run lasts. On one host the kernel releases it the moment
   the holder dies (SIGKILL, crash), so a dead holder never blocks anyone.
2. A *grant*: the session group's fence raised by one (a ref transaction),
   and a holder record ``leases/sessions/<ses>`` (pid, host, run, since,
   fence, expiry). Every ref update made for the run carries the fence; the
   store refuses one whose fence is lower than the group's.

Rule for taking a lease: free if the ``fcntl`` lock can be taken and the
holder record (if any) is from this host or has expired; or, when the lock
cannot be taken, if the holder record has expired — a holder that stopped
renewing (paused, partitioned, on another host of a shared volume) loses the
lease at its expiry, and its next write is refused by the fence. The holder
renews its expiry every ``ttl/3`` from a background thread.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass

from kxen_agent.errors import KxenError
from kxen_agent.store import Store
from kxen_agent.store.locks import FileLock, LockBusy, _get as _lock_for  # one lock object per path

__all__ = ["Lease", "LeaseBusy", "LeaseLost", "lease_ttl_s"]

DEFAULT_TTL_S = 30.0


def lease_ttl_s() -> float:
    try:
        return float(os.environ.get("KXEN_AGENT_LEASE_TTL_S", DEFAULT_TTL_S))
    except ValueError:
        return DEFAULT_TTL_S


class LeaseBusy(KxenError):
    """Another process holds the session's run lease."""

    exit_code = 75

    def __init__(self, ses: str, holder: dict | None) -> None:
        if holder:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("sinceNs", 0) / 1e9))
            who = (
                f"pid {holder.get('pid')} on {holder.get('host')}, "
                f"{holder.get('purpose', 'run')} {holder.get('run') or '-'}, since {since}"
            )
        else:
            who = "another process (holder record not written yet)"
        super().__init__(
            f"session {ses} is busy: its run lease is held by {who}; wait for it to finish "
            "or stop that process"
        )
        self.holder = holder


class LeaseLost(KxenError):
    """This process's lease was taken over (it paused past its expiry)."""

    exit_code = 75


@dataclass
class _Record:
    pid: int
    host: str
    run: str | None
    purpose: str
    since_ns: int
    fence: int
    expires_ns: int

    def to_json(self) -> dict:
        return {
            "pid": self.pid,
            "host": self.host,
            "run": self.run,
            "purpose": self.purpose,
            "sinceNs": self.since_ns,
            "fence": self.fence,
            "expiresNs": self.expires_ns,
        }


class Lease:
    """A granted run lease; use as a context manager or call :meth:`release`."""

    def __init__(self, store: Store, ses: str, fence: int, record: _Record, lock: FileLock | None, ttl: float) -> None:
        self.store = store
        self.ses = ses
        self.fence = fence
        self.record = record
        self._lock = lock
        self._ttl = ttl
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.released = False

    # ---------------------------------------------------------------- paths

    @staticmethod
    def lock_path(store: Store, ses: str) -> str:
        return os.path.join(store.root, "locks", "sessions", f"{ses}.lease")

    @staticmethod
    def record_path(store: Store, ses: str) -> str:
        return os.path.join(store.root, "leases", "sessions", ses)

    @staticmethod
    def holder(store: Store, ses: str) -> dict | None:
        try:
            return json.loads(store.io.read(Lease.record_path(store, ses)))
        except (FileNotFoundError, ValueError):
            return None

    # ---------------------------------------------------------------- acquire

    @classmethod
    def acquire(cls, store: Store, ses: str, *, run: str | None = None, purpose: str = "run") -> "Lease":
        """Take the lease now or raise :class:`LeaseBusy` (never waits)."""
        group = f"sessions/{ses}"
        store.ensure_initialized()
        lock_path = cls.lock_path(store, ses)
        store.io.makedirs(os.path.dirname(lock_path))
        lock: FileLock | None = _lock_for(lock_path)
        try:
            lock.acquire(timeout=0)
        except LockBusy:
            lock = None
        host = socket.gethostname()
        ttl = lease_ttl_s()
        try:
            with store.refs.lock(group):
                now = time.time_ns()
                holder = cls.holder(store, ses)
                expired = holder is not None and holder.get("expiresNs", 0) < now
                if lock is None and not expired:
                    raise LeaseBusy(ses, holder)
                if lock is not None and holder is not None and holder.get("host") != host and not expired:
                    # fcntl across hosts of a shared volume may not see the
                    # other host's lock: respect its unexpired record.
                    raise LeaseBusy(ses, holder)
                state = store.refs.read(group)
                fence = state.fence + 1
                store.refs.transaction(group, [], reason=f"lease: {purpose} {run or ''} pid {os.getpid()}",
                                       new_fence=fence, locked=True)
                rec = _Record(os.getpid(), host, run, purpose, now, fence, now + int(ttl * 1e9))
                cls._write_record(store, ses, rec)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        lease = cls(store, ses, fence, rec, lock, ttl)
        lease._start_renewer()
        return lease

    @staticmethod
    def _write_record(store: Store, ses: str, rec: _Record) -> None:
        path = Lease.record_path(store, ses)
        store.io.makedirs(os.path.dirname(path))
        store.io.write_durable(path, json.dumps(rec.to_json()).encode())

    # ---------------------------------------------------------------- renew / release

    def _start_renewer(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self._ttl / 3):
                try:
                    self.renew()
                except KxenError:
                    return

        self._renewer = threading.Thread(target=loop, name=f"lease-{self.ses}", daemon=True)
        self._renewer.start()

    def renew(self) -> None:
        """Push the expiry forward, unless the lease has been taken over."""
        with self.store.refs.lock(f"sessions/{self.ses}"):
            cur = self.holder(self.store, self.ses)
            if cur is None or cur.get("fence") != self.fence:
                raise LeaseLost(f"run lease of session {self.ses} was taken over by another process")
            self.record.expires_ns = time.time_ns() + int(self._ttl * 1e9)
            self._write_record(self.store, self.ses, self.record)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if another process now holds the lease."""
        if self.store.refs.read(f"sessions/{self.ses}").fence != self.fence:
            raise LeaseLost(f"run lease of session {self.ses} was taken over by another process")

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(timeout=5)
        try:
            with self.store.refs.lock(f"sessions/{self.ses}"):
                cur = self.holder(self.store, self.ses)
                if cur is not None and cur.get("fence") == self.fence:
                    path = self.record_path(self.store, self.ses)
                    self.store.io.unlink(path)
                    self.store.io.fsync_dir(os.path.dirname(path))
        finally:
            if self._lock is not None:
                self._lock.release()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
