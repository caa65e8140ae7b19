"""fsck: verify every object, every ref and the closure between them.

Read-only; takes no lock (objects are immutable, ref files are replaced
whole). Problems are what makes the store untrustworthy: an object whose
bytes do not hash to its name or do not decode strictly, a ref or reflog
that does not parse, a ref whose reflog disagrees with it, an object that a
reachable object links to but that is missing. Dangling objects (written,
never referenced: normal after a crash or a failed import) are reported as
information only, as ``git fsck`` does, and so are stray files: temp files a
crashed writer left anywhere in the state dir, and names under ``objects/``
that are not objects (``objects_spec.md`` §11).

Every file-system call (reads, ``stat``, listings, the walk for temp files)
goes through the store's :class:`~.fsio.FileIO`. The skeleton checked is
the store's own (:meth:`Store.skeleton_dirs`, from the namespaces it was
opened with): a namespace directory the store was not told of is checked
like any other directory, as a holder of groups.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from kxen_agent.errors import KxenError

from .fsio import FileIO
from .loose import PACK_DIR_NAME
from .objects import CorruptObject, ObjectId, Schema, SchemaViolation, a_kind, decode_body, links_of
from .refs import TEMP_PREFIX, BadRefName, CorruptRef, is_temp_file, validate_group
from .repo import FORMAT_VERSION, Store
from .salvage import salvage_log, salvage_pack

#: Temp files of the state dir: ``tmp_…`` (every writer, §9.1) and
#: ``FORMAT.tmp_…`` (the FORMAT file's, §10.3).
_TEMP_PREFIXES = (TEMP_PREFIX, "FORMAT." + TEMP_PREFIX)

__all__ = ["Damage", "FsckReport", "NEXT", "Problem", "fsck"]


@dataclass(frozen=True)
class Problem:
    kind: str  # corrupt-object | corrupt-ref | reflog-mismatch | missing-object | broken-link | corrupt-pack | skeleton | schema | a cache kind's (history-index)
    where: str
    message: str

    def line(self) -> str:
        return f"{self.kind}: {self.where}: {self.message}"

    @property
    def next(self) -> str:
        """The command that gets past this kind of problem (never fsck itself)."""
        return NEXT.get(self.kind, NEXT_OTHER)


#: Each problem kind's next command (objects_spec.md §18; docs/damage.md explains them in order).
NEXT = {
    "corrupt-object": "kxen-agent repair --from BUNDLE or --remote NAME (a good copy, checked by its id); "
                      "without one: kxen-agent repair --apply",
    "missing-object": "kxen-agent repair --from BUNDLE or --remote NAME; without one: kxen-agent repair --apply "
                      "(the session goes on from its last intact message as a new branch)",
    "broken-link": "kxen-agent repair --from BUNDLE or --remote NAME; without one: kxen-agent repair --apply",
    "corrupt-pack": "kxen-agent repair --apply (re-packs every entry that reads; the rest goes to lost-found/)",
    "corrupt-ref": "kxen-agent repair --apply (keeps every record and line that checks; the damaged file goes "
                   "to lost-found/)",
    "reflog-mismatch": "kxen-agent repair --apply",
    "skeleton": "any write makes the directory again (kxen-agent gc)",
    "schema": "kxen-agent repair --from BUNDLE or --remote NAME (an object of the right shape)",
    "history-index": "kxen-agent repair --apply (a cache: moved to lost-found/, the session's next run "
                     "writes it again)",
    "run-state": "kxen-agent run show SES names the run; kxen-agent session fork SES --at MSG goes on from "
                 "before it",
}
NEXT_OTHER = "kxen-agent repair (a dry run first: it says what it would change)"

#: Advice to run fsck, in messages other commands raise: fsck does not repeat it (it printed them).
_SELF_ADVICE = re.compile(r"(?:[;:,]\s*|\s*\(|\s+then\s+)(?:run\s+)?(?:'kxen-agent fsck'|`kxen-agent fsck`|fsck)"
                          r"(?:, then 'kxen-agent gc' to rewrite packs|,? and keep a copy of the file before any repair"
                          r"| again)?\)?")


def _no_self_advice(text: str) -> str:
    return _SELF_ADVICE.sub("", text)


@dataclass(frozen=True)
class Damage:
    """One object that does not read where it is kept: id, file, offset (None: a loose file), kind if known."""

    oid: ObjectId | None
    file: str
    offset: int | None
    reason: str
    kind: str | None = None

    def to_json(self, reached: list[str]) -> dict:
        return {"id": self.oid.hex() if self.oid else None, "file": self.file, "offset": self.offset,
                "kind": self.kind, "reason": self.reason, "reachedFrom": reached}


@dataclass
class FsckReport:
    state_dir: str
    objects: int = 0
    loose: int = 0
    packed: int = 0
    #: Object copies in step logs (§6.8).
    in_steps: int = 0
    bytes: int = 0
    groups: int = 0
    refs: int = 0
    reachable: int = 0
    problems: list[Problem] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)
    stray_files: list[str] = field(default_factory=list)
    #: What a cache's check found normal for a cache (§11a): (the kind's title, text); not in the JSON.
    notes: list[tuple[str, str]] = field(default_factory=list)
    #: Every copy of an object that does not read (§18), and the refs (group/name) that reach each damaged id.
    damage: list[Damage] = field(default_factory=list)
    reached_from: dict[ObjectId, list[str]] = field(default_factory=dict)
    #: Ids reachable from a ref that no good copy holds (damaged or missing).
    bad_ids: set[ObjectId] = field(default_factory=set)
    #: Groups that do not read: group -> (file, why).
    unreadable_groups: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Damaged step logs: path -> what checks and where the damage is (JSON-ready).
    damaged_logs: dict[str, dict] = field(default_factory=dict)
    #: Packs with damage: path -> {entries that read, damaged entries, frame problems}.
    damaged_packs: dict[str, dict] = field(default_factory=dict)
    #: What the layer above adds (the session layer's classification of sessions).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            "stateDir": self.state_dir,
            "clean": self.clean,
            "objects": self.objects,
            "looseObjects": self.loose,
            "packedObjects": self.packed,
            "stepLogObjects": self.in_steps,
            "bytes": self.bytes,
            "refGroups": self.groups,
            "refs": self.refs,
            "reachable": self.reachable,
            "problems": [{"kind": p.kind, "where": p.where, "message": p.message, "next": p.next}
                         for p in self.problems],
            "dangling": self.dangling,
            "strayFiles": self.stray_files,
            "damage": [d.to_json(self.reached_from.get(d.oid, []) if d.oid else []) for d in self.damage],
            "damagedStepLogs": list(self.damaged_logs.values()),
            "damagedPacks": list(self.damaged_packs.values()),
            "unreadableGroups": [{"group": g, "file": f, "reason": r}
                                 for g, (f, r) in sorted(self.unreadable_groups.items())],
            **self.extra,
        }


def fsck(store: Store, progress: Callable[[int], None] | None = None, schema: Schema | None = None) -> FsckReport:
    """Verify every object, ref and reflog and the closure between them.

    With ``schema`` (the session layer's, from the CLI), the shape of each
    object reachable from a group the schema governs, and the kind every
    link and ref of those names, are checked too: problem kind ``schema``.
    """
    rep = FsckReport(store.root)
    links: dict[ObjectId, list[ObjectId]] = {}
    kind_of: dict[ObjectId, str] = {}
    # Judged while each object is decoded, reported once reachability is known:
    # id -> (where, what is wrong) and id -> [(link, kind it must name)].
    misshapen: dict[ObjectId, tuple[str, str]] = {}
    typed: dict[ObjectId, list[tuple[ObjectId, str]]] = {}

    def check_shape(where: str, obj: Any, value: Any) -> None:
        kind_of[obj.id] = obj.kind
        if schema is None:
            return
        try:
            want = schema.check(obj.kind, value)
        except SchemaViolation as e:
            misshapen[obj.id] = (where, f"{obj.kind} object: {e}")
        else:
            if want:
                typed[obj.id] = want

    strays: set[str] = set()
    present: set[ObjectId] = set()  # ids with a good loose or packed copy (checks 1 and 2)
    damage: list[Damage] = []  # every copy that does not read, named once reachability is known

    # 0. A version-2 state dir's skeleton (§10.3): writers rely on these
    # names being durable directories, so one missing (removed by hand) or
    # replaced by a file is damage, not a leftover.
    not_dirs: set[str] = set()
    if store.format_version >= 2:
        for rel in store.skeleton_dirs():
            if store.format_version < 3 and rel.split(os.sep)[0] == "steps":
                continue  # made by the first write of this version (§10.2)
            d = os.path.join(store.root, rel)
            if store.io.isdir(d):
                continue
            if store.io.lexists(d):
                not_dirs.add(d)
                rep.problems.append(Problem("skeleton", d, "is not a directory; move it out of the state dir"))
            else:
                rep.problems.append(Problem(
                    "skeleton", d, "directory is missing (removed by hand?); the next write makes it again, "
                    "then run fsck again"))

    # 1. Every loose object: name == hash, strict header and body.
    for path, named in store.loose.scan():
        if named is None:  # a temp file, an upper-case or odd name: lookups never see it
            strays.add(path)
            continue
        try:
            obj = store.loose.read_named(path, named)
            value = decode_body(obj)
        except CorruptObject as e:
            damage.append(Damage(named, path, None, e.reason))
            continue
        except OSError as e:
            damage.append(Damage(named, path, None, f"unreadable: {e.strerror}"))
            continue
        links[obj.id] = links_of(obj.kind, value)
        check_shape(path, obj, value)
        present.add(obj.id)
        rep.loose += 1
        rep.bytes += len(obj.raw)
        if progress:
            progress(1)

    # 2. Every packed object (the pack checks its own checksums too). A pack that fails its
    # whole-file checks is read entry by entry (§18): an entry that checks is present, whatever
    # the trailer, end record or index say; each entry that does not is named.
    for pack in store.packs:
        path = getattr(pack, "path", "pack")
        verify = getattr(pack, "verify", None)
        broken = False
        verr: str | None = None
        if verify is not None:
            try:
                verify()
            except KxenError as e:
                broken = True
                verr = getattr(e, "reason", None) or str(e)
        if not broken:
            for oid in pack.iter_ids():
                try:
                    obj = pack.read_raw(oid)
                    value = decode_body(obj)
                except CorruptObject:
                    broken = True
                    break
                if obj is None:
                    continue
                rep.packed += 1
                present.add(oid)
                if oid not in links:
                    links[oid] = links_of(obj.kind, value)
                    check_shape(f"{path}:{oid.hex()}", obj, value)
                    rep.bytes += len(obj.raw)
                if progress:
                    progress(1)
            if not broken:
                continue
        got: dict[ObjectId, Any] = {}
        sal = salvage_pack(store.io, path, raws=got)
        for oid, obj in got.items():
            try:
                value = decode_body(obj)
            except CorruptObject as e:
                damage.append(Damage(oid, path, sal.good[oid][0], e.reason, obj.kind))
                continue
            if oid not in present:
                rep.packed += 1
            present.add(oid)
            if oid not in links:
                links[oid] = links_of(obj.kind, value)
                check_shape(f"{path}:{oid.hex()}", obj, value)
                rep.bytes += len(obj.raw)
        for d in sal.damaged:
            damage.append(Damage(d.oid, path, d.offset, d.reason))
        rep.damaged_packs[path] = {"pack": path, "index": sal.idx_path, "entriesRead": len(sal.good),
                                   "entriesDamaged": len(sal.damaged), "frame": list(sal.frame)}
        frame = sal.frame or ([verr] if verr and not sal.damaged else [])  # e.g. the index disagrees with an entry
        if frame and not sal.damaged:
            rep.problems.append(Problem("corrupt-pack", path, f"{'; '.join(frame)}; all {len(sal.good)} "
                                        "entries read and are counted"))
            rep.damaged_packs[path]["frame"] = list(frame)
        elif sal.damaged and not sal.good and len(sal.damaged) > 1:
            rep.problems.append(Problem("corrupt-pack", path, f"no entry reads ({'; '.join(sal.frame) or 'damaged'})"))
    # 2b. Every object in a step log (§6.8): each record's checksum, each
    # object's frame and id. A log that does not read is a damaged group.
    steps = store.steps
    for group in steps.groups():
        ns, gid = group.split("/", 1)
        if not _group_name(ns, gid):
            continue  # a stray name (step 7), never read as a group
        try:
            log = steps.load(group, fresh=True)  # every byte, not what this store cached: damage in place too
        except (KxenError, ValueError) as e:
            _damaged_log(store, group, str(e), rep, damage, links, present, check_shape)
            continue
        if log is None:
            continue
        if log.size > log.end:
            strays.add(f"{log.path} (an uncommitted tail of {log.size - log.end} bytes from offset {log.end}: "
                       "a writer that died in its append; the next writer cuts it)")
        for rec in log.records:
            for oid, at, n in rec.objects:
                where = f"{log.path} at offset {at}"
                try:
                    obj = steps.read_frame(log, oid, at, n)
                    value = decode_body(obj)
                except CorruptObject as e:
                    damage.append(Damage(oid, log.path, at, e.reason))
                    continue
                rep.in_steps += 1
                if oid not in links:
                    links[oid] = links_of(obj.kind, value)
                    check_shape(where, obj, value)
                    rep.bytes += len(obj.raw)
                if progress:
                    progress(1)
    rep.objects = len(links)

    # 2c. Only a step log that its group reads holds objects (§6.9 question 8): a stale log
    # (a checkpoint's previous generation) or a removed group's leftover is replaced by that
    # group's next write, so an object that only such a log holds is as good as missing. Its
    # copies were verified and counted above (step log objects); here it leaves the present set.
    held_dead = _held_only_by_dead_logs(store, present, rep)
    for oid, (_where, size) in held_dead.items():
        if links.pop(oid, None) is not None:
            rep.bytes -= size
        kind_of.pop(oid, None)
        misshapen.pop(oid, None)
        typed.pop(oid, None)
    rep.objects = len(links)

    # 3. Refs and reflogs.
    roots: list[tuple[str, ObjectId]] = []
    governed_roots: list[ObjectId] = []
    root_kinds: dict[ObjectId, str] = {}
    keep: set[ObjectId] = set()
    listed = list(store.refs.groups())
    for group in listed:
        rep.groups += 1
        try:
            # One snapshot: the reflog is checked against this very ref file
            # (read first), so a concurrent commit cannot fake a mismatch.
            state = store.refs.read(group)
            log = store.refs.reflog(group, state)
        except (CorruptRef, BadRefName) as e:  # a stray file under refs/ is named, not fatal
            if not any(p.kind == "corrupt-ref" and p.where == steps.path(group) for p in rep.problems):
                rep.problems.append(Problem("corrupt-ref", group, str(e)))
            rep.unreadable_groups.setdefault(group, (_file_of(store, group, str(e)), str(e)))
            continue
        last: dict[str, bytes | None] = {}
        for entry in log:
            last[entry.name] = entry.new
            for v in (entry.old, entry.new):
                if v is not None:
                    keep.add(v)
        for name, value in state.refs.items():
            rep.refs += 1
            roots.append((f"{group}/{name}", value))
            if schema is not None and schema.governs(group):
                governed_roots.append(value)
                kind = schema.ref_kind(group, name)
                if kind is not None and value not in kind_of:
                    root_kinds[value] = kind  # what an unreadable root must be, for its damage's name
                if kind is not None and kind_of.get(value, kind) != kind:
                    rep.problems.append(Problem("schema", f"{group}/{name}", f"ref names object {value.hex()}, "
                                                f"{a_kind(kind_of[value])}, where {a_kind(kind)} object belongs"))
            if name not in last:
                rep.problems.append(Problem("reflog-mismatch", f"{group}/{name}", "ref has no reflog entry"))
            elif last[name] != value:
                got = last[name].hex() if last[name] else "deletion"
                rep.problems.append(
                    Problem("reflog-mismatch", f"{group}/{name}", f"ref is {value.hex()} but its reflog ends at {got}")
                )
        for name, value in last.items():
            if name not in state.refs and value is not None:
                rep.problems.append(
                    Problem("reflog-mismatch", f"{group}/{name}", f"reflog ends at {value.hex()} but the ref is absent")
                )

    # 4. Closure from the refs: everything reachable must exist. An object with a damaged copy and
    # no good one is named once, as damage (with every ref that reaches it), not as missing.
    damaged_ids = {d.oid for d in damage if d.oid is not None and d.oid not in links}
    reachable: set[ObjectId] = set()
    for where, oid in roots:
        if oid not in links:
            rep.bad_ids.add(oid)
            if oid not in damaged_ids:
                rep.problems.append(Problem("missing-object", where, f"ref points to missing object {oid.hex()}"
                                            + _only_in(held_dead, oid)))
            continue
        stack = [oid]
        while stack:
            cur = stack.pop()
            if cur in reachable:
                continue
            reachable.add(cur)
            for child in links[cur]:
                if child not in links:
                    rep.bad_ids.add(child)
                    if child not in damaged_ids:
                        rep.problems.append(
                            Problem("broken-link", cur.hex(), f"links to missing object {child.hex()}"
                                    + _only_in(held_dead, child))
                        )
                elif child not in reachable:
                    stack.append(child)
    rep.reachable = len(reachable)
    if rep.bad_ids or damage:
        rep.reached_from = _reached_from(links, roots, rep.bad_ids | damaged_ids)
    for oid, kind in {**root_kinds, **_kinds_of_bad(typed, rep.bad_ids)}.items():
        kind_of.setdefault(oid, kind)
    for d in damage:
        kind = d.kind or (kind_of.get(d.oid) if d.oid else None)
        d = Damage(d.oid, d.file, d.offset, d.reason, kind)
        rep.damage.append(d)
        name = d.oid.hex() if d.oid else "an entry whose id no check names"
        at = "" if d.offset is None else f" at offset {d.offset}"
        what = f"{a_kind(kind)} object" if kind else "object"
        if d.oid is not None and d.oid in links:
            tail = "; a good copy is elsewhere: reads use it"
        else:
            refs = rep.reached_from.get(d.oid, []) if d.oid else []
            tail = ("; reached from " + ", ".join(refs)) if refs else "; no ref reaches it"
        if d.oid is None or d.offset is None:
            where = d.file
        elif d.file.endswith(".pack"):
            where = f"{d.file}:{d.oid.hex()}"
        else:
            where = f"{d.file} at offset {d.offset}"  # a step log's frame
        rep.problems.append(Problem("corrupt-object", where, f"{what} {name}{at} does not read: {d.reason}{tail}"))

    # 4b. The schema, over what the groups it governs reach: each object's
    # shape, and the kind each of its links names (a missing one is reported
    # above).
    if len(governed_roots) == len(roots):
        governed = reachable  # the usual state dir holds only governed groups: the closure above
    else:
        governed = _closure(links, governed_roots, set())
    for oid in sorted(misshapen.keys() & governed):
        where, what = misshapen[oid]
        rep.problems.append(Problem("schema", where, what))
    for oid in sorted(typed.keys() & governed):
        for child, kind in typed[oid]:
            got = kind_of.get(child)
            if got is not None and got != kind:
                rep.problems.append(Problem("schema", oid.hex(), f"links to object {child.hex()}, {a_kind(got)}, "
                                            f"where {a_kind(kind)} object belongs"))

    # 5. Dangling: present, reachable from neither refs nor reflogs.
    alive = _closure(links, keep, set(reachable))
    rep.dangling = sorted(oid.hex() for oid in links if oid not in alive)

    # 6. Temp files anywhere else (refs/, logs/, objects/pack/, the FORMAT temp file).
    strays.update(_temp_files(store.root, store.io))
    # 7. Names no writer makes, outside objects/ and in objects/pack/: information too.
    strays.update(_stray_entries(store.root, store.io, set(listed), store.caches.kind_files()))
    rep.stray_files = sorted(strays - not_dirs)

    # 8. The derived caches of the kinds the store was given (§11a): each kind's own check.
    for kind, (wrong, notes) in store.caches.verify(store):
        rep.problems.extend(Problem(kind.problem, path, text) for path, text in wrong)
        rep.notes.extend((kind.title, note) for note in notes)
    rep.problems = [Problem(p.kind, p.where, _no_self_advice(p.message)) for p in rep.problems]
    return rep


#: What the top of a state dir holds (§1.3); ``FORMAT.tmp_…`` is a temp file (step 6).
_TOP_NAMES = frozenset({"FORMAT", "objects", "refs", "logs", "locks", "leases", "steps", "cache", "git",
                        "lost-found", "prompts", "mcp", "hooks"})
#: The Git mirror (§1.3, §16.7): Git's own repository, which ``git fsck`` checks; fsck does not look inside.
_GIT_DIR = "git"
#: The store's own lock files at the top of ``locks/`` (§8.2, §8.4).
_TOP_LOCKS = frozenset({"gc.lock", "gc-gate.lock", "gc-run.lock"})
#: The settled markers of the state dir (§10.3): empty files beside them.
_SETTLED = re.compile(r"settled-[0-9]+-[0-9]+-[0-9]+-[0-9a-f]{16}")


def _held_only_by_dead_logs(store: Store, present: set[ObjectId], rep: FsckReport) -> dict[ObjectId, tuple[str, int]]:
    """Objects whose only good copies are in stale or leftover step logs: id -> (which log and why, size).

    ``present``: the ids with a good loose or packed copy. A log that does
    not read, or whose group does not, counts as read (checks 2b and 3
    report it). In a version-1 or -2 state dir each step log is a problem
    too (§10.2, §6.9 question 12): no writer of those versions makes one,
    and an older writer would commit past its records.
    """
    steps = store.steps
    live: set[ObjectId] = set()
    dead = []
    for group in steps.groups():
        ns, gid = group.split("/", 1)
        if not _group_name(ns, gid):
            continue
        try:
            log = steps.load(group)  # as step 2b read it
            if log is None:
                continue
            reads = store.refs.read_with_log(group)[1] is not None
        except (KxenError, ValueError):
            continue
        if store.format_version < 3:
            rep.problems.append(Problem("corrupt-ref", log.path, f"a step log in a version-{store.format_version} "
                                        "state dir, whose FORMAT was put back by hand or restored from a backup: "
                                        f"set FORMAT to version {FORMAT_VERSION} (kxen-agent-state {FORMAT_VERSION}) or move the log out"))
        ids = {oid for rec in log.records for oid, _at, _n in rec.objects}
        if reads:
            live |= ids
        elif ids:
            why = ("a stale step log (a previous generation, which the group's next transaction replaces)"
                   if store.io.lexists(store.refs.ref_path(group)) else
                   "the leftover step log of a removed group (which the group's next creation replaces)")
            dead.append((log, why))
    out: dict[ObjectId, tuple[str, int]] = {}
    for log, why in dead:
        for rec in log.records:
            for oid, at, n in rec.objects:
                if oid in present or oid in live or oid in out:
                    continue
                try:
                    size = len(steps.read_frame(log, oid, at, n).raw)
                except KxenError:
                    continue  # a corrupt copy: step 2b reported it, and it counted nowhere
                out[oid] = (f"{log.path}, {why}", size)
    return out


def _damaged_log(store: Store, group: str, error: str, rep: FsckReport, damage: list[Damage],
                 links: dict, present: set, check_shape: Callable) -> None:
    """A step log that does not read: name it, every record that still checks, and where the damage is (§18)."""
    steps = store.steps
    path = steps.path(group)
    gens: tuple[int, ...] = (0, 1)
    try:
        gens = (store.refs._read_base(group).steps_gen, 0)
    except KxenError:
        pass
    sal = salvage_log(store.io, path, group, gens)
    if sal is None:  # the error was not in the bytes (a generation mismatch, a read error)
        rep.problems.append(Problem("corrupt-ref", path, error))
        rep.unreadable_groups[group] = (path, error)
        return
    for rec in sal.records:
        for oid, at, n in rec.objects:
            try:
                from .objects import decompress_loose, parse_object
                obj = parse_object(decompress_loose(sal.data[at:at + n], path), path, expect_id=oid)
                value = decode_body(obj)
            except CorruptObject as e:
                damage.append(Damage(oid, path, at, e.reason))
                continue
            rep.in_steps += 1
            present.add(oid)
            if oid not in links:
                links[oid] = links_of(obj.kind, value)
                check_shape(f"{path} at offset {at}", obj, value)
                rep.bytes += len(obj.raw)
    spans = ", ".join(f"{a}-{b}" for a, b, _ in sal.damage)
    rep.damaged_logs[path] = {
        "file": path, "group": group,
        "intactRecords": [[r.offset, r.end] for r in sal.records],
        "recordsBefore": sal.before, "recordsAfter": sal.after,
        "damage": [{"start": a, "end": b, "reason": why} for a, b, why in sal.damage]}
    rep.unreadable_groups[group] = (path, f"step log damaged at bytes {spans}")
    first = error.split("; no writer cuts it")[0]
    rep.problems.append(Problem("corrupt-ref", path, f"{first}; damaged bytes {spans}; {len(sal.records)} records "
                                f"check ({sal.before} before the damage, {sal.after} after); group {group} "
                                "does not read until repaired"))


def _file_of(store: Store, group: str, error: str) -> str:
    ns, _, gid = group.partition("/")
    for top in ("steps", "logs"):
        path = os.path.join(store.root, top, ns, gid)
        if path in error:
            return path
    return os.path.join(store.root, "refs", ns, gid)


def _reached_from(links: dict[ObjectId, list[ObjectId]], roots: list[tuple[str, ObjectId]],
                  bad: set[ObjectId]) -> dict[ObjectId, list[str]]:
    """For each id in ``bad``, every root (group/ref name) whose closure reaches it, sorted."""
    out: dict[ObjectId, set[str]] = {}
    for where, oid in roots:
        seen: set[ObjectId] = set()
        stack = [oid]
        while stack:
            cur = stack.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if cur in bad:
                out.setdefault(cur, set()).add(where)
                continue
            stack.extend(c for c in links.get(cur, ()) if c not in seen)
    return {k: sorted(v) for k, v in out.items()}


def _kinds_of_bad(typed: dict[ObjectId, list[tuple[ObjectId, str]]], bad: set[ObjectId]) -> dict[ObjectId, str]:
    """What kind each unreadable object must be, as the links that name it say (the schema's typed links)."""
    out: dict[ObjectId, str] = {}
    if not bad:
        return out
    for want in typed.values():
        for child, kind in want:
            if child in bad:
                out.setdefault(child, kind)
    return out


def _only_in(held_dead: dict[ObjectId, tuple[str, int]], oid: ObjectId) -> str:
    """What a missing object's message adds when a stale or leftover step log still holds a copy."""
    where = held_dead.get(oid, (None,))[0]
    if where is None:
        return ""
    return (f" (its only copy is in {where}: restore the object from a backup or a bundle before the group "
            "is written again)")


def _group_name(ns: str, gid: str) -> bool:
    try:
        validate_group(f"{ns}/{gid}")
    except BadRefName:
        return False
    return True


def _stray_entries(root: str, io: FileIO, groups: set[str], kept: frozenset[str] = frozenset()) -> list[str]:
    """Entries outside ``objects/``, and in ``objects/pack/``, that no writer makes (§11 step 7).

    ``groups``: the groups that exist (§6.2), whose caches ``cache/<kind>/<ns>/<id>`` are the
    layer above's, as are the files ``kept`` of a kind (``cache/<kind>/<name>``, :attr:`CacheKind.files`);
    ``git/`` is the Git mirror's (§16.7), not looked into.

    ``refs/`` holds namespace directories only (what is in one is a group,
    judged by step 3); ``steps/`` a step log per group (§6.8); ``logs/`` a reflog ``logs/<ns>/<id>`` per group whose
    ref file exists (one without it is a removal's leftover, §6.7); ``locks/``
    the store's three lock files and ``<ns>/<id>.lock`` or ``.lease`` lock
    files of valid group names (left behind by design, §8.1). Temp files are
    step 6's; ``leases/`` is the run lease's (§15), not judged here.
    """
    def ls(d: str) -> list[str]:
        try:
            return sorted(io.listdir(d))
        except (FileNotFoundError, NotADirectoryError):
            return []

    out: list[str] = []
    for name in ls(root):
        if name not in _TOP_NAMES and not name.startswith(_TEMP_PREFIXES):
            out.append(os.path.join(root, name))
    git = os.path.join(root, _GIT_DIR)
    if io.lexists(git) and not io.isdir(git):
        out.append(git)  # the mirror is a directory (a bare repository); anything else is no one's
    refs, logs, locks, steps = (os.path.join(root, d) for d in ("refs", "logs", "locks", "steps"))
    # objects/pack/ (§12.4, §6.9 question 23): packs with their indexes; an index-less pack (a writer
    # died before its index: gc removes it after the grace period) and any other name are listed.
    pack_dir = os.path.join(root, "objects", PACK_DIR_NAME)
    in_pack = ls(pack_dir) if io.isdir(pack_dir) else []
    indexed = {n[:-len(".idx")] for n in in_pack if n.startswith("pack-") and n.endswith(".idx")}
    for n in in_pack:
        path = os.path.join(pack_dir, n)
        if n.startswith(TEMP_PREFIX) and not io.isdir(path):
            continue  # step 6
        if n.startswith("pack-") and (n.endswith(".idx") or n.endswith(".pack") and n[:-len(".pack")] in indexed):
            continue  # read as a pack (step 2), broken or not
        out.append(path)
    out += [os.path.join(refs, ns) for ns in ls(refs) if not io.isdir(os.path.join(refs, ns))]
    for ns in ls(steps):
        d = os.path.join(steps, ns)
        if not io.isdir(d):
            out.append(d)
            continue
        # A tmp_ name there is a writer's temp file if it is a file (§6.9 question 9): no group is named
        # so (§6.1), so it hides none; step 6 lists it. A directory of that name is no one's.
        out += [os.path.join(d, gid) for gid in ls(d) if io.isdir(os.path.join(d, gid))
                or not gid.startswith(TEMP_PREFIX) and not _group_name(ns, gid)]
    # cache/<kind>/<ns>/<id>: a derived file of a group that exists (§11a); its content is the layer
    # above's to check (the history index: `kxen-agent fsck`, §14.12).
    cache = os.path.join(root, "cache")
    for kind in ls(cache):
        k = os.path.join(cache, kind)
        for ns in ls(k) if io.isdir(k) else [None]:
            d = k if ns is None else os.path.join(k, ns)
            if ns is None or not io.isdir(d):
                if d not in kept:
                    out.append(d)
                continue
            # The group exists as §6.2 says (a ref file, or a generation-0 log with a committed record;
            # a group that fails to read is listed too): a stale or leftover log makes none (§6.9 q. 10).
            out += [os.path.join(d, gid) for gid in ls(d) if not gid.startswith(TEMP_PREFIX)
                    and (io.isdir(os.path.join(d, gid)) or not _group_name(ns, gid) or f"{ns}/{gid}" not in groups)]
    for ns in ls(logs):
        d = os.path.join(logs, ns)
        if not io.isdir(d):
            out.append(d)
            continue
        for gid in ls(d):
            path = os.path.join(d, gid)
            if gid.startswith(TEMP_PREFIX):
                continue
            if io.isdir(path) or not _group_name(ns, gid) or not io.lexists(os.path.join(refs, ns, gid)):
                out.append(path)
    for name in ls(locks):
        d = os.path.join(locks, name)
        if name in _TOP_LOCKS or name.startswith(TEMP_PREFIX) or _SETTLED.fullmatch(name):
            continue
        if not io.isdir(d):
            out.append(d)
            continue
        for f in ls(d):
            path = os.path.join(d, f)
            stem, _dot, ext = f.rpartition(".")
            if ext not in ("lock", "lease") or io.isdir(path) or not _group_name(name, stem):
                out.append(path)
    return out


def _closure(links: dict[ObjectId, list[ObjectId]], start: Any, into: set[ObjectId]) -> set[ObjectId]:
    """``into`` plus every present object reachable from ``start`` (missing ones are reported elsewhere)."""
    stack = [k for k in start if k in links]
    while stack:
        cur = stack.pop()
        if cur in into:
            continue
        into.add(cur)
        stack.extend(c for c in links[cur] if c in links and c not in into)
    return into


def _temp_files(root: str, io: FileIO) -> list[str]:
    """Temp files under ``root``, but in the fan-out dirs (step 1 listed those)."""
    objects_dir = os.path.join(root, "objects")
    refs_dir = os.path.join(root, "refs")
    out = []
    for d, dirs, files in io.walk(root):
        if d == objects_dir:
            dirs[:] = [x for x in dirs if x == PACK_DIR_NAME]
        elif d == root:
            dirs[:] = [x for x in dirs if x != _GIT_DIR]  # Git's own temp files are Git's (§11 step 7)
        for f in files:
            path = os.path.join(d, f)
            # In refs/<ns>/ only what RefStore.groups() skips is a temp file;
            # any other name there was checked as a group in step 3.
            if is_temp_file(path, io) if os.path.dirname(d) == refs_dir else f.startswith(_TEMP_PREFIXES):
                out.append(path)
    return out
