"""What a store must do for the layers above: the object store and the ref store as protocols.

Two implementations satisfy them: the state directory on disk
(:class:`~kxen_agent.store.repo.Store`, with its
:class:`~kxen_agent.store.refs.RefStore`) and the in-process
:class:`~kxen_agent.store.memory.MemoryStore` (with its
:class:`~kxen_agent.store.memory.MemoryRefStore`), in the manner of
dulwich's ``DiskObjectStore``/``MemoryObjectStore`` and
``DiskRefsContainer``/``DictRefsContainer``. ``tests/store/test_store_contract.py``
runs one suite against both.

The protocols hold what the session layer (``SessionStore``, the session
schema's ``read``/``put``), the runtime (``Runner``, the run lease) and a
bundle export use — no more. What fsck, gc and a bundle import need beyond
them (loose files, packs, the state dir's skeleton, the exclusive side of
the store lock) belongs to the disk store alone: they take a
:class:`~kxen_agent.store.repo.Store`. Of those, fsck's ref checks and
gc's group removal go through :class:`RefContainer` too.

This module only describes; it never imports an implementation, and like
the rest of the store layer it knows nothing of sessions.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Iterable, Iterator, Protocol, runtime_checkable

from .objects import ObjectId, RawObject
from .refformat import ANY, RefGroupState, ReflogEntry, RefUpdate

__all__ = ["DurableStep", "ExclusiveLock", "ObjectStore", "RefContainer", "Repository"]


@runtime_checkable
class ExclusiveLock(Protocol):
    """An exclusive lock that is neither re-entrant nor owned by a thread's identity.

    ``acquire(timeout)``: ``None`` waits for ever, ``0`` (or less) fails at
    once, anything else waits that many seconds; on failure it raises
    :class:`~kxen_agent.store.locks.LockBusy` naming ``path`` (a lock file,
    or a memory store's name for the lock). A second ``acquire`` from the
    thread already holding it does not succeed: one holder, whoever asks.
    """

    path: str

    def acquire(self, timeout: float | None = None) -> None: ...

    def release(self) -> None: ...

    @property
    def held(self) -> bool: ...


@runtime_checkable
class ObjectStore(Protocol):
    """Immutable, content-addressed objects.

    Guarantees of every implementation:

    - an object's id is BLAKE3-256 of its object bytes
      (``b"<kind> <length>\\0" + body``, ``objects_spec.md`` §3), built by
      :func:`~kxen_agent.store.objects.encode_object`: the same value of the
      same kind has the same id in every store;
    - what :meth:`read_raw` returns is the object the id names (verified);
    - storing an object twice is harmless (the second ``put`` stores nothing
      new); an object is never changed, only (by gc, on disk) removed when
      unreachable.
    """

    @property
    def root(self) -> str:
        """Where the store lives, for messages: the state dir's path, or a memory store's name."""
        ...

    def put(self, kind: str, value: Any) -> ObjectId:
        """Store ``value`` as an object of ``kind``; its id. Raises ``EncodeError`` for a value the codec refuses."""
        ...

    def put_raw(self, obj: RawObject) -> bool:
        """Store an already-encoded object; False if it was there already."""
        ...

    def read_raw(self, oid: ObjectId) -> RawObject:
        """The verified object ``oid``; ``MissingObject`` naming the store if absent, ``CorruptObject`` if damaged."""
        ...

    def get(self, oid: ObjectId, kind: str | None = None) -> Any:
        """The decoded value of ``oid``; ``CorruptObject`` if ``kind`` is given and the object is another kind."""
        ...

    def has(self, oid: ObjectId) -> bool: ...

    def iter_ids(self) -> Iterator[ObjectId]:
        """Every object id, each once."""
        ...

    def resolve(self, text: str) -> ObjectId:
        """The id of 8 to 64 hex digits (a unique prefix, like git).

        ``UsageError`` for text that is not 8 to 64 hex digits,
        ``MissingObject`` if nothing matches, ``AmbiguousId`` (a
        ``UsageError``) if several objects do.
        """
        ...

    def batch(self) -> AbstractContextManager[None]:
        """Share one durability barrier among the puts of the block.

        Nothing put inside may be named by a ref before the block has ended.
        """
        ...


@runtime_checkable
class RefContainer(Protocol):
    """Named pointers to objects, in groups, each group with a fence and a reflog (``objects_spec.md`` §6-§7).

    A group is named ``namespace/id`` (:func:`~kxen_agent.store.refs.validate_group`),
    a ref in it by one to four segments. Guarantees of every implementation:

    - :meth:`transaction` is atomic over all its updates of one group: all
      are committed together, or none is and nothing changes;
    - each update is compare-and-swap: its expected old value (``None``:
      absent; :data:`~kxen_agent.store.refs.ANY`: no compare) is checked
      against the group as it is under the group's lock, not as the caller
      last read it; a mismatch is ``RefConflict`` (expected, found);
    - ``fence``: an update carrying a fence lower than the group's is
      refused with ``StaleFence``; ``new_fence`` raises the group's fence
      and must be higher than it (else ``StaleFence``); the fence never
      goes down while the group exists;
    - every committed update appends one reflog entry (old, new, one time
      for the transaction, the fence it carried — or the group's fence —,
      its name and the reason), in the order of the updates; the group's
      state records the committed reflog length (``log_size``), and
      :meth:`reflog` returns exactly the entries within it;
    - a bad group or ref name is ``BadRefName``, a bad value ``BadRefValue``,
      both raised before anything is locked or written.
    """

    def read(self, group: str) -> RefGroupState:
        """The committed state of ``group`` (``exists`` False and empty if it has none); needs no lock."""
        ...

    def get(self, group: str, name: str) -> bytes | None: ...

    def reflog(self, group: str, state: RefGroupState | None = None) -> list[ReflogEntry]:
        """The committed reflog, oldest first; with ``state`` (an earlier :meth:`read`), cut at its ``log_size``."""
        ...

    def groups(self, namespace: str | None = None) -> Iterator[str]:
        """Every group (of ``namespace``) with a committed state, sorted by namespace, then id.

        The disk store also yields any other name it finds among the ref
        files (not a temp file), so that reading it fails loudly in fsck
        and keeps gc from pruning what it might name.
        """
        ...

    def transaction(
        self,
        group: str,
        updates: Iterable[RefUpdate],
        *,
        reason: str,
        fence: int | None = None,
        new_fence: int | None = None,
        deleted_ns: int | None | Any = ANY,
    ) -> RefGroupState:
        """Apply ``updates`` to ``group`` all together or not at all; the new committed state.

        ``deleted_ns``: mark the group deleted (an int), unmark it (None),
        or leave it (``ANY``). One step (:meth:`Repository.step`) of the
        updates: the library API for programs sharing the state dir.
        """
        ...

    def lock(self, group: str, timeout: float | None = None) -> AbstractContextManager[Any]:
        """Hold ``group``'s lock for a read-decide-write; ``LockBusy`` after ``timeout`` (default: the store's)."""
        ...

    def remove_group(self, group: str) -> None:
        """Remove the group's refs, fence and reflog altogether (gc, after the grace period)."""
        ...


