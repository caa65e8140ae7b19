"""Exporting ref groups to a bundle file: the closure walk, the target file and the glue.

Owns :func:`export_bundle`: the refs of the named groups, every object
reachable from them in closure order (parents first, each once), the
dictionary sampled from the small ones, and writing the chosen form
(:func:`~.pack_form.write_pack_bundle`, :func:`~.json_form.write_json_bundle`)
to a file object or, through the store's :class:`~kxen_agent.store.fsio.FileIO`,
to a temp file renamed over the target at the end (:class:`_Sink`). A
failed export leaves nothing behind.

Memory holds ids, about one object's bytes, a write buffer of a MiB and a
constant budget of small objects the walk keeps for the dictionary and the
writer (:data:`EXPORT_KEEP_BUDGET`, so that each is read once; the others
are read again).

It must never encode bundle bytes itself (the form modules do), nor call
``os`` or ``open`` for a file: every file operation goes through the seam.
"""

from __future__ import annotations

import os
import stat
from typing import IO, BinaryIO, Iterator

from kxen_agent.errors import KxenError, UsageError

from ..fsio import FileIO
from ..objects import CorruptObject, ObjectId, RawObject, decode_stored, links_of
from ..pack import DICT_SAMPLE_BUDGET, DICT_SAMPLE_MAX_OBJECT, sample_dictionary
from ..refs import validate_group
from ..repo import MissingObject, Store
from .header import BUNDLE_VERSION, CAP_GIT_CHECKPOINTS, CAP_ZSTD_DICT, BundleInfo, Progress, _Header, _set_total, format_for_path
from .json_form import write_json_bundle
from .pack_form import write_pack_bundle

__all__ = ["BundleWriteError", "EXPORT_KEEP_BUDGET", "NoSuchGroup", "bundle_objects", "export_bundle"]

#: Export keeps the small objects its closure walk reads (those of at most
#: DICT_SAMPLE_MAX_OBJECT bytes, the dictionary's audience), up to this many
#: object bytes, and writes them from memory; the others are read again.
#: A constant, whatever the bundle's size (a session of ~15,000 messages fits).
EXPORT_KEEP_BUDGET = 16 << 20
# What keeping an object costs beyond its bytes (RawObject, bytes header, id, dict slot), about.
_KEPT_OVERHEAD = 200


class BundleWriteError(KxenError):
    """The bundle file could not be written (nothing is left behind)."""


class NoSuchGroup(UsageError):
    """An export named a ref group that does not exist (or has no refs, or is deleted)."""


def _export_roots(store: Store, groups: list[str]) -> dict[str, dict[str, bytes]]:
    if not groups:
        raise UsageError("name at least one ref group to export")
    refs: dict[str, dict[str, bytes]] = {}
    for g in sorted(set(groups)):
        validate_group(g)
        state = store.refs.read(g)
        if not state.exists or not state.refs:
            raise NoSuchGroup(f"ref group {g} does not exist in {store.root} (or has no refs); nothing exported")
        if state.deleted_ns is not None:
            raise NoSuchGroup(f"ref group {g} is marked deleted; nothing exported")
        refs[g] = dict(state.refs)
    return refs


def _closure_order(
    store: Store, refs: dict[str, dict[str, bytes]], keep: dict[ObjectId, RawObject] | None = None,
    keep_budget: int = DICT_SAMPLE_BUDGET,
) -> tuple[list[ObjectId], int, list[ObjectId], int, dict[str, int]]:
    """Every reachable id, parents first (DFS pre-order), with the total size,
    the small objects (a dictionary's audience) and their size, and the kinds.

    ``keep``, if given, receives the verified small objects met first, up to
    ``keep_budget`` bytes of them, so that the dictionary sample and the
    writer need not read them again (memory bounded by the budget)."""
    kept = 0
    roots = [(oid, f"ref {g}/{n}") for g in sorted(refs) for n, oid in sorted(refs[g].items())]
    # (id, who asked for it): "ref G/R", or the linking object's id (named in an error only)
    stack: list[tuple[ObjectId, str | bytes]] = list(reversed(roots))
    seen: set[ObjectId] = set()
    order: list[ObjectId] = []
    total = small = 0
    smalls: list[ObjectId] = []
    kinds: dict[str, int] = {}
    read_raw = store.read_raw
    while stack:
        oid, who = stack.pop()
        if oid in seen:
            continue
        try:
            obj = read_raw(oid)
        except CorruptObject as e:
            who = who if isinstance(who, str) else f"object {who.hex()}"
            raise CorruptObject(e.where, f"{e.reason} (reached from {who}); nothing exported; "
                                "`session export --salvage` exports up to the damage, `kxen-agent repair` "
                                "mends it") from None
        except MissingObject:
            who = who if isinstance(who, str) else f"object {who.hex()}"
            raise MissingObject(oid.hex(), f"{store.root} (reached from {who}); nothing exported; `kxen-agent fsck` names what is damaged, `session export --salvage` exports up to it") from None
        kind = obj.kind
        size = len(obj.raw)
        seen.add(oid)
        order.append(oid)
        total += size
        if size <= DICT_SAMPLE_MAX_OBJECT:
            small += size
            smalls.append(oid)
            if keep is not None and kept + size + _KEPT_OVERHEAD <= keep_budget:
                keep[oid] = obj
                kept += size + _KEPT_OVERHEAD
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind != "blob":  # a blob has no links and no structure to check
            links = links_of(kind, decode_stored(obj))
            for child in reversed(links):
                if child not in seen:
                    stack.append((child, oid))
    return order, total, smalls, small, kinds


