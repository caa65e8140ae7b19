"""The pack form of a bundle (``objects_spec.md`` §12.5): read as a stream, verified; written from objects.

A pack-form bundle is ``KXBUNDLE``, the format version, a strict-CBOR
header with a CRC-32 (:mod:`.header`), then exactly a pack of the objects
(:mod:`kxen_agent.store.pack`), then a BLAKE3-256 trailer over every byte
before it. Reading reuses the pack package's entry parser, CRC and
decompressor on a stream (:class:`_PackBundleReader`); writing reuses its
:class:`~kxen_agent.store.pack.PackStream` (:func:`write_pack_bundle`), so
the pack section is byte for byte what a pack file would hold.

It must never open a file or ask the file system anything: it reads the
stream it is given and writes to the sink it is given.
"""

from __future__ import annotations

import struct
import zlib
from typing import BinaryIO, Callable, Iterable, Iterator

import blake3

from kxen_agent.errors import UsageError

from ..objects import CorruptObject, ObjectId, RawObject, parse_object
from ..pack import (
    END_MAGIC,
    END_SIZE,
    ENTRY_HEADER_SIZE,
    PACK_PREFIX_SIZE,
    TRAILER_SIZE,
    BadPack,
    Decompressor,
    PackStream,
    check_pack_header,
    parse_end,
    parse_entry_fields,
    parse_pack_header_prefix,
)
from .closure import _Closure, _Item
from .hashing_reader import _Input
from .header import (
    BUNDLE_VERSION,
    CAP_GIT_CHECKPOINTS,
    CAP_ZSTD_DICT,
    GIT_SECTION_MAGIC,
    MAX_HEADER_SIZE,
    PREFIX_SIZE,
    BadBundle,
    BundleInfo,
    BundleLimits,
    MIN_ENTRY_BYTES,
    _PACK_FORM_OVERHEAD,
    _Header,
    check_header_fits,
    check_header_limits,
    encode_bundle_head,
    parse_bundle_header,
    parse_bundle_prefix,
)

__all__ = ["write_pack_bundle"]

_U32 = struct.Struct(">I")
# Entry header bytes covered by the entry's CRC (all but the CRC itself).
_ENTRY_CRC_COVERED = ENTRY_HEADER_SIZE - 4


