"""Mutable refs: named pointers to objects, grouped, with a reflog each group.

A *ref group* is the unit of locking and of atomicity: all refs of one group
live in one small text file, so a transaction over several refs of a group
is one atomic rename (``objects_spec.md`` §6-§7). A group is named by two
path segments (``ns/id``, e.g. one per session); a ref inside it by one to
four more.

An update is compare-and-swap: under the group's lock, the file is re-read
(another process may have moved a ref since the caller looked) and every
expected old value must match. Every committed update also appends to the
group's reflog; the ref file records how long the committed reflog is, so a
reflog tail written by a transaction that crashed before its rename is
recognised as uncommitted and cut off by the next writer.

Each group carries a *fence*: a number that only increases. An update made
with a fence lower than the group's current one is refused (:class:`StaleFence`)
— this is what stops a paused lease holder from writing after its lease
was given to another process.

A transaction is one durable step (:mod:`.step`, ``Store.step``) of its
updates; the step logs (:mod:`.steps`) belong to the store, which hands
them to its ref store. The byte formats of the ref file and the reflog,
and the rules for names and values, are :mod:`.refformat`'s (pure, no
I/O; imported from here too).

Every file-system call, listings and sizes included, goes through the
store's :class:`~.fsio.FileIO`; nothing here calls ``os`` on a file.
"""

from __future__ import annotations

import os
import time
from typing import Iterable, Iterator

from kxen_agent.errors import UsageError

from .fsio import FileIO
from .locks import file_lock
from .objects import decode_body, links_of
# The pure formats, names and values live in .refformat; imported from here
# too, as they always were (they are this module's public API).
from .refformat import (  # noqa: F401
    ANY,
    MAX_GENERATION,
    MAX_NUMBER,
    TEMP_NAME,
    TEMP_PREFIX,
    ZERO,
    BadRefName,
    BadRefValue,
    CorruptRef,
    RefConflict,
    RefGroupState,
    ReflogEntry,
    RefUpdate,
    StaleFence,
    _Any,
    clean_reason,
    format_ref_file,
    format_reflog_line,
    parse_ref_file,
    parse_reflog,
    validate_group,
    validate_namespace,
    validate_ref_name,
    validate_update,
)
from .step import transaction
from .steps import CorruptSteps, StepLogs, StepTx, TxUpdate

__all__ = [
    "ANY",
    "BadRefName",
    "BadRefValue",
    "CorruptRef",
    "RefConflict",
    "RefGroupState",
    "RefStore",
    "RefUpdate",
    "ReflogEntry",
    "StaleFence",
    "clean_reason",
    "is_temp_file",
    "prepare_transaction",
    "validate_group",
    "validate_namespace",
    "validate_ref_name",
    "validate_update",
]

#: A record carries at most this many objects, and bytes of them, copied from other groups' logs
#: rather than fsync those logs (§9.3 rule 12): a fork carries its parent's agent and the
#: messages since the parent's last checkpoint, which the checkpoint policy keeps few (§6.8.2).
CARRY_MAX_OBJECTS = 64
CARRY_MAX_BYTES = 1 << 20


def is_temp_file(path: str, io: FileIO) -> bool:
    """Whether ``path`` is a temp file as :meth:`.fsio.FileIO.write_tmp` makes them.

    Named ``tmp_`` and 16 hex digits, and not a directory (asked through
    ``io``); since no segment may begin with ``tmp_`` (§6.1), it can never
    be a ref group's file. One that has vanished counts too: a writer
    renamed it into place between a listing and this check.
    """
    return TEMP_NAME.fullmatch(os.path.basename(path)) is not None and not io.isdir(path)



# ------------------------------------------------------------------ the store