def _export_target(path: str, io: FileIO) -> str:
    """The file an export to ``path`` replaces: ``path``, or the file a symlink there names.

    As ``git bundle create`` does (its lock file follows symlinks), a
    symlink is followed and its target replaced, the link kept; a target
    that does not exist yet is created. Anything there that is not a
    regular file — a directory, a device (``/dev/full``), a FIFO, a socket,
    a symlink loop — is refused before anything is written: renaming the
    temp file over it would replace it (as root, turn ``/dev/full`` into a
    regular file). Raises :class:`BundleWriteError`.
    """
    target = io.realpath(path)
    try:
        st = io.lstat(target)
    except FileNotFoundError:
        return target  # a new file (a missing directory fails when the temp file is made)
    except OSError as e:
        raise BundleWriteError(f"cannot write bundle {path}: {e.strerror}; nothing was written") from None
    if stat.S_ISREG(st.st_mode):
        return target
    if stat.S_ISDIR(st.st_mode):
        what = "a directory"
    elif stat.S_ISLNK(st.st_mode):
        what = "a symbolic link that does not resolve (a loop)"
    else:
        what = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
                stat.S_IFSOCK: "a socket"}.get(stat.S_IFMT(st.st_mode), "not a regular file")
    via = f" (the target of symlink {path})" if io.islink(path) and target != os.path.abspath(path) else ""
    raise BundleWriteError(
        f"cannot write bundle {path}: {target if via else 'it'} is {what}{via}, not a regular file; "
        "nothing was written — give the path of a new file or of a regular file to replace"
    )


class _Sink:
    """Buffered writes to a file object or, through a FileIO, a temp file renamed at the end.

    A path is resolved by :func:`_export_target` (symlinks followed, only a
    regular file or a new one accepted); the temp file is made next to the
    target, so the final rename stays in one directory.
    """

    def __init__(self, out: str | os.PathLike | BinaryIO, io: FileIO) -> None:
        self.io = io
        self.size = 0
        self.buf = bytearray()
        self.f: IO[bytes] | None = None
        self.tmp: str | None = None
        if hasattr(out, "write"):
            self.f = out  # type: ignore[assignment]
            self.path = getattr(out, "name", "<stream>")
        else:
            self.path = os.fspath(out)
            self.target = _export_target(self.path, io)
            self.tmp = io.write_tmp(os.path.dirname(self.target), b"", sync=False, prefix=".kxen-bundle-tmp-")

    def write(self, b: bytes | memoryview) -> None:
        self.size += len(b)
        if not self.buf and len(b) >= 1 << 20:  # a whole piece already (the pack writer's): no copy
            self._put(b)
            return
        self.buf += b
        if len(self.buf) >= 1 << 20:
            self.flush()

    def _put(self, data: bytes | memoryview) -> None:
        if self.f is not None:
            self.f.write(data)
        else:
            self.io.append(self.tmp, data, sync=False)

    def flush(self) -> None:
        if not self.buf:
            return
        data = bytes(self.buf)
        self.buf.clear()
        self._put(data)

    def commit(self) -> None:
        self.flush()
        if self.f is not None:
            self.f.flush()
            return
        self.io.fsync_path(self.tmp)
        # Again, just before the rename: something not a regular file may have appeared there meanwhile.
        if _export_target(self.path, self.io) != self.target:
            raise BundleWriteError(f"cannot write bundle {self.path}: a symlink there was made, changed or "
                                   "removed while the bundle was written; nothing was written — retry")
        self.io.rename(self.tmp, self.target)
        self.tmp = None
        self.io.fsync_dir(os.path.dirname(self.target))

    def abort(self) -> None:
        if self.tmp is not None:
            try:
                self.io.unlink(self.tmp)
            except FileNotFoundError:
                pass
            self.tmp = None