class _PackBundleReader:
    """Parse and verify a pack-form bundle as a stream.

    Construction reads the header and the pack header; iterating yields
    every verified object; the end of the iteration checks the end record,
    both trailers, the closure and that nothing follows. Only after the
    iteration completed is :attr:`info` set.
    """

    def __init__(self, f: BinaryIO, where: str, path: str, size: int | None,
                 limits: BundleLimits | None = None) -> None:
        self.inp = _Input(f, where, size)
        self.where = where
        self.path = path
        self.info: BundleInfo | None = None
        inp = self.inp
        prefix = inp.read(PREFIX_SIZE, "the bundle prefix")
        hlen = parse_bundle_prefix(prefix, where)
        raw_header = inp.read(hlen, "the header")
        crc = inp.read(4, "the header checksum")
        self.header = parse_bundle_header(prefix, raw_header, crc, where)
        room = None if size is None else size - inp.pos - _PACK_FORM_OVERHEAD
        check_header_fits(self.header, where, room, MIN_ENTRY_BYTES, PREFIX_SIZE)
        self.limits = limits or BundleLimits()
        self.size = size
        check_header_limits(self.header, where, size, self.limits, PREFIX_SIZE)
        self.closure = _Closure(self.header, where)

        self.pack_start = inp.pos
        inp.start_pack_hash()
        prefix = inp.read(PACK_PREFIX_SIZE, "the pack header")
        try:
            dlen = parse_pack_header_prefix(prefix, where, self.pack_start)
            dictionary = inp.read(dlen, "the pack dictionary")
            (pcrc,) = _U32.unpack(inp.read(4, "the pack header checksum"))
            check_pack_header(prefix, dictionary, pcrc, where, self.pack_start)
        except BadPack as e:
            raise BadBundle(where, e.reason, e.offset) from None
        if bool(dictionary) != (CAP_ZSTD_DICT in self.header.capabilities):
            raise BadBundle(where, "the pack's dictionary and the zstd-dict capability disagree", self.pack_start)
        self.dictionary = dictionary or None
        try:
            self.decompressor = Decompressor(self.dictionary)
        except BadPack as e:  # pragma: no cover - libzstd loads dictionaries lazily
            raise BadBundle(where, e.reason, self.pack_start) from None

    def __iter__(self) -> Iterator[_Item]:
        inp, where = self.inp, self.where
        has_dict = self.dictionary is not None
        decompress = self.decompressor.decompress_raw
        add = self.closure.add
        charge = self.closure.charge
        read, read_unless = inp.read, inp.read_unless
        count = 0
        while True:
            at = inp.pos
            # The whole header is read ahead (always, but near the end): take
            # it in one slice, unless it is the end record. Otherwise read as
            # the format reads, magic first, so a cut file is named the same.
            head = read_unless(ENTRY_HEADER_SIZE, END_MAGIC)
            if head is None:
                magic = inp.read(4, "an entry or the end record")
                if magic == END_MAGIC:
                    break
                head = magic + inp.read(ENTRY_HEADER_SIZE - 4, "an entry header")
            try:
                method, oid, raw_len, stored_len, crc = parse_entry_fields(head, at, where, has_dict=has_dict)
            except BadPack as ex:
                raise BadBundle(where, ex.reason, ex.offset) from None
            stored = read(stored_len, lambda: f"object {oid.hex()}")
            # Before decompressing: never more than the header declared (bounded
            # by the limits), and from a pipe never more than the limits allow
            # the bytes read so far.
            charge(raw_len, at)
            if self.size is None and self.closure.bytes + raw_len > self.limits.allowed(inp.pos):
                raise BadBundle(where, f"the objects so far hold {self.closure.bytes + raw_len} bytes in "
                                f"{inp.pos} bytes read, more than {self.limits.max_ratio} times as many "
                                "(a compression bomb?)", at)
            if zlib.crc32(stored, zlib.crc32(head[:_ENTRY_CRC_COVERED])) != crc:
                raise BadBundle(where, f"entry checksum mismatch for object {oid.hex()}", at)
            h = oid.hex()
            try:
                obj = parse_object(decompress(method, raw_len, stored, h), h, expect_id=oid)
            except CorruptObject as ex:
                raise BadBundle(where, f"object {ex.where}: {ex.reason}", at) from None
            add(obj, at)
            count += 1
            yield _Item(obj, head, stored, at, crc)
        end_at = inp.pos - 4
        try:
            n = parse_end(END_MAGIC + inp.read(END_SIZE - 4, "the end record"), end_at, where)
        except BadPack as ex:  # pragma: no cover - the magic was just matched
            raise BadBundle(where, ex.reason, ex.offset) from None
        if n != count:
            raise BadBundle(where, f"end record counts {n} entries, the pack holds {count}", end_at)
        pack_digest = inp.pack_digest()
        if inp.read(TRAILER_SIZE, "the pack trailer") != pack_digest:
            raise BadBundle(where, "pack trailer checksum mismatch", inp.pos - TRAILER_SIZE)
        pack_bytes = inp.pos - self.pack_start
        checkpoints = self._git_section() if CAP_GIT_CHECKPOINTS in self.header.capabilities else None
        digest = inp.digest()
        if inp.read(TRAILER_SIZE, "the bundle trailer") != digest:
            raise BadBundle(where, "bundle trailer checksum mismatch", inp.pos - TRAILER_SIZE)
        if not inp.at_eof():
            raise BadBundle(where, "trailing garbage after the bundle trailer", inp.pos)
        self.closure.finish(None)
        c = self.closure
        self.info = BundleInfo(self.path, "pack", BUNDLE_VERSION, self.header.capabilities, self.header.refs,
                               c.count, c.bytes, pack_bytes, inp.pos, digest.hex(), dict(c.kinds),
                               c.content.hexdigest(), checkpoints)

    def _git_section(self) -> tuple[int, int]:
        """Read the checkpoint section (§12.7a) through the bundle hash, holding none of it: (offset, length)."""
        inp, where = self.inp, self.where
        at = inp.pos
        if inp.read(len(GIT_SECTION_MAGIC), "the checkpoint section") != GIT_SECTION_MAGIC:
            raise BadBundle(where, "the git-checkpoints capability is declared but no checkpoint section follows "
                            "the pack", at)
        (n,) = _U64.unpack(inp.read(8, "the checkpoint section's length"))
        start = inp.pos
        if self.size is not None and n > self.size - start - 32:
            raise BadBundle(where, f"the checkpoint section declares {n} bytes, more than the file holds", at)
        if n < len(_GIT_BUNDLE_V2):
            raise BadBundle(where, "the checkpoint section is not a Git bundle (version 2)", start)
        if inp.read(len(_GIT_BUNDLE_V2), "the checkpoint section") != _GIT_BUNDLE_V2:
            raise BadBundle(where, "the checkpoint section is not a Git bundle (version 2)", start)
        left = n - len(_GIT_BUNDLE_V2)
        while left:
            step = min(left, 1 << 20)
            inp.read(step, "the checkpoint section")
            left -= step
        return start, n


_U64 = struct.Struct(">Q")
_GIT_BUNDLE_V2 = b"# v2 git bundle\n"


def write_pack_bundle(hdr: _Header, objects: Iterable[RawObject], dictionary: bytes | None,
                      write: Callable[[bytes | memoryview], None],
                      precompressed: dict[ObjectId, tuple[int, bytes]] | None = None,
                      git_section: tuple[BinaryIO, int] | None = None) -> tuple[str, int]:
    """Write a pack-form bundle of ``objects`` (in closure order) to ``write``.

    Returns the bundle trailer in hex and the pack section's size.
    ``precompressed`` is :meth:`~kxen_agent.store.pack.PackStream.add_many`'s.
    Raises ``UsageError`` before writing anything if the header is too large. ``git_section``
    (a file and its length, with the ``git-checkpoints`` capability in ``hdr``) is copied after the pack.
    """
    h = blake3.blake3()

    def emit(b: bytes | memoryview) -> None:
        h.update(b)
        write(b)

    raw_header = hdr.cbor()
    if len(raw_header) > MAX_HEADER_SIZE:
        raise UsageError(f"too many refs for one bundle (header of {len(raw_header)} bytes)")
    emit(encode_bundle_head(raw_header))
    stream = PackStream(emit, dictionary)
    stream.add_many(objects, precompressed=precompressed)
    stream.finish()
    if git_section is not None:
        # The checkpoint section (§12.7a): after the pack, under the bundle trailer.
        f, n = git_section
        emit(GIT_SECTION_MAGIC + _U64.pack(n))
        left = n
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                raise UsageError("the checkpoints' Git bundle ended early while it was copied; nothing was written")
            emit(chunk)
            left -= len(chunk)
    digest = h.digest()
    write(digest)
    return digest.hex(), stream.size
