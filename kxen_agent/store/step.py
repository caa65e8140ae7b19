"""A durable step as a value: one ref group's new objects and ref edits, committed together.

``store.step(group, fence=...)`` returns a :class:`Step`. The caller puts
the step's new objects in it (:meth:`Step.put`), says how the group's refs
move (:meth:`Step.update`, compare-and-swap), may raise the group's fence
(:meth:`Step.new_fence`) or mark it deleted (:meth:`Step.mark_deleted`),
then :meth:`Step.commit`: on disk, one step-log record holding the objects
and the ref change, made durable by one fsync (``objects_spec.md`` §6.8);
in memory, the same judgement and the same reflog bytes. Until the commit
nothing of the step is visible to anyone but the step itself, which reads
its own objects (:meth:`Step.read_raw`, :meth:`Step.get`, :meth:`Step.has`)
before the store's.

Used as a context manager (``with store.step(g) as step:``), a step holds
the store open for writing (gc does not prune meanwhile) and the group's
lock from entry to exit: what is read inside may be decided on and written
with no other writer in between (a lease grant reads the fence, then
raises it). Without ``with``, :meth:`Step.commit` takes them for itself.

This module holds what both stores share (the value, its rules, the ref
store's ``transaction`` over it); each store supplies how a step holds
its locks and commits (:class:`StepEngine`). Nothing here does I/O.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any, Callable, Iterable, Protocol

from .objects import ObjectId, RawObject, decode_kind, encode_object
from .refformat import ANY, RefGroupState, RefUpdate, _Any, validate_group, validate_update

__all__ = ["FAIL_MODES", "Step", "StepEngine", "transaction"]

#: What a step does with its objects when it ends without a commit (a refused
#: compare-and-swap, a stale fence, a with-block left without committing):
#: ``"drop"`` forgets them (nothing of the step was written); ``"loose"``
#: writes them as plain objects, as a caller that will name them later wants
#: (not when a with-block ends by an exception: then they are dropped).
FAIL_MODES = ("drop", "loose")


class StepEngine(Protocol):
    """What a store gives its steps: how to hold the group, commit, and keep objects."""

    def hold(self, group: str, timeout: float | None) -> AbstractContextManager[Any]:
        """The store open for writing and ``group``'s lock, for the block."""
        ...

    def commit(self, group: str, updates: list[RefUpdate], reason: str, fence: int | None, new_fence: int | None,
               deleted: Any, objects: list[RawObject]) -> RefGroupState:
        """Commit one step, the group held (:meth:`hold`): one record, or nothing and an error."""
        ...

    def keep(self, objects: list[RawObject]) -> None:
        """Store ``objects`` as plain objects (``fail="loose"``)."""
        ...

    def admit(self, obj: RawObject) -> None:
        """Check ``obj`` as the store's ``put_raw`` would before taking it (may raise)."""
        ...

    def read_raw(self, oid: ObjectId) -> RawObject: ...

    def has(self, oid: ObjectId) -> bool: ...


