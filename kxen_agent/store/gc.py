"""gc: pack what is reachable, prune what is not (after a grace period).

Like ``git gc``: every object reachable from a root is written into one
new pack; loose copies of packed objects are removed; objects reachable
from no root are removed once they are older than the grace period
(default two weeks), so an object a concurrent run wrote before moving its
ref is never deleted. A ref group marked deleted (``session delete``) is
removed once it has been deleted for longer than the grace period; gc never
removes a group that is not marked.

Roots: every ref of every group, and every object named by a committed
reflog line. If anything reachable from a *ref* is missing or corrupt, gc
aborts before writing or deleting anything (:class:`GcAborted`): deleting
on the strength of a broken graph could only make things worse.

Two phases:

1. without blocking writers (only one gc at a time, ``locks/gc-run.lock``):
   compute the reachable set and write the new pack;
2. under the store lock's exclusive side (:meth:`Store.pruning`; writers
   hold the shared side, :meth:`Store.shared_lock`, in a step): recompute the roots (refs
   may have moved), then remove expired groups, old packs, packed loose
   copies and expired unreachable objects. Unreachable objects of a removed
   pack that are still within the grace period become loose files again
   with the pack's mtime, as ``git repack --unpack-unreachable`` does.

Every file-system call goes through the store's :class:`~.fsio.FileIO`:
file changes, and the listings, ``stat`` calls and ``utime`` calls that the
grace period is judged by and kept with.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from kxen_agent.errors import KxenError, UsageError

from .fold import fold_step_logs
from .locks import file_lock
from .objects import CorruptObject, ObjectId, decode_stored, links_of
from .pack import DICT_SAMPLE_MAX_OBJECT, PackReader, sample_dictionary
from .refs import CorruptRef
from .repo import MissingObject, Store

__all__ = ["BadDuration", "DEFAULT_PRUNE", "GcAborted", "GcReport", "MAX_PRUNE_S", "gc", "parse_duration"]

#: The default grace period, as git's ``gc.pruneExpire``.
DEFAULT_PRUNE = "2w"

# Unit names as ``git gc --prune`` takes them ("2.weeks.ago") and as people
# write them ("1y", "6mo", "12h"); a month is 30 days and a year 365, as in
# Git's approxidate.
_UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 7 * 86400, "week": 7 * 86400, "weeks": 7 * 86400,
    "mo": 30 * 86400, "month": 30 * 86400, "months": 30 * 86400,
    "y": 365 * 86400, "year": 365 * 86400, "years": 365 * 86400,
}
_TERM = r"(\d+)\.?\s*(" + "|".join(sorted(_UNITS, key=len, reverse=True)) + r")"
_DURATION = re.compile(rf"(?:{_TERM}[\s.,]*)+?(?:ago)?")
_TERM_RE = re.compile(_TERM)


class BadDuration(UsageError):
    """A ``--prune`` value that is not a duration."""


class GcAborted(KxenError):
    """gc found the object graph broken and changed nothing."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"gc aborted, nothing was written or deleted: {reason}; run 'kxen-agent fsck'")
        self.reason = reason


#: The longest ``--prune`` grace period: 100 years (365.25-day), far past any
#: object's age. A longer one means "never prune", which is spelt ``never``.
MAX_PRUNE_S = 36525 * 86400


def parse_duration(text: str) -> float | None:
    """Seconds of a ``--prune`` value: ``2w``, ``3d``, ``12h``, ``30m``, ``45s``, ``6mo``, ``1y``,
    spelt out (``2weeks``, ``1 year``, git's ``2.weeks.ago``), combined (``1d12h``,
    ``1y6mo``), ``0`` or ``now`` (no grace), ``never`` (None)."""
    t = text.strip().lower()
    if t in ("now", "0"):
        return 0.0
    if t == "never":
        return None
    shown = repr(text) if len(text) <= 40 else repr(text[:40]) + "..."
    if not _DURATION.fullmatch(t):
        raise BadDuration(
            f"invalid --prune value {shown}: give a duration like 2w, 3d, 12h, 30m, 45s, 6mo, 1y "
            "(or 2.weeks.ago), or 'now', '0', 'never'"
        )
    # Any number of digits matches; a grace past 100 years is a typo or a way
    # to say "never" (and a long enough one overflows float or int parsing).
    total = 0
    for n, u in _TERM_RE.findall(t):
        total += (int(n) if len(n.lstrip("0")) <= 12 else MAX_PRUNE_S + 1) * _UNITS[u]
    if total > MAX_PRUNE_S:
        raise BadDuration(f"--prune value {shown} is longer than 100 years; give a shorter duration "
                          "(2w, 3d, 1y...), or --prune=never to keep every unreachable object")
    return float(total)


