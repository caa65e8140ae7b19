"""In-process storage: objects, refs and locks in memory, with the disk store's semantics.

:class:`MemoryStore` satisfies :class:`~kxen_agent.store.protocols.Repository`
as :class:`~kxen_agent.store.repo.Store` does, so the session layer and the
run loop can be tested in-process, in milliseconds (dulwich's
``MemoryObjectStore`` and ``DictRefsContainer`` play this part there):

- objects are kept as :class:`~kxen_agent.store.objects.RawObject` in a dict
  keyed by their id, made by the same :func:`~kxen_agent.store.objects.encode_object`
  and read back by the same :func:`~kxen_agent.store.objects.decode_stored`:
  a value has the same id here and on disk;
- refs (:class:`MemoryRefStore`) have the same transactions — atomic over a
  group, compare-and-swap under the group's lock, fences — the same errors
  (``RefConflict``, ``StaleFence``, ``BadRefName``, ``BadRefValue``,
  ``LockBusy``) raised in the same order, and reflogs kept in the very bytes
  the disk store appends (:func:`~kxen_agent.store.refs.format_reflog_line`),
  so a group's ``log_size`` is the same number on both;
- a durable step (:meth:`MemoryStore.step`) is the same :class:`~kxen_agent.store.step.Step`
  value: its objects are stored, and its refs move, together at its commit or
  not at all (a ref transaction is one step, as on disk);
- locks (:class:`MemoryLock`) are ``threading`` locks with the disk locks'
  acquire/timeout rules: one holder whichever thread asks, ``LockBusy`` when
  the wait runs out.

A layer's :class:`~kxen_agent.store.objects.Schema` applies as on disk: its
own writers and readers check shapes (``session.schema.put``/``read``)
over either store, and the disk store calls a schema only in fsck and a
bundle import, which this store has not.

What it must never do: touch the file system (``io`` is kept only for files
a caller writes *outside* the store, such as an export's bundle), pretend to
be durable (it is gone with the process), or be shared between processes
(its locks are a process's). It has no packs, no loose files and no gc:
fsck, gc and bundle import are the disk store's alone. Nothing here knows
what a session is.
"""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Iterable, Iterator


from .fsio import OS_IO, FileIO
from .locks import LockBusy
from .objects import ObjectId, RawObject, decode_kind, encode_object, parse_object
from .refs import (
    ANY,
    CorruptRef,
    RefGroupState,
    ReflogEntry,
    RefUpdate,
    format_reflog_line,
    parse_reflog,
    prepare_transaction,
    validate_group,
    validate_ref_name,
)
from .repo import MissingObject, resolve_object_id
from .step import Step, transaction

__all__ = ["MemoryLock", "MemoryLockBusy", "MemoryLocks", "MemoryRefStore", "MemoryStore"]

_names = itertools.count(1)


# ------------------------------------------------------------------ locks


class MemoryLockBusy(LockBusy):
    """A memory lock is held by another thread and the wait ran out (a :class:`LockBusy`, exit 75)."""

    def __init__(self, path: str, waited: float) -> None:
        super().__init__(path, waited)
        # LockBusy's text speaks of another process; here it is a thread of this one.
        self.args = (f"lock {path} is held by another thread of this process (waited {waited:.1f}s); "
                     "retry when it finishes",)


class MemoryLock:
    """An exclusive in-process lock with :class:`~kxen_agent.store.locks.FileLock`'s rules.

    ``acquire(None)`` waits for ever, ``acquire(0)`` fails at once, any other
    timeout waits that long, then :class:`MemoryLockBusy`. Not re-entrant,
    and not owned by a thread: as with the disk lock, a thread that holds it
    and asks again is refused (or waits for itself), and the holder is
    whoever released last let in. One per name per store (:class:`MemoryLocks`).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def acquire(self, timeout: float | None = None) -> None:
        start = time.monotonic()
        if timeout is None:
            got = self._lock.acquire()
        elif timeout <= 0:
            got = self._lock.acquire(blocking=False)
        else:
            got = self._lock.acquire(timeout=timeout)
        if not got:
            raise MemoryLockBusy(self.path, time.monotonic() - start)

    def release(self) -> None:
        self._lock.release()

    @property
    def held(self) -> bool:
        return self._lock.locked()


class MemoryLocks:
    """The named locks of one memory store: one :class:`MemoryLock` per name (``lock_for``)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._guard = threading.Lock()
        self._locks: dict[str, MemoryLock] = {}

    def lock_for(self, name: str) -> MemoryLock:
        """The one lock named ``name`` (a path relative to a state dir, e.g. ``locks/ns/id.lock``)."""
        with self._guard:
            lock = self._locks.get(name)
            if lock is None:
                lock = self._locks[name] = MemoryLock(f"{self.where}/{name}")
            return lock

    @contextmanager
    def hold(self, name: str, timeout: float | None) -> Iterator[MemoryLock]:
        lock = self.lock_for(name)
        lock.acquire(timeout)
        try:
            yield lock
        finally:
            lock.release()


