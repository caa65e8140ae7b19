"""The content-addressed object store, modeled on Git's internals.

Bottom layer of kxen-agent. Nothing here knows what a session, an agent or
a run is (the namespaces of the state dir's skeleton are given by the layer
above: ``Store(root, namespaces=...)``); ``objects_spec.md`` is the
normative description of every byte this layer writes. Every file-system
call of the store goes through one :class:`FileIO` (:mod:`.fsio`).

Modules, one line each (pure formats first, then files, then whole-store
operations):

- :mod:`.codec` — strict deterministic CBOR, the byte format of every structured object;
- :mod:`.objects` — object bytes: header, ids, links, the loose frame;
- :mod:`.refformat` — pure ref-file and reflog formats;
- :mod:`.gitmap` — the Git image of objects and ref groups (§16), bytes in, bytes out;
- :mod:`.fsio` — the one seam through which the store touches the file system;
- :mod:`.locks` — group locks and the store lock on lock files;
- :mod:`.loose` — loose objects, one zstd file each;
- :mod:`.pack` — packs and their indexes (package: format, compress, stream, writer, reader);
- :mod:`.refs` — mutable refs, grouped, with a reflog each group;
- :mod:`.steps` — step logs: a group's durable steps, objects and ref change in one record;
- :mod:`.steps_tail` — the one-pass search for record-shaped fields in a step log's tail (steps, salvage);
- :mod:`.step` — the durable step as a value (Store.step);
- :mod:`.fold` — folding step logs into a pack and the ref files;
- :mod:`.caches` — derived caches the store knows (path, removal, verify);
- :mod:`.access` — who may use a state dir, and in which mode (§10.4);
- :mod:`.repo` — the state directory: layout, version, the disk :class:`Store`;
- :mod:`.memory` — the in-memory store, with the disk store's semantics;
- :mod:`.protocols` — the object store and ref store as protocols;
- :mod:`.autopack` — automatic packing, as ``git gc --auto``;
- :mod:`.fsck` — verify every object, every ref and the closure between them;
- :mod:`.salvage` — what a damaged pack or step log still holds, entry by entry, record by record;
- :mod:`.repair` — mend what fsck names from good copies; the rest to ``lost-found/`` (§18);
- :mod:`.gc` — pack what is reachable, prune what is not;
- :mod:`.bundle` — ref groups and their objects in one verifiable file (package).

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
