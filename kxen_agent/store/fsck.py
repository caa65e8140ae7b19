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
from dataclasses import dataclass, field
from typing import Any, Callable

from kxen_agent.errors import KxenError

from .fsio import FileIO
from .loose import PACK_DIR_NAME
from .objects import CorruptObject, ObjectId, Schema, SchemaViolation, a_kind, decode_body, links_of
from .refs import TEMP_PREFIX, BadRefName, CorruptRef, is_temp_file, validate_group
from .repo import Store

#: Temp files of the state dir: ``tmp_…`` (every writer, §9.1) and
#: ``FORMAT.tmp_…`` (the FORMAT file's, §10.3).
_TEMP_PREFIXES = (TEMP_PREFIX, "FORMAT." + TEMP_PREFIX)

__all__ = ["FsckReport", "Problem", "fsck"]


@dataclass(frozen=True)
class Problem:
    kind: str  # corrupt-object | corrupt-ref | reflog-mismatch | missing-object | broken-link | corrupt-pack | skeleton | schema | history-index (the CLI's)
    where: str
    message: str

    def line(self) -> str:
        return f"{self.kind}: {self.where}: {self.message}"


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
            "problems": [{"kind": p.kind, "where": p.where, "message": p.message} for p in self.problems],
            "dangling": self.dangling,
            "strayFiles": self.stray_files,
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
            rep.problems.append(Problem("corrupt-object", path, e.reason))
            continue
        except OSError as e:
            rep.problems.append(Problem("corrupt-object", path, f"unreadable: {e.strerror}"))
            continue
        links[obj.id] = links_of(obj.kind, value)
        check_shape(path, obj, value)
        rep.loose += 1
        rep.bytes += len(obj.raw)
        if progress:
            progress(1)

    # 2. Every packed object (the pack checks its own checksums too).
    for pack in store.packs:
        verify = getattr(pack, "verify", None)
        if verify is not None:
            try:
                verify()
            except KxenError as e:
                rep.problems.append(Problem("corrupt-pack", getattr(pack, "path", "?"), str(e)))
                continue
        for oid in pack.iter_ids():
            try:
                obj = pack.read_raw(oid)
                value = decode_body(obj)
            except CorruptObject as e:
                rep.problems.append(Problem("corrupt-object", f"{getattr(pack, 'path', 'pack')}:{oid.hex()}", e.reason))
                continue
            rep.packed += 1
            if oid not in links:
                links[oid] = links_of(obj.kind, value)
                check_shape(f"{getattr(pack, 'path', 'pack')}:{oid.hex()}", obj, value)
                rep.bytes += len(obj.raw)
            if progress:
                progress(1)
    # 2b. Every object in a step log (§6.8): each record's checksum, each
    # object's frame and id. A log that does not read is a damaged group.
    steps = store.refs.steps
    for group in steps.groups():
        ns, gid = group.split("/", 1)
        if not _group_name(ns, gid):
            continue  # a stray name (step 7), never read as a group
        try:
            log = steps.load(group, fresh=True)  # every byte, not what this store cached: damage in place too
        except (KxenError, ValueError) as e:
            rep.problems.append(Problem("corrupt-ref", steps.path(group), str(e)))
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
                    rep.problems.append(Problem("corrupt-object", where, e.reason))
                    continue
                rep.in_steps += 1
                if oid not in links:
                    links[oid] = links_of(obj.kind, value)
                    check_shape(where, obj, value)
                    rep.bytes += len(obj.raw)
                if progress:
                    progress(1)
    rep.objects = len(links)

    # 3. Refs and reflogs.
    roots: list[tuple[str, ObjectId]] = []
    governed_roots: list[ObjectId] = []
    keep: set[ObjectId] = set()
    for group in store.refs.groups():
        rep.groups += 1
        try:
            # One snapshot: the reflog is checked against this very ref file
            # (read first), so a concurrent commit cannot fake a mismatch.
            state = store.refs.read(group)
            log = store.refs.reflog(group, state)
        except (CorruptRef, BadRefName) as e:  # a stray file under refs/ is named, not fatal
            rep.problems.append(Problem("corrupt-ref", group, str(e)))
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

    # 4. Closure from the refs: everything reachable must exist.
    reachable: set[ObjectId] = set()
    for where, oid in roots:
        if oid not in links:
            rep.problems.append(Problem("missing-object", where, f"ref points to missing object {oid.hex()}"))
            continue
        stack = [oid]
        while stack:
            cur = stack.pop()
            if cur in reachable:
                continue
            reachable.add(cur)
            for child in links[cur]:
                if child not in links:
                    rep.problems.append(
                        Problem("broken-link", cur.hex(), f"links to missing object {child.hex()}")
                    )
                elif child not in reachable:
                    stack.append(child)
    rep.reachable = len(reachable)

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
    # 7. Names no writer makes, outside objects/: information too.
    strays.update(_stray_entries(store.root, store.io))
    rep.stray_files = sorted(strays - not_dirs)
    return rep


#: What the top of a state dir holds (§1.3); ``FORMAT.tmp_…`` is a temp file (step 6).
_TOP_NAMES = frozenset({"FORMAT", "objects", "refs", "logs", "locks", "leases", "steps", "cache"})
#: The store's own lock files at the top of ``locks/`` (§8.2, §8.4).
_TOP_LOCKS = frozenset({"gc.lock", "gc-gate.lock", "gc-run.lock"})


def _group_name(ns: str, gid: str) -> bool:
    try:
        validate_group(f"{ns}/{gid}")
    except BadRefName:
        return False
    return True


def _stray_entries(root: str, io: FileIO) -> list[str]:
    """Entries outside ``objects/`` that no writer makes (§11 step 7).

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
    refs, logs, locks, steps = (os.path.join(root, d) for d in ("refs", "logs", "locks", "steps"))
    out += [os.path.join(refs, ns) for ns in ls(refs) if not io.isdir(os.path.join(refs, ns))]
    for ns in ls(steps):
        d = os.path.join(steps, ns)
        if not io.isdir(d):
            out.append(d)
            continue
        out += [os.path.join(d, gid) for gid in ls(d) if not gid.startswith(TEMP_PREFIX)
                and (io.isdir(os.path.join(d, gid)) or not _group_name(ns, gid))]
    # cache/<kind>/<ns>/<id>: a derived file of a group that exists (§11a); its content is the layer
    # above's to check (the history index: `kxen-agent fsck`, §14.12).
    cache = os.path.join(root, "cache")
    for kind in ls(cache):
        k = os.path.join(cache, kind)
        for ns in ls(k) if io.isdir(k) else [None]:
            d = k if ns is None else os.path.join(k, ns)
            if ns is None or not io.isdir(d):
                out.append(d)
                continue
            out += [os.path.join(d, gid) for gid in ls(d) if not gid.startswith(TEMP_PREFIX)
                    and (io.isdir(os.path.join(d, gid)) or not _group_name(ns, gid)
                         or not io.lexists(os.path.join(refs, ns, gid)) and not io.lexists(os.path.join(steps, ns, gid)))]
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
        if name in _TOP_LOCKS or name.startswith(TEMP_PREFIX):
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
        for f in files:
            path = os.path.join(d, f)
            # In refs/<ns>/ only what RefStore.groups() skips is a temp file;
            # any other name there was checked as a group in step 3.
            if is_temp_file(path, io) if os.path.dirname(d) == refs_dir else f.startswith(_TEMP_PREFIXES):
                out.append(path)
    return out