def export_bundle(
    store: Store,
    groups: list[str],
    out: str | os.PathLike | BinaryIO,
    *,
    fmt: str = "pack",
    progress: Progress | None = None,
    refs: dict[str, dict[str, bytes]] | None = None,
    git_section: tuple[BinaryIO, int] | None = None,
) -> BundleInfo:
    """Write one bundle of ``groups``' refs and every object reachable from them.

    ``out`` is a path (written to a temp file, fsynced and renamed into
    place: a failed export leaves nothing; a symlink is followed, and a path
    that holds anything but a regular file is refused, see
    :func:`_export_target`) or a binary file object.
    Objects shared by several groups are written once. Raises
    :class:`NoSuchGroup` and :class:`MissingObject` before writing anything.
    """
    fmt = format_for_path("", fmt)
    if not hasattr(out, "write"):
        _export_target(os.fspath(out), store.io)  # a device or FIFO there is refused before the closure walk
    # ``refs``: the refs to write instead of the groups' own (``session export --salvage``: a damaged
    # session up to its damage, §18); their closure must read, as any export's.
    refs = _export_roots(store, groups) if refs is None else {g: dict(r) for g, r in sorted(refs.items())}
    kept: dict[ObjectId, RawObject] = {}
    compressed: dict[ObjectId, tuple[int, bytes]] = {}
    order, total, smalls, small, kinds = _closure_order(store, refs, kept if fmt == "pack" else None, EXPORT_KEEP_BUDGET)
    _set_total(progress, len(order))
    if fmt == "pack":
        # The sample reads what the walk kept (already verified), the rest from the store;
        # the objects its choice compressed with the dictionary are not compressed again.
        dictionary = sample_dictionary(lambda oid: kept.get(oid) or store.read_raw(oid), smalls, small, compressed)
    else:
        dictionary = None
    caps = (CAP_ZSTD_DICT,) if dictionary else ()
    if git_section is not None:  # workspace checkpoints (§12.7a): the pack form only
        if fmt != "pack":
            raise UsageError("checkpoints travel in the pack form of a bundle only (objects_spec.md §12.7a); "
                             "write a .kxb (or --format pack)")
        caps = tuple(sorted((*caps, CAP_GIT_CHECKPOINTS)))
    hdr = _Header(caps, refs, len(order), total)
    try:
        sink = _Sink(out, store.io)
    except OSError as e:
        where = f" in {os.path.dirname(e.filename)}" if e.filename else ""
        raise BundleWriteError(f"cannot write bundle {os.fspath(out) if not hasattr(out, 'write') else '<stream>'}: "
                               f"cannot create a file{where}: {e.strerror}; nothing was written — check that "
                               "the directory exists and is writable") from None
    try:
        if fmt == "pack":
            # The walk's objects from memory (each given up once written), the others read again.
            objects = _objects(store, order, progress, kept)
            digest, pack_bytes = write_pack_bundle(hdr, objects, dictionary, sink.write, compressed, git_section)
        else:
            digest, pack_bytes = write_json_bundle(hdr, _objects(store, order, progress), sink.write), 0
        sink.commit()
    except OSError as e:
        sink.abort()
        raise BundleWriteError(f"cannot write bundle {sink.path}: {e.strerror or e}; nothing was written") from None
    except BaseException:
        sink.abort()
        raise
    content = hdr.content_digest()
    for oid in order:
        content.update(oid)
    return BundleInfo(sink.path, fmt, BUNDLE_VERSION, caps, refs, len(order), total, pack_bytes, sink.size, digest, kinds,
                      content.hexdigest(), (sink.size - 32 - git_section[1], git_section[1]) if git_section is not None else None)


def bundle_objects(store: Store, groups: list[str]) -> Iterator[RawObject]:
    """Every object an export of ``groups`` writes, in bundle order, each read from the store.

    For a caller that must look at a bundle's contents before it is
    written (``session export --scan``); refuses what :func:`export_bundle`
    refuses (a group missing, empty or deleted; an object missing).
    """
    refs = _export_roots(store, groups)
    order = _closure_order(store, refs, None, EXPORT_KEEP_BUDGET)[0]
    for oid in order:
        yield store.read_raw(oid)


def _objects(store: Store, order: list[ObjectId], progress: Progress | None,
             kept: dict[ObjectId, RawObject] | None = None) -> Iterator[RawObject]:
    """The objects of ``order``: each popped from ``kept`` if there, else read; progress after each is written."""
    kept = {} if kept is None else kept
    read_raw = store.read_raw
    for oid in order:
        obj = kept.pop(oid, None)
        yield obj if obj is not None else read_raw(oid)
        if progress:
            progress(1)
