"""The content-addressed object store, modeled on Git's internals.

Bottom layer of kxen-agent: strict deterministic CBOR (:mod:`.codec`), object
bytes and ids (:mod:`.objects`), loose files (:mod:`.loose`), the ref-file
and reflog formats (:mod:`.refformat`, pure), refs with transactions and
reflogs (:mod:`.refs`), the step logs (:mod:`.steps`), the durable step as
a value (:mod:`.step`: ``store.step(group)``), derived caches
(:mod:`.caches`), locks (:mod:`.locks`), the one I/O seam (:mod:`.fsio`),
the state dir (:mod:`.repo`), the storage protocols (:mod:`.protocols`)
with an in-memory implementation (:mod:`.memory`), :mod:`.fsck`, packs
(:mod:`.pack`), :mod:`.gc`, folding step logs into packs and ref files
(:mod:`.fold`), automatic packing (:mod:`.autopack`), who may use a state
dir (:mod:`.access`), bundles (:mod:`.bundle`) and the Git image of objects
and ref groups (:mod:`.gitmap`). Nothing
here knows what a session, an agent or a run is (the namespaces of the
state dir's skeleton are given by the layer above: ``Store(root,
namespaces=...)``); ``objects_spec.md`` is the normative description of
every byte this layer writes. Every file-system call of the store goes
through one :class:`FileIO` (:mod:`.fsio`).

``__all__`` below is the store's public surface, tested in
``tests/store/test_public_surface.py``; the submodules' own ``__all__``
name what else each offers the layers above.
"""

import sys as _sys
import types as _types
import typing as _typing

import kxen_agent.lazy

from .codec import DecodeError, EncodeError
from .fsio import OS_IO, FaultyIO, FileIO, IOFaultSpecError, TracingIO
from .locks import FileLock, LockBusy, StoreLock, file_lock, lock_for, store_lock
from .objects import KINDS, MAX_OBJECT_SIZE, CorruptObject, ObjectId, RawObject, decode_body, encode_object
from .protocols import ExclusiveLock, ObjectStore, RefContainer, Repository
from .refs import ANY, BadRefName, CorruptRef, RefConflict, RefUpdate, StaleFence
from .repo import AmbiguousId, MissingObject, StateDirError, Store, default_state_dir

if _typing.TYPE_CHECKING:  # loaded on first use (below): bundles and the memory store are not needed to read a session
    from .bundle import BadBundle, BundleInfo, BundleRefused, ImportResult, export_bundle, import_bundle, verify_bundle
    from .fsck import FsckReport, Problem, fsck
    from .gc import GcAborted, GcReport, gc
    from .memory import MemoryRefStore, MemoryStore
    from .pack import BadPack, PackReader, PackWriter

# Name -> the module that defines it, imported on first use (PEP 562): the
# CLI's read commands start without importing bundles, fsck, gc or packs.
_LAZY = {
    "BadBundle": ".bundle", "BundleInfo": ".bundle", "BundleRefused": ".bundle", "ImportResult": ".bundle",
    "export_bundle": ".bundle", "import_bundle": ".bundle", "verify_bundle": ".bundle",
    "FsckReport": ".fsck", "Problem": ".fsck", "fsck": ".fsck",
    "GcAborted": ".gc", "GcReport": ".gc", "gc": ".gc",
    "MemoryRefStore": ".memory", "MemoryStore": ".memory",
    "BadPack": ".pack", "PackReader": ".pack", "PackWriter": ".pack",
}


class _Package(_types.ModuleType):
    """This package's module type: ``fsck`` and ``gc`` name the functions, never their modules.

    Importing a submodule binds it as an attribute of its package; for
    ``kxen_agent.store.fsck`` and ``kxen_agent.store.gc`` that name is the
    function's, which must win (as it did when this package imported them
    eagerly). The modules stay in ``sys.modules``, so ``from
    kxen_agent.store.gc import parse_duration`` works as ever.
    """

    def __setattr__(self, name: str, value: object) -> None:
        if name in ("fsck", "gc") and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


__getattr__, __dir__ = kxen_agent.lazy.lazy_surface(__name__, _LAZY, globals())
del kxen_agent  # bound by the import above; not a name of this package

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