@dataclass
class GcReport:
    state_dir: str
    prune: str
    reachable: int = 0
    packed: int = 0
    pack: str | None = None
    loose_removed: int = 0
    pruned: int = 0
    kept_unreachable: int = 0
    exploded: int = 0
    packs_removed: int = 0
    groups_removed: list[str] = field(default_factory=list)
    tmp_removed: int = 0
    #: Disk usage of ``objects/`` before and after (allocated blocks, as ``du`` counts).
    bytes_before: int = 0
    bytes_after: int = 0
    #: Why no pack was written although there was something to pack (it would not have been smaller).
    pack_skipped: str | None = None
    #: What does not read (groups, packs, objects): gc then packs what reads and prunes nothing (§18).
    damaged: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "stateDir": self.state_dir,
            "prune": self.prune,
            "reachable": self.reachable,
            "packedObjects": self.packed,
            "pack": self.pack,
            "looseRemoved": self.loose_removed,
            "pruned": self.pruned,
            "keptUnreachable": self.kept_unreachable,
            "exploded": self.exploded,
            "packsRemoved": self.packs_removed,
            "groupsRemoved": self.groups_removed,
            "tmpRemoved": self.tmp_removed,
            "bytesBefore": self.bytes_before,
            "bytesAfter": self.bytes_after,
            "packSkipped": self.pack_skipped,
            "damaged": self.damaged,
        }


@dataclass
class _Roots:
    refs: list[tuple[str, ObjectId]]  # (where, id): their closure must be complete
    logged: list[tuple[str, ObjectId]]  # reflog values: kept, best effort
    expired: list[str]  # groups deleted longer than the grace period


def _roots(store: Store, cutoff_ns: int | None, *, skip: Iterable[str] = (),
           damaged: list[str] | None = None) -> _Roots:
    out = _Roots([], [], [])
    skip = set(skip)
    for group in store.refs.groups():
        if group in skip:
            continue
        try:
            state = store.refs.read(group)
            log = store.refs.reflog(group)
        except (CorruptRef, KxenError) as e:
            if damaged is None:
                raise GcAborted(f"cannot read ref group {group}: {e}") from None
            damaged.append(f"group {group} does not read")
            continue
        if state.deleted_ns is not None and cutoff_ns is not None and state.deleted_ns <= cutoff_ns:
            out.expired.append(group)
            continue
        for name, oid in sorted(state.refs.items()):
            out.refs.append((f"ref {group}/{name}", oid))
        for e in log:
            for v in (e.old, e.new):
                if v is not None:
                    out.logged.append((f"reflog of {group}", v))
    return out


def _closure(
    store: Store,
    roots: list[tuple[str, ObjectId]],
    reachable: set[ObjectId],
    order: list[ObjectId] | None,
    *,
    strict: bool,
    progress: Callable[[int], None] | None = None,
    small: list | None = None,
    damaged: list[str] | None = None,
) -> None:
    """Add everything reachable from ``roots`` to ``reachable`` (in DFS pre-order to ``order``).

    Objects already in ``reachable`` are not descended into: callers pass a
    set that is closed. ``strict``: a missing object aborts gc.
    """
    stack = [(oid, where) for where, oid in reversed(roots)]
    while stack:
        oid, where = stack.pop()
        if oid in reachable:
            continue
        try:
            obj = store.read_raw(oid)
            value = decode_stored(obj)
        except MissingObject:
            # Missing is not damage: no file holds it to judge (a writer broke a rule): gc aborts (§12.11).
            if strict:
                raise GcAborted(f"object {oid.hex()} (reached from {where}) is missing") from None
            continue
        except CorruptObject as e:
            if damaged is not None:
                damaged.append(f"object {oid.hex()} (reached from {where}) does not read: {e.reason}")
                continue
            raise GcAborted(f"object {oid.hex()} (reached from {where}) is corrupt: {e.reason}") from None
        reachable.add(oid)
        if order is not None:
            order.append(oid)
        if small is not None and len(obj.raw) <= DICT_SAMPLE_MAX_OBJECT:
            small[0] += len(obj.raw)  # what a dictionary would serve
            small.append(oid)
        if progress:
            progress(1)
        children = list(links_of(obj.kind, value))
        for child in reversed(children):
            if child not in reachable:
                stack.append((child, f"object {oid.hex()}"))


