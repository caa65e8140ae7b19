"""Importing a bundle into a store: verify everything, stage the new objects, then move the refs.

Owns :func:`import_bundle` (``objects_spec.md`` §12.6): while the bundle
is read and verified (:mod:`.verify`'s reader, opened through the store's
:class:`~kxen_agent.store.fsio.FileIO`), the objects the store lacks are
staged verbatim into a temporary pack (:class:`~kxen_agent.store.pack.PackWriter`);
then every ref update is checked to be a fast-forward, then the pack's
index is committed, then the refs move, one transaction per group. A
bundle that fails any check leaves no ref, no object and no pack.

It must never parse bundle bytes itself (the form readers do), nor call
``os`` or ``open`` for a file.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kxen_agent.errors import KxenError

from ..loose import LooseNames
from ..objects import ObjectId, Schema, decode_stored, links_of
from ..pack import PackWriter
from ..refs import validate_ref_name
from ..repo import MissingObject, Store
from ..step import Step
from .header import BundleInfo, BundleLimits, Progress, _set_total
from .verify import _reading

__all__ = ["BundleRefused", "ImportResult", "Transform", "import_bundle"]


class BundleRefused(KxenError):
    """Import would move a local ref backwards or sideways; nothing was imported."""

    def __init__(self, group: str, ref: str, local: bytes, bundle: bytes | None, why: str) -> None:
        theirs = "has no such ref" if bundle is None else f"has {bundle.hex()[:16]}"
        super().__init__(
            f"import refused: ref {group}/{ref} is {local.hex()[:16]} here and the bundle {theirs}: {why}; "
            "nothing was imported (fork or delete the local one first)"
        )
        self.group = group
        self.ref = ref
        self.local = local
        self.bundle = bundle


@dataclass(frozen=True)
class ImportResult:
    """What an import did: the bundle as verified, the objects and pack it added, each group's fate."""

    info: BundleInfo
    new_objects: int
    pack: str | None  # the pack written, None when every object was already here
    groups: Mapping[str, str]  # group -> "created" | "updated" | "unchanged" | "restored"
    refs: Mapping[str, Mapping[str, bytes]]  # as written (after ``transform``)

    def to_json(self) -> dict:
        return {
            "bundle": self.info.to_json(),
            "newObjects": self.new_objects,
            "pack": self.pack,
            "groups": dict(self.groups),
            "refs": {g: {n: v.hex() for n, v in sorted(r.items())} for g, r in sorted(self.refs.items())},
        }


def _reaches(store: Store, start: ObjectId, target: ObjectId) -> bool:
    """Is ``target`` reachable from ``start`` through links?"""
    stack = [start]
    seen: set[ObjectId] = set()
    while stack:
        oid = stack.pop()
        if oid == target:
            return True
        if oid in seen:
            continue
        seen.add(oid)
        try:
            obj = store.read_raw(oid)
        except MissingObject:
            continue
        if obj.kind == "blob":
            continue
        stack.extend(c for c in links_of(obj.kind, decode_stored(obj)) if c not in seen)
    return False


def _check_fast_forward(store: Store, group: str, local: Mapping[str, bytes], new: Mapping[str, bytes]) -> None:
    for name in sorted(local):
        lv = local[name]
        nv = new.get(name)
        if nv is None:
            raise BundleRefused(group, name, lv, None, "importing would drop it")
        if nv == lv or _reaches(store, nv, lv):
            continue
        if _reaches(store, lv, nv):
            raise BundleRefused(group, name, lv, nv, "the local history is newer than the bundle's")
        raise BundleRefused(group, name, lv, nv, "the histories diverged")


def _check_transformed(store: Store, step: Step, group: str, refs: Any) -> dict[str, bytes]:
    if not isinstance(refs, Mapping):
        raise TypeError(f"transform must return a mapping of ref names to ids, not {type(refs).__name__}")
    out = {}
    for name, oid in refs.items():
        validate_ref_name(name)
        if not isinstance(oid, bytes) or len(oid) != 32:
            raise TypeError(f"transform returned a non-id for {group}/{name}")
        if not step.has(oid):
            raise MissingObject(oid.hex(), f"{store.root} (transform's ref {group}/{name})")
        out[name] = oid
    if not out:
        raise TypeError(f"transform returned no refs for {group}")
    return out


Transform = Callable[[str, dict[str, bytes], Step], Mapping[str, bytes]]


