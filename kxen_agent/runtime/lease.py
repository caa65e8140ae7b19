"""The run lease: at most one active run (or mutation) per Session.

This is the library API that the CLI and any long-running server embedding
kxen-agent must both use (``Lease.acquire``); docs/runs-and-recovery.md, "One run at a
time: the run lease" section documents it for users and embedders.

A lease is three things:

1. A *grant*: under the session's ref-group lock, the group's fence is
   raised by one and a holder record ``leases/sessions/<ses>`` is written
   (pid, host, boot id, run, purpose, since, fence, expiry, whether the
   holder has the ``fcntl`` lock). Every ref update made for the run carries
   the fence; the store refuses one whose fence is lower than the group's
   (:class:`~kxen_agent.store.StaleFence`). The fence is the safety; the two
   things below only decide *when* a new grant may be made.
2. An exclusive ``fcntl`` lock on ``locks/sessions/<ses>.lease`` held for the
   lease's life when it can be had. On one host the kernel drops it the
   moment the holder dies (SIGKILL, crash), so a dead holder is seen at once.
3. An expiry, pushed forward every ``ttl/3`` by a renewer thread
   (``KXEN_AGENT_LEASE_TTL_S``, default 30 s). It is what frees a session
   whose holder is paused (SIGSTOP, a frozen VM) or on another host of a
   shared volume, where ``fcntl`` says nothing reliable.

Rule for a new grant, decided under the group lock from the holder record
(:func:`blocking_reason` is the whole rule):

- no record, or a record whose fence is not the group's current fence (the
  holder released it, or died between raising the fence and writing it):
  free;
- the record's expiry has passed (by the taker's clock): free — the old
  holder is fenced out and its next write is refused;
- recorded on another host (hostname or boot id differ): busy until expiry;
- same host, the holder had the ``fcntl`` lock: free if we could take it
  (the kernel released it, so the holder is dead) or if its pid is gone;
- same host, the holder had no ``fcntl`` lock (it took over from a paused
  holder that still kept it): free iff its pid is gone (or reused).

The lock and the record live in a :class:`LeaseBackend`: the state dir's
files for the disk store (:class:`DiskLeaseBackend`, the layout above,
``objects_spec.md`` §8.3, §15), a lock and a dict for a
:class:`~kxen_agent.store.memory.MemoryStore` (:class:`MemoryLeaseBackend`,
for the threads of one process); the fence is in the ref group either way.
Only the disk backend touches the state dir.

Pids are trusted only within the holder's pid namespace (containers on one
host may share a hostname); elsewhere an unexpired record counts as alive.
A grant taken without the ``fcntl`` lock picks it up at a later renewal, once
the paused holder lets go of it. Limitations: the group lock itself is an
``fcntl`` lock, so a holder paused *inside* a ref transaction blocks grants
(they fail with ``LockBusy``, exit 75) until it continues or dies; hosts on a
shared volume must keep their clocks within ``2*ttl/3`` of each other or a
healthy holder can be fenced out early (never two writers, but a needless
abort).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from typing import Callable, Protocol

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.session.sessions import UnknownSession
from kxen_agent.store import Store
from kxen_agent.store.locks import LockBusy, lock_for  # one lock object per path
from kxen_agent.store.memory import MemoryLock, MemoryStore
from kxen_agent.store.protocols import ExclusiveLock, Repository

__all__ = [
    "DEFAULT_TTL_S",
    "DiskLeaseBackend",
    "Lease",
    "LeaseBackend",
    "LeaseBusy",
    "LeaseLost",
    "MemoryLeaseBackend",
    "RenewedHold",
    "StagedRecord",
    "blocking_reason",
    "lease_backend",
    "lease_ttl_s",
    "start_renewer",
]

DEFAULT_TTL_S = 30.0
#: How long a grant or release waits for the session's ref-group lock, which
#: writers hold for milliseconds; only a holder paused inside a transaction
#: makes this run out.
GROUP_LOCK_WAIT_S = 10.0


def lease_ttl_s() -> float:
    """The lease expiry from ``KXEN_AGENT_LEASE_TTL_S`` (seconds, 0.1 to 86400; default 30).

    The renewer writes the holder record every TTL/3, so a tiny TTL
    (``1e-300`` is a float > 0) would rewrite it in a loop with no pause;
    0.1 s is well below any real use (the tests' shortest is 0.3 s).
    """
    low, high = 0.1, 86_400.0
    raw = os.environ.get("KXEN_AGENT_LEASE_TTL_S")
    if raw is None or raw.strip() == "":
        return DEFAULT_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = -1.0
    if not low <= ttl <= high:
        raise UsageError(f"KXEN_AGENT_LEASE_TTL_S={raw!r} is not a number of seconds from {low:g} to "
                         f"{high:g}; unset it for {DEFAULT_TTL_S:g}")
    return ttl


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def proc_stat(pid: int) -> tuple[bytes, int] | None:
    """(state letter, start time in clock ticks since boot) of a process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parens; fields resume after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _pid_start(pid: int) -> int | None:
    st = proc_stat(pid)
    return None if st is None else st[1]


def pid_alive(pid: object, start: object) -> bool:
    """Whether ``pid`` (of this pid namespace) still names the process that wrote the record."""
    if not isinstance(pid, int) or pid <= 0:
        return True  # unreadable: assume alive, the expiry still frees it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    st = proc_stat(pid)
    if st is None:
        return True  # no /proc: trust kill()
    state, started = st
    # A zombie has no effects left; another start time means the pid was reused.
    return state not in (b"Z", b"X") and (start is None or started == start)


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


_HOST = socket.gethostname()
_BOOT = _boot_id()
_PIDNS = _pid_namespace()


def _since(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


class LeaseBusy(KxenError):
    """Another process (or thread) holds the session's run lease; raised at once, never after waiting.

    ``holder`` is the holder record (a dict, see :meth:`Lease.holder`) or None.
    """

    exit_code = 75

    def __init__(self, ses: str, holder: dict | None, why: str = "") -> None:
        if holder:
            what = holder.get("purpose", "run")
            target = f"run {holder['run']}" if holder.get("run") else "the session"
            doing = target if what == "run" else f"{what} of {target}"
            left = (holder.get("expiresNs", 0) - time.time_ns()) / 1e9
            who = (
                f"pid {holder.get('pid')} on host {holder.get('host')} ({doing}, since "
                f"{_since(holder.get('sinceNs', 0))}, expires in {max(left, 0):.0f}s unless renewed)"
            )
        else:
            who = "another process"
        super().__init__(
            f"session {ses} is busy: its run lease is held by {who}{'; ' + why if why else ''}; "
            "wait for it to finish or stop that process (a holder that dies frees the session)"
        )
        self.ses = ses
        self.holder = holder


class LeaseLost(KxenError):
    """This process's lease was taken over: it paused past its expiry and another process was granted it."""

    exit_code = 75

    def __init__(self, ses: str, fence: int, current: int) -> None:
        super().__init__(
            f"run lease of session {ses} was taken over by another process (our fence {fence}, "
            f"current {current}); this process must stop writing for it"
        )
        self.ses = ses
        self.fence = fence
        self.current = current


@dataclass
class _Record:
    pid: int
    host: str
    boot: str | None
    pidStart: int | None
    pidns: str | None
    run: str | None
    purpose: str
    sinceNs: int
    fence: int
    expiresNs: int
    ttlMs: int
    locked: bool


def blocking_reason(holder: dict | None, fence: int, *, have_fcntl: bool, now_ns: int) -> str | None:
    """Why ``holder`` still holds the lease (None: a new grant may be made).

    ``fence`` is the group's current fence; ``have_fcntl`` whether the caller
    could take the ``fcntl`` lease lock. This is the whole takeover rule.
    """
    if holder is None or holder.get("fence") != fence:
        return None
    if holder.get("expiresNs", 0) <= now_ns:
        return None
    if holder.get("host") != _HOST or holder.get("boot") != _BOOT:
        return "it is on another host: it frees the session when it ends or at its expiry"
    # Same kernel: fcntl locks are shared. Pids mean something only in the
    # same pid namespace (containers on one host may share a hostname).
    pid_known = holder.get("pidns") == _PIDNS
    alive = not pid_known or pid_alive(holder.get("pid"), holder.get("pidStart"))
    if holder.get("locked"):
        # It holds the fcntl lock while it lives. Free lock: it died. Busy
        # lock but a dead pid: another process is mid-grant; the group lock
        # decides between us.
        return None if have_fcntl or not alive else "it is alive"
    return "it is alive" if alive else None


# ---------------------------------------------------------------- where a lease lives


class StagedRecord(Protocol):
    """A holder record written aside, not yet in place (:meth:`LeaseBackend.stage_record`)."""

    def commit(self) -> None:
        """Put it in place of the session's record, whole (called under the group lock)."""
        ...

    def discard(self) -> None:
        """Forget it if it was not committed; never raises."""
        ...


class LeaseBackend(Protocol):
    """Where a session's lease lives besides its ref group: the holder lock and the holder record.

    The fence is in the ref group (any :class:`~kxen_agent.store.protocols.RefContainer`);
    the backend keeps the other two parts. On disk (:class:`DiskLeaseBackend`)
    they are ``locks/sessions/<ses>.lease`` (an ``fcntl`` lock that dies with
    its process) and the record file ``leases/sessions/<ses>``; in memory
    (:class:`MemoryLeaseBackend`) a :class:`~kxen_agent.store.memory.MemoryLock`
    and a dict, shared by every thread using one
    :class:`~kxen_agent.store.memory.MemoryStore`. A record is replaced or
    removed whole: a reader sees the old one or the new one, never a part.
    """

    def holder_lock(self, ses: str) -> ExclusiveLock:
        """The session's holder lock (the one object per session of this process); may prepare the store."""
        ...

    def read_record(self, ses: str) -> bytes | None:
        """The holder record's bytes, or None if there is none."""
        ...

    def write_record(self, ses: str, data: bytes) -> None:
        """Replace the record durably (a grant, under the group lock)."""
        ...

    def stage_record(self, ses: str, data: bytes) -> StagedRecord:
        """Write ``data`` aside, outside the group lock (the slow part of a renewal)."""
        ...

    def remove_record(self, ses: str) -> None:
        """Remove the record (a release, under the group lock)."""
        ...

    def sync_records(self, ses: str) -> None:
        """Make the last commit or removal durable (after the group lock is let go)."""
        ...


class _StagedFile:
    def __init__(self, io, tmp: str, path: str) -> None:
        self._io = io
        self._tmp: str | None = tmp
        self._path = path

    def commit(self) -> None:
        assert self._tmp is not None
        self._io.rename(self._tmp, self._path)
        self._tmp = None

    def discard(self) -> None:
        if self._tmp is not None:
            try:
                self._io.unlink(self._tmp)  # through the seam, like every write
            except OSError:
                pass
            self._tmp = None


class DiskLeaseBackend:
    """The lease's files in a state dir (the lock file and the holder record), through the store's I/O seam.

    Every operation is the one the lease made on the files before it had a
    backend, in the same order: fault injection and crash points count the
    same operations.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def holder_lock(self, ses: str) -> ExclusiveLock:
        self.store.ensure_initialized()
        path = Lease.lock_path(self.store, ses)
        self.store.io.makedirs(os.path.dirname(path))
        return lock_for(path)

    def read_record(self, ses: str) -> bytes | None:
        try:
            return self.store.io.read(Lease.record_path(self.store, ses))
        except FileNotFoundError:
            return None

    def write_record(self, ses: str, data: bytes) -> None:
        path = Lease.record_path(self.store, ses)
        self.store.io.makedirs(os.path.dirname(path))
        self.store.io.write_durable(path, data)

    def stage_record(self, ses: str, data: bytes) -> StagedRecord:
        path = Lease.record_path(self.store, ses)
        return _StagedFile(self.store.io, self.store.io.write_tmp(os.path.dirname(path), data), path)

    def remove_record(self, ses: str) -> None:
        self.store.io.unlink(Lease.record_path(self.store, ses))

    def sync_records(self, ses: str) -> None:
        self.store.io.fsync_dir(os.path.dirname(Lease.record_path(self.store, ses)))


class _StagedValue:
    def __init__(self, backend: "MemoryLeaseBackend", ses: str, data: bytes) -> None:
        self._backend, self._ses, self._data = backend, ses, data

    def commit(self) -> None:
        self._backend._records[self._ses] = self._data

    def discard(self) -> None:
        pass


class MemoryLeaseBackend:
    """The lease's holder locks and records in memory, for the threads of one process.

    Over a :class:`~kxen_agent.store.memory.MemoryStore` the rule of
    :func:`blocking_reason` holds as on one host: the holder lock plays the
    ``fcntl`` lock (held for the lease's life), the pid is this process's
    (alive), so a second thread is refused at once with :class:`LeaseBusy`
    naming the holder, and a holder that stops renewing is taken over at
    its expiry with the fence raised. Unlike an ``fcntl`` lock, a thread
    that ends without releasing keeps the holder lock: its lease is freed
    by expiry only.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self._guard = threading.Lock()
        self._locks: dict[str, MemoryLock] = {}
        self._records: dict[str, bytes] = {}

    def holder_lock(self, ses: str) -> ExclusiveLock:
        with self._guard:
            lock = self._locks.get(ses)
            if lock is None:
                lock = self._locks[ses] = MemoryLock(f"{self.where}/locks/sessions/{ses}.lease")
            return lock

    def read_record(self, ses: str) -> bytes | None:
        return self._records.get(ses)

    def write_record(self, ses: str, data: bytes) -> None:
        self._records[ses] = data

    def stage_record(self, ses: str, data: bytes) -> StagedRecord:
        return _StagedValue(self, ses, data)

    def remove_record(self, ses: str) -> None:
        self._records.pop(ses, None)

    def sync_records(self, ses: str) -> None:
        pass


_memory_backends: "weakref.WeakKeyDictionary[MemoryStore, MemoryLeaseBackend]" = weakref.WeakKeyDictionary()
_memory_backends_guard = threading.Lock()


def lease_backend(store: Repository) -> LeaseBackend:
    """The backend of ``store``'s leases: its state dir's files, or (a memory store) its one in-memory backend."""
    if isinstance(store, Store):
        return DiskLeaseBackend(store)
    if isinstance(store, MemoryStore):
        # One per store, so every Runner and Lease over it contends for the same records.
        with _memory_backends_guard:
            backend = _memory_backends.get(store)
            if backend is None:
                backend = _memory_backends[store] = MemoryLeaseBackend(store.root)
            return backend
    where = getattr(store, "root", "?")
    raise TypeError(f"no lease backend is known for {type(store).__name__} ({where}); "
                    "pass one with backend= (Lease.acquire) or leases= (Runner)")


# ---------------------------------------------------------------- the lease


class RenewedHold:
    """What a held lease with a renewer thread keeps (the local :class:`Lease`, the remote one).

    ``_mu`` serialises renew and release (a renewal may be under way while
    the owner releases); ``released`` makes release idempotent and stops
    later renewals.
    """

    def __init__(self) -> None:
        self.released = False
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _end_renewal(self) -> bool:
        """Mark the hold released and stop its renewer; False if it was released already.

        The renewer is waited for, so no renewal runs after this returns —
        unless the caller is the renewer itself (``on_lost`` releasing), which
        cannot wait for itself.
        """
        with self._mu:
            if self.released:
                return False
            self.released = True
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        return True


class Lease(RenewedHold):
    """A granted run lease; use as a context manager or call :meth:`release`.

    ``fence`` goes with every ref update made for the run. ``lost`` is set
    when the renewer finds the lease taken over (the holder paused past its
    expiry); ``on_lost`` (if given) is then called once, from that thread.
    """

    def __init__(self, store: Repository, ses: str, record: _Record, flock: ExclusiveLock, have_fcntl: bool,
                 ttl: float, on_lost: Callable[[], None] | None, backend: LeaseBackend | None = None) -> None:
        self.store = store
        self.backend = backend if backend is not None else lease_backend(store)
        self.ses = ses
        self.fence = record.fence
        self.record = record
        self.ttl = ttl
        self.lost = threading.Event()
        self._flock = flock
        self._have_fcntl = have_fcntl
        self._on_lost = on_lost
        super().__init__()

    @property
    def group(self) -> str:
        return f"sessions/{self.ses}"

    # ---------------------------------------------------------------- paths (the disk backend's)

    @staticmethod
    def lock_path(store: Store, ses: str) -> str:
        return os.path.join(store.root, "locks", "sessions", f"{ses}.lease")

    @staticmethod
    def record_path(store: Store, ses: str) -> str:
        return os.path.join(store.root, "leases", "sessions", ses)

    @staticmethod
    def holder(store: Repository, ses: str, *, backend: LeaseBackend | None = None) -> dict | None:
        """The holder record as written (it may be stale: see :func:`blocking_reason`), or None."""
        data = (backend if backend is not None else lease_backend(store)).read_record(ses)
        if data is None:
            return None
        try:
            rec = json.loads(data)
        except ValueError:
            return None
        # A record that is not ours to read is void; the fence still guards.
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), int) for k in ("fence", "expiresNs", "sinceNs")):
            return None
        return rec

    @staticmethod
    def held(store: Repository, ses: str, *, backend: LeaseBackend | None = None, now_ns: int | None = None) -> bool:
        """Whether a live process holds the lease of ``ses`` now, as a reader sees it.

        Judged from the holder record and the group's fence with the takeover
        rule, taking no lock (a reader never does, and probing the lease lock
        could make a starting run fail as busy): a holder that died on this
        host is seen at once, one on another host at its expiry.
        """
        holder = Lease.holder(store, ses, backend=backend)
        fence = store.refs.read(f"sessions/{ses}").fence
        now = time.time_ns() if now_ns is None else now_ns
        return blocking_reason(holder, fence, have_fcntl=False, now_ns=now) is not None

    # ---------------------------------------------------------------- acquire

    @classmethod
    def acquire(cls, store: Repository, ses: str, *, run: str | None = None, purpose: str = "run",
                ttl: float | None = None, on_lost: Callable[[], None] | None = None,
                backend: LeaseBackend | None = None) -> "Lease":
        """Take the lease of session ``ses`` now or raise :class:`LeaseBusy` (never waits for a holder).

        ``purpose`` names what the holder does (``run``, ``resolve``,
        ``rebind``, ``import``...); ``ttl`` defaults to :func:`lease_ttl_s`;
        ``backend`` to :func:`lease_backend` of ``store``.
        """
        ttl = lease_ttl_s() if ttl is None else ttl
        backend = backend if backend is not None else lease_backend(store)
        group = f"sessions/{ses}"
        flock = backend.holder_lock(ses)
        try:
            flock.acquire(timeout=0)
            have_fcntl = True
        except LockBusy:
            have_fcntl = False  # a live holder, or one paused or remote: the record decides
        try:
            if not have_fcntl:
                # Refuse at once from a snapshot, without queueing on the
                # group lock: both files are replaced whole, and refusing is
                # always safe.
                holder = cls.holder(store, ses, backend=backend)
                why = blocking_reason(holder, store.refs.read(group).fence, have_fcntl=False, now_ns=time.time_ns())
                if why:
                    raise LeaseBusy(ses, holder, why)
            with store.step(group, timeout=GROUP_LOCK_WAIT_S) as step:
                # Decide again under the lock: the snapshot may be stale (the race).
                state = store.refs.read(group)
                if not state.exists or "meta" not in state.refs:
                    raise UnknownSession(ses, store.root)
                now = time.time_ns()
                holder = cls.holder(store, ses, backend=backend)
                why = blocking_reason(holder, state.fence, have_fcntl=have_fcntl, now_ns=now)
                if why:
                    raise LeaseBusy(ses, holder, why)
                fence = state.fence + 1
                rec = _Record(os.getpid(), _HOST, _BOOT, _pid_start(os.getpid()), _PIDNS, run, purpose, now, fence,
                              now + int(ttl * 1e9), int(ttl * 1000), have_fcntl)
                # Fence first: a crash between the two leaves a record whose
                # fence is behind the group's, which the rule reads as free.
                step.new_fence(fence)
                step.commit(f"lease: {purpose} {run or '-'} pid {os.getpid()} on {_HOST}")
                backend.write_record(ses, _record_bytes(rec))
        except BaseException:
            if have_fcntl:
                flock.release()
            raise
        lease = cls(store, ses, rec, flock, have_fcntl, ttl, on_lost, backend)
        lease._start_renewer()
        return lease

    # ---------------------------------------------------------------- renew / check / release

    def _start_renewer(self) -> None:
        def lost() -> None:
            self.lost.set()
            if self._on_lost is not None:
                self._on_lost()

        self._renewer = start_renewer(f"kxen-lease-{self.ses}", self.ttl, self._stop, self.renew, LeaseLost, lost)

    def renew(self) -> None:
        """Push the expiry forward (and take the ``fcntl`` lock if it is free now).

        Raises :class:`LeaseLost` if the lease has been taken over.
        """
        with self._mu:
            if self.released:
                return
            if not self._have_fcntl:
                try:
                    self._flock.acquire(timeout=0)
                    self._have_fcntl = True
                except LockBusy:
                    pass
            self.record.expiresNs = time.time_ns() + int(self.ttl * 1e9)
            self.record.locked = self._have_fcntl
            # The slow part (write, fsync) happens outside the group lock, so
            # a holder paused mid-renewal almost never sits inside it.
            staged = self.backend.stage_record(self.ses, _record_bytes(self.record))
            try:
                with self.store.refs.lock(self.group, timeout=self.ttl / 3):
                    # Under the lock, so a stale holder never overwrites a
                    # newer holder's record.
                    current = self.store.refs.read(self.group).fence
                    if current != self.fence:
                        raise LeaseLost(self.ses, self.fence, current)
                    staged.commit()
            finally:
                staged.discard()
            self.backend.sync_records(self.ses)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if another process now holds the lease (a cheap read, no lock)."""
        current = self.store.refs.read(self.group).fence
        if current != self.fence:
            raise LeaseLost(self.ses, self.fence, current)

    def release(self) -> None:
        """Give the lease back; idempotent. Never removes a newer holder's record."""
        if not self._end_renewal():
            return
        try:
            removed = False
            with self.store.refs.lock(self.group, timeout=GROUP_LOCK_WAIT_S):
                cur = self.holder(self.store, self.ses, backend=self.backend)
                if cur is not None and cur.get("fence") == self.fence:
                    self.backend.remove_record(self.ses)
                    removed = True
            if removed:
                self.backend.sync_records(self.ses)
        except (LockBusy, OSError):
            # The record stays: on this host it is void once the fcntl lock
            # or the process is gone, elsewhere at its expiry.
            pass
        finally:
            with self._mu:
                if self._have_fcntl:
                    self._have_fcntl = False
                    self._flock.release()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def start_renewer(name: str, ttl: float, stop: threading.Event, renew: Callable[[], None],
                  lost: type[BaseException], on_lost: Callable[[], None]) -> threading.Thread:
    """A daemon thread that calls ``renew`` every ``ttl``/3 until ``stop`` is set (a lease's renewer).

    ``renew`` raising ``lost`` ends it, after ``on_lost()``. Any other
    :class:`KxenError` or ``OSError`` is transient (a lock busy, an I/O or
    network error): it tries again after min(``ttl``/3, 0.5 s); the lease
    is lost only if that goes on past its expiry and someone takes it over.
    """

    def loop() -> None:
        interval = ttl / 3
        while not stop.wait(interval):
            try:
                renew()
                interval = ttl / 3
            except lost:
                on_lost()
                return
            except (KxenError, OSError):
                interval = min(ttl / 3, 0.5)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


def _record_bytes(rec: _Record) -> bytes:
    return json.dumps(asdict(rec), sort_keys=True).encode()
