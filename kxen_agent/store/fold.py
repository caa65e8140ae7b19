"""Folding step logs: their objects into a pack, their transactions into the ref files (§6.8, §12.11a).

A step log grows by one record per durable step. Automatic packing and gc
fold it: every object the logs hold goes into one pack, committed (§12.6:
durable before anything else moves); then, group by group under the
group's lock, a checkpoint writes the log's transactions into the reflog
and the ref file and starts the log's next, empty generation. A record
committed between the pack and the checkpoint has objects the pack lacks:
those are written loose (one batch, durable) before the checkpoint, so
the old log never holds the only copy of anything once it is replaced.

Like the pack writers it runs under ``locks/gc-run.lock`` (the caller
takes it), never prunes, and holds each group's lock only for its
checkpoint: a few fsyncs, which a writer of that group waits out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kxen_agent.errors import KxenError

from .objects import CorruptObject, ObjectId, RawObject
from .repo import Store

__all__ = ["FoldReport", "fold_step_logs", "pack_objects", "step_objects"]


@dataclass
class FoldReport:
    packed: int = 0
    pack: str | None = None
    groups: list[str] = field(default_factory=list)
    loose_written: int = 0


def step_objects(store: Store) -> int:
    """How many objects the step logs hold now (what automatic packing counts besides loose files)."""
    store.steps.scan_all()
    return sum(1 for _ in store.steps.iter_ids())


def fold_step_logs(store: Store, *, pack: bool = True, groups: list[str] | None = None) -> FoldReport:
    """Pack what the step logs hold, then checkpoint every group whose log has records.

    ``pack=False`` (gc, after its own pack): write no pack; fold only the
    logs whose every object a committed pack holds already, leave the others.
    ``groups``: only these groups' logs (the checkpoint policy of automatic
    packing, :mod:`.autopack`): their objects alone are packed, and no other
    log is read.
    """
    rep = FoldReport()
    steps = store.steps
    only = groups is not None
    if not only:
        steps.scan_all()
    store.reload_packs()
    groups = [g for g in (steps.groups() if groups is None else groups) if _has_records(store, g)]
    if not groups:
        return rep

    def in_packs(oid: ObjectId) -> bool:
        return any(p.has(oid) for p in store.packs if p not in store._pinned)

    ids = _ids_of(store, groups) if only else steps.iter_ids()
    todo = [oid for oid in ids if not in_packs(oid)]
    if todo and pack:
        packed, info = pack_objects(store, todo, steps.read_raw)
        if info is not None:
            rep.packed, rep.pack = info.count, info.name
    for g in groups:
        with store.shared_lock(), store.refs.lock(g):
            cur, log = store.refs.read_with_log(g)
            if log is None or not log.records:
                continue
            missing = [oid for oid in log.ids if not in_packs(oid)]
            if missing and not pack:
                continue  # its objects are in no pack: left for automatic packing
            try:
                objs = [steps.read_raw(oid) for oid in missing]
            except CorruptObject:
                continue  # a damaged log is not folded: fsck names it, nothing is lost
            if objs:
                with store.loose.batch():
                    for obj in objs:
                        if obj is not None:
                            store.loose.write(obj)
                rep.loose_written += len(objs)
            try:
                folded = store.refs.checkpoint(g, locked=True)
            except KxenError:
                continue  # a damaged group (fsck names it) is left as it is; the others are folded
            if folded:
                rep.groups.append(g)
    return rep


def pack_objects(store: Store, ids: list[ObjectId], read: Callable[[ObjectId], RawObject | None],
                 limit: int | None = None) -> tuple[list[ObjectId], Any]:
    """Write one pack (no dictionary) of ``ids`` as ``read`` gives them, and commit it (§12.6).

    An object ``read`` finds corrupt or gone is left out (fsck names the
    first; the second was removed since the listing); at most ``limit``
    objects. The ids packed and the committed pack's info (None: nothing
    to pack, no pack written).
    """
    packed: list[ObjectId] = []
    with store.pack_writer(None) as w:
        for oid in ids:
            if limit is not None and len(packed) >= limit:
                break
            try:
                obj = read(oid)
            except CorruptObject:
                continue
            if obj is None:
                continue
            w.add(obj)
            packed.append(oid)
        if not packed:
            w.abort()
            return packed, None
        sealed = w.seal()
    try:
        info = sealed.commit()
    except BaseException:
        sealed.discard()
        raise
    store.reload_packs()
    return packed, info


def _ids_of(store: Store, groups: list[str]) -> list[ObjectId]:
    """The objects the logs of ``groups`` hold, each once."""
    seen: dict[ObjectId, None] = {}
    for g in groups:
        try:
            _, log = store.refs.read_with_log(g)
        except KxenError:
            continue
        if log is not None:
            seen.update(dict.fromkeys(log.ids))
    return list(seen)


def _has_records(store: Store, group: str) -> bool:
    try:
        _, log = store.refs.read_with_log(group)
    except KxenError:  # a damaged group: fsck's to name, not ours to fold
        return False
    return log is not None and bool(log.records)
