"""Bundles: ref groups and every object reachable from them, in one verifiable file.

A bundle is self-contained (no prerequisites, like ``git bundle create
--all`` of a closed set): it imports into an empty state dir. Two forms
(normative text: ``objects_spec.md`` §12.5-§12.7):

- *pack form*: ``KXBUNDLE``, the format version, a strict-CBOR header (the
  capabilities, the refs with their ids, the object count and size) with a
  CRC-32, then exactly a pack (:mod:`kxen_agent.store.pack`) of the
  objects, then a BLAKE3-256 trailer over every byte before it;
- *JSON form*: one JSON document with the same header fields and each
  object's id, kind and canonical bytes (base64), for people who read
  bundles with ``jq``; a ``digest`` ties the refs to the object ids.

Objects come parents first: each object follows an object that links to
it or is the target of a ref. So one streaming pass, remembering only ids,
checks that the bundle holds exactly the closure of its refs — nothing
missing, nothing extra, nothing twice.

Bundles carry objects reachable from the named refs and nothing else: no
environment, no configuration, no credentials (the store holds none).

Export, verification and import stream: memory holds ids, about one
object's bytes (twice, while it is read or compressed), a read-ahead or
write buffer of a MiB and, for export, a constant budget of small objects
the closure walk keeps for the dictionary and the writer
(:data:`EXPORT_KEEP_BUDGET`, so that each is read once; the others are read
again). Import verifies everything while staging the new objects into a
temporary pack, then checks the refs (fast-forward only), then commits the
pack's index, then moves the refs, one transaction per group. A bundle that
fails any check leaves no ref, no object and no pack. Every rejection is
one :class:`BadBundle` naming the first problem.

The package, byte formats at the bottom, as dulwich keeps ``bundle.py``
small by reusing ``pack.py``'s reader and writer (here the pack package's
entry parser, decompressor and :class:`~kxen_agent.store.pack.PackStream`):

- :mod:`.header`: the header block's bytes and values, :class:`BadBundle`,
  :class:`BundleInfo` (pure);
- :mod:`.closure`: the one-pass closure (and schema) check (pure);
- :mod:`.hashing_reader`: exact, hashed reads from a stream;
- :mod:`.pack_form`, :mod:`.json_form`: each form's streaming reader and
  its writer into a sink (they never open a file);
- :mod:`.verify`: opening a bundle through the FileIO seam and checking it;
- :mod:`.envelope`: the signed and encrypted envelopes' bytes (§12.14, pure);
- :mod:`.export`, :mod:`.import_`: the store-facing operations.
"""

from __future__ import annotations

from .export import EXPORT_KEEP_BUDGET, BundleWriteError, NoSuchGroup, bundle_objects, export_bundle
from .header import (
    BUNDLE_MAGIC,
    BUNDLE_VERSION,
    CAP_GIT_CHECKPOINTS,
    CAP_ZSTD_DICT,
    CONTENT_DIGEST_PREFIX,
    GIT_SECTION_MAGIC,
    KNOWN_CAPABILITIES,
    MAX_HEADER_NAMES,
    MAX_HEADER_SIZE,
    PREFIX_SIZE,
    BadBundle,
    BundleInfo,
    BundleLimits,
    Progress,
    encode_bundle_head,
    format_for_path,
    parse_bundle_header,
    parse_bundle_prefix,
)
from .import_ import BundleRefused, ImportResult, Transform, import_bundle
from .json_form import JSON_FORMAT_NAME, write_json_bundle
from .pack_form import write_pack_bundle
from .verify import JudgeRefs, iter_bundle_objects, verify_bundle, verify_bundle_with_ref_targets

__all__ = [
    "BUNDLE_MAGIC",
    "BUNDLE_VERSION",
    "BadBundle",
    "BundleInfo",
    "BundleLimits",
    "BundleRefused",
    "BundleWriteError",
    "CAP_GIT_CHECKPOINTS",
    "CAP_ZSTD_DICT",
    "CONTENT_DIGEST_PREFIX",
    "EXPORT_KEEP_BUDGET",
    "GIT_SECTION_MAGIC",
    "ImportResult",
    "JSON_FORMAT_NAME",
    "JudgeRefs",
    "KNOWN_CAPABILITIES",
    "MAX_HEADER_NAMES",
    "MAX_HEADER_SIZE",
    "NoSuchGroup",
    "PREFIX_SIZE",
    "Progress",
    "Transform",
    "bundle_objects",
    "encode_bundle_head",
    "export_bundle",
    "format_for_path",
    "import_bundle",
    "iter_bundle_objects",
    "parse_bundle_header",
    "parse_bundle_prefix",
    "verify_bundle",
    "verify_bundle_with_ref_targets",
    "write_json_bundle",
    "write_pack_bundle",
]