def import_bundle(
    store: Store,
    path: str,
    *,
    transform: Transform | None = None,
    progress: Progress | None = None,
    schema: Schema | None = None,
    limits: BundleLimits | None = None,
) -> ImportResult:
    """Verify a bundle completely, then add its objects, then its refs.

    Streaming: objects the store lacks are staged, verbatim, into a
    temporary pack while every check runs; the pack's index is committed
    only after the whole bundle verified and every ref update is known to
    be a fast-forward. ``transform(group, refs, step) -> refs`` may rewrite
    the refs (it may ``step.put`` new objects, and can read the bundle's):
    ``step`` is the group's. Then one step per group moves its refs (CAS
    against what was checked) with the objects put in it, so objects are
    durable before any ref names them.

    Importing the same bundle twice is a no-op. A local ref that the
    bundle's value does not descend from refuses the import
    (:class:`BundleRefused`); a bad bundle raises :class:`BadBundle`. Either
    way no ref, object or pack index is written (``transform`` may have
    left unreferenced objects, which fsck reports as dangling). With
    ``schema``, an object of the wrong shape or kind is a :class:`BadBundle`.
    ``limits``: the object bytes accepted (default :meth:`BundleLimits.from_env`).
    """
    with _reading(path, schema, store.io, limits=limits) as r:
        _set_total(progress, r.header.objects)
        with store.shared_lock():  # gc must not prune (or take our temp pack) meanwhile
            writer: PackWriter | None = None
            try:
                found_dirs: set[str] = set()
                found_packed = False
                found_steps: list = []
                steps = store.steps
                steps.scan_all()
                loose = LooseNames(store.loose, r.header.objects)
                add_checked = None
                for item in r:
                    oid = item.obj.id
                    if loose.has(oid):
                        found_dirs.add(os.path.dirname(store.loose.path(oid)))
                    elif store.packs and any(p.has(oid) for p in store.packs):
                        found_packed = True
                    elif steps.has(oid):
                        found_steps.append(oid)  # in a step log: made durable below (§9.3 rule 12)
                    else:
                        if writer is None:
                            writer = store.pack_writer(r.dictionary)
                            add_checked = writer.stream.add_checked_entry
                        if item.head:
                            # verified by the reader (header checks and CRC, against this dictionary)
                            add_checked(item.head, item.stored, oid, len(item.obj.raw), item.crc)
                        else:
                            writer.add(item.obj)
                    if progress:
                        progress(1)
                sealed = writer.seal() if writer is not None else None
            except BaseException:
                if writer is not None:
                    writer.abort()
                raise
            info = r.info
            assert info is not None
            # Objects found present are relied on by the refs below, so their
            # names must be durable first (an earlier writer may have failed
            # before its directory fsync).
            for d in sorted(found_dirs):
                store.loose.barrier(d)
            if found_packed:
                store.sync_pack_dir_once()
            for oid in found_steps:
                steps.make_durable(oid)
            try:
                return _apply_refs(store, info, r.header.refs, sealed, transform)
            finally:
                if sealed is not None:
                    sealed.discard()  # a no-op once committed
                store.reload_packs()


def _apply_refs(store: Store, info: BundleInfo, refs, sealed, transform) -> ImportResult:
    with contextlib.ExitStack() as stack:
        if sealed is not None:
            reader = sealed.reader()
            stack.callback(reader.close)
            stack.enter_context(store.pinned_source(reader))
        plan = []
        for group in sorted(refs):
            new = dict(refs[group])
            # Not entered: its commit below takes the group's lock for itself.
            step = store.step(group)
            if transform is not None:
                new = _check_transformed(store, step, group, transform(group, dict(new), step))
            local = store.refs.read(group)
            _check_fast_forward(store, group, local.refs, new)
            plan.append((group, local, new, step))
        pack = sealed.commit().name if sealed is not None else None
    statuses: dict[str, str] = {}
    written: dict[str, dict[str, bytes]] = {}
    for group, local, new, step in plan:
        written[group] = new
        if local.exists and local.refs == new and local.deleted_ns is None:
            statuses[group] = "unchanged"  # what the transform put is named by no ref: dropped with the step
            continue
        for n, v in sorted(new.items()):
            if local.refs.get(n) != v:
                step.update(n, local.refs.get(n), v)
        step.mark_deleted(None)
        step.commit(f"import bundle {info.content_digest[:16]}")
        statuses[group] = "created" if not local.exists else ("restored" if local.refs == new else "updated")
    return ImportResult(info, sealed.count if sealed is not None else 0, pack, statuses, written)
