"""Golden rejections: each rule of the strict codec, with its exact reason."""

from __future__ import annotations

import pytest

from kxen_agent.store import codec
from kxen_agent.store.codec import MAX_DEPTH, DecodeError, EncodeError

LINK = bytes(range(32))

# (hex input, reason substring, offset of the offending item)
REJECTED = [
    # non-minimal integers and lengths
    ("1817", "non-minimal integer or length", 0),
    ("190017", "non-minimal integer or length", 0),
    ("1900ff", "non-minimal integer or length", 0),
    ("1a0000ffff", "non-minimal integer or length", 0),
    ("1b00000000ffffffff", "non-minimal integer or length", 0),
    ("3817", "non-minimal integer or length", 0),
    ("580161", "non-minimal integer or length", 0),
    ("78016161", "non-minimal integer or length", 0),
    ("980100", "non-minimal integer or length", 0),
    ("b8016161f6", "non-minimal integer or length", 0),
    ("8218170a", "non-minimal integer or length", 1),
    ("a1780161610a", "non-minimal integer or length", 1),  # a key's head too
    # indefinite lengths
    ("9fff", "indefinite length is not allowed", 0),
    ("9f00ff", "indefinite length is not allowed", 0),
    ("5f4161ff", "indefinite length is not allowed", 0),
    ("7f6161ff", "indefinite length is not allowed", 0),
    ("bf616100ff", "indefinite length is not allowed", 0),
    ("a17f6161ff00", "indefinite length is not allowed", 1),
    ("1f", "indefinite length is not allowed", 0),
    # reserved additional information
    ("1c", "reserved additional information 28", 0),
    ("9e", "reserved additional information 30", 0),
    # tags
    ("c000", "tags are not allowed", 0),
    ("c11a514b67b0", "tags are not allowed", 0),
    ("d82a582500" + "00" * 36, "tags are not allowed", 0),
    ("81d82a40", "tags are not allowed", 1),
    # floats
    ("f93c00", "floats are not allowed", 0),
    ("fa3f800000", "floats are not allowed", 0),
    ("fb3ff0000000000000", "floats are not allowed", 0),
    ("a16161f90000", "floats are not allowed", 3),
    # undefined and other simple values, a stray break
    ("f7", "simple value 0xf7 is not allowed", 0),
    ("f820", "simple value 0xf8 is not allowed", 0),
    ("e0", "simple value 0xe0 is not allowed", 0),
    ("ff", "unexpected break code", 0),
    # map keys
    ("a2616200616100", "map keys are not in canonical order", 4),
    ("a262616100616200", "map keys are not in canonical order", 5),  # length first
    ("a2616100616100", "duplicate map key", 4),
    ("a10101", "map key is not a text string", 1),
    ("a1410101", "map key is not a text string", 1),
    ("a1f600", "map key is not a text string", 1),
    # UTF-8
    ("62c328", "text string is not valid UTF-8", 0),
    ("62c080", "text string is not valid UTF-8", 0),  # overlong
    ("63eda080", "text string is not valid UTF-8", 0),  # surrogate
    ("61ff", "text string is not valid UTF-8", 0),
    ("a161ff00", "text string is not valid UTF-8", 1),
    # trailing bytes and truncation
    ("0000", "1 trailing bytes after the item", 1),
    ("f6f6f6", "2 trailing bytes after the item", 1),
    ("", "unexpected end of data", 0),
    ("19", "unexpected end of data", 0),
    ("1901", "unexpected end of data", 0),
    ("1b000000010000", "unexpected end of data", 0),
    ("6261", "string of 2 bytes runs past the end", 0),
    ("826161", "unexpected end of data", 3),
    ("a16161", "unexpected end of data", 3),
    ("8200", "array declares 2 elements, more than the data can hold", 0),
    ("a1", "map declares 1 entries, more than the data can hold", 0),
]


