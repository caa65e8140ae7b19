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
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from kxen_agent.errors import KxenError

from .loose import PACK_DIR_NAME
from .objects import CorruptObject, ObjectId, decode_body, links_of
from .refs import TEMP_PREFIX, BadRefName, CorruptRef, is_temp_file
from .repo import Store, skeleton_dirs

#: Temp files of the state dir: ``tmp_…`` (every writer, §9.1) and
#: ``FORMAT.tmp_…`` (the FORMAT file's, §10.3).
_TEMP_PREFIXES = (TEMP_PREFIX, "FORMAT." + TEMP_PREFIX)

__all__ = ["FsckReport", "Problem", "fsck"]


@dataclass(frozen=True)
class Problem:
    kind: str  # corrupt-object | corrupt-ref | reflog-mismatch | missing-object | broken-link | corrupt-pack | skeleton
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
            "bytes": self.bytes,
            "refGroups": self.groups,
            "refs": self.refs,
            "reachable": self.reachable,
            "problems": [{"kind": p.kind, "where": p.where, "message": p.message} for p in self.problems],
            "dangling": self.dangling,
            "strayFiles": self.stray_files,
        }


def fsck(store: Store, progress: Callable[[int], None] | None = None) -> FsckReport:
    rep = FsckReport(store.root)
    links: dict[ObjectId, list[ObjectId]] = {}

    strays: set[str] = set()

    # 0. A version-2 state dir's skeleton (§10.3): writers rely on these
    # names being durable directories, so one missing (removed by hand) or
    # replaced by a file is damage, not a leftover.
    not_dirs: set[str] = set()
    if store.format_version >= 2:
        for rel in skeleton_dirs():
            d = os.path.join(store.root, rel)
            if os.path.isdir(d):
                continue
            if os.path.lexists(d):
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
                rep.bytes += len(obj.raw)
            if progress:
                progress(1)
    rep.objects = len(links)

    # 3. Refs and reflogs.
    roots: list[tuple[str, ObjectId]] = []
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

    # 5. Dangling: present, reachable from neither refs nor reflogs.
    alive = set(reachable)
    stack = [k for k in keep if k in links]
    while stack:
        cur = stack.pop()
        if cur in alive:
            continue
        alive.add(cur)
        stack.extend(c for c in links[cur] if c in links and c not in alive)
    rep.dangling = sorted(oid.hex() for oid in links if oid not in alive)

    # 6. Temp files anywhere else (refs/, logs/, objects/pack/, the FORMAT temp file).
    strays.update(_temp_files(store.root))
    rep.stray_files = sorted(strays - not_dirs)
    return rep


def _temp_files(root: str) -> list[str]:
    """Temp files under ``root``, but in the fan-out dirs (step 1 listed those)."""
    objects_dir = os.path.join(root, "objects")
    refs_dir = os.path.join(root, "refs")
    out = []
    for d, dirs, files in os.walk(root):
        if d == objects_dir:
            dirs[:] = [x for x in dirs if x == PACK_DIR_NAME]
        for f in files:
            path = os.path.join(d, f)
            # In refs/<ns>/ only what RefStore.groups() skips is a temp file;
            # any other name there was checked as a group in step 3.
            if is_temp_file(path) if os.path.dirname(d) == refs_dir else f.startswith(_TEMP_PREFIXES):
                out.append(path)
    return out