# ------------------------------------------------------------------ refs


class MemoryRefStore:
    """Ref groups in a dict, with :class:`~kxen_agent.store.refs.RefStore`'s transactions (§6-§7).

    A group's committed state is one immutable :class:`RefGroupState`
    replaced whole at commit, as the disk store renames a ref file in whole:
    a :meth:`read` needs no lock and never sees half a transaction. The
    reflog is appended before the state is replaced, so a reader that reads
    the state first always finds at least ``log_size`` bytes of reflog.
    """

    def __init__(self, where: str, locks: MemoryLocks, lock_timeout: float = 30.0, open_step: Any = None) -> None:
        self.where = where
        # (group, fence) -> an entered Step of the owning MemoryStore: what transaction() commits with.
        self._open_step = open_step
        self.lock_timeout = lock_timeout
        self._locks = locks
        self._states: dict[str, RefGroupState] = {}
        self._logs: dict[str, bytearray] = {}

    @staticmethod
    def _lock_name(group: str) -> str:
        ns, gid = validate_group(group).split("/")
        return f"locks/{ns}/{gid}.lock"  # the disk store's lock file, relative to its state dir

    def read(self, group: str) -> RefGroupState:
        st = self._states.get(validate_group(group))
        if st is None:
            return RefGroupState(group)
        # The stored state is never changed, but its dict could be by a caller.
        return RefGroupState(group, dict(st.refs), st.fence, st.log_size, st.deleted_ns, True)

    def get(self, group: str, name: str) -> bytes | None:
        return self.read(group).refs.get(validate_ref_name(name))

    def reflog(self, group: str, state: RefGroupState | None = None) -> list[ReflogEntry]:
        if state is None:
            state = self.read(group)
        elif state.group != group:
            raise ValueError(f"state of {state.group} given for the reflog of {group}")
        where = f"{self.where}/logs/{group}"
        data = bytes(self._logs.get(group, b""))
        if len(data) < state.log_size:
            # Only a group removed and made again since ``state`` was read.
            raise CorruptRef(f"reflog {where} is shorter ({len(data)} bytes) than its ref state records ({state.log_size})")
        return parse_reflog(data[: state.log_size], where)

    def groups(self, namespace: str | None = None) -> Iterator[str]:
        names = [g for g in list(self._states) if namespace is None or g.split("/", 1)[0] == namespace]
        # The disk store lists namespace directories, then each one's groups.
        yield from sorted(names, key=lambda g: g.split("/", 1))

    def lock(self, group: str, timeout: float | None = None):
        """The group's lock, for callers that must read-decide-write atomically."""
        return self._locks.hold(self._lock_name(group), self.lock_timeout if timeout is None else timeout)

    def transaction(
        self,
        group: str,
        updates: Iterable[RefUpdate],
        *,
        reason: str,
        fence: int | None = None,
        new_fence: int | None = None,
        deleted_ns: Any = ANY,
    ) -> RefGroupState:
        """Apply ``updates`` to ``group`` all together or not at all: one step of them (see the disk ``RefStore``)."""
        if self._open_step is None:
            raise RuntimeError("this MemoryRefStore belongs to no MemoryStore: it has no steps to commit with")
        return transaction(self._open_step, group, updates, reason=reason, fence=fence, new_fence=new_fence,
                           deleted_ns=deleted_ns)

    def commit_locked(self, group: str, updates: list[RefUpdate], reason: str, fence: int | None,
                      new_fence: int | None, deleted_ns: Any, add_objects: Any = None) -> RefGroupState:
        """Commit one step (``MemoryStore.step``'s commit): the caller holds the group's lock.

        ``add_objects()`` stores the step's objects once the step is judged
        good, before its refs are visible: a reader that sees a new ref
        finds what it names.
        """
        # The state read here is the one the compare-and-swap must hold
        # against, whatever the caller saw before.
        cur = self._states.get(group) or RefGroupState(group)
        refs, olds, out_fence, out_deleted = prepare_transaction(cur, updates, fence, new_fence, deleted_ns)
        if add_objects is not None:
            add_objects()
        now = time.time_ns()
        used_fence = fence if fence is not None else out_fence
        lines = b"".join(
            format_reflog_line(ReflogEntry(old, u.new, now, used_fence, u.name, reason))
            for u, old in zip(updates, olds)
        )
        log = self._logs.setdefault(group, bytearray())
        log += lines  # before the state that counts it (see the class docstring)
        state = RefGroupState(group, refs, out_fence, cur.log_size + len(lines), out_deleted, True)
        self._states[group] = state
        return RefGroupState(group, dict(refs), state.fence, state.log_size, state.deleted_ns, True)

    def remove_group(self, group: str) -> None:
        """Forget a group's refs, fence and reflog (what gc's removal does on disk)."""
        with self.lock(group):
            self._states.pop(group, None)
            self._logs.pop(group, None)