def _allocated(st: os.stat_result) -> int:
    """The bytes a file takes on disk, as ``du`` counts them: its blocks (a 70-byte loose object
    takes a whole 4 KiB block), or its size where the file system reports no blocks."""
    blocks = getattr(st, "st_blocks", None)
    return st.st_size if blocks is None else blocks * 512


def _disk_usage(store: Store, path: str) -> int:
    total = 0
    for dirpath, _dirs, files in store.io.walk(path):
        for f in files:
            try:
                total += _allocated(store.io.lstat(os.path.join(dirpath, f)))
            except FileNotFoundError:
                pass
    return total


def _unlink(store: Store, path: str) -> bool:
    try:
        store.io.unlink(path)
        return True
    except FileNotFoundError:
        return False


def gc(
    store: Store,
    *,
    prune: str | float | None = DEFAULT_PRUNE,
    progress: Callable[[int], None] | None = None,
    now: float | None = None,
    lock_timeout: float | None = None,
    always_pack: bool = False,
) -> GcReport:
    """Pack reachable objects, prune expired unreachable ones, drop expired deleted groups.

    ``prune``: the grace period, as a ``--prune`` string or seconds; ``None``
    or ``"never"`` prunes nothing. ``now`` overrides the clock (tests).
    ``lock_timeout``: how long phase 2 waits for writers to release the
    shared lock (:meth:`Store.shared_lock`; default: the store's lock timeout).
    ``always_pack``: write the pack even when it is not smaller than what it
    replaces (tests of the pack mechanics on a handful of objects; the CLI
    never sets it).
    """
    grace = parse_duration(prune) if isinstance(prune, str) else (None if prune is None else float(prune))
    label = prune if isinstance(prune, str) else ("never" if grace is None else f"{grace:g}s")
    rep = GcReport(store.root, label)
    if not store.exists:
        return rep  # nothing to collect, and gc must not create a state dir
    now = time.time() if now is None else now
    cutoff = None if grace is None else now - grace
    cutoff_ns = None if cutoff is None else int(cutoff * 1e9)
    objects_dir = os.path.join(store.root, "objects")
    steps_dir = os.path.join(store.root, "steps")  # objects live in step logs too (§6.8)
    rep.bytes_before = _disk_usage(store, objects_dir) + _disk_usage(store, steps_dir)
    # Before the first file gc makes (its lock file): upgrade a version-1
    # dir, or sync the state dir once, so that no file of gc's can outlive
    # a FORMAT a crash loses (§10.3).
    store.ensure_initialized()
    with file_lock(os.path.join(store.root, "locks", "gc-run.lock"), timeout=0, io=store.io):
        if _damaged(store, rep):
            # Something does not read: pack what does, prune nothing (what the damaged part
            # reaches is unknown, so any unreachable object may be one it needs), §18.
            _gc_damaged(store, rep, progress, lock_timeout)
            store.reload_packs()
            rep.bytes_after = _disk_usage(store, objects_dir) + _disk_usage(store, steps_dir)
            return rep
        sealed_info = _phase1(store, cutoff_ns, cutoff, rep, progress, always_pack)
        _phase2(store, cutoff_ns, cutoff, rep, sealed_info, progress, lock_timeout)
        # Last, the step logs whose objects phase 1's pack now holds (it is
        # kept: phase 2 passed its checks): their records go into the ref
        # files. Folded before phase 2, an aborted phase 2 would have removed
        # the one pack holding them. Logs with objects in no pack are left
        # for automatic packing: gc writes no pack that does not shrink the store.
        fold_step_logs(store, pack=False)
    store.reload_packs()
    rep.bytes_after = _disk_usage(store, objects_dir) + _disk_usage(store, steps_dir)
    return rep


def _damaged(store: Store, rep: GcReport) -> bool:
    """Whether anything gc would read does not: a group, a pack, an object reachable from a ref."""
    from .pack import BrokenPack

    store.reload_packs()
    for p in store.packs:
        if isinstance(p, BrokenPack):
            rep.damaged.append(f"pack {p.path} does not open ({p.error})")
    damaged: list[str] = []
    roots = _roots(store, None, damaged=damaged)
    _closure(store, roots.refs, set(), None, strict=True, damaged=damaged)
    seen: set[str] = set()
    for what in damaged:  # one line per object, however many links reach it
        key = what.split(" (reached from ")[0]
        if key not in seen:
            seen.add(key)
            rep.damaged.append(what)
    return bool(rep.damaged)


