"""The bundle format's constants and header block, and the record of what a bundle holds.

Owns ``objects_spec.md`` §12.5's header: the 16-byte prefix (``KXBUNDLE``,
version, header length), the strict-CBOR header map (capabilities, refs,
object count and size) and its CRC-32, as pure functions over bytes
(:func:`encode_bundle_head`, :func:`parse_bundle_prefix`,
:func:`parse_bundle_header`), and the checks of a header's values that
both forms share (:func:`_check_header`, :func:`_check_refs`). Also the
small pieces every bundle operation shares: :class:`BadBundle`,
:class:`BundleInfo`, :func:`format_for_path` and the progress callback.

It must never open a file or read a stream: callers hand it bytes.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kxen_agent.errors import KxenError, UsageError

from .. import codec
from ..objects import MAX_OBJECT_SIZE
from ..pack import crc32
from ..refs import BadRefName, validate_group, validate_ref_name

__all__ = sorted(
    [
        "BUNDLE_MAGIC",
        "BUNDLE_VERSION",
        "BadBundle",
        "BundleInfo",
        "BundleLimits",
        "CAP_GIT_CHECKPOINTS",
        "CAP_ZSTD_DICT",
        "CONTENT_DIGEST_PREFIX",
        "GIT_SECTION_MAGIC",
        "KNOWN_CAPABILITIES",
        "MAX_HEADER_SIZE",
        "MAX_HEADER_NAMES",
        "PREFIX_SIZE",
        "Progress",
        "encode_bundle_head",
        "format_for_path",
        "parse_bundle_header",
        "parse_bundle_prefix",
    ]
)

#: What the content digest hashes first (§12.7, the JSON form's ``digest``, §12.8).
CONTENT_DIGEST_PREFIX = b"kxen-bundle-json 1\n"
BUNDLE_MAGIC = b"KXBUNDLE"
BUNDLE_VERSION = 1
#: Capabilities a version-1 reader understands; any other is refused.
CAP_ZSTD_DICT = "zstd-dict"  # entries may use the pack's zstd dictionary
#: A checkpoint section (a Git bundle of workspace checkpoints) follows the pack section (§12.7a).
CAP_GIT_CHECKPOINTS = "git-checkpoints"
KNOWN_CAPABILITIES = frozenset({CAP_ZSTD_DICT, CAP_GIT_CHECKPOINTS})
#: The checkpoint section's magic, then its length (u64, big-endian), then that many bytes of a Git bundle.
GIT_SECTION_MAGIC = b"KXGITCKP"
MAX_HEADER_SIZE = 16 << 20

#: The most group and ref names one header may hold: the header is decoded as
#: one object (``objects_spec.md`` §2.7's decode budget, 524 288 data items),
#: and its map takes 10 items at most (itself, four keys, four values, one
#: capability) plus 2 per group (key and value) and 2 per ref: 262 139.
MAX_HEADER_NAMES = (codec.MAX_BODY_ITEMS - 10) // 2

_PREFIX = struct.Struct(">8sII")  # magic, version, header length
_U32 = struct.Struct(">I")
PREFIX_SIZE = _PREFIX.size  # 16

Progress = Callable[[int], None]


#: The environment variables that set :class:`BundleLimits` (``objects_spec.md`` §12.13).
ENV_MAX_BYTES = "KXEN_AGENT_BUNDLE_MAX_BYTES"
ENV_MAX_RATIO = "KXEN_AGENT_BUNDLE_MAX_RATIO"
#: The object bytes any bundle may hold, whatever its ratio: two largest objects (128 MiB + 34).
RATIO_FLOOR = 2 * (MAX_OBJECT_SIZE + 17)


@dataclass(frozen=True)
class BundleLimits:
    """How many object bytes a reader accepts from one bundle, judged before any object is read.

    The objects' bytes are what a reader must decompress and hash (their ids
    are hashes), so they, not the file, are the cost: a 90 KB bundle of
    zstd frames of zeros declared 2.4 GB and took 25 s of CPU to verify.
    A bundle may declare at most ``max_bytes`` object bytes, and at most
    ``max_ratio`` times its file's size — but never less than
    :data:`RATIO_FLOOR`, two objects of the largest size, however small the
    file (one 64 MiB output of a single letter and the session around it).
    Defaults: 4 GiB and 256 (measured sessions compress 3 to 12 times; §12.5).
    """

    max_bytes: int = 4 << 30
    max_ratio: int = 256

    def allowed(self, file_bytes: int | None) -> int:
        """The most object bytes a bundle of ``file_bytes`` (None: not known yet) may hold."""
        if file_bytes is None:
            return self.max_bytes
        return min(self.max_bytes, max(RATIO_FLOOR, self.max_ratio * file_bytes))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "BundleLimits":
        """The limits :data:`ENV_MAX_BYTES` and :data:`ENV_MAX_RATIO` set (each a positive integer), else the defaults."""
        env = os.environ if env is None else env
        values = {}
        for name, key in ((ENV_MAX_BYTES, "max_bytes"), (ENV_MAX_RATIO, "max_ratio")):
            text = env.get(name)
            if text is None or text == "":
                continue
            if not text.isdigit() or int(text) < 1:
                raise UsageError(f"{name}={text!r} is not a positive whole number; set it to one, or unset it "
                                 "for the default")
            values[key] = int(text)
        return cls(**values)


def check_header_limits(hdr: "_Header", where: str, file_bytes: int | None, limits: BundleLimits,
                        offset: int | None, unit: str = "byte") -> None:
    """Refuse a header that declares more object bytes than ``limits`` allow a file of ``file_bytes``.

    Before any object is read (``objects_spec.md`` §12.9 step 1): a reader
    then never decompresses or hashes more than the header declares
    (the readers hold every object to it before they decompress it).
    """
    size = hdr.size
    if size > limits.max_bytes:
        raise BadBundle(where, f"header declares {size} object bytes, more than the {limits.max_bytes} this "
                        f"reader accepts from one bundle; set {ENV_MAX_BYTES} to accept it", offset, unit)
    allowed = limits.allowed(file_bytes)
    if size > allowed:
        raise BadBundle(where, f"header declares {size} object bytes in a file of {file_bytes} bytes, more than "
                        f"{limits.max_ratio} times its size (a compression bomb, or set {ENV_MAX_RATIO} "
                        "to accept it)", offset, unit)


class BadBundle(KxenError):
    """A bundle file breaks the format or fails a check; nothing was imported."""

    def __init__(self, where: str, reason: str, offset: int | None = None, unit: str = "byte") -> None:
        at = f" (at {unit} {offset})" if offset is not None else ""
        super().__init__(f"bad bundle {where}: {reason}{at}")
        self.where = where
        self.reason = reason
        self.offset = offset


@dataclass(frozen=True)
class BundleInfo:
    """What a bundle holds, as verified."""

    path: str
    format: str  # "pack" | "json"
    version: int
    capabilities: tuple[str, ...]
    refs: Mapping[str, Mapping[str, bytes]]
    objects: int
    object_bytes: int  # sum of the canonical object sizes
    pack_bytes: int  # the pack section (pack form), 0 for JSON
    file_bytes: int
    digest: str  # the trailer (pack form) or the digest (JSON form), hex
    kinds: Mapping[str, int] = field(default_factory=dict)
    #: What the bundle holds, whatever its form (§12.7): the refs, the counts
    #: and the object ids in order; the same bundle exported in the two forms
    #: has the same one (the JSON form's ``digest``). Imports name it.
    content_digest: str = ""
    #: (offset, length) of the checkpoint section's Git bundle in the file (§12.7a), or None.
    checkpoints: tuple[int, int] | None = None

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "format": self.format,
            "version": self.version,
            "capabilities": list(self.capabilities),
            "refs": {g: {n: v.hex() for n, v in sorted(r.items())} for g, r in sorted(self.refs.items())},
            "objects": self.objects,
            "objectBytes": self.object_bytes,
            "packBytes": self.pack_bytes,
            "fileBytes": self.file_bytes,
            "digest": self.digest,
            "contentDigest": self.content_digest,
            "kinds": dict(sorted(self.kinds.items())),
            **({"checkpointBytes": self.checkpoints[1]} if self.checkpoints else {}),
        }


def format_for_path(path: str, fmt: str | None = None) -> str:
    """``fmt`` if given, else ``json`` for a ``.json`` file name, else ``pack``."""
    if fmt is not None:
        if fmt not in ("pack", "json"):
            raise UsageError(f"unknown bundle format {fmt!r}: use 'pack' or 'json'")
        return fmt
    return "json" if str(path).lower().endswith(".json") else "pack"


def _set_total(progress: Progress | None, n: int) -> None:
    # Duck-typed: the CLI's Progress shows a percentage once it knows the total.
    if progress is not None and hasattr(progress, "total") and getattr(progress, "total") is None:
        try:
            progress.total = n  # type: ignore[attr-defined]
        except AttributeError:
            pass


# ------------------------------------------------------------------ the header's values


@dataclass(frozen=True)
class _Header:
    capabilities: tuple[str, ...]
    refs: dict[str, dict[str, bytes]]
    objects: int
    size: int

    def cbor(self) -> bytes:
        names = len(self.refs) + sum(len(r) for r in self.refs.values())
        if names > MAX_HEADER_NAMES:
            raise UsageError(f"too many refs for one bundle: {names} group and ref names, more than the "
                             f"{MAX_HEADER_NAMES} a bundle header may hold; export the sessions in several bundles")
        return codec.encode(
            {"capabilities": list(self.capabilities), "objects": self.objects, "refs": self.refs, "size": self.size},
            links_only=True,
        )

    def content_digest(self) -> Any:
        """The running BLAKE3 of the content digest (§12.7), before the ids: feed it each object's id in order.

        The header map with ``capabilities`` empty: ``zstd-dict`` says how a
        pack section is compressed, not what the bundle holds, so the two
        forms of one bundle get one digest (the JSON form's ``digest``).
        """
        import blake3

        return blake3.blake3(CONTENT_DIGEST_PREFIX + _Header((), self.refs, self.objects, self.size).cbor())


def _check_refs(refs: Any, where: str, offset: int | None, unit: str = "byte") -> dict[str, dict[str, bytes]]:
    def bad(reason: str) -> BadBundle:
        return BadBundle(where, reason, offset, unit)

    if type(refs) is not dict or not refs:
        raise bad("refs must be a non-empty map of ref groups")
    # The same bound in both forms (the pack form's decoder meets it first):
    # the header is one object's worth of data items (§2.7, §12.7).
    names = len(refs) + sum(len(v) for v in refs.values() if type(v) is dict)
    if names > MAX_HEADER_NAMES:
        raise bad(f"header holds {names} group and ref names, more than the {MAX_HEADER_NAMES} a bundle header "
                  "may hold (objects_spec.md §12.7: a header is decoded as one object); split the bundle")
    out: dict[str, dict[str, bytes]] = {}
    for group, names in refs.items():
        try:
            validate_group(group)
        except BadRefName as e:
            raise bad(str(e)) from None
        if type(names) is not dict or not names:
            raise bad(f"ref group {group!r} must map at least one ref name to an id")
        out[group] = {}
        for name, oid in names.items():
            try:
                validate_ref_name(name)
            except BadRefName as e:
                raise bad(f"in ref group {group}: {e}") from None
            if type(oid) is not bytes or len(oid) != 32:
                raise bad(f"ref {group}/{name} is not a 32-byte object id")
            out[group][name] = oid
    return out


#: The fewest bytes one object takes in a pack-form bundle: an entry header
#: and the shortest object bytes (``blob 0`` NUL, 7 bytes; a zstd frame is
#: longer), and what a pack section and the trailer add to its entries.
MIN_ENTRY_BYTES = 57 + 7
_PACK_FORM_OVERHEAD = 4 + 4 + 4 + 4 + 4 + 8 + 32 + 32  # pack magic, version, dictionary length, CRC; end record; trailers
#: The fewest characters one element of a JSON bundle's ``objects`` takes:
#: ``{"id":"<64 hex>","kind":"run","bytes":"<12 base64>"}`` and its comma.
MIN_JSON_OBJECT_CHARS = 110
#: The shortest object bytes of any kind (``blob 0`` NUL).
MIN_OBJECT_BYTES = 7


def check_header_fits(hdr: _Header, where: str, room: int | None, per_object: int, offset: int | None,
                      unit: str = "byte") -> None:
    """Judge the header's counts against each other and against the file, before any object is read.

    ``room`` is what the file has left for objects (bytes of the pack form
    after its header, characters of the JSON form; None: unknown, a pipe),
    ``per_object`` the fewest an object takes there. A count the file
    cannot hold, or a size its objects cannot have, is refused at once
    (``objects_spec.md`` §12.9 step 1), so that nothing is read, decoded
    or remembered for a bundle whose header already shows it is wrong.
    """
    n, size = hdr.objects, hdr.size
    if room is not None and n > max(0, room) // per_object:
        raise BadBundle(where, f"header declares {n} objects, which take at least {n * per_object} {unit}s, and "
                        f"the file has {max(0, room)} for them: truncated, or the header lies", offset, unit)
    if not MIN_OBJECT_BYTES * n <= size <= (MAX_OBJECT_SIZE + 17) * n:
        raise BadBundle(where, f"header declares {size} object bytes, which {n} objects cannot have "
                        f"({MIN_OBJECT_BYTES} to {MAX_OBJECT_SIZE + 17} bytes each)", offset, unit)


def _check_header(value: Any, where: str, offset: int) -> _Header:
    if type(value) is not dict:
        raise BadBundle(where, "header is not a map", offset)
    keys = {"capabilities", "objects", "refs", "size"}
    if set(value) != keys:
        extra = sorted(set(value) - keys)
        missing = sorted(keys - set(value))
        raise BadBundle(where, f"header keys: unknown {extra}, missing {missing}", offset)
    caps = value["capabilities"]
    if type(caps) is not list or any(type(c) is not str for c in caps):
        raise BadBundle(where, "capabilities must be a list of strings", offset)
    for c in caps:
        if c not in KNOWN_CAPABILITIES:
            raise BadBundle(where, f"unknown capability {c!r} (this kxen-agent knows {sorted(KNOWN_CAPABILITIES)}); upgrade kxen-agent", offset)
    if caps != sorted(set(caps)):
        raise BadBundle(where, "capabilities must be sorted and unique", offset)
    n, size = value["objects"], value["size"]
    if type(n) is not int or n < 0 or type(size) is not int or size < 0:
        raise BadBundle(where, "object count and size must be non-negative integers", offset)
    return _Header(tuple(caps), _check_refs(value["refs"], where, offset), n, size)


# ------------------------------------------------------------------ the header block's bytes


def encode_bundle_head(raw_header: bytes) -> bytes:
    """The prefix, the header's CBOR ``raw_header`` and their CRC-32: what precedes the pack."""
    prefix = _PREFIX.pack(BUNDLE_MAGIC, BUNDLE_VERSION, len(raw_header))
    return prefix + raw_header + _U32.pack(crc32(prefix, raw_header))


def parse_bundle_prefix(prefix: bytes, where: str) -> int:
    """Check the :data:`PREFIX_SIZE`-byte prefix at the start of a pack-form bundle; the header's length."""
    magic, version, hlen = _PREFIX.unpack(prefix)
    if magic != BUNDLE_MAGIC:
        raise BadBundle(where, f"not a kxen bundle (magic {magic!r})", 0)
    if version != BUNDLE_VERSION:
        raise BadBundle(where, f"unknown bundle version {version} (this kxen-agent reads version {BUNDLE_VERSION}); upgrade kxen-agent", 8)
    if hlen > MAX_HEADER_SIZE:
        raise BadBundle(where, f"header of {hlen} bytes exceeds the {MAX_HEADER_SIZE}-byte limit", 12)
    return hlen


_OVER_BUDGET = f", more than the {codec.MAX_BODY_ITEMS} items one object may hold"


def parse_bundle_header(prefix: bytes, raw_header: bytes, crc: bytes, where: str) -> _Header:
    """Check the header block: ``crc`` (4 bytes) over ``prefix`` and ``raw_header``, strict CBOR, the values."""
    if crc32(prefix, raw_header) != _U32.unpack(crc)[0]:
        raise BadBundle(where, "header checksum mismatch", PREFIX_SIZE)
    try:
        value = codec.decode(raw_header, links_only=True)
    except codec.DecodeError as e:
        reason = e.reason
        if reason.endswith(_OVER_BUDGET):  # say what it is about: a header, not an object
            raise BadBundle(where, f"header is over the decode budget: {reason[: -len(_OVER_BUDGET)]}, more than "
                            f"the {codec.MAX_BODY_ITEMS} data items a bundle header may hold (at most "
                            f"{MAX_HEADER_NAMES} group and ref names, objects_spec.md §12.7); split the bundle",
                            PREFIX_SIZE + e.offset) from None
        raise BadBundle(where, f"header is not strict CBOR: {reason}", PREFIX_SIZE + e.offset) from None
    return _check_header(value, where, PREFIX_SIZE)
