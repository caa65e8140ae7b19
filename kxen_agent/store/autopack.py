"""Automatic packing, as ``git gc --auto``: objects outside packs go into packs once there are too many.

A run writes a handful of objects per tool call: into its session's step
log (§6.8), or loose files (objects put outside a step). :class:`AutoPacker`
keeps the objects outside packs near a threshold (git's default, 6,700;
the ``KXEN_AGENT_AUTOPACK`` variable sets it, ``0`` turns automatic
packing off); a pass packs the loose objects, then folds the step logs
(:mod:`.fold`: their objects into a pack, their records into the ref files):

- :meth:`AutoPacker.between_turns`: cheap when under the threshold (a
  counter of the objects this store wrote, after one count of the fan-out
  dirs per process); over it, starts a pass in a background thread and
  returns at once, so the pass's reading, compressing and fsyncs overlap
  the model call instead of stalling the turn. The one moment a writer of
  this process can wait for it is the removal of loose copies, done under
  the store lock, one hold of at most :data:`UNLINK_HOLD_S` at a time;
- :meth:`AutoPacker.after_run`: waits for a background pass, then, over
  the threshold, packs every loose object; past :data:`PACK_LIMIT` packs,
  runs a full :func:`~.gc.gc` with the default grace period (git's
  ``gc.autoPackLimit``).

A pass that finds ``gc-run.lock`` busy is not tried again before a tenth
of the threshold's worth of new objects.

The checkpoint policy (``objects_spec.md`` §6.8.2): every read of a group
replays its step log's records since the last checkpoint, and a pass over
the threshold is the only other checkpoint, so a session's reads grew with
its history (1,625 records, 75 ms a read, before the threshold came).
:meth:`AutoPacker.between_turns` also starts a pass when a log this store
has read holds :data:`CHECKPOINT_RECORDS` records: it packs that log's
objects (one small pack) and checkpoints the group, in the background like
any pass, so a read replays at most about that many records. Those small
packs are merged into one once there are :data:`MERGE_PACKS` of them (as
``git repack --geometric``: every object kept, the merged packs removed
once the merge is committed), so the packs a reader looks through stay few.

What a pass does (``objects_spec.md`` §12.11a): take ``locks/gc-run.lock``
without waiting (a gc or another packer at work: skip); read each loose
object (verified: its id is its hash), write them into one pack and commit
it (§12.6: the pack and its index durable before anything is removed);
then, holding the store lock exclusively (§8.2; no writer is between its
objects and its ref) for at most :data:`UNLINK_HOLD_S` at a time, unlink
the loose copies of what the pack holds. It never prunes: every object it
removes a file of is in a committed pack,
reachable or not (an unreachable object's age for gc's grace period is
then its pack's modification time, which only makes it live longer). The
fan-out directories are not fsynced after the unlinks: a loose copy that
a power loss brings back is a duplicate of a packed object, which gc
removes and every reader tolerates.

It never knows what a session is, and never runs unless asked: the run
layer calls it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from kxen_agent.errors import KxenError, UsageError

from .locks import LockBusy, file_lock
from .objects import ObjectId
from .fold import fold_step_logs, pack_objects, step_objects
from .repo import Store

__all__ = ["AUTOPACK_ENV", "AutoPackReport", "AutoPacker", "CHECKPOINT_ENV", "CHECKPOINT_RECORDS", "DEFAULT_THRESHOLD",
           "MERGE_PACKS", "PACK_LIMIT", "checkpoint_from_env", "threshold_from_env"]

#: The environment variable that sets the loose-object threshold (``0``: never pack automatically).
AUTOPACK_ENV = "KXEN_AGENT_AUTOPACK"

#: Loose objects tolerated before packing: git's ``gc.auto`` default.
DEFAULT_THRESHOLD = 6700

#: Packs tolerated before :meth:`AutoPacker.after_run` consolidates them with a full gc (git's ``gc.autoPackLimit``).
PACK_LIMIT = 50

#: How long one hold of the store lock's exclusive side may go on removing loose copies: a writer waits at
#: most about this long (an unlink costs ~10 µs on an idle disk, 2 ms on this project's shared VM under load).
UNLINK_HOLD_S = 0.02

#: How long a pass waits for writers to leave the store lock before it leaves the loose copies for later.
UNLINK_WAIT_S = 1.0

#: A step log holding this many committed records is checkpointed by the next pass (0: never, but over the
#: threshold). A read replays ~46 µs a record on this project's VM: 128 records are ~6 ms, a CLI command
#: ~200 ms; a checkpoint costs a small pack and ~10 fsyncs in the background, once every ~32 tool calls.
CHECKPOINT_RECORDS = 128

#: The environment variable that sets :data:`CHECKPOINT_RECORDS` (tests and torture runs set it low).
CHECKPOINT_ENV = "KXEN_AGENT_CHECKPOINT_RECORDS"

#: Packs of fewer objects than this count as small (a checkpoint's); MERGE_PACKS of them are merged into one.
SMALL_PACK = DEFAULT_THRESHOLD
MERGE_PACKS = 8


def checkpoint_from_env(environ: "os._Environ[str] | dict[str, str] | None" = None) -> int:
    """The bound ``KXEN_AGENT_CHECKPOINT_RECORDS`` sets (default :data:`CHECKPOINT_RECORDS`; 0: no checkpoint
    but the threshold's); a bad value is a UsageError."""
    env = os.environ if environ is None else environ
    text = env.get(CHECKPOINT_ENV, "").strip()
    if not text:
        return CHECKPOINT_RECORDS
    if not text.isdigit() or len(text) > 12:
        raise UsageError(f"{CHECKPOINT_ENV}={text[:40]!r} is not a whole number of step-log records (0 turns the "
                         f"checkpoint policy off; unset, {CHECKPOINT_RECORDS})")
    return int(text)


def threshold_from_env(environ: "os._Environ[str] | dict[str, str] | None" = None) -> int:
    """The threshold ``KXEN_AGENT_AUTOPACK`` sets (default :data:`DEFAULT_THRESHOLD`); a bad value is a UsageError."""
    env = os.environ if environ is None else environ
    text = env.get(AUTOPACK_ENV, "").strip()
    if not text:
        return DEFAULT_THRESHOLD
    if not text.isdigit() or len(text) > 12:
        raise UsageError(f"{AUTOPACK_ENV}={text[:40]!r} is not a whole number of loose objects (0 turns automatic "
                         f"packing off; unset, {DEFAULT_THRESHOLD})")
    return int(text)


@dataclass
class AutoPackReport:
    """What one pass did."""

    packed: int = 0
    pack: str | None = None
    loose_removed: int = 0
    #: Step logs folded into their ref files (§6.8).
    folded: int = 0
    #: Objects left loose: past the pass's ``max_objects``, or corrupt (fsck names them).
    left: int = 0
    #: Why the pass did nothing or stopped short ("gc running", "writers busy"), if it did.
    skipped: str | None = None
    seconds: float = 0.0
    #: The longest hold of the store lock's exclusive side (what a writer could wait for).
    longest_hold_s: float = 0.0
    #: A full gc ran (too many packs).
    consolidated: bool = False
    #: The pass ran in a background thread.
    background: bool = False
    #: It did nothing because a gc or another pass held ``gc-run.lock`` (not worth telling a user).
    busy: bool = False
    #: A checkpoint pass (the checkpoint policy's: logs past :data:`CHECKPOINT_RECORDS`, not the threshold).
    checkpoint: bool = False
    #: Small packs merged into one by this pass.
    merged: int = 0

    def line(self) -> str:
        """What the pass did, in words ("" when it did nothing, or only checkpointed: routine upkeep)."""
        if self.checkpoint and not (self.skipped and not self.busy):
            return ""
        done = (f"packed {self.packed} object(s) in {self.seconds:.2f} s" if self.packed else "") + (
            " and consolidated the packs (gc)" if self.consolidated else "")
        if self.skipped and not self.busy:
            return (done.strip() + "; " if done else "") + f"automatic packing: {self.skipped}"
        return done.strip()


class AutoPacker:
    """Keeps ``store``'s loose objects under ``threshold`` (0: never packs); see the module doc."""

    def __init__(self, store: Store, threshold: int | None = None, *, background: bool = True,
                 pack_limit: int = PACK_LIMIT, checkpoint_records: int = CHECKPOINT_RECORDS) -> None:
        self.store = store
        self.threshold = threshold_from_env() if threshold is None else threshold
        #: The checkpoint policy's bound (0: off); off too when automatic packing is (threshold 0).
        self.checkpoint_records = checkpoint_records if self.threshold > 0 else 0
        #: Passes between turns run in a thread (False: in the caller's, as tests of the mechanics want).
        self.background = background
        self.pack_limit = pack_limit
        self._base: int | None = None  # loose objects counted, ...
        self._written_at_base = 0  # ... when this store had written this many
        #: Every pass, oldest first.
        self.reports: list[AutoPackReport] = []
        self._thread: threading.Thread | None = None
        self._told = 0
        self._not_before = 0  # after a pass found gc-run.lock busy: wait until the store wrote this many

    @classmethod
    def for_store(cls, store: object) -> "AutoPacker | None":
        """The packer of a state dir on disk, with the threshold of the environment; None for any other
        store (a memory store has no files) or when ``KXEN_AGENT_AUTOPACK=0``."""
        if not isinstance(store, Store):
            return None
        packer = cls(store, checkpoint_records=checkpoint_from_env())
        return packer if packer.threshold > 0 else None

    def estimate(self) -> int:
        """Loose objects now: one count of the fan-out dirs per process, then what this store wrote since."""
        written = self._written()
        if self._base is None:
            self._base = (sum(1 for _ in self.store.loose.iter_ids()) + step_objects(self.store)
                          if self.store.exists else 0)
            self._written_at_base = written
        return self._base + written - self._written_at_base

    def _written(self) -> int:
        # Objects written since this store opened: loose files and step-log records alike.
        return self.store.loose.written + self.store.steps.written

    def due(self) -> bool:
        return (self.threshold > 0 and self.store.exists and self._written() >= self._not_before
                and self.estimate() > self.threshold)

    def over_bound(self) -> list[str]:
        """The groups whose step log, as this store last read it, holds :attr:`checkpoint_records` records
        or more (memory only: asked between every two turns)."""
        if self.checkpoint_records <= 0 or self._written() < self._not_before:
            return []
        return sorted(g for g, n in self.store.steps.record_counts().items() if n >= self.checkpoint_records)

    def between_turns(self, max_objects: int | None = None) -> AutoPackReport | None:
        """Start a pass (of at most ``max_objects``) if over the threshold and none is running.

        In the background (the default): returns None at once, the pass's
        report comes from :meth:`finished` or :meth:`wait`. Otherwise the
        pass's report; None if nothing was due.
        """
        if self.running() or not (self.due() or self.over_bound()):
            return None
        if not self.background:
            return self._pass(max_objects)
        self._thread = threading.Thread(target=self._pass, args=(max_objects, True), name="kxen-autopack", daemon=True)
        self._thread.start()
        return None

    def step(self, *, after_run: bool = False) -> list[str]:
        """:meth:`after_run` or :meth:`between_turns`, never raising; what was done since the last
        step, in words (a failure, a full disk, included: the caller's work goes on)."""
        try:
            if after_run:
                self.after_run()
            else:
                self.between_turns()
        except (KxenError, OSError) as e:
            return [f"automatic packing skipped: {e}"]
        return [line for line in (rep.line() for rep in self.finished()) if line]

    def pack_now(self, max_objects: int | None = None) -> AutoPackReport:
        """One pass in the caller's thread, whatever the threshold (tests, and a user's explicit request)."""
        self.wait()
        return self._pass(max_objects, full=True)

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Wait for the background pass, if one runs."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def finished(self) -> list[AutoPackReport]:
        """The reports of passes finished since the last call (for the caller to tell about)."""
        if self.running():
            return []
        new = self.reports[self._told:]
        self._told = len(self.reports)
        return new

    def after_run(self) -> AutoPackReport | None:
        """Wait for a background pass; pack every loose object if over the threshold; consolidate past the
        pack limit. The report of what this call did, None if nothing was due."""
        self.wait()
        rep = self._pass(None) if self.due() or self.over_bound() else None
        if self.threshold > 0 and self.store.exists:
            self.store.reload_packs()
            if len(self.store.packs) > self.pack_limit:
                from .gc import gc

                if rep is None:
                    rep = AutoPackReport()
                    self.reports.append(rep)
                t = time.perf_counter()
                try:
                    gc(self.store, lock_timeout=UNLINK_WAIT_S)
                except KxenError as e:
                    rep.skipped = f"consolidation skipped: {e}"
                else:
                    rep.consolidated = True
                    self._recount()
                rep.seconds += time.perf_counter() - t
        return rep

    def _recount(self) -> None:
        self._base = None

    def _pass(self, max_objects: int | None, background: bool = False, full: bool | None = None) -> AutoPackReport:
        rep = AutoPackReport(background=background)
        t0 = time.perf_counter()
        store = self.store
        full = self.due() if full is None else full  # not due: a checkpoint pass (over_bound)
        try:
            with file_lock(os.path.join(store.root, "locks", "gc-run.lock"), timeout=0, io=store.io):
                if full:
                    self._pack(rep, max_objects)
                else:
                    self._checkpoint(rep)
        except LockBusy:
            rep.skipped, rep.busy = "a gc or another packer holds locks/gc-run.lock", True
            # Not again at the next turn: after a tenth of the threshold's worth of new objects.
            self._not_before = self._written() + max(1, self.threshold // 10)
        except (KxenError, OSError) as e:
            if not background:
                raise
            rep.skipped = f"failed: {e}"  # a full disk: the run goes on, the objects stay loose
        rep.seconds = time.perf_counter() - t0
        if full or self._base is None:
            self._recount()
        else:
            # Its objects left the step logs for a pack: no recount (a listing of every fan-out dir and a
            # read of every step log), which a pass every ~32 tool calls would make the turns' cost.
            self._base = max(0, self._base - rep.packed)
        self.reports.append(rep)
        return rep

    def _checkpoint(self, rep: AutoPackReport) -> None:
        """The checkpoint policy's pass: the logs past the bound packed and folded, then small packs merged."""
        rep.checkpoint = True
        groups = self.over_bound()
        if groups:
            folded = fold_step_logs(self.store, groups=groups)
            rep.packed, rep.pack, rep.folded = folded.packed, folded.pack, len(folded.groups)
            if not folded.groups:
                # Nothing folded (a damaged log, which fsck names): not again at every turn, only after
                # another bound's worth of objects.
                self._not_before = self._written() + max(1, self.checkpoint_records)
        rep.merged = self._merge_small_packs()

    def _merge_small_packs(self) -> int:
        """Past :data:`MERGE_PACKS` small packs, one pack of all their objects, then those packs removed
        (each index first, durably: §11); how many were merged (0: none, or one of them did not read)."""
        from .pack import PackReader  # here: the CLI's start-up imports this module, not the pack code

        store = self.store
        store.reload_packs()
        small = [p for p in store.packs if p not in store._pinned and isinstance(p, PackReader)
                 and 0 < p.count < SMALL_PACK]
        if len(small) < MERGE_PACKS:
            return 0
        ids = list(dict.fromkeys(oid for p in small for oid in p.iter_ids()))

        def read(oid: ObjectId):
            for p in small:
                obj = p.read_raw(oid)  # verified: its id is its hash (CorruptObject: left out)
                if obj is not None:
                    return obj
            return None

        packed, info = pack_objects(store, ids, read)
        if len(packed) != len(ids):
            # An object did not read (fsck names it): the small packs stay, the merge is a duplicate.
            return 0
        bases = [p.path[: -len(".pack")] for p in small]
        try:
            with store.pruning(UNLINK_WAIT_S):
                for base in bases:
                    _unlink_quiet(store, base + ".idx")
                store.io.fsync_dir(store.pack_dir)
                for base in bases:
                    _unlink_quiet(store, base + ".pack")
                store.io.fsync_dir(store.pack_dir)
        except LockBusy:
            return 0  # writers busy: the small packs stay (duplicates of the merged one) until a later pass
        store.reload_packs()
        return len(small)

    def _pack(self, rep: AutoPackReport, max_objects: int | None) -> None:
        store = self.store
        store.reload_packs()
        packs = [p for p in store.packs if p not in store._pinned]
        ids = list(store.loose.iter_ids())
        redundant = [oid for oid in ids if any(p.has(oid) for p in packs)]
        todo = [oid for oid in ids if not any(p.has(oid) for p in packs)] if redundant else ids
        packed: list[ObjectId] = []
        if todo:
            packed, info = pack_objects(store, todo, store.loose.read_raw, max_objects)
            if info is not None:
                rep.packed, rep.pack = info.count, info.name
        rep.left = len(todo) - len(packed)
        # The step logs next: their objects packed, their records folded
        # into the ref files (each group's lock held only for its checkpoint).
        folded = fold_step_logs(store)
        rep.packed += folded.packed
        rep.folded = len(folded.groups)
        gone = redundant + packed
        if not gone:
            return
        todo_unlink = list(reversed(gone))
        while todo_unlink:
            try:
                with store.pruning(UNLINK_WAIT_S):
                    held = time.perf_counter()
                    while todo_unlink:
                        try:
                            store.io.unlink(store.loose.path(todo_unlink.pop()))
                            rep.loose_removed += 1
                        except FileNotFoundError:
                            pass
                        if time.perf_counter() - held >= UNLINK_HOLD_S:
                            break
                    rep.longest_hold_s = max(rep.longest_hold_s, time.perf_counter() - held)
            except LockBusy:
                rep.skipped = "writers held the store lock; the packed objects' loose copies stay until the next pass"
                return
            if todo_unlink:
                # Let a writer that waited for this hold in before the next one: the
                # store lock wakes every waiter, and this thread would otherwise win the race.
                time.sleep(UNLINK_HOLD_S / 2)


def _unlink_quiet(store: Store, path: str) -> None:
    try:
        store.io.unlink(path)
    except FileNotFoundError:
        pass