@runtime_checkable
class DurableStep(Protocol):
    """One durable step of one ref group (:class:`~kxen_agent.store.step.Step` in both stores).

    Guarantees of every implementation:

    - :meth:`commit` applies every :meth:`update` (each compare-and-swap
      against the group as it is at commit), the raised fence and the
      deleted mark, and stores every object put, all at once or not at all;
      on disk that is one step-log record and one fsync (§6.8);
    - ``fence`` given to ``step()``: a commit while the group's fence is
      higher is refused with ``StaleFence``; a refused or failed commit
      writes nothing, and its objects are dropped (``fail="drop"``) or
      stored as plain objects (``fail="loose"``);
    - until the commit, the step's objects are seen by :meth:`read_raw`,
      :meth:`get` and :meth:`has` of the step only;
    - inside ``with``, the group's lock (and on disk the store's shared
      lock) is held from entry to exit: a read-decide-write in between is
      atomic; without it, :meth:`commit` takes them;
    - a bad ref name or value is refused by :meth:`update`, before
      anything is locked or written; a step commits once.
    """

    group: str
    fence: int | None

    def put(self, kind: str, value: Any) -> ObjectId: ...

    def put_raw(self, obj: RawObject) -> bool: ...

    def read_raw(self, oid: ObjectId) -> RawObject: ...

    def get(self, oid: ObjectId, kind: str | None = None) -> Any: ...

    def has(self, oid: ObjectId) -> bool: ...

    def update(self, ref: str, old: bytes | None | Any, new: bytes | None) -> None: ...

    def new_fence(self, fence: int) -> None: ...

    def mark_deleted(self, at_ns: int | None) -> None: ...

    def commit(self, reason: str) -> RefGroupState: ...

    def __enter__(self) -> "DurableStep": ...

    def __exit__(self, *exc: Any) -> None: ...


@runtime_checkable
class Repository(ObjectStore, Protocol):
    """Objects and refs together: what ``SessionStore`` and ``Runner`` are built on."""

    @property
    def refs(self) -> RefContainer: ...

    def step(self, group: str, *, fence: int | None = None, fail: str = "drop",
             timeout: float | None = None) -> DurableStep:
        """A durable step of ``group``: its new objects and ref change, committed as one (:class:`DurableStep`)."""
        ...
