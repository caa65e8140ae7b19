"""The content-addressed object store, modeled on Git's internals.

Bottom layer of kxen-agent: strict deterministic CBOR (:mod:`.codec`), object
bytes and ids (:mod:`.objects`), loose files (:mod:`.loose`), refs with
transactions and reflogs (:mod:`.refs`), locks (:mod:`.locks`), the one I/O
seam (:mod:`.fsio`), the state dir (:mod:`.repo`), the storage protocols (:mod:`.protocols`)
with an in-memory implementation (:mod:`.memory`), :mod:`.fsck`, packs
(:mod:`.pack`), :mod:`.gc` and bundles (:mod:`.bundle`). Nothing
here knows what a session, an agent or a run is (the namespaces of the
state dir's skeleton are given by the layer above: ``Store(root,
namespaces=...)``); ``objects_spec.md`` is the normative description of
every byte this layer writes. Every file-system call of the store goes
through one :class:`FileIO` (:mod:`.fsio`).

``__all__`` below is the store's public surface, tested in
``tests/store/test_public_surface.py``; the submodules' own ``__all__``
name what else each offers the layers above.
"""

from .bundle import BadBundle, BundleInfo, BundleRefused, ImportResult, export_bundle, import_bundle, verify_bundle
from .codec import DecodeError, EncodeError
from .fsck import FsckReport, Problem, fsck
from .fsio import OS_IO, FaultyIO, FileIO, IOFaultSpecError, TracingIO
from .gc import GcAborted, GcReport, gc
from .locks import FileLock, LockBusy, StoreLock, file_lock, lock_for, store_lock
from .memory import MemoryRefStore, MemoryStore
from .objects import KINDS, MAX_OBJECT_SIZE, CorruptObject, ObjectId, RawObject, decode_body, encode_object
from .pack import BadPack, PackReader, PackWriter
from .protocols import ExclusiveLock, ObjectStore, RefContainer, Repository
from .refs import ANY, BadRefName, CorruptRef, RefConflict, RefUpdate, StaleFence
from .repo import AmbiguousId, MissingObject, StateDirError, Store, default_state_dir

__all__ = [
    "ANY",
    "AmbiguousId",
    "BadBundle",
    "BadPack",
    "BadRefName",
    "BundleInfo",
    "BundleRefused",
    "CorruptObject",
    "CorruptRef",
    "DecodeError",
    "EncodeError",
    "ExclusiveLock",
    "FaultyIO",
    "FileIO",
    "FileLock",
    "FsckReport",
    "GcAborted",
    "GcReport",
    "IOFaultSpecError",
    "ImportResult",
    "KINDS",
    "LockBusy",
    "MAX_OBJECT_SIZE",
    "MemoryRefStore",
    "MemoryStore",
    "MissingObject",
    "OS_IO",
    "ObjectId",
    "ObjectStore",
    "PackReader",
    "PackWriter",
    "Problem",
    "RawObject",
    "RefConflict",
    "RefContainer",
    "RefUpdate",
    "Repository",
    "StaleFence",
    "StateDirError",
    "Store",
    "StoreLock",
    "TracingIO",
    "decode_body",
    "default_state_dir",
    "encode_object",
    "export_bundle",
    "file_lock",
    "fsck",
    "gc",
    "import_bundle",
    "lock_for",
    "store_lock",
    "verify_bundle",
]