def prepare_transaction(
    cur: RefGroupState, updates: list[RefUpdate], fence: int | None, new_fence: int | None, deleted_ns: "int | None | _Any"
) -> tuple[dict[str, bytes], list[bytes | None], int, int | None]:
    """The prepare step of a ref transaction, pure: judge ``updates`` against ``cur``.

    Returns the group's new refs, each update's old value (a reflog line's
    old value is the ref's value just before that update, so two updates of
    one ref in one transaction chain correctly), the new fence and the new
    deleted mark; raises :class:`StaleFence` or :class:`RefConflict` with
    nothing changed. Every ref store (disk, memory) commits what this
    returns, so they cannot disagree on what a transaction means.
    """
    group = cur.group
    if fence is not None and fence < cur.fence:
        raise StaleFence(group, fence, cur.fence)
    refs = dict(cur.refs)
    olds: list[bytes | None] = []
    for u in updates:
        found = refs.get(u.name)
        if u.old is not ANY and found != u.old:
            raise RefConflict(group, u.name, u.old, found)  # type: ignore[arg-type]
        olds.append(found)
        if u.new is None:
            refs.pop(u.name, None)
        else:
            refs[u.name] = u.new
    out_fence = cur.fence
    if new_fence is not None:
        if new_fence <= cur.fence:
            raise StaleFence(group, new_fence, cur.fence)
        out_fence = new_fence
    out_deleted = cur.deleted_ns if deleted_ns is ANY else deleted_ns
    return refs, olds, out_fence, out_deleted  # type: ignore[return-value]


def _with_own_refs(state: RefGroupState) -> RefGroupState:
    """``dataclasses.replace(state, refs=dict(state.refs))``, without its per-call field introspection."""
    out = object.__new__(type(state))  # a shallow copy of the frozen dataclass (it has no slots)
    out.__dict__.update(state.__dict__)
    out.__dict__["refs"] = dict(state.refs)  # set on the fresh copy only
    return out