@pytest.mark.parametrize(("hexdata", "reason", "offset"), REJECTED, ids=[r[0] or "empty" for r in REJECTED])
def test_decoder_rejects(hexdata, reason, offset):
    with pytest.raises(DecodeError) as ei:
        codec.decode(bytes.fromhex(hexdata))
    assert reason in ei.value.reason
    assert ei.value.offset == offset
    assert str(ei.value) == f"{ei.value.reason} (at byte {offset})"


@pytest.mark.parametrize("hexdata", ["40", "4161", "581f" + "00" * 31, "5821" + "00" * 33, "81a1616141ff"])
def test_links_only_rejects_byte_strings_that_are_not_ids(hexdata):
    data = bytes.fromhex(hexdata)
    codec.decode(data)  # fine as plain CBOR
    with pytest.raises(DecodeError) as ei:
        codec.decode(data, links_only=True)
    assert "links must be 32-byte ids" in ei.value.reason


def test_links_only_accepts_32_byte_ids():
    data = codec.encode({"parent": LINK, "kids": [LINK, LINK]})
    assert codec.decode(data, links_only=True) == {"parent": LINK, "kids": [LINK, LINK]}


def test_accepted_golden_encodings():
    golden = {
        "00": 0, "17": 23, "1818": 24, "18ff": 255, "190100": 256, "1affffffff": 2**32 - 1,
        "1b0000000100000000": 2**32, "1bffffffffffffffff": 2**64 - 1, "20": -1, "3bffffffffffffffff": -(2**64),
        "f4": False, "f5": True, "f6": None, "60": "", "40": b"", "80": [], "a0": {},
        "a3616201616302626161f6": {"aa": None, "b": 1, "c": 2},
    }
    for hexdata, value in golden.items():
        assert codec.encode(value).hex() == hexdata
        assert codec.decode(bytes.fromhex(hexdata)) == value
        assert type(codec.decode(bytes.fromhex(hexdata))) is type(value)


def _nested(depth: int):
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


def test_depth_limit_is_the_same_both_ways():
    ok = _nested(MAX_DEPTH)
    data = codec.encode(ok)
    assert codec.decode(data) == ok
    with pytest.raises(EncodeError, match=f"nesting deeper than {MAX_DEPTH}"):
        codec.encode(_nested(MAX_DEPTH + 1))
    with pytest.raises(DecodeError, match=f"nesting deeper than {MAX_DEPTH}"):
        codec.decode(b"\x81" + data)
    with pytest.raises(EncodeError, match=f"nesting deeper than {MAX_DEPTH}"):
        codec.encode(_nested(10_000))  # refused, not a RecursionError


class _Thing:
    pass


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (1.0, "floats are not allowed"),
        ([0.5], "floats are not allowed"),
        ({1: 2}, "map key 1 is not a text string"),
        ({b"k": 2}, "is not a text string"),
        ({("a",): 1}, "is not a text string"),
        (2**64, "integer 18446744073709551616 is larger than 2**64-1"),
        (-(2**64) - 1, "is smaller than -2**64"),
        ({"a": [2**70]}, "is larger than 2**64-1"),
        ({1, 2}, "cannot encode a value of type set"),
        (frozenset(), "cannot encode a value of type frozenset"),
        (_Thing(), "cannot encode a value of type _Thing"),
        (bytearray(b"x"), "cannot encode a value of type bytearray"),
        ("\ud800", "text is not valid UTF-8"),
        ({"\udc80": 1}, "text is not valid UTF-8"),
    ],
)
def test_encoder_rejects(value, reason):
    with pytest.raises(EncodeError) as ei:
        codec.encode(value)
    assert reason in str(ei.value)


def test_encoder_links_only_rejects_short_byte_strings():
    with pytest.raises(EncodeError, match="byte string of length 3 in a structured object"):
        codec.encode({"a": b"abc"}, links_only=True)
    assert codec.encode({"a": b"abc"})  # fine without the rule