def _gc_damaged(store: Store, rep: GcReport, progress, lock_timeout) -> None:
    """gc of a damaged state dir: pack the reachable objects that read and lie in no pack; delete nothing
    but the loose copies the new pack holds; fold the step logs of the groups that read."""
    from .fold import pack_objects

    roots = _roots(store, None, damaged=[])
    reachable: set[ObjectId] = set()
    order: list[ObjectId] = []
    _closure(store, roots.refs, reachable, order, strict=False, progress=progress, damaged=[])
    _closure(store, roots.logged, reachable, order, strict=False, damaged=[])
    rep.reachable = len(reachable)
    good = [p for p in store.packs if isinstance(p, PackReader) and p not in store._pinned]
    store.steps.scan_all()
    todo = [oid for oid in order if not any(p.has(oid) for p in good)]
    if todo:
        packed, info = pack_objects(store, todo, store.read_raw)
        if info is not None:
            rep.packed, rep.pack = info.count, info.name
            with store.pruning(lock_timeout):
                store.reload_packs()
                new = [p for p in store.packs if isinstance(p, PackReader) and p.name == info.name]
                touched: set[str] = set()
                for oid in packed:
                    if new and new[0].has(oid) and _unlink(store, store.loose.path(oid)):
                        rep.loose_removed += 1
                        touched.add(os.path.dirname(store.loose.path(oid)))
                for d in sorted(touched):
                    store.io.fsync_dir(d)
    fold_step_logs(store, pack=False)


@dataclass
class _Phase1:
    reachable: set[ObjectId]
    old_packs: list[PackReader]  # packs to replace (empty: no repack)
    new_pack: str | None  # name of the pack written, if any


def _phase1(store: Store, cutoff_ns, cutoff, rep: GcReport, progress, always_pack: bool = False) -> _Phase1:
    store.reload_packs()
    roots = _roots(store, cutoff_ns)
    reachable: set[ObjectId] = set()
    order: list[ObjectId] = []
    small: list = [0]  # total size, then the ids
    _closure(store, roots.refs, reachable, order, strict=True, small=small)
    _closure(store, roots.logged, reachable, order, strict=False, small=small)
    old_packs = [p for p in store.packs if isinstance(p, PackReader) and p not in store._pinned]

    def in_old_packs(oid: ObjectId) -> bool:
        return any(p.has(oid) for p in old_packs)

    steps = store.steps
    steps.scan_all()
    needs = len(old_packs) > 1 or any(oid in reachable and not in_old_packs(oid)
                                      for oid in (*store.loose.iter_ids(), *steps.iter_ids()))
    if not needs and len(old_packs) == 1 and cutoff is not None:
        p = old_packs[0]
        needs = p.mtime() <= cutoff and any(oid not in reachable for oid in p.iter_ids())
    if not needs:
        return _Phase1(reachable, [], None)
    if not reachable:  # nothing to pack: the old packs only hold garbage
        return _Phase1(reachable, old_packs, None)

    # Reuse the dictionary of the pack that already holds most of what is
    # reachable: its entries are then copied verbatim (CRC-checked), the
    # rest compressed with it. Otherwise train one on a sample.
    best, best_n = None, 0
    for p in old_packs:
        n = sum(1 for oid in order if p.has(oid)) if p.dictionary else 0
        if n > best_n:
            best, best_n = p, n
    if best is not None and 2 * best_n >= len(order):
        dictionary = best.dictionary
    else:
        best = None
        dictionary = sample_dictionary(store.read_raw, small[1:], small[0])

    # What the new pack replaces: the old packs, and the loose copies of the
    # objects it holds (phase 2 removes both), counted as disk usage (blocks).
    # A pack that is not smaller than that is not written: one or two objects
    # (a pack and its index take two blocks at least), or objects already
    # packed as well as they can be (a dictionary that does not pay for
    # itself), would only grow the store.
    replaced = sum(_file_size(store, p.path) + _file_size(store, p.path[: -len(".pack")] + ".idx")
                   for p in old_packs)
    replaced += sum(_file_size(store, store.loose.path(oid)) for oid in store.loose.iter_ids() if oid in reachable)
    # And what folding the step logs frees: each log but its header's block.
    replaced += sum(max(0, _file_size(store, steps.path(g)) - 4096) for g in steps.groups())
    sealed = _write_pack(store, order, best, dictionary, progress)
    if always_pack:
        replaced = _pack_disk_size(sealed) + 1
    if _pack_disk_size(sealed) >= replaced and dictionary is not None:
        # The dictionary itself can be what does not pay: try without it.
        sealed.discard()
        sealed = _write_pack(store, order, None, None, None)
    if _pack_disk_size(sealed) >= replaced:
        rep.pack_skipped = (f"a pack of {len(order)} objects ({_pack_disk_size(sealed)} bytes on disk) "
                            f"would not be smaller than what it replaces ({replaced} bytes)")
        sealed.discard()
        return _Phase1(reachable, [], None)
    try:
        info = sealed.commit()
    except BaseException:
        sealed.discard()
        raise
    rep.packed = info.count
    rep.pack = info.name
    store.reload_packs()
    return _Phase1(reachable, old_packs, info.name)


