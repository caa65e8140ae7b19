"""Packs: many objects in one file, and an index for O(log n) lookup.

Normative text: ``objects_spec.md`` §12 (drafted in ``docs/pack_spec_draft.md``).
In brief, a pack ``objects/pack/pack-<hex>.pack`` is

- a header: magic ``KXPK``, version, an optional zstd dictionary trained on
  the pack's own objects, and a CRC-32 of the header;
- entries, each: a 4-byte magic (so a scanner can resynchronise after a
  corrupt length, as borg's segments allow), the compression method, the
  32-byte object id, the object's length, the stored length, a CRC-32 over
  the entry header and the stored bytes (so an entry can be copied to
  another pack without decompressing or rehashing), then the stored bytes:
  the canonical object bytes of :mod:`..objects`, raw or as one zstd frame;
- an end record (magic and entry count) and a trailer: BLAKE3-256 of every
  byte before it. The pack is named by that trailer.

The index ``pack-<hex>.idx`` holds a 256-entry fanout, the sorted ids,
their CRCs and 64-bit offsets, the pack's trailer and its own BLAKE3
trailer. It is renamed into place after the pack: the index is the commit
point, a pack without one does not exist.

The package is split as gitoxide's ``gix-pack`` is, the byte format at the
bottom:

- :mod:`.format`: the pack and index layouts, pure functions over bytes
  (what the fuzz and property tests drive); never opens a file;
- :mod:`.compress`: zstd contexts and the dictionary policy (§12.4);
- :mod:`.stream`: :class:`PackStream`, one pack encoded into a sink;
- :mod:`.reader`: :class:`PackReader` (lookup by binary search over a
  mapping of the index, made through the :class:`~..fsio.FileIO` seam:
  nothing reads a whole pack) and :class:`BrokenPack`;
- :mod:`.writer`: :class:`PackWriter` (temp file, fsync, rename, index
  last, every step through :class:`~..fsio.FileIO`).

Every declared size is checked against :data:`~..objects.MAX_OBJECT_SIZE`
before anything is allocated, and a zstd frame must declare exactly the
entry's length: a pack cannot make a reader allocate more than one object.
It knows nothing of refs, gc or bundles.
"""

from __future__ import annotations

from .compress import (
    COMPRESSION_LEVEL,
    DICT_SAMPLE_BUDGET,
    DICT_SAMPLE_MAX_OBJECT,
    Compressor,
    Decompressor,
    choose_dictionary,
    dictionary_size_for,
    sample_dictionary,
)
from .format import (
    DICT_MAX_SIZE,
    END_MAGIC,
    END_SIZE,
    ENTRY_HEADER_SIZE,
    ENTRY_MAGIC,
    IDX_HEADER_SIZE,
    IDX_MAGIC,
    IDX_VERSION,
    MAX_RAW_SIZE,
    METHOD_STORED,
    METHOD_ZSTD,
    METHOD_ZSTD_DICT,
    PACK_MAGIC,
    PACK_PREFIX_SIZE,
    PACK_VERSION,
    TRAILER_SIZE,
    BadPack,
    Entry,
    IndexLayout,
    PackLayout,
    check_entry_crc,
    check_pack_header,
    crc32,
    encode_end,
    encode_entry,
    encode_entry_header,
    encode_index,
    encode_pack_header,
    parse_end,
    parse_entry_fields,
    parse_entry_header,
    parse_index,
    parse_pack_header_prefix,
    parse_pack_layout,
    scan_entries,
    verify_index,
    verify_pack_trailer,
)
from .reader import BrokenPack, PackReader
from .stream import PackStream
from .writer import PackInfo, PackWriter, SealedPack

__all__ = [
    "BadPack",
    "BrokenPack",
    "COMPRESSION_LEVEL",
    "Compressor",
    "DICT_MAX_SIZE",
    "DICT_SAMPLE_BUDGET",
    "DICT_SAMPLE_MAX_OBJECT",
    "Decompressor",
    "END_MAGIC",
    "END_SIZE",
    "ENTRY_HEADER_SIZE",
    "ENTRY_MAGIC",
    "Entry",
    "IDX_HEADER_SIZE",
    "IDX_MAGIC",
    "IDX_VERSION",
    "IndexLayout",
    "MAX_RAW_SIZE",
    "METHOD_STORED",
    "METHOD_ZSTD",
    "METHOD_ZSTD_DICT",
    "PACK_MAGIC",
    "PACK_PREFIX_SIZE",
    "PACK_VERSION",
    "PackInfo",
    "PackLayout",
    "PackReader",
    "PackStream",
    "PackWriter",
    "SealedPack",
    "TRAILER_SIZE",
    "check_entry_crc",
    "check_pack_header",
    "choose_dictionary",
    "crc32",
    "dictionary_size_for",
    "encode_end",
    "encode_entry",
    "encode_entry_header",
    "encode_index",
    "encode_pack_header",
    "parse_end",
    "parse_entry_fields",
    "parse_entry_header",
    "parse_index",
    "parse_pack_header_prefix",
    "parse_pack_layout",
    "sample_dictionary",
    "scan_entries",
    "verify_index",
    "verify_pack_trailer",
]
