"""The disk model of the crash simulator: inodes, directory entries and file contents, and a trace compiled onto it.

Split from :mod:`.crashsim` (which explains the method): :class:`FS` is the
model of a disk taken from a snapshot, :class:`Trace` compiles a
:class:`~kxen_agent.store.fsio.TracingIO` trace against it and tags each
operation with the barrier that made it durable, and materialises the
crash states a policy chooses.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
from dataclasses import dataclass, field
from typing import Callable, Iterator

from kxen_agent.store.fsio import TraceOp


#: "Never acknowledged": the end of a commit that failed after its commit point.
INF = float("inf")


def _is_lock_file(rel: str) -> bool:
    # Lock files: empty, never fsynced, meaningless (objects_spec.md §8.1).
    # The store creates a missing one through store.io (a "create" the
    # trace holds, which the model skips); fasteners opens it, and would
    # create it again itself if it vanished in between.
    parts = rel.split(os.sep)
    return len(parts) >= 3 and parts[0] == "state" and parts[1] == "locks"


class TraceError(AssertionError):
    """The trace does not replay on the model: some file change bypassed the FileIO."""


# ================================================================== the disk model


class _Node:
    __slots__ = ("is_dir", "entries", "data")

    def __init__(self, is_dir: bool, data: bytes = b"") -> None:
        self.is_dir = is_dir
        self.entries: dict[str, int] = {}
        self.data = data


#: Content digests of file data: the states of one exploration share most files' bytes (the same
#: objects, copied by reference), so each is hashed once rather than once per state.
_DIGESTS: dict[bytes, bytes] = {}


def _digest(data: bytes) -> bytes:
    d = _DIGESTS.get(data)
    if d is None:
        if len(_DIGESTS) >= 50_000:
            _DIGESTS.clear()
        d = _DIGESTS[data] = hashlib.blake2b(data).digest()
    return d


def _splice(data: bytes, offset: int, chunk: bytes) -> bytes:
    if offset > len(data):
        data = data + b"\0" * (offset - len(data))
    return data[:offset] + chunk + data[offset + len(chunk):]


class FS:
    """An in-memory tree of inodes under one top directory (inode 0)."""

    def __init__(self) -> None:
        self.nodes: dict[int, _Node] = {0: _Node(True)}

    @classmethod
    def capture(cls, top: str) -> "FS":
        fs = cls()
        nxt = 1

        def walk(path: str, ino: int) -> None:
            nonlocal nxt
            for name in sorted(os.listdir(path)):
                p = os.path.join(path, name)
                child = nxt
                nxt += 1
                if os.path.isdir(p) and not os.path.islink(p):
                    fs.nodes[child] = _Node(True)
                    walk(p, child)
                else:
                    with open(p, "rb") as f:
                        fs.nodes[child] = _Node(False, f.read())
                fs.nodes[ino].entries[name] = child

        walk(top, 0)
        return fs

    def copy(self) -> "FS":
        out = FS.__new__(FS)
        out.nodes = {}
        for ino, n in self.nodes.items():
            m = _Node(n.is_dir, n.data)
            m.entries = dict(n.entries)
            out.nodes[ino] = m
        return out

    def lookup(self, rel: str) -> int | None:
        ino = 0
        if rel in ("", "."):
            return 0
        for part in rel.split(os.sep):
            node = self.nodes[ino]
            if not node.is_dir or part not in node.entries:
                return None
            ino = node.entries[part]
        return ino

    def files(self) -> Iterator[tuple[str, _Node]]:
        """(relative path, node) of everything reachable from the top, sorted."""
        stack = [("", 0)]
        while stack:
            rel, ino = stack.pop()
            node = self.nodes[ino]
            if rel:
                yield rel, node
            if node.is_dir:
                prefix = rel + os.sep if rel else ""  # (os.path.join per entry was a tenth of a crash exploration)
                for name in sorted(node.entries, reverse=True):
                    stack.append((prefix + name, node.entries[name]))

    def listing(self, skip: Callable[[str], bool] = lambda rel: False) -> dict[str, bytes | None]:
        """Every directory (None) and file (its bytes); ``skip`` drops files by path."""
        return {rel: (None if n.is_dir else n.data) for rel, n in self.files() if n.is_dir or not skip(rel)}

    def fingerprint(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for rel, n in self.files():
            h.update(rel.encode() + (b"/\0" if n.is_dir else b"\0" + _digest(n.data)))
        return h.hexdigest()

    def materialize(self, dest: str) -> None:
        os.makedirs(dest, exist_ok=True)
        for rel, n in self.files():
            p = os.path.join(dest, rel)
            if n.is_dir:
                os.mkdir(p)
            else:
                with open(p, "wb") as f:
                    f.write(n.data)


# ================================================================== the trace, compiled

_DIR_EVENTS = ("link", "unlink", "rename")


@dataclass
class _Event:
    seq: int  # position among events
    i: int  # index of its trace op: done for crash points k > i
    kind: str  # write | trunc | link | unlink | rename
    ino: int
    dir: int = -1
    name: str = ""
    dst_dir: int = -1
    dst_name: str = ""
    offset: int = 0
    data: bytes = b""
    size: int = 0
    durable_at: float = INF  # index of the op that made it durable
    waiting: set[int] = field(default_factory=set)  # directories still to fsync

    @property
    def is_dir_event(self) -> bool:
        return self.kind in _DIR_EVENTS


class Trace:
    """A trace compiled against a snapshot: events with the barrier that made each durable."""

    def __init__(self, snapshot: FS, ops: list[TraceOp], top: str) -> None:
        self.snapshot = snapshot
        self.ops = ops
        self.top = os.path.abspath(top)
        self.events: list[_Event] = []
        self.new_inodes: dict[int, bool] = {}  # ino -> is_dir
        self.outside = 0  # operations on files outside the top (an exported bundle...)
        self.lock_files = 0  # lock files created (not modelled: see _is_lock_file)
        self._compile()

    def __len__(self) -> int:
        return len(self.ops)

    def _rel(self, path: str) -> str | None:
        rel = os.path.relpath(os.path.abspath(path), self.top)
        return None if rel == ".." or rel.startswith(".." + os.sep) else rel

    def _compile(self) -> None:
        live = self.snapshot.copy()
        nxt = max(live.nodes) + 1
        pending_data: dict[int, list[_Event]] = {}
        pending_dir: dict[int, list[_Event]] = {}

        def need(rel: str, i: int, what: str) -> int:
            ino = live.lookup(rel)
            if ino is None:
                raise TraceError(f"trace op {i} ({what}) names {rel}, which the model does not have: "
                                 "a file change bypassed store.io")
            return ino

        def split(rel: str, i: int, what: str) -> tuple[int, str]:
            parent = need(os.path.dirname(rel), i, what)
            if not live.nodes[parent].is_dir:
                raise TraceError(f"trace op {i} ({what}): parent of {rel} is not a directory")
            return parent, os.path.basename(rel)

        def emit(ev: _Event) -> None:
            ev.seq = len(self.events)
            self.events.append(ev)
            if ev.is_dir_event:
                ev.waiting = {ev.dir} | ({ev.dst_dir} if ev.kind == "rename" else set())
                for d in ev.waiting:
                    pending_dir.setdefault(d, []).append(ev)
            else:
                pending_data.setdefault(ev.ino, []).append(ev)

        def new_node(is_dir: bool) -> int:
            nonlocal nxt
            ino = nxt
            nxt += 1
            live.nodes[ino] = _Node(is_dir)
            self.new_inodes[ino] = is_dir
            return ino

        for i, op in enumerate(self.ops):
            rel = self._rel(op.path)
            if rel is None:
                self.outside += 1
                continue
            k = op.kind
            if k == "create" and _is_lock_file(rel):
                # A lock file, which the store creates through its FileIO
                # (store/locks.py): not modelled, as the final comparison
                # leaves lock files out too. It carries nothing, is never
                # fsynced, and a crash state with or without it is the same
                # state dir to every reader and writer.
                self.lock_files += 1
                continue
            if k in ("create", "mkdir"):
                d, name = split(rel, i, k)
                if name in live.nodes[d].entries:
                    raise TraceError(f"trace op {i} ({k}) of {rel}: it already exists in the model")
                ino = new_node(k == "mkdir")
                live.nodes[d].entries[name] = ino
                emit(_Event(0, i, "link", ino, dir=d, name=name))
            elif k in ("write", "append"):
                ino = live.lookup(rel)
                if ino is None and k == "append":  # O_CREAT: the append made the file
                    d, name = split(rel, i, k)
                    ino = new_node(False)
                    live.nodes[d].entries[name] = ino
                    emit(_Event(0, i, "link", ino, dir=d, name=name))
                ino = need(rel, i, k) if ino is None else ino
                node = live.nodes[ino]
                node.data = _splice(node.data, op.offset, op.data)
                emit(_Event(0, i, "write", ino, offset=op.offset, data=op.data))
            elif k == "truncate":
                ino = need(rel, i, k)
                node = live.nodes[ino]
                node.data = node.data[: op.size] + b"\0" * max(0, op.size - len(node.data))
                emit(_Event(0, i, "trunc", ino, size=op.size))
            elif k == "fsync":
                ino = need(rel, i, k)
                for ev in pending_data.pop(ino, []):
                    ev.durable_at = i
            elif k == "fsync_dir":
                d = need(rel, i, k)
                for ev in pending_dir.pop(d, []):
                    ev.waiting.discard(d)
                    if not ev.waiting:
                        ev.durable_at = i
            elif k == "rename":
                assert op.dst is not None
                drel = self._rel(op.dst)
                if drel is None:
                    raise TraceError(f"trace op {i}: rename of {rel} out of the top directory")
                sd, sn = split(rel, i, k)
                ino = need(rel, i, k)
                dd, dn = split(drel, i, k)
                del live.nodes[sd].entries[sn]
                live.nodes[dd].entries[dn] = ino
                emit(_Event(0, i, "rename", ino, dir=sd, name=sn, dst_dir=dd, dst_name=dn))
            elif k == "unlink":
                d, name = split(rel, i, k)
                ino = need(rel, i, k)
                del live.nodes[d].entries[name]
                emit(_Event(0, i, "unlink", ino, dir=d, name=name))
            elif k in ("utime", "chmod"):
                # Times are not modelled (a crash state is judged by names and
                # bytes); the target must exist, as for any operation on it.
                need(rel, i, k)
            else:
                raise TraceError(f"trace op {i}: unknown kind {k!r}")
        self.final = live

    # ------------------------------------------------------------ crash states

    def pending(self, k: int) -> list[_Event]:
        return [e for e in self.events if e.i < k and e.durable_at >= k]

    def state(self, k: int, policy: str, rng: random.Random | None = None) -> FS:
        """The disk after a power loss at crash point ``k`` under ``policy``."""
        pending = self.pending(k)
        keep: set[int] = set()
        tear: dict[int, int] = {}
        if policy == "kill":
            keep = {e.seq for e in pending}
        elif policy == "meta":
            keep = {e.seq for e in pending if e.is_dir_event}
        elif policy == "data":
            keep = {e.seq for e in pending if not e.is_dir_event}
        elif policy == "random":
            assert rng is not None
            by_ino: dict[int, list[_Event]] = {}
            for e in pending:
                if e.is_dir_event:
                    if rng.random() < 0.5:
                        keep.add(e.seq)
                else:
                    by_ino.setdefault(e.ino, []).append(e)
            for evs in by_ino.values():
                n = rng.randint(0, len(evs))
                keep.update(e.seq for e in evs[:n])
                last = evs[n - 1] if n else None
                if last is not None and last.kind == "write" and len(last.data) > 1 and rng.random() < 0.5:
                    tear[last.seq] = rng.randint(1, len(last.data) - 1)
        elif policy != "sync":
            raise ValueError(f"unknown policy {policy!r}")
        return self.build(k, keep, tear)

    def subsets(self, k: int, limit: int) -> Iterator[FS] | None:
        """Every crash state at ``k`` (each pending entry change kept or not, each
        file keeping each prefix of its pending writes), or None if there are
        more than ``limit``."""
        pending = self.pending(k)
        dir_events = [e.seq for e in pending if e.is_dir_event]
        by_ino: dict[int, list[int]] = {}
        for e in pending:
            if not e.is_dir_event:
                by_ino.setdefault(e.ino, []).append(e.seq)
        count = 2 ** len(dir_events)
        for seqs in by_ino.values():
            count *= len(seqs) + 1
        if count > limit:
            return None
        choices = [((), (s,)) for s in dir_events] + [tuple(tuple(seqs[:n]) for n in range(len(seqs) + 1))
                                                      for seqs in by_ino.values()]
        return (self.build(k, {s for part in combo for s in part}, {}) for combo in itertools.product(*choices))

    def build(self, k: int, keep: set[int], tear: dict[int, int]) -> FS:
        """The snapshot, every operation durable before ``k``, and the pending events in ``keep``."""
        fs = self.snapshot.copy()
        for ino, is_dir in self.new_inodes.items():
            fs.nodes[ino] = _Node(is_dir)
        for e in self.events:
            if e.i >= k:
                break
            if e.durable_at < k or e.seq in keep:
                _apply(fs, e, tear.get(e.seq))
        return fs


def _apply(fs: FS, e: _Event, tear: int | None) -> None:
    if e.kind == "write":
        node = fs.nodes[e.ino]
        node.data = _splice(node.data, e.offset, e.data if tear is None else e.data[:tear])
    elif e.kind == "trunc":
        node = fs.nodes[e.ino]
        node.data = node.data[: e.size] + b"\0" * max(0, e.size - len(node.data))
    elif e.kind == "link":
        fs.nodes[e.dir].entries[e.name] = e.ino
    elif e.kind == "unlink":
        if fs.nodes[e.dir].entries.get(e.name) == e.ino:
            del fs.nodes[e.dir].entries[e.name]
    elif e.kind == "rename":
        if fs.nodes[e.dir].entries.get(e.name) == e.ino:
            del fs.nodes[e.dir].entries[e.name]
        fs.nodes[e.dst_dir].entries[e.dst_name] = e.ino