class RefStore:
    """Ref groups: ref files under ``<state>/refs``, step logs under ``<state>/steps``, reflogs under ``<state>/logs``.

    A transaction is one record appended to the group's step log (§6.8);
    the ref file and the reflog are rewritten only by a checkpoint, which
    folds the log in once its objects are durable elsewhere.
    """

    def __init__(self, root: str, io: FileIO, steps: StepLogs, lock_timeout: float = 30.0, before_write=None,
                 open_step=None, removed=None) -> None:
        self.root = root
        self.io = io
        self.lock_timeout = lock_timeout
        # Called (with no argument) before the first write, so the state dir
        # is initialised lazily by whoever owns it.
        self._before_write = before_write
        # refs/<ns>, logs/<ns>, steps/<ns> and their tops whose own names
        # this instance has made durable in their parents (see _ensure_dir).
        self._durable_dirs: set[str] = set()
        # The store's step logs (``Store.steps``, which owns them): a group's
        # state is its ref file with its step log's records applied.
        self._steps = steps
        # (group, fence) -> a Step of the owning Store, which transaction()
        # enters and commits (the Store gives it).
        self._open_step = open_step
        # Called with a group's name once its files are gone (the store removes its caches).
        self._removed = removed
        # group -> (base, log, records applied, state): see _apply.
        self._applied: dict[str, tuple] = {}
        # group -> its four paths (validated once): see _paths.
        self._path_cache: dict[str, tuple[str, str, str, str]] = {}

    def _paths(self, group: str) -> tuple[str, str, str, str]:
        """The group's ref file, reflog, step log and lock file (a pure function of the name: kept)."""
        paths = self._path_cache.get(group)
        if paths is None:
            ns, gid = validate_group(group).split("/")
            root = self.root
            paths = (os.path.join(root, "refs", ns, gid), os.path.join(root, "logs", ns, gid),
                     os.path.join(root, "steps", ns, gid), os.path.join(root, "locks", ns, gid + ".lock"))
            if len(self._path_cache) >= 4096:
                self._path_cache.clear()
            self._path_cache[group] = paths
        return paths

    def ref_path(self, group: str) -> str:
        return self._paths(group)[0]

    def log_path(self, group: str) -> str:
        return self._paths(group)[1]

    def steps_path(self, group: str) -> str:
        return self._paths(group)[2]

    def lock_path(self, group: str) -> str:
        return self._paths(group)[3]

    def groups(self, namespace: str | None = None) -> Iterator[str]:
        """Every name under ``refs/<ns>/`` except temp files, and every group whose step log is its state.

        Only a temp file (:func:`is_temp_file`) is skipped: no group may be
        named so (§6.1). Anything else is yielded even if it is not a valid
        group (a directory, a bad name), so that reading it fails loudly —
        in fsck, and in gc, which must not prune what an unreadable group
        might keep alive (§6.2). A group that has no ref file yet lives in
        its step log alone (generation 0, §6.8).
        """
        io = self.io
        base = os.path.join(self.root, "refs")
        names: set[str] = set()
        namespaces = [namespace] if namespace else sorted(io.listdir(base)) if io.isdir(base) else []
        for ns in namespaces:
            d = os.path.join(base, ns)
            if not io.isdir(d):
                continue
            for gid in io.listdir(d):
                if is_temp_file(os.path.join(d, gid), io):
                    continue
                names.add(f"{ns}/{gid}")
        for g in self._steps.groups(namespace):
            if g in names:
                continue
            try:
                if self.read(g).exists:
                    names.add(g)
            except (CorruptRef, UsageError):
                names.add(g)  # fsck must see it
        for g in sorted(names, key=lambda g: g.split("/", 1)):
            yield g

    def _read_base(self, group: str) -> RefGroupState:
        path = self.ref_path(group)
        try:
            data = self.io.read(path)
        except FileNotFoundError:
            return RefGroupState(group)
        except OSError as e:  # a directory, no permission: not a ref file we can use
            raise CorruptRef(f"cannot read ref file {path}: {e.strerror}") from None
        return parse_ref_file(data, group, path)

    def read(self, group: str) -> RefGroupState:
        """The committed state; consistent without the lock (see :meth:`read_with_log`)."""
        return self.read_with_log(group)[0]

    def read_with_log(self, group: str):
        """The committed state and the step log it was read with (None if the state is the ref file's alone).

        The ref file is read first, then the step log: a checkpoint writes
        the ref file before it starts the log's new generation, so a log of
        a later generation than the ref file read means a checkpoint came
        in between, and the ref file is read again (§6.8).
        """
        for _ in range(8):
            base = self._read_base(group)
            try:
                log = self._steps.load(group)
            except CorruptSteps as e:
                raise CorruptRef(str(e)) from None
            if log is None or log.gen < base.steps_gen:
                return base, None  # no log, or a stale one
            if log.gen > base.steps_gen:
                if not base.exists and self._read_base(group).exists == base.exists:
                    return base, None  # no ref file still: a removed group's leftover log
                continue  # a checkpoint between the two reads: read again
            return self._apply(base, log), log
        raise CorruptRef(f"step log {self._steps.path(group)} keeps naming a generation its ref file does not; run fsck")

    def _apply(self, base: RefGroupState, log) -> RefGroupState:
        """``base`` with ``log``'s committed records applied, from where this instance applied them last.

        A reader re-reads a group every time (40 reads a turn in a run), and
        a log holds thousands of records between checkpoints: applying them
        all each time cost a long run time quadratic in its length.
        """
        n = len(log.records)
        if n == 0:
            return base
        done = self._applied.get(base.group)
        if (done is not None and done[1] is log and done[0] == base and done[0].steps_gen == base.steps_gen
                and done[2] <= n):
            cur, start = done[3], done[2]
        else:
            cur, start = base, 0
        if start == n:
            return _with_own_refs(cur)  # a state handed out is the caller's to change
        refs = dict(cur.refs)
        fence, deleted, size = cur.fence, cur.deleted_ns, cur.log_size
        where = log.path
        for r in log.records[start:]:
            t = r.tx
            if t.fence < fence:
                # No writer commits with a fence below the group's (§6.4 step 4): a stale holder's step
                # in the log is damage, never applied (§6.9 question 7).
                raise CorruptRef(f"step log {where} at offset {r.offset}: the record's fence {t.fence} is below "
                                 f"the group's {fence} (a stale writer's step); run fsck")
            for u in t.updates:
                try:
                    validate_ref_name(u.name)
                except BadRefName as e:
                    raise CorruptRef(f"step log {where} at offset {r.offset}: {e}") from None
                if refs.get(u.name) != u.old:
                    raise CorruptRef(f"step log {where} at offset {r.offset}: ref {u.name!r} was not what the "
                                     "record says it replaced; run fsck")
                if u.new is None:
                    refs.pop(u.name, None)
                else:
                    refs[u.name] = u.new
                size += len(format_reflog_line(ReflogEntry(u.old, u.new, t.time_ns, t.fence, u.name, t.reason)))
            if t.new_fence is not None:
                if t.new_fence <= fence:
                    raise CorruptRef(f"step log {where} at offset {r.offset}: the fence goes down or stays")
                fence = t.new_fence
            if t.deleted != "leave":
                deleted = t.deleted  # type: ignore[assignment]
        out = RefGroupState(base.group, refs, fence, size, deleted, True, base.steps_gen, log, n)
        self._applied[base.group] = (base, log, n, out)
        return _with_own_refs(out)

    def get(self, group: str, name: str) -> bytes | None:
        return self.read(group).refs.get(validate_ref_name(name))

    def reflog(self, group: str, state: RefGroupState | None = None) -> list[ReflogEntry]:
        """The committed reflog (an uncommitted tail past the recorded size is ignored), the step log's after it.

        ``state`` is a :meth:`read` of the group made earlier, to check the
        reflog against that one snapshot (fsck does); else the ref file is
        read now. Either way the reflog is read after the ref file, so a
        commit in between can only make it longer, never shorter (§6.4).
        """
        if state is None:
            state = self.read(group)
        elif state.group != group:
            raise ValueError(f"state of {state.group} given for the reflog of {group}")
        path = self.log_path(group)
        try:
            data = self.io.read(path)
        except FileNotFoundError:
            data = b""
        except OSError as e:
            raise CorruptRef(f"cannot read reflog {path}: {e.strerror}") from None
        tail_size = sum(len(format_reflog_line(e)) for e in state.tail)
        committed = state.log_size - tail_size
        if len(data) < committed:
            raise CorruptRef(f"reflog {path} is shorter ({len(data)} bytes) than its ref file records ({committed})")
        return parse_reflog(data[:committed], path) + list(state.tail)

    def lock(self, group: str, timeout: float | None = None):
        """The group's lock, for callers that must read-decide-write atomically."""
        path = self.lock_path(group)
        if self._before_write:
            self._before_write()
        # A missing lock file, and its directory, are made (durably) when the lock is taken (locks._find).
        return file_lock(path, self.lock_timeout if timeout is None else timeout, self.io)

    def transaction(
        self,
        group: str,
        updates: Iterable[RefUpdate],
        *,
        reason: str,
        fence: int | None = None,
        new_fence: int | None = None,
        deleted_ns: int | None | _Any = ANY,
    ) -> RefGroupState:
        """Apply ``updates`` to ``group`` all together or not at all: one step (``Store.step``) of them.

        ``fence``: refuse with :class:`StaleFence` if the group's fence is
        higher. ``new_fence``: raise the group's fence (never lower it).
        ``deleted_ns``: mark (an int) or unmark (None) the group deleted.
        The library API for programs that share the state dir; the store's
        own writers make their steps with ``Store.step``.
        """
        if self._open_step is None:
            raise RuntimeError("this RefStore belongs to no Store: it has no steps to commit with")
        return transaction(self._open_step, group, updates, reason=reason, fence=fence, new_fence=new_fence,
                           deleted_ns=deleted_ns)

    def commit_locked(self, group: str, updates: list[RefUpdate], reason: str, fence: int | None,
                      new_fence: int | None, deleted_ns: "int | None | _Any", objects: "list | tuple" = ()
                      ) -> RefGroupState:
        """Commit one step's record (``Store.step``'s commit): the caller holds the group's lock.

        ``objects``: the step's new objects, carried in the record.
        """
        # Re-read under the lock: the caller's view may be stale (the race
        # compare-and-swap exists to catch).
        cur, log = self.read_with_log(group)
        if fence is not None and fence < cur.fence:
            raise StaleFence(group, fence, cur.fence)
        refs, olds, out_fence, out_deleted = prepare_transaction(cur, updates, fence, new_fence, deleted_ns)
        if self._before_write:
            self._before_write()
        steps_path = self.steps_path(group)
        self._ensure_dir(os.path.dirname(steps_path))
        now = time.time_ns()
        used_fence = fence if fence is not None else out_fence
        tx = StepTx(now, clean_reason(reason), used_fence, new_fence,
                    "leave" if deleted_ns is ANY else deleted_ns,  # type: ignore[arg-type]
                    tuple(TxUpdate(u.name, old, u.new) for u, old in zip(updates, olds)))
        # What the log already holds is durable with it: not written twice.
        known = log.ids if log is not None else frozenset()
        objs = [o for o in dict((o.id, o) for o in objects).values() if o.id not in known]
        carried = {o.id for o in objs}
        named = [u.new for u in updates if u.new is not None]
        for o in objs:
            if o.kind != "blob":
                named += links_of(o.kind, decode_body(o))
        copies = self._copies(named, carried, log)
        if copies is None:  # too much to carry: make the other logs durable instead (§9.3 rule 12)
            for oid in named:
                if oid not in carried:
                    self._steps.make_durable(oid, but=log)
        else:
            objs += copies
        log = self._steps.append(group, cur.steps_gen, log, tx, objs)  # the commit point
        size = cur.log_size
        for u, old in zip(updates, olds):
            size += len(format_reflog_line(ReflogEntry(old, u.new, now, used_fence, u.name, tx.reason)))
        return RefGroupState(group, refs, out_fence, size, out_deleted, True, cur.steps_gen, log, len(log.records))

    def _copies(self, named: list, carried: set, own) -> list | None:
        """The objects to carry in a record so that nothing it names rests on another log's unsynced record.

        §9.3 rule 12: an object (or one it links to, transitively) found in a
        record of *another* group's step log that no fsync of this instance
        covers may vanish in a power loss if that log's writer died before
        its fsync. Rather than fsync that log (and its directory), the
        record carries copies of those objects — a fork of a session names
        its parent's agent and messages; a copy costs their compressed
        bytes, two fsyncs cost far more. None when they pass
        :data:`CARRY_MAX_OBJECTS` or :data:`CARRY_MAX_BYTES` (the caller
        fsyncs instead): a record stays small. ``own``: the group's log.
        """
        steps = self._steps
        out: list = []
        size = 0
        seen = set(carried)
        todo = [o for o in named if o not in seen]
        while todo:
            oid = todo.pop()
            if oid in seen:
                continue
            seen.add(oid)
            if (own is not None and oid in own.ids) or steps.unsynced(oid, own) is None:
                continue
            obj = steps.read_raw(oid)
            if obj is None:
                continue
            out.append(obj)
            size += len(obj.raw)
            if len(out) > CARRY_MAX_OBJECTS or size > CARRY_MAX_BYTES:
                return None
            if obj.kind != "blob":
                todo += links_of(obj.kind, decode_body(obj))
        return out

    def checkpoint(self, group: str, *, locked: bool = False) -> bool:
        """Fold ``group``'s step log into its ref file and reflog, and start the log's next generation.

        The caller guarantees that every object the log holds is durable
        elsewhere (a committed pack, or a loose file whose barrier passed):
        the old log's bytes are gone once this returns. False if there was
        nothing to fold.
        """
        if not locked:
            with self.lock(group):
                return self.checkpoint(group, locked=True)
        cur, log = self.read_with_log(group)
        if log is None or not log.records:
            return False
        if self._before_write:
            self._before_write()
        ref_path = self.ref_path(group)
        log_path = self.log_path(group)
        self._ensure_dir(os.path.dirname(ref_path))
        self._ensure_dir(os.path.dirname(log_path))
        lines = b"".join(format_reflog_line(e) for e in cur.tail)
        committed = cur.log_size - len(lines)
        try:
            size = self.io.getsize(log_path)
            log_existed = True
        except FileNotFoundError:
            size, log_existed = 0, False
        if size > committed:
            self.io.truncate(log_path, committed)
        elif size < committed:
            raise CorruptRef(f"reflog {log_path} is shorter than its ref file records; run fsck")
        if lines:
            self.io.append(log_path, lines)
            if not log_existed or committed == 0:
                self.io.fsync_dir(os.path.dirname(log_path))
        gen = cur.steps_gen + 1
        self.io.write_durable(ref_path, format_ref_file(cur.refs, cur.fence, cur.log_size, cur.deleted_ns, gen))
        # The ref file now holds everything the log did: the log's new,
        # empty generation may follow (a crash before leaves a stale log,
        # which readers pass over and the next writer replaces).
        self._steps.start_generation(group, gen)
        return True

    def trust_dirs(self, dirs: Iterable[str]) -> None:
        """Directories whose names are known durable (the state dir's skeleton, §10.3)."""
        self._durable_dirs.update(dirs)

    def _ensure_dir(self, d: str) -> None:
        """Create ``refs/<ns>``, ``logs/<ns>`` or ``steps/<ns>`` if missing, with a durable name.

        ``makedirs`` syncs the parent of a directory it creates; one found
        existing may have been made by a process that has not synced its
        parent yet or died before it did (and "I made it" cannot be told
        from "I lost the race to make it"). So the first time this instance
        uses a directory it syncs its parent and grandparent (§9.1).
        """
        if d in self._durable_dirs and os.path.dirname(d) in self._durable_dirs:
            return
        self.io.makedirs(d)
        named = [p for p in (d, os.path.dirname(d)) if p not in self._durable_dirs]
        for p in named:
            self.io.fsync_dir(os.path.dirname(p))
        self._durable_dirs.update(named)

    def remove_group(self, group: str, timeout: float | None = None) -> None:
        """Delete a group's ref file, step log and reflog (gc's job, after the grace period).

        Whatever could read as the group alone goes last: the ref file
        goes before a log of generation 1 or more (which without it is
        nobody's), after a generation-0 log (which without it would be
        the group's whole state, §6.8).
        """
        with self.lock(group, timeout):
            self.unlink_group(group)

    def unlink_group(self, group: str) -> None:
        """:meth:`remove_group`'s work, for a caller that holds the group's lock (gc)."""
        base = self._read_base(group)
        try:
            log = self._steps.load(group)
        except CorruptSteps:
            log = None
        ref, steps = self.ref_path(group), self.steps_path(group)
        # A generation-0 log beside a ref file is a stale one (a checkpoint
        # died before replacing it): alone it would read as the group, so it
        # goes before the ref file does.
        order = [ref, steps] if base.exists and (log is None or log.gen > 0) else [steps, ref]
        for p in (*order, self.log_path(group)):
            try:
                self.io.unlink(p)
                self.io.fsync_dir(os.path.dirname(p))
            except FileNotFoundError:
                pass
        self._steps.forget(group)
        # Then what the store derived from the group (its caches, §11a).
        if self._removed is not None:
            self._removed(group)
