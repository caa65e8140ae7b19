"""The content-addressed object store, modeled on Git's internals.

Bottom layer of kxen-agent: strict deterministic CBOR (:mod:`.codec`), object
bytes and ids (:mod:`.objects`), loose files (:mod:`.loose`), refs with
transactions and reflogs (:mod:`.refs`), locks (:mod:`.locks`), the one I/O
seam (:mod:`.fsio`), the state dir (:mod:`.repo`), :mod:`.fsck`, packs
(:mod:`.pack`), :mod:`.gc` and bundles (:mod:`.bundle`). Nothing
here knows what a session, an agent or a run is; ``objects_spec.md`` is the
normative description of every byte this layer writes.
"""

from .bundle import BadBundle, BundleInfo, BundleRefused, ImportResult, export_bundle, import_bundle, verify_bundle
from .codec import DecodeError, EncodeError
from .fsck import FsckReport, Problem, fsck
from .fsio import OS_IO, FileIO
from .gc import GcAborted, GcReport, gc
from .locks import LockBusy, file_lock
from .objects import KINDS, MAX_OBJECT_SIZE, CorruptObject, ObjectId, RawObject, decode_body, encode_object
from .pack import BadPack, PackReader, PackWriter
from .refs import ANY, BadRefName, CorruptRef, RefConflict, RefUpdate, StaleFence
from .repo import AmbiguousId, MissingObject, StateDirError, Store, default_state_dir

__all__ = sorted(
    [
        "PackWriter",
        "PackReader",
        "BadPack",
        "gc",
        "GcReport",
        "GcAborted",
        "verify_bundle",
        "import_bundle",
        "export_bundle",
        "ImportResult",
        "BundleRefused",
        "BundleInfo",
        "BadBundle",
        "ANY",
        "AmbiguousId",
        "BadRefName",
        "CorruptObject",
        "CorruptRef",
        "DecodeError",
        "EncodeError",
        "FileIO",
        "FsckReport",
        "KINDS",
        "LockBusy",
        "MAX_OBJECT_SIZE",
        "MissingObject",
        "OS_IO",
        "ObjectId",
        "Problem",
        "RawObject",
        "RefConflict",
        "RefUpdate",
        "StaleFence",
        "StateDirError",
        "Store",
        "decode_body",
        "default_state_dir",
        "encode_object",
        "file_lock",
        "fsck",
    ]
)
