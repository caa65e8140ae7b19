"""Property tests: the codec is a bijection between the model and its bytes."""

from __future__ import annotations

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from kxen_agent.store import codec
from kxen_agent.store.objects import (
    KINDS,
    CorruptObject,
    compress_loose,
    decode_body,
    decompress_loose,
    encode_object,
    parse_object,
)

from tests.helpers import depth

from .helpers import linked_values, mutations, same, values

#: Examples per property: 100 by default, KXEN_TEST_LONG=1 200 (as test_codec_fast.py; the
#: explicit vectors and rejections in test_spec_vectors.py and test_codec_rejections.py pin the edges).
SETTINGS = settings(max_examples=depth(fast=100, long=200), deadline=None)


@SETTINGS
@given(values)
def test_roundtrip_is_exact_and_reencodes_identically(v):
    data = codec.encode(v)
    back = codec.decode(data)
    assert same(back, v)
    assert codec.encode(back) == data


@SETTINGS
@given(values)
def test_encoding_matches_cbor2_canonical(v):
    # cbor2 is an independent oracle for shortest heads and the canonical
    # (length-first, then bytewise) map key order.
    assert codec.encode(v) == cbor2.dumps(v, canonical=True)


@SETTINGS
@given(linked_values)
def test_links_only_roundtrip(v):
    data = codec.encode(v, links_only=True)
    assert data == codec.encode(v)
    assert same(codec.decode(data, links_only=True), v)


@SETTINGS
@given(st.data())
def test_a_mutated_encoding_never_decodes_to_another_encoding_of_a_value(data):
    v = data.draw(values)
    enc = codec.encode(v)
    m = data.draw(mutations(enc))
    try:
        back = codec.decode(m)
    except codec.DecodeError:
        return
    # Accepted bytes are the one encoding of what they decode to, and that
    # value is not the original one: no value has two encodings.
    assert codec.encode(back) == m
    assert m != enc
    assert not same(back, v)


@SETTINGS
@given(st.binary(max_size=64))
def test_arbitrary_bytes_are_refused_or_canonical(b):
    try:
        v = codec.decode(b)
    except codec.DecodeError as e:
        assert 0 <= e.offset <= len(b)
        return
    assert codec.encode(v) == b


def _object_strategy():
    blob = st.binary(max_size=200).map(lambda b: encode_object("blob", b))
    structured = st.tuples(st.sampled_from([k for k in KINDS if k != "blob"]), linked_values).map(
        lambda kv: encode_object(*kv)
    )
    return blob | structured


@SETTINGS
@given(st.data())
def test_a_mutated_object_is_refused_or_has_another_id(data):
    obj = data.draw(_object_strategy())
    m = data.draw(mutations(obj.raw))
    try:
        got = parse_object(m, "mutant")
        value = decode_body(got)
    except CorruptObject:
        return
    assert got.id != obj.id
    # What is accepted is the canonical object bytes of its own value.
    assert encode_object(got.kind, value).raw == m
    # ...and under the original id it is refused.
    try:
        parse_object(m, "mutant", expect_id=obj.id)
    except CorruptObject as e:
        assert "not to its id" in e.reason
    else:
        raise AssertionError("mutant accepted under the original id")


@SETTINGS
@given(st.data())
def test_a_mutated_loose_frame_never_yields_other_bytes_under_the_id(data):
    obj = data.draw(_object_strategy())
    frame = compress_loose(obj.raw)
    m = data.draw(mutations(frame))
    try:
        raw = decompress_loose(m, "mutant")
        got = parse_object(raw, "mutant", expect_id=obj.id)
    except CorruptObject:
        return
    # A zstd frame has bits a decoder must ignore (RFC 8878 §3.1.1.1.1, the
    # frame header's unused bit), so a few mutants still hold the very same
    # object; none may hold different bytes under the object's id.
    assert got.raw == obj.raw


def _links_by_stack(value):
    """The obvious walk: every byte string, depth first, in document order."""
    out, stack = [], [value]
    while stack:
        v = stack.pop()
        if type(v) is bytes:
            out.append(v)
        elif type(v) is dict:
            stack.extend(reversed(list(v.values())))
        elif type(v) is list:
            stack.extend(reversed(v))
    return out


@SETTINGS
@given(linked_values, st.integers(0, 70))
def test_links_of_finds_every_link_in_order_at_any_depth(v, depth):
    from kxen_agent.store.objects import links_of

    nested = v
    for i in range(depth):  # past the recursion's 32 levels, the stack walk takes over
        nested = [nested, b"\x01" * 32] if i % 2 else {"k": nested}
    assert links_of("message", nested) == _links_by_stack(nested)
    assert links_of("blob", nested) == []