class Step:
    """One durable step of ``group``; see the module docstring.

    ``fence``: the step is refused (``StaleFence``) if the group's fence is
    higher when it commits (a lease that was taken over). ``fail``: one of
    :data:`FAIL_MODES`. ``timeout``: the wait for the group's lock (default:
    the store's). A step commits once; after that, or after a failed commit,
    it takes nothing more.
    """

    def __init__(self, engine: StepEngine, group: str, *, fence: int | None = None, fail: str = "drop",
                 timeout: float | None = None) -> None:
        if fail not in FAIL_MODES:
            raise ValueError(f"fail={fail!r}: expected one of {', '.join(FAIL_MODES)}")
        self.group = validate_group(group)
        self.fence = fence
        self.fail = fail
        self.timeout = timeout
        self._engine = engine
        self._objects: dict[ObjectId, RawObject] = {}
        self._updates: list[RefUpdate] = []
        self._new_fence: int | None = None
        self._deleted: int | None | _Any = ANY
        self._held: ExitStack | None = None
        self._done = False
        #: The group's state as the commit left it (None until then).
        self.state: RefGroupState | None = None

    def __repr__(self) -> str:
        what = "committed" if self.state is not None else "ended" if self._done else "open"
        return f"<Step {self.group} {what}: {len(self._objects)} objects, {len(self._updates)} updates>"

    # ------------------------------------------------------------ holding

    def __enter__(self) -> "Step":
        if self._held is not None or self._done:
            raise RuntimeError(f"step on {self.group} entered twice")
        stack = ExitStack()
        stack.enter_context(self._engine.hold(self.group, self.timeout))
        self._held = stack
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        held, self._held = self._held, None
        try:
            if not self._done:
                self._end(keep=exc_type is None)
        finally:
            if held is not None:
                held.close()

    @property
    def held(self) -> bool:
        """Whether the step holds its group (inside its ``with`` block)."""
        return self._held is not None

    # ------------------------------------------------------------ objects

    def put(self, kind: str, value: Any) -> ObjectId:
        """Encode ``value`` as an object of ``kind`` for this step; its id."""
        obj = encode_object(kind, value)
        self._take(obj, encoded_here=True)
        return obj.id

    def put_raw(self, obj: RawObject) -> bool:
        """Take ``obj`` into this step; False if the step holds it already."""
        return self._take(obj, encoded_here=False)

    def _take(self, obj: RawObject, *, encoded_here: bool) -> bool:
        self._open()
        if obj.id in self._objects:
            return False
        if not encoded_here:  # bytes made here are right by construction
            self._engine.admit(obj)
        self._objects[obj.id] = obj
        return True

    @property
    def objects(self) -> tuple[ObjectId, ...]:
        """The ids of the objects this step holds, in the order they were put."""
        return tuple(self._objects)

    def read_raw(self, oid: ObjectId) -> RawObject:
        """``oid`` from this step's own objects, else from the store."""
        obj = self._objects.get(oid)
        return obj if obj is not None else self._engine.read_raw(oid)

    def get(self, oid: ObjectId, kind: str | None = None) -> Any:
        """The decoded value of ``oid`` (this step's or the store's), checking its kind if given."""
        return decode_kind(self.read_raw(oid), kind)

    def has(self, oid: ObjectId) -> bool:
        return oid in self._objects or self._engine.has(oid)

    def batch(self) -> AbstractContextManager[None]:
        """Nothing to share: the step's objects are made durable by its commit's one fsync.

        So a step stands for an object store to a writer that batches its
        puts (``SessionStore(step).append_messages``).
        """
        return nullcontext()

    # ------------------------------------------------------------ the ref change

    def update(self, ref: str, old: bytes | None | _Any, new: bytes | None) -> None:
        """Set ``ref`` to ``new`` (None deletes it) if it is ``old`` (None: absent; ``ANY``: no compare) at commit."""
        self._open()
        self._updates.append(validate_update(RefUpdate(ref, old, new)))

    def new_fence(self, fence: int) -> None:
        """Raise the group's fence to ``fence`` (it must be higher than the group's at commit)."""
        self._open()
        self._new_fence = fence

    def mark_deleted(self, at_ns: int | None) -> None:
        """Mark the group deleted at ``at_ns`` (nanoseconds), or unmark it (None)."""
        self._open()
        self._deleted = at_ns

    def commit(self, reason: str) -> RefGroupState:
        """Commit the step: its objects and ref change all at once, or nothing (the error is raised).

        On disk, one step-log record and one fsync. The group's state after
        it is returned (and kept in :attr:`state`). On failure
        (``RefConflict``, ``StaleFence``, an I/O error) the objects go as
        ``fail`` says.
        """
        self._open()
        args = (self.group, list(self._updates), reason, self.fence, self._new_fence, self._deleted,
                list(self._objects.values()))
        try:
            if self._held is not None:
                state = self._engine.commit(*args)
            else:
                with self._engine.hold(self.group, self.timeout):
                    state = self._engine.commit(*args)
        except BaseException:
            self._end(keep=True)
            raise
        self._done = True
        self._objects.clear()
        self.state = state
        return state

    def _open(self) -> None:
        if self._done:
            raise RuntimeError(f"step on {self.group} has ended: start another (store.step)")

    def _end(self, *, keep: bool) -> None:
        """End without a commit: the objects go as ``fail`` says (dropped whatever it says if ``keep`` is False)."""
        self._done = True
        objs, self._objects = list(self._objects.values()), {}
        if keep and self.fail == "loose" and objs:
            self._engine.keep(objs)


def transaction(open_step: Callable[[str, int | None], AbstractContextManager[Step]], group: str,
                updates: Iterable[RefUpdate], *, reason: str, fence: int | None = None,
                new_fence: int | None = None, deleted_ns: Any = ANY) -> RefGroupState:
    """A ref store's ``transaction``: one :class:`Step` of ``updates``, committed.

    Names and values are checked first: a refused update locks and writes
    nothing (not even the state dir). ``open_step(group, fence)`` is the
    store's entered step.
    """
    updates = list(updates)
    validate_group(group)
    for u in updates:
        validate_update(u)
    with open_step(group, fence) as step:
        for u in updates:
            step.update(u.name, u.old, u.new)
        if new_fence is not None:
            step.new_fence(new_fence)
        if deleted_ns is not ANY:
            step.mark_deleted(deleted_ns)
        return step.commit(reason)
