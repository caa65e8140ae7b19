"""Hostile inputs, each a few bytes that claim something enormous.

Importable on its own (no package-relative imports) so that a fresh
interpreter can measure its peak memory around each case.
"""

from __future__ import annotations

import zstandard

from kxen_agent.store import codec, objects

ZSTD_MAGIC = bytes.fromhex("28b52ffd")


def zstd_frame(declared_size: int | None, payload: bytes) -> bytes:
    """A hand-assembled zstd frame (RFC 8878 §3.1.1): single segment, one raw block.

    ``declared_size`` goes in an 8-byte Frame_Content_Size field (FHD
    0b111_00000: FCS flag 3, single segment); ``None`` is not allowed in a
    single-segment frame, so use :func:`zstd_frame_without_size` for that.
    """
    fhd = bytes([0b1110_0000])
    fcs = declared_size.to_bytes(8, "little")
    block = (1 | (0 << 1) | (len(payload) << 3)).to_bytes(3, "little")  # last, raw, size
    return ZSTD_MAGIC + fhd + fcs + block + payload


def zstd_frame_without_size(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=False).compress(data)


def _decode(data: bytes):
    return lambda: codec.decode(data)


def _decompress(frame: bytes):
    return lambda: objects.decompress_loose(frame, "hostile")


def cases() -> list[tuple[str, str, object]]:
    """(name, expected exception class name, thunk)."""
    raw = objects.encode_object("blob", b"hello").raw
    good = objects.compress_loose(raw)
    return [
        ("array of 2**32", "DecodeError", _decode(bytes.fromhex("9b0000000100000000"))),
        ("array of 2**63", "DecodeError", _decode(bytes.fromhex("9b8000000000000000"))),
        ("array of 2**32-1", "DecodeError", _decode(bytes.fromhex("9affffffff") + b"\x00" * 8)),
        ("map of 2**32", "DecodeError", _decode(bytes.fromhex("bb0000000100000000"))),
        ("map of 2**63", "DecodeError", _decode(bytes.fromhex("bb8000000000000000"))),
        ("bytes of 2**32", "DecodeError", _decode(bytes.fromhex("5b0000000100000000"))),
        ("bytes of 2**63", "DecodeError", _decode(bytes.fromhex("5b8000000000000000"))),
        ("text of 2**63", "DecodeError", _decode(bytes.fromhex("7b8000000000000000"))),
        ("array nested 10000 deep", "DecodeError", _decode(b"\x81" * 10_000 + b"\x00")),
        ("map nested 10000 deep", "DecodeError", _decode(b"\xa1\x61a" * 10_000 + b"\x00")),
        ("zstd declares 2**40 bytes", "CorruptObject", _decompress(zstd_frame(2**40, b"abc"))),
        ("zstd declares 2**63 bytes", "CorruptObject", _decompress(zstd_frame(2**63, b"abc"))),
        (
            "zstd declares just past the limit",
            "CorruptObject",
            _decompress(zstd_frame(objects.MAX_OBJECT_SIZE + 18, b"abc")),
        ),
        ("zstd without content size", "CorruptObject", _decompress(zstd_frame_without_size(raw))),
        ("data after the zstd frame", "CorruptObject", _decompress(good + b"\x00")),
        ("a second zstd frame", "CorruptObject", _decompress(good + good)),
        (
            "header declares a body past MAX_OBJECT_SIZE",
            "CorruptObject",
            lambda: objects.parse_object(b"blob %d\x00abc" % (objects.MAX_OBJECT_SIZE + 1), "hostile"),
        ),
    ]
