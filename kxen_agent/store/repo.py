"""The state directory: its layout, its version, and the object database.

:class:`Store` is the store layer's front door: objects (loose and packed,
read transparently), refs, and the state dir's format file. It knows
nothing of sessions. The state dir is created lazily by the first write, so
read-only commands (``fsck``, ``session list``) never create one.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from typing import Any, Iterator, Protocol

from kxen_agent.errors import KxenError, UsageError

from .fsio import OS_IO, FileIO
from .loose import LooseObjects
from .objects import CorruptObject, ObjectId, RawObject, decode_body, encode_object
from .refs import RefStore

__all__ = [
    "AmbiguousId",
    "FORMAT_VERSION",
    "MissingObject",
    "ObjectSource",
    "StateDirError",
    "Store",
    "default_state_dir",
]

FORMAT_VERSION = 1
FORMAT_FILE = "FORMAT"
# The FORMAT file's temporary name while it is being written. A process that
# dies between creating it and renaming it leaves it behind; it must not make
# the otherwise empty directory look foreign (nor may a concurrent first
# writer's temp file).
_FORMAT_TMP_PREFIX = "FORMAT.tmp_"
_FORMAT_RE = re.compile(rb"kxen-agent-state (\d+)\n")


class StateDirError(KxenError):
    """The state directory cannot be used (unknown version, not ours, unreadable)."""


class MissingObject(KxenError):
    """An object is not in this store."""

    def __init__(self, oid_hex: str, where: str) -> None:
        super().__init__(f"object {oid_hex} not found in state dir {where}")
        self.oid_hex = oid_hex


class AmbiguousId(UsageError):
    """An id prefix matches several objects."""


class ObjectSource(Protocol):
    """A read-only source of verified objects (a pack, for example)."""

    def read_raw(self, oid: ObjectId) -> RawObject | None: ...
    def has(self, oid: ObjectId) -> bool: ...
    def iter_ids(self) -> Iterator[ObjectId]: ...
    def with_prefix(self, hexprefix: str) -> list[ObjectId]: ...


def default_state_dir() -> str:
    env = os.environ.get("KXEN_AGENT_STATE_DIR")
    if env:
        return os.path.abspath(env)
    xdg = os.environ.get("XDG_DATA_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "kxen-agent")


class Store:
    """Objects and refs of one state directory."""

    def __init__(self, root: str, io: FileIO = OS_IO, lock_timeout: float = 30.0) -> None:
        self.root = os.path.abspath(root)
        self.io = io
        self._initialized = False
        self._check_format()
        self.loose = LooseObjects(os.path.join(self.root, "objects"), io, before_write=self.ensure_initialized)
        self.refs = RefStore(self.root, io, lock_timeout, before_write=self.ensure_initialized)
        self.packs: list[ObjectSource] = []
        self._load_packs()

    @classmethod
    def open(cls, root: str | None = None, **kw: Any) -> "Store":
        return cls(root or default_state_dir(), **kw)

    # ------------------------------------------------------------ format file

    def _check_format(self) -> None:
        path = os.path.join(self.root, FORMAT_FILE)
        try:
            data = self.io.read(path)
        except FileNotFoundError:
            if os.path.isdir(self.root) and any(
                not n.startswith(_FORMAT_TMP_PREFIX) for n in os.listdir(self.root)
            ):
                if os.path.exists(path):  # a concurrent first writer just created it
                    return self._check_format()
                raise StateDirError(
                    f"{self.root} is not empty and is not a kxen-agent state dir (no {FORMAT_FILE} file); "
                    "point KXEN_AGENT_STATE_DIR at an empty or new directory"
                ) from None
            if os.path.exists(self.root) and not os.path.isdir(self.root):
                raise StateDirError(f"state dir {self.root} exists and is not a directory")
            return
        except OSError as e:
            raise StateDirError(f"cannot read {path}: {e.strerror}") from None
        m = _FORMAT_RE.fullmatch(data)
        if not m:
            raise StateDirError(f"{path} is not a kxen-agent format file")
        version = int(m.group(1))
        if version > FORMAT_VERSION:
            raise StateDirError(
                f"state dir {self.root} has format version {version}, newer than this kxen-agent "
                f"understands ({FORMAT_VERSION}); upgrade kxen-agent"
            )
        if version < 1:
            raise StateDirError(f"{path}: unknown format version {version}")
        self._initialized = True

    @property
    def exists(self) -> bool:
        return self._initialized

    def ensure_initialized(self) -> None:
        """Create the state dir on first write: the FORMAT file first, the rest lazily."""
        if self._initialized:
            return
        self.io.makedirs(self.root)
        path = os.path.join(self.root, FORMAT_FILE)
        if not os.path.exists(path):
            self._check_format()  # refuse a foreign non-empty directory
            tmp = self.io.write_tmp(
                self.root, b"kxen-agent-state %d\n" % FORMAT_VERSION, prefix=_FORMAT_TMP_PREFIX
            )
            try:
                self.io.rename(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
            self.io.fsync_dir(self.root)
        self._initialized = True

    # ------------------------------------------------------------ packs

    def _load_packs(self) -> None:
        """Open every pack whose index is in place (the index is the commit point)."""
        pack_dir = os.path.join(self.root, "objects", "pack")
        if not os.path.isdir(pack_dir):
            self.packs = []
            return
        try:
            from .pack import PackReader
        except ImportError:  # packs arrive with the pack module
            self.packs = []
            return
        packs = []
        for name in sorted(os.listdir(pack_dir)):
            if name.endswith(".idx"):
                packs.append(PackReader.open(os.path.join(pack_dir, name[:-4])))
        self.packs = packs

    def reload_packs(self) -> None:
        for p in self.packs:
            close = getattr(p, "close", None)
            if close:
                close()
        self._load_packs()

    # ------------------------------------------------------------ objects

    def put(self, kind: str, value: Any) -> ObjectId:
        """Store ``value`` as an object of ``kind``; return its id."""
        obj = encode_object(kind, value)
        self.put_raw(obj)
        return obj.id

    def put_raw(self, obj: RawObject) -> bool:
        if any(p.has(obj.id) for p in self.packs):
            return False
        return self.loose.write(obj)

    def batch(self):
        """Share one durability barrier among many :meth:`put` calls (§5.3)."""
        return self.loose.batch()

    def read_raw(self, oid: ObjectId) -> RawObject:
        obj = self.loose.read_raw(oid)
        if obj is not None:
            return obj
        for p in self.packs:
            obj = p.read_raw(oid)
            if obj is not None:
                return obj
        # A concurrent gc may have packed the object since we listed packs.
        if os.path.isdir(os.path.join(self.root, "objects", "pack")):
            self.reload_packs()
            for p in self.packs:
                obj = p.read_raw(oid)
                if obj is not None:
                    return obj
        raise MissingObject(oid.hex(), self.root)

    def get(self, oid: ObjectId, kind: str | None = None) -> Any:
        """The decoded value of object ``oid``, checking its kind if given."""
        obj = self.read_raw(oid)
        if kind is not None and obj.kind != kind:
            raise CorruptObject(oid.hex(), f"is a {obj.kind} object, expected a {kind}")
        return decode_body(obj)

    def has(self, oid: ObjectId) -> bool:
        return self.loose.has(oid) or any(p.has(oid) for p in self.packs)

    def iter_ids(self) -> Iterator[ObjectId]:
        """Every object id, each once (an object may be both loose and packed)."""
        seen: set[ObjectId] = set()
        for oid in self.loose.iter_ids():
            seen.add(oid)
            yield oid
        for p in self.packs:
            for oid in p.iter_ids():
                if oid not in seen:
                    seen.add(oid)
                    yield oid

    def resolve(self, text: str) -> ObjectId:
        """An object id from 8 to 64 hex digits (a unique prefix, like git)."""
        h = text.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{8,64}", h):
            raise UsageError(f"{text!r} is not an object id: give 8 to 64 hex digits")
        if len(h) == 64:
            oid = bytes.fromhex(h)
            if not self.has(oid):
                raise MissingObject(h, self.root)
            return oid
        found = set(self.loose.with_prefix(h))
        for p in self.packs:
            found.update(p.with_prefix(h))
        if not found:
            raise MissingObject(h + "…", self.root)
        if len(found) > 1:
            raise AmbiguousId(f"object id prefix {h} is ambiguous ({len(found)} objects); give more digits")
        return found.pop()

    @contextmanager
    def writing(self):
        """Hold around "write objects, then move refs" (gc's prune excludes it)."""
        yield

    @contextmanager
    def lock_group(self, group: str, timeout: float | None = None):
        with self.refs.lock(group, timeout):
            yield
