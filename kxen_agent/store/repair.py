"""repair: mend what fsck names, from a good copy where there is one, without deleting anything.

``objects_spec.md`` §18. A dry run (:func:`repair` with ``apply=False``)
returns the plan; with ``apply=True`` each step is made durable in this
order, so that a crash at any point leaves a state dir no worse than the
one repair found:

1. **restore**: every object that does not read (damaged or missing) and
   that a source holds — a bundle, a Git remote's objects, each checked
   against its id — is written as a loose object, with every object it
   links to that the store cannot read either; a damaged loose file is
   first moved to ``lost-found/``;
2. **re-pack**: a pack with damage is replaced by a new pack of every entry
   that reads; the old pack and its index go to ``lost-found/``;
3. **groups**: a group whose ref file, reflog or step log does not read is
   rebuilt from every record and reflog line that checks: the objects of
   those records become loose objects, the state is the base with the
   records applied in order, the fence is never lowered (raised past any
   the damaged bytes could have set), the reflog gains a ``repair`` line
   per ref, and the damaged files go to ``lost-found/``. When the records
   after a gap do not apply to the state before it (the gap changed what
   they expect), the state is ambiguous: the group is *quarantined* (its
   files moved to ``lost-found/``) and the layer above is asked to make a
   new branch from the last value it can prove (:data:`OnLost`);
4. a group whose refs still reach an object that no source holds is
   quarantined the same way (the session layer branches the session at
   its last intact message).

Nothing is ever deleted: what is replaced is moved to
``lost-found/<time>-repair/`` with a ``manifest.jsonl`` line per file
(where it was, why). This module knows nothing of sessions.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from kxen_agent.errors import KxenError

from .fsck import FsckReport, fsck
from .objects import CorruptObject, ObjectId, RawObject, decode_body, links_of, parse_object
from .refformat import (
    CorruptRef,
    ReflogEntry,
    clean_reason,
    format_ref_file,
    format_reflog_line,
    parse_ref_file,
    parse_reflog,
    validate_ref_name,
)
from .repo import MissingObject, Store
from .salvage import LogSalvage, salvage_log, salvage_pack
from .steps import StepRecord, read_header, scan

__all__ = ["LOST_FOUND", "Action", "GroupSalvage", "OnLost", "RepairReport", "repair", "quarantine_group"]

#: Where repair and ``session delete --force`` put what they replace (§18): never deleted.
LOST_FOUND = "lost-found"
#: The reflog reason of every change repair makes (§18).
REASON = "repair"


@dataclass(frozen=True)
class Action:
    """One thing repair does (or, in a dry run, would do)."""

    kind: str  # restore | lost-found | repack | rebuild | quarantine | branch | skeleton | left
    target: str
    detail: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "target": self.target, "detail": self.detail}

    def line(self) -> str:
        return f"{self.kind}: {self.target}: {self.detail}"


@dataclass
class GroupSalvage:
    """What a lost group's readable parts prove, for the layer above to branch from.

    ``refs``: the best state known (possibly missing a gap's changes);
    ``heads``: every value each ref name had in a record or reflog line that
    checks, newest first (a session's last provably reached message is among them).
    """

    group: str
    refs: dict[str, bytes]
    values: dict[str, list[bytes]]
    why: str


#: Called for a group repair quarantines: returns a line saying what the layer above made of it
#: (a new branch), or None. Only called when applying.
OnLost = Callable[[Store, GroupSalvage], "str | None"]


@dataclass
class RepairReport:
    state_dir: str
    applied: bool
    actions: list[Action] = field(default_factory=list)
    lost_found: str | None = None
    #: What still does not read once done (a dry run: what fsck reports now).
    left: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"stateDir": self.state_dir, "applied": self.applied, "lostFound": self.lost_found,
                "actions": [a.to_json() for a in self.actions], "left": self.left}


class _LostFound:
    """``lost-found/<time>-repair/``: files moved there whole, one manifest line each, all durable."""

    def __init__(self, store: Store, label: str = REASON) -> None:
        self.store = store
        self.io = store.io
        top = os.path.join(store.root, LOST_FOUND)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.dir = os.path.join(top, f"{stamp}-{label}-{os.getpid()}")
        self._made = False

    def _make(self) -> None:
        if not self._made:
            self.io.makedirs(self.dir)
            self.io.fsync_dir(os.path.dirname(self.dir))
            self.io.fsync_dir(os.path.dirname(os.path.dirname(self.dir)))
            self._made = True

    def _dest(self, path: str) -> str:
        rel = os.path.relpath(path, self.store.root)
        dest = os.path.join(self.dir, rel)
        n = 1
        while self.io.lexists(dest):
            dest = os.path.join(self.dir, f"{rel}.{n}")
            n += 1
        return dest

    def note(self, entry: dict) -> None:
        self._make()
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        path = os.path.join(self.dir, "manifest.jsonl")
        new = not self.io.lexists(path)
        self.io.append(path, line)
        if new:
            self.io.fsync_dir(self.dir)

    def move(self, path: str, why: str) -> str:
        """Move ``path`` here (a rename: same file system), durably; its manifest line first."""
        self._make()
        dest = self._dest(path)
        self.note({"file": os.path.relpath(path, self.store.root), "kept": os.path.relpath(dest, self.store.root),
                   "why": why, "how": "moved"})
        self.io.makedirs(os.path.dirname(dest))
        self.io.rename(path, dest)
        self.io.fsync_dir(os.path.dirname(dest))
        self.io.fsync_dir(os.path.dirname(path))
        return dest

    def copy(self, path: str, data: bytes, why: str) -> str:
        """Keep a copy of ``data`` (the bytes of ``path``, which repair is about to replace)."""
        self._make()
        dest = self._dest(path)
        self.note({"file": os.path.relpath(path, self.store.root), "kept": os.path.relpath(dest, self.store.root),
                   "why": why, "how": "copied"})
        self.io.makedirs(os.path.dirname(dest))
        self.io.write_durable(dest, data)
        return dest


# ------------------------------------------------------------------ sources


class _Sources:
    """Good copies by id: every object a source gives is checked against its id before use.

    A source is (name, read by id) or (name, read by id, its refs: group -> name -> id): a
    bundle's refs, or a remote's, say what a damaged group held when the source was made.
    """

    def __init__(self, sources: Iterable[tuple]) -> None:
        self.sources = [(x[0], x[1]) for x in sources]
        self.refs: dict[str, tuple[str, dict[str, bytes]]] = {}
        for x in sources:
            for g, r in (x[2] if len(x) > 2 else {}).items():
                self.refs.setdefault(g, (x[0], dict(r)))

    def get(self, oid: ObjectId) -> tuple[RawObject, str] | None:
        for name, read in self.sources:
            try:
                obj = read(oid)
            except KxenError:
                continue
            if obj is None:
                continue
            try:
                good = parse_object(obj.raw, name, expect_id=oid)  # a source is trusted for nothing but bytes
            except CorruptObject:
                continue
            return good, name
        return None


def _store_reads(store: Store, oid: ObjectId) -> RawObject | None:
    try:
        return store.read_raw(oid)
    except (MissingObject, CorruptObject):
        return None


# ------------------------------------------------------------------ the repair


def repair(store: Store, *, sources: Iterable[tuple[str, Callable[[ObjectId], RawObject | None]]] = (),
           apply: bool = False, on_lost: OnLost | None = None, schema: Any = None) -> RepairReport:
    """Plan (``apply=False``) or make the repair of ``store``: see the module's docstring.

    ``sources``: (name, read by id) pairs, tried in order. ``on_lost``: the
    layer above's hook for a quarantined group (a session's new branch).
    """
    rep = RepairReport(store.root, apply)
    lost = _LostFound(store)
    sources = list(sources)
    src = _Sources(sources)
    found = fsck(store, schema=schema)
    if found.clean:
        return rep
    with store.shared_lock():
        _restore(store, found, src, rep, lost, apply)
        if apply:
            store.reload_packs()
        _repack(store, found, rep, lost, apply)
        if apply:
            store.reload_packs()
            store.steps.scan_all()
        _groups(store, found, rep, lost, apply, on_lost, src)
        _skeleton(store, found, rep, apply, lost)
    if apply:
        store.reload_packs()
        # What still reaches an object that nothing holds: quarantined, the layer above branches.
        again = fsck(store, schema=schema)
        with store.shared_lock():
            _unreachable_damage(store, again, rep, lost, on_lost)
        again = fsck(store, schema=schema)
        rep.left = [p.line() for p in again.problems]
    else:
        rep.left = [p.line() for p in found.problems]
        # What step 4 would do: groups reaching an object that neither the store nor a source holds.
        restored = {a.target for a in rep.actions if a.kind == "restore"}
        done = {a.target for a in rep.actions if a.kind in ("quarantine", "rebuild")}
        lost_groups: dict[str, set[str]] = {}
        for oid in found.bad_ids:
            if oid.hex() in restored:
                continue
            for where in found.reached_from.get(oid, []):
                parts = where.split("/")
                lost_groups.setdefault("/".join(parts[:2]), set()).add("/".join(parts[2:]))
        for group, names in sorted(lost_groups.items()):
            if group not in done:
                rep.actions.append(Action("quarantine", group, f"its refs {', '.join(sorted(names))} reach an "
                                          "object that no file and no source holds (a session: a new branch at "
                                          "its last intact message)"))
    if lost._made:
        rep.lost_found = lost.dir
    return rep


def _restore(store: Store, found: FsckReport, src: _Sources, rep: RepairReport, lost: _LostFound,
             apply: bool) -> None:
    """Step 1: good copies, from the sources, of every object that does not read (and what it links to)."""
    want = set(found.bad_ids) | {d.oid for d in found.damage if d.oid is not None}
    loose_bad = {d.oid: d.file for d in found.damage if d.oid is not None and d.offset is None}
    done: set[ObjectId] = set()
    stack = sorted(want)
    while stack:
        oid = stack.pop()
        if oid in done:
            continue
        done.add(oid)
        if oid not in want and _store_reads(store, oid) is not None:
            continue
        if oid in want and oid not in found.bad_ids and oid not in loose_bad and _store_reads(store, oid) is not None:
            continue  # a damaged copy with a good one elsewhere: re-packing drops the damaged one
        got = src.get(oid)
        if got is None:
            continue
        obj, name = got
        rep.actions.append(Action("restore", oid.hex(), f"a good copy from {name}, checked against its id"))
        if apply:
            bad = loose_bad.get(oid)
            if bad is not None and store.io.lexists(bad):
                lost.move(bad, f"loose object {oid.hex()} does not read")
            store.loose.write(obj)
        if obj.kind != "blob":
            stack.extend(c for c in links_of(obj.kind, decode_body(obj)) if c not in done)
    # A damaged loose file with no good copy anywhere: out of the way (it holds nothing that reads).
    for oid, path in loose_bad.items():
        if any(a.kind == "restore" and a.target == oid.hex() for a in rep.actions):
            continue
        rep.actions.append(Action("lost-found", path, "a loose object that does not read, and no source holds it"))
        if apply and store.io.lexists(path):
            lost.move(path, f"loose object {oid.hex()} does not read")
    for d in found.damage:
        if d.oid is None and d.offset is None and store.io.lexists(d.file):
            rep.actions.append(Action("lost-found", d.file, "a file under objects/ that does not read"))
            if apply:
                lost.move(d.file, "does not read")


def _repack(store: Store, found: FsckReport, rep: RepairReport, lost: _LostFound, apply: bool) -> None:
    """Step 2: each pack with damage becomes a new pack of what reads; the old one goes to lost-found/."""
    from .fold import pack_objects

    for path, info in found.damaged_packs.items():
        idx = info["index"]
        rep.actions.append(Action("repack", path, f"{info['entriesRead']} entries that read into a new pack; the "
                                  f"pack ({info['entriesDamaged']} damaged entries) and its index to lost-found/"))
        if not apply:
            continue
        raws: dict[ObjectId, RawObject] = {}
        sal = salvage_pack(store.io, path, raws=raws)
        elsewhere = [p for p in store.packs if getattr(p, "path", None) != path]
        keep = [oid for oid in raws if not any(p.has(oid) for p in elsewhere if not hasattr(p, "error"))]
        # Copies first: the new pack may have the old one's very name (the same entries: a damaged
        # index alone), and its commit then replaces the damaged files.
        lost.note({"pack": os.path.relpath(path, store.root),
                   "damaged": [{"id": d.oid.hex() if d.oid else None, "offset": d.offset, "reason": d.reason}
                               for d in sal.damaged], "frame": sal.frame})
        why = "a pack with damage, replaced by a new pack of every entry that reads"
        for f in (idx, path):
            data = _read_or_none(store, f)
            if data is not None and data != b"\x00unreadable":
                lost.copy(f, data, why)
        info = pack_objects(store, keep, raws.get)[1] if keep else None
        if info is not None and os.path.basename(path) == f"pack-{info.name}.pack":
            store.reload_packs()
            continue  # rewritten whole in place
        # The index first (§12.6: a pack without its index does not exist), then the pack.
        for f in (idx, path):
            if store.io.lexists(f):
                store.io.unlink(f)
                store.io.fsync_dir(os.path.dirname(f))
        store.reload_packs()


def _skeleton(store: Store, found: FsckReport, rep: RepairReport, apply: bool, lost: "_LostFound") -> None:
    cache = os.path.join(store.root, "cache") + os.sep
    for p in found.problems:
        if p.where.startswith(cache) and store.io.lexists(p.where):
            # A derived cache (§11a) that does not check: out of the way; its owner writes it again.
            rep.actions.append(Action("lost-found", p.where, "a cache that does not check"))
            if apply:
                lost.move(p.where, f"{p.kind}: {p.message}")
            continue
        if p.kind == "skeleton" and "missing" in p.message:
            rep.actions.append(Action("skeleton", p.where, "made again"))
            if apply:
                store.io.makedirs(p.where)


# ------------------------------------------------------------------ groups


def _damaged_groups(store: Store, found: FsckReport) -> list[str]:
    """The groups to rebuild: those that do not read, and those whose reflog disagrees with them."""
    names = set(found.unreadable_groups)
    names |= {p.where for p in found.problems if p.kind == "reflog-mismatch"}
    return sorted({"/".join(g.split("/")[:2]) for g in names})


def _groups(store: Store, found: FsckReport, rep: RepairReport, lost: _LostFound, apply: bool,
            on_lost: OnLost | None, src: "_Sources") -> None:
    from .refformat import validate_group
    from .refs import BadRefName

    for group in _damaged_groups(store, found):
        try:
            validate_group(group)
        except BadRefName:
            # Not a group at all (a stray name under refs/): moved out of the way.
            path = os.path.join(store.root, "refs", group)
            if store.io.lexists(path):
                rep.actions.append(Action("lost-found", path, "a name under refs/ that is no group"))
                if apply:
                    lost.move(path, "not a group")
            continue
        with store.refs.lock(group):
            _rebuild(store, group, rep, lost, apply, on_lost, src)


def _read_or_none(store: Store, path: str) -> bytes | None:
    try:
        return store.io.read(path)
    except FileNotFoundError:
        return None
    except OSError:
        return b"\x00unreadable"


def _reflog_lines(data: bytes | None, where: str) -> tuple[list[ReflogEntry], int, bool]:
    """The reflog lines that parse, in order, up to the first that does not: (lines, their bytes, whole)."""
    if not data:
        return [], 0, True
    out: list[ReflogEntry] = []
    at = 0
    while at < len(data):
        nl = data.find(b"\n", at)
        if nl < 0:
            return out, at, False
        try:
            out += parse_reflog(data[at:nl + 1], where)
        except CorruptRef:
            return out, at, False
        at = nl + 1
    return out, at, True


def _rebuild(store: Store, group: str, rep: RepairReport, lost: _LostFound, apply: bool,
             on_lost: OnLost | None, src: "_Sources") -> None:
    """Step 3 for one group (its lock held): rebuild it from what checks, or quarantine it."""
    ref_path, log_path, steps_path = store.refs.ref_path(group), store.refs.log_path(group), store.steps.path(group)
    ref_data = _read_or_none(store, ref_path)
    base = None
    base_ok = True
    if ref_data is not None:
        try:
            base = parse_ref_file(ref_data, group, ref_path)
        except CorruptRef:
            base_ok = False
    reflog_data = _read_or_none(store, log_path)
    lines, good_bytes, reflog_whole = _reflog_lines(reflog_data, log_path)
    if base is not None and reflog_data is not None and len(reflog_data) >= base.log_size:
        committed, cut, cut_whole = _reflog_lines(reflog_data[:base.log_size], log_path)
        if cut_whole and cut == base.log_size:
            lines, good_bytes, reflog_whole = committed, cut, True
    elif base is not None and base.log_size > len(reflog_data or b""):
        reflog_whole = False
    # The step log: every record that checks, and the gaps.
    steps_data = _read_or_none(store, steps_path)
    records: list[StepRecord] = []
    gap_bytes = 0
    before = 0
    log_gen: int | None = None
    log_damaged = False
    if steps_data is not None:
        gens = tuple(dict.fromkeys(([base.steps_gen] if base else []) + [0, 1]))
        sal: LogSalvage | None = salvage_log(store.io, steps_path, group, gens)
        if sal is None:
            try:
                _v, _g, log_gen, hlen = read_header(steps_data, steps_path)
                records, _end = scan(steps_data, hlen, steps_path)
            except KxenError:
                records, log_gen = [], None
            before = len(records)
        else:
            log_damaged = True
            records, before, log_gen = sal.records, sal.before, sal.gen
            gap_bytes = sum(b - a for a, b, _ in sal.damage)
    base_gen = base.steps_gen if base is not None else 0
    if log_gen is not None and base is not None and log_gen < base_gen:
        records, before = [], 0  # a stale generation: nothing of the group's
    # The starting state: the ref file, else the reflog's last value per name (it is the ref file's record).
    values: dict[str, list[bytes]] = {}
    for e in lines:
        if e.new is not None:
            values.setdefault(e.name, []).insert(0, e.new)
    ambiguous: str | None = None
    if base is not None:
        refs, fence, deleted = dict(base.refs), base.fence, base.deleted_ns
    elif not base_ok and lines:
        refs = {}
        for e in lines:
            if e.new is None:
                refs.pop(e.name, None)
            else:
                refs[e.name] = e.new
        fence, deleted = max(e.fence for e in lines) + 1, None
    elif not base_ok:
        refs, fence, deleted = {}, 0, None
        ambiguous = f"its ref file {ref_path} does not read and no reflog line says what it held"
    else:
        refs, fence, deleted = {}, 0, None
    seen_fence = max([fence] + [e.fence for e in lines])
    applied: list[StepRecord] = []
    for i, r in enumerate(records):
        t = r.tx
        seen_fence = max(seen_fence, t.fence, t.new_fence or 0)
        ok = all(_valid_name(u.name) for u in t.updates)
        trial = dict(refs)
        for u in t.updates:
            if trial.get(u.name) != u.old:
                ok = False
                break
            if u.new is None:
                trial.pop(u.name, None)
            else:
                trial[u.name] = u.new
        for u in t.updates:
            if u.new is not None:
                values.setdefault(u.name, []).insert(0, u.new)
        if not ok:
            if ambiguous is None:
                side = "after" if i >= before else "before"
                ambiguous = (f"the record at offset {r.offset} ({side} the damage) does not apply to the state "
                             "before it: the damaged bytes changed what it expects")
            continue
        if ambiguous is None:
            refs = trial
            if t.deleted != "leave":
                deleted = t.deleted  # type: ignore[assignment]
            applied.append(r)
    # A source's refs of this group (a bundle, the remote): taken whole when they hold every value the
    # records and lines that check prove (each newest one equal, or reached from the source's): the
    # gap's changes are then in them. Their objects come from the source where the store lacks them.
    from_source = None
    if group in src.refs:
        name, theirs = src.refs[group]
        proven = {n: v[0] for n, v in values.items() if v}
        if all(n in theirs and _reaches(store, src, theirs[n], v) for n, v in proven.items()
               if n in refs or n in theirs):
            from_source = (name, theirs)
            if ambiguous is not None or refs != theirs:
                refs, ambiguous = dict(theirs), None
                applied = [r for r in applied if records.index(r) < before]
    # Never lower a fence: past every fence seen, and past any the damaged bytes could hold
    # (one raise per record that fits in them: a lease's taker raises it by one, §15.4).
    new_fence = seen_fence + (1 + gap_bytes // 96 if gap_bytes else 0)
    if base_ok and not log_damaged and reflog_whole and base is not None and ambiguous is None:
        new_fence = max(new_fence, base.fence)
    # Every object of every record that checks becomes a loose object: nothing that checked is lost.
    objs: list[RawObject] = []
    if steps_data is not None:
        from .objects import decompress_loose

        for r in records:
            for oid, at, n in r.objects:
                try:
                    objs.append(parse_object(decompress_loose(steps_data[at:at + n], steps_path), steps_path,
                                             expect_id=oid))
                except CorruptObject:
                    continue
    damaged_files = []
    if not base_ok:
        damaged_files.append(ref_path)
    if not reflog_whole:
        damaged_files.append(log_path)
    if log_damaged:
        damaged_files.append(steps_path)
    if ambiguous is not None:
        rep.actions.append(Action("quarantine", group, f"{ambiguous}; its files go to lost-found/, the "
                                  f"{len(objs)} objects of its {len(records)} records that check stay as loose objects"))
        if apply:
            _keep_objects(store, objs)
            quarantine_group(store, group, lost, ambiguous)
            if on_lost is not None:
                made = on_lost(store, GroupSalvage(group, refs, values, ambiguous))
                if made:
                    rep.actions.append(Action("branch", group, made))
        return
    what = (f"kept {len(applied)} of {len(records)} records that check"
            + (f" ({before} before the damage, {len(records) - before} after)" if log_damaged else "")
            + f", fence {new_fence}" + (f" (was {base.fence})" if base is not None else "")
            + (f"; {', '.join(os.path.relpath(f, store.root) for f in damaged_files)} to lost-found/"
               if damaged_files else ""))
    if from_source is not None:
        what += f"; its refs as {from_source[0]} holds them"
    rep.actions.append(Action("rebuild", group, what))
    if not apply:
        return
    _keep_objects(store, objs)
    if from_source is not None:
        _restore_closure(store, src, list(refs.values()), rep)
    # The new reflog: the lines that check, each applied record's, then one repair line per name whose last
    # line does not say its value (or every ref's, so the reflog records the repair).
    entries = list(lines) + [ReflogEntry(u.old, u.new, r.tx.time_ns, r.tx.fence, u.name, r.tx.reason)
                             for r in applied for u in r.tx.updates]
    last: dict[str, bytes | None] = {}
    for e in entries:
        last[e.name] = e.new
    now = time.time_ns()
    reason = clean_reason(f"{REASON}: {'; '.join(os.path.basename(f) for f in damaged_files) or 'reflog'} "
                          "rebuilt from what checks")
    for name in sorted(set(last) | set(refs)):
        entries.append(ReflogEntry(last.get(name), refs.get(name), now, new_fence, name, reason))
    reflog = b"".join(format_reflog_line(e) for e in entries)
    for f, data in ((ref_path, ref_data), (log_path, reflog_data), (steps_path, steps_data)):
        if data is not None and data != b"\x00unreadable" and (f in damaged_files or f == log_path):
            lost.copy(f, data, "replaced by repair" + (" (damaged)" if f in damaged_files else ""))
    store.refs._ensure_dir(os.path.dirname(log_path))
    store.refs._ensure_dir(os.path.dirname(ref_path))
    store.io.write_durable(log_path, reflog)
    gen = max(base_gen, log_gen or 0) + 1
    store.io.write_durable(ref_path, format_ref_file(refs, new_fence, len(reflog), deleted, gen))
    store.refs._ensure_dir(os.path.dirname(steps_path))
    store.steps.start_generation(group, gen)
    store.refs._applied.pop(group, None)


def _read_any(store: Store, src: "_Sources", oid: ObjectId) -> RawObject | None:
    got = _store_reads(store, oid)
    if got is None:
        hit = src.get(oid)
        got = hit[0] if hit else None
    return got


def _reaches(store: Store, src: "_Sources", start: ObjectId, target: ObjectId, limit: int = 200_000) -> bool:
    """Whether ``target`` is ``start`` or in its closure (read from the store, else the sources)."""
    seen: set[ObjectId] = set()
    stack = [start]
    while stack and len(seen) < limit:
        cur = stack.pop()
        if cur == target:
            return True
        if cur in seen:
            continue
        seen.add(cur)
        obj = _read_any(store, src, cur)
        if obj is not None and obj.kind != "blob":
            stack.extend(links_of(obj.kind, decode_body(obj)))
    return False


def _restore_closure(store: Store, src: "_Sources", roots: list[ObjectId], rep: RepairReport) -> None:
    """Write, from the sources, every object of ``roots``' closure that the store cannot read."""
    seen: set[ObjectId] = set()
    stack = list(roots)
    while stack:
        cur = stack.pop()
        if cur in seen:
            continue
        seen.add(cur)
        obj = _store_reads(store, cur)
        if obj is None:
            hit = src.get(cur)
            if hit is None:
                continue
            obj = hit[0]
            store.loose.write(obj)
            rep.actions.append(Action("restore", cur.hex(), f"a good copy from {hit[1]}, checked against its id"))
        if obj.kind != "blob":
            stack.extend(links_of(obj.kind, decode_body(obj)))


def _valid_name(name: str) -> bool:
    try:
        validate_ref_name(name)
        return True
    except KxenError:
        return False


def _keep_objects(store: Store, objs: list[RawObject]) -> None:
    if not objs:
        return
    with store.loose.batch():
        for o in objs:
            store.loose.write(o)


def quarantine_group(store: Store, group: str, lost: "_LostFound | None" = None, why: str = "quarantined") -> str:
    """Move ``group``'s ref file, reflog and step log to ``lost-found/`` (durably; the caller holds its lock).

    The step log's objects are first written as loose objects (read from
    every record that checks): quarantining loses no object. Returns the
    lost-found directory.
    """
    lost = lost or _LostFound(store, "quarantine")
    steps_path = store.steps.path(group)
    data = _read_or_none(store, steps_path)
    if data is not None and data != b"\x00unreadable":
        objs = []
        from .objects import decompress_loose

        sal = salvage_log(store.io, steps_path, group)
        try:
            recs = sal.records if sal is not None else scan(data, read_header(data, steps_path)[3], steps_path)[0]
        except KxenError:
            recs = []
        for r in recs:
            for oid, at, n in r.objects:
                try:
                    objs.append(parse_object(decompress_loose(data[at:at + n], steps_path), steps_path, expect_id=oid))
                except CorruptObject:
                    continue
        _keep_objects(store, objs)
    lost.note({"group": group, "why": why})
    # The ref file first: alone, a generation-0 step log would read as the group (§6.7), so it goes next.
    for path in (store.refs.ref_path(group), steps_path, store.refs.log_path(group)):
        if store.io.lexists(path):
            lost.move(path, f"group {group} quarantined: {why}")
    store.steps.forget(group)
    store.refs._applied.pop(group, None)
    return lost.dir


def _unreachable_damage(store: Store, found: FsckReport, rep: RepairReport, lost: _LostFound,
                        on_lost: OnLost | None) -> None:
    """Step 4: groups whose refs reach an object nothing holds: quarantined, the layer above branches."""
    groups: dict[str, set[str]] = {}
    for oid in found.bad_ids:
        for where in found.reached_from.get(oid, []):
            parts = where.split("/")
            groups.setdefault("/".join(parts[:2]), set()).add("/".join(parts[2:]))
    for p in found.problems:
        if p.kind == "missing-object":
            parts = p.where.split("/")
            groups.setdefault("/".join(parts[:2]), set()).add("/".join(parts[2:]))
    for group, names in sorted(groups.items()):
        try:
            with store.refs.lock(group):
                state = store.refs.read(group)
                log = store.refs.reflog(group, state)
                values: dict[str, list[bytes]] = {}
                for e in reversed(log):
                    if e.new is not None:
                        values.setdefault(e.name, []).append(e.new)
                why = f"its refs {', '.join(sorted(names))} reach an object that no file and no source holds"
                rep.actions.append(Action("quarantine", group, why))
                quarantine_group(store, group, lost, why)
        except KxenError as e:
            rep.actions.append(Action("left", group, f"could not be quarantined: {e}"))
            continue
        if on_lost is not None:
            made = on_lost(store, GroupSalvage(group, dict(state.refs), values, why))
            if made:
                rep.actions.append(Action("branch", group, made))


def _mapping_source(name: str, objs: Mapping[ObjectId, RawObject]) -> tuple[str, Callable[[ObjectId], RawObject | None]]:
    return name, objs.get