# ------------------------------------------------------------------ the store


class MemoryStore:
    """Objects and refs of one process's memory; see the module docstring.

    ``name`` shows in messages where the disk store shows its state dir
    (``root``: ``memory:<name>``). ``lock_timeout`` is the default wait for
    a ref group's lock, as the disk store's.
    """

    def __init__(self, name: str | None = None, *, lock_timeout: float = 30.0, io: FileIO = OS_IO) -> None:
        self.root = f"memory:{name if name is not None else next(_names)}"
        self.lock_timeout = lock_timeout
        #: For files written outside the store (an export's bundle); the store itself writes none.
        self.io = io
        self.locks = MemoryLocks(self.root)
        self.refs = MemoryRefStore(self.root, self.locks, lock_timeout, open_step=self._transaction_step)
        self._objects: dict[ObjectId, RawObject] = {}
        self._mu = threading.Lock()
        self._steps_engine = _MemorySteps(self)

    def __repr__(self) -> str:
        return f"<MemoryStore {self.root}: {len(self._objects)} objects>"

    # ------------------------------------------------------------ objects

    def put(self, kind: str, value: Any) -> ObjectId:
        """Store ``value`` as an object of ``kind``; return its id."""
        obj = encode_object(kind, value)
        self._add(obj)
        return obj.id

    def put_raw(self, obj: RawObject) -> bool:
        """Store ``obj``; False if it was already there.

        Its bytes are verified against its id here, once: the disk store
        verifies on every read, and this one never reads anything back.
        """
        parse_object(obj.raw, f"{obj.id.hex()} (being stored in {self.root})", expect_id=obj.id)
        return self._add(obj)

    def _add(self, obj: RawObject) -> bool:
        with self._mu:
            if obj.id in self._objects:
                return False
            self._objects[obj.id] = obj
            return True

    def read_raw(self, oid: ObjectId) -> RawObject:
        obj = self._objects.get(oid)
        if obj is None:
            raise MissingObject(oid.hex(), self.root)
        return obj

    def get(self, oid: ObjectId, kind: str | None = None) -> Any:
        """The decoded value of object ``oid``, checking its kind if given."""
        return decode_kind(self.read_raw(oid), kind)  # a fresh value each time: callers may change it

    def has(self, oid: ObjectId) -> bool:
        return oid in self._objects

    def iter_ids(self) -> Iterator[ObjectId]:
        """Every object id, each once, in id order (as the disk store lists loose objects)."""
        with self._mu:
            ids = sorted(self._objects)
        yield from ids

    def resolve(self, text: str) -> ObjectId:
        """An object id from 8 to 64 hex digits (a unique prefix, like git)."""
        return resolve_object_id(text, self.has, self._with_prefix, self.root)

    def _with_prefix(self, h: str) -> list[ObjectId]:
        with self._mu:
            return [oid for oid in self._objects if oid.hex().startswith(h)]

    def batch(self):
        """Nothing to share: every put is complete when it returns."""
        return nullcontext()

    # ------------------------------------------------------------ steps

    def step(self, group: str, *, fence: int | None = None, fail: str = "drop",
             timeout: float | None = None) -> Step:
        """A durable step of ``group`` (:class:`~.step.Step`), with the disk store's semantics.

        ``with store.step(g) as step:`` holds the group's lock for the block.
        """
        return Step(self._steps_engine, group, fence=fence, fail=fail, timeout=timeout)

    @contextmanager
    def _transaction_step(self, group: str, fence: int | None) -> Iterator[Step]:
        with self.step(group, fence=fence) as step:
            yield step


class _MemorySteps:
    """How a :class:`~.step.Step` of a memory store holds its group, commits and keeps objects."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    def hold(self, group: str, timeout: float | None):
        return self._store.refs.lock(group, timeout)  # no gc: the group's lock is all

    def commit(self, group: str, updates: list[RefUpdate], reason: str, fence: int | None, new_fence: int | None,
               deleted: Any, objects: list[RawObject]) -> RefGroupState:
        store = self._store

        def add() -> None:
            for o in objects:
                store._add(o)

        return store.refs.commit_locked(group, updates, reason, fence, new_fence, deleted, add)

    def keep(self, objects: list[RawObject]) -> None:
        for o in objects:
            self._store._add(o)

    def admit(self, obj: RawObject) -> None:
        # As put_raw: verified once, here (the disk store verifies on every read).
        parse_object(obj.raw, f"{obj.id.hex()} (being stored in {self._store.root})", expect_id=obj.id)

    def read_raw(self, oid: ObjectId) -> RawObject:
        return self._store.read_raw(oid)

    def has(self, oid: ObjectId) -> bool:
        return self._store.has(oid)