def _write_pack(store: Store, order: list[ObjectId], best: PackReader | None, dictionary: bytes | None,
                progress: Callable[[int], None] | None):
    """Write ``order`` into a sealed (not yet visible) pack; the caller commits or discards it."""
    with store.pack_writer(dictionary) as w:
        for oid in order:
            try:
                found = best.entry(oid) if best is not None else None
            except CorruptObject:
                found = None  # a damaged copy: recompress the good one closure read
            if found is not None:
                _e, head, stored = found
                w.add_entry(head, stored)
            else:
                w.add(store.read_raw(oid))
            if progress:
                progress(1)
        return w.seal()


def _file_size(store: Store, path: str) -> int:
    try:
        return _allocated(store.io.lstat(path))
    except FileNotFoundError:
        return 0


def _pack_disk_size(sealed, block: int = 4096) -> int:
    """What a sealed pack and its index would take on disk (whole blocks, as :func:`_allocated`)."""
    return sum(-(-n // block) * block for n in (sealed.size, len(sealed.index)))


def _remove_packs(store: Store, bases: list[str]) -> int:
    """Remove packs, every index first and durably so (§11: a power loss may keep a later unlink and
    lose an earlier one; an index left without its pack is ``corrupt-pack``); how many were there."""
    if not bases:
        return 0
    removed = [_unlink(store, base + ".idx") for base in bases]
    store.io.fsync_dir(store.pack_dir)
    removed = [_unlink(store, base + ".pack") or r for base, r in zip(bases, removed)]
    store.io.fsync_dir(store.pack_dir)
    return sum(map(int, removed))


def _phase2(store: Store, cutoff_ns, cutoff, rep: GcReport, p1: _Phase1, progress, lock_timeout) -> None:
    with store.pruning(lock_timeout):
        store.reload_packs()
        # Prune only on a durable listing of ref groups: a group removal
        # (ours, earlier, or a killed gc's) whose directory fsync never
        # happened could come back after a power loss, naming pruned objects.
        # Step logs likewise: a generation-0 log is a group of its own (§6.8).
        for top in ("refs", "steps"):
            top_dir = os.path.join(store.root, top)
            if store.io.isdir(top_dir):
                store.io.fsync_dir(top_dir)
                for ns in sorted(store.io.listdir(top_dir)):
                    if store.io.isdir(os.path.join(top_dir, ns)):
                        store.io.fsync_dir(os.path.join(top_dir, ns))
        roots = _roots(store, cutoff_ns)
        reachable = set(p1.reachable)
        try:
            # Closed since phase 1 (nothing was deleted): only new objects are read.
            _closure(store, roots.refs, reachable, None, strict=True)
        except GcAborted:
            if p1.new_pack:
                _remove_packs(store, [os.path.join(store.pack_dir, f"pack-{p1.new_pack}")])
                rep.packed, rep.pack = 0, None
            raise
        _closure(store, roots.logged, reachable, None, strict=False)

        # 1. Expired deleted groups; one whose lock is busy waits for the next gc.
        kept_groups = []
        for group in roots.expired:
            if _remove_group(store, group, cutoff_ns):
                rep.groups_removed.append(group)
            else:
                kept_groups.append(group)
        if kept_groups:
            extra = _roots(store, None, skip=[g for g in store.refs.groups() if g not in kept_groups])
            _closure(store, extra.refs + extra.logged, reachable, None, strict=False)
        rep.reachable = len(reachable)

        # 2. Old packs, once the new one holds what they had that is reachable.
        if p1.old_packs:
            olds = [p for p in p1.old_packs if p.name != p1.new_pack]
            survivors = [p for p in store.packs if isinstance(p, PackReader) and p not in olds]
            with store.batch():
                for old in olds:
                    try:
                        mtime = old.mtime()
                    except FileNotFoundError:
                        continue
                    young = cutoff is None or mtime > cutoff
                    for oid in old.iter_ids():
                        if any(p.has(oid) for p in survivors):
                            continue
                        if oid in reachable or young:
                            obj = _read_for_explode(store, old, oid, oid in reachable)
                            if obj is None:
                                continue
                            store.loose.write(obj)
                            if oid not in reachable:
                                try:
                                    store.io.utime(store.loose.path(oid), (mtime, mtime))  # keep its age
                                except OSError:
                                    pass
                            rep.exploded += 1
                        else:
                            rep.pruned += 1
                        if progress:
                            progress(1)
            rep.packs_removed += _remove_packs(store, [old.path[: -len(".pack")] for old in olds])
            store.reload_packs()

        # 3. Loose objects: packed copies go; unreachable ones go once expired.
        survivors = [p for p in store.packs if isinstance(p, PackReader)]
        touched: set[str] = set()
        for oid in list(store.loose.iter_ids()):
            path = store.loose.path(oid)
            if any(p.has(oid) for p in survivors):
                if _unlink(store, path):
                    rep.loose_removed += 1
                    touched.add(os.path.dirname(path))
            elif oid in reachable:
                continue
            else:
                try:
                    mtime = store.io.stat(path).st_mtime
                except FileNotFoundError:
                    continue
                if cutoff is not None and mtime <= cutoff:
                    if _unlink(store, path):
                        rep.pruned += 1
                        touched.add(os.path.dirname(path))
                else:
                    rep.kept_unreachable += 1
            if progress:
                progress(1)
        for d in sorted(touched):
            store.io.fsync_dir(d)

        # 4. Temp files of crashed writers, and packs whose index never came.
        # Every writer of the store holds the shared lock while its temp files
        # exist, so under the exclusive lock any temp file is garbage; the
        # grace period still applies, as git applies it to its tmp_ files.
        if cutoff is not None:
            rep.tmp_removed += _remove_stale_tmp(store, cutoff)


def _read_for_explode(store: Store, pack: PackReader, oid: ObjectId, needed: bool):
    try:
        return pack.read_raw(oid)
    except CorruptObject as e:
        # Nothing is deleted yet: refuse rather than drop a needed object.
        if needed and not store.loose.has(oid):
            raise GcAborted(f"object {oid.hex()} is corrupt in {pack.path}: {e.reason}") from None
        return None


def _remove_group(store: Store, group: str, cutoff_ns: int | None) -> bool:
    # timeout=0: gc holds the store's exclusive lock, and a writer holding
    # this group's lock may be waiting for the shared side — never wait here.
    try:
        with store.refs.lock(group, timeout=0):
            state = store.refs.read(group)  # re-read under the lock
            if state.deleted_ns is None or cutoff_ns is None or state.deleted_ns > cutoff_ns:
                return False
            store.refs.unlink_group(group)  # in the order of §6.7: never a file that reads as the group alone
            return True
    except KxenError:
        return False


def _remove_stale_tmp(store: Store, cutoff: float) -> int:
    n = 0
    objects_dir = os.path.join(store.root, "objects")
    dirs = [store.pack_dir] + [os.path.join(objects_dir, d) for d in _listdir(store, objects_dir) if len(d) == 2]
    for d in dirs:
        names = _listdir(store, d)
        idx = {x[:-4] for x in names if x.endswith(".idx")}
        for name in names:
            orphan_pack = d == store.pack_dir and name.endswith(".pack") and name[:-5] not in idx
            if not (name.startswith("tmp_") or orphan_pack):
                continue
            path = os.path.join(d, name)
            try:
                if store.io.lstat(path).st_mtime > cutoff:
                    continue
            except FileNotFoundError:
                continue
            if _unlink(store, path):
                n += 1
    return n


def _listdir(store: Store, d: str) -> list[str]:
    try:
        return sorted(store.io.listdir(d))
    except FileNotFoundError:
        return []
