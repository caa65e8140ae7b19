"""The fast decode path (cbor2's C decoder + checks) is exactly the strict decoder.

``codec.decode`` lets cbor2 build the value and accepts it only if it passes
``_fits_model`` and re-encodes to the input; otherwise it asks the strict
pure-Python decoder. These tests compare the *fast path alone* (the strict
decoder replaced by a sentinel, so a fallback is seen as such) with
``codec.decode_strict``: whatever the fast path accepts, the strict decoder
must accept with the identical value (same types, recursively, same key
order), and ``decode`` must always give the strict answer, error message
included. Inputs are valid encodings, loosely-encoded CBOR that cbor2 accepts
but the store's rules do not (tags, floats, non-minimal heads, indefinite
lengths, unsorted or duplicate keys...), mutants of both, and random bytes.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from contextlib import contextmanager
from typing import Any, Iterator
from unittest import mock

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kxen_agent.store import codec
from kxen_agent.store.codec import MAX_DEPTH, DecodeError

from tests.helpers import depth

from .helpers import linked_values, mutations, run_python, same, values

#: Examples per property: 100 by default, KXEN_TEST_LONG=1 the full 400 (a quarter of the CPU;
#: the explicit cases below pin the known edge inputs whatever the sample).
SETTINGS = settings(max_examples=depth(fast=100, long=400), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
LINK = bytes(range(32))
MB = 1024 * 1024


# --------------------------------------------------------------------- helpers


class _FellBack(Exception):
    """The fast path refused the input and handed it to the strict decoder."""


def _no_strict(*_args: Any) -> Any:
    raise _FellBack


@contextmanager
def _strict_disabled() -> Iterator[None]:
    with mock.patch.object(codec, "_decode_strict", _no_strict):
        yield


_REFUSED = object()


def fast_only(data: bytes, **kw: Any) -> Any:
    """The fast path's own answer: its value, or _REFUSED if it fell back."""
    with _strict_disabled():
        try:
            return codec.decode(data, **kw)
        except _FellBack:
            return _REFUSED


def strict(data: bytes, **kw: Any) -> tuple[str, Any]:
    try:
        return "ok", codec.decode_strict(data, **kw)
    except DecodeError as e:
        return "error", str(e)


def identical(a: Any, b: Any) -> bool:
    """Equal, with the same types at every node and the same key order."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        ka, kb = list(a), list(b)
        return (
            len(ka) == len(kb)
            and all(type(x) is type(y) and x == y for x, y in zip(ka, kb))
            and all(identical(a[k], b[k]) for k in ka)
        )
    return a == b


def assert_agree(data: bytes, **kw: Any) -> str:
    """Fast path, strict decoder and ``decode`` give one answer; return which."""
    want = strict(data, **kw)
    got = fast_only(data, **kw)
    if got is not _REFUSED:
        assert want[0] == "ok", f"fast path accepted {data.hex()} ({got!r}) but strict says {want[1]}"
        assert identical(got, want[1]), (data.hex(), got, want[1])
    # decode() itself, fallback included, is the strict decoder.
    try:
        res = ("ok", codec.decode(data, **kw))
    except DecodeError as e:
        res = ("error", str(e))
    assert res[0] == want[0], (data.hex(), res, want)
    if res[0] == "ok":
        assert identical(res[1], want[1])
    else:
        assert res[1] == want[1]
    # ...and valid input is never left to the slow path.
    assert got is not _REFUSED or want[0] == "error", f"fast path refused valid {data.hex()}"
    return "fast" if got is not _REFUSED else "error"


# ---------------------------------------------------- loosely encoded CBOR


def _head(major: int, n: int, width: int) -> bytes:
    """A head for ``n``; ``width`` 0 is the shortest form, 1-4 force 1/2/4/8 bytes."""
    mt = major << 5
    if width == 0:
        if n < 24:
            return bytes([mt | n])
        width = 1 if n < 0x100 else 2 if n < 0x10000 else 3 if n < 0x100000000 else 4
    size = {1: 1, 2: 2, 3: 4, 4: 8}[width]
    if n >= 1 << (8 * size):
        size, width = 8, 4
    return bytes([mt | (23 + width)]) + n.to_bytes(size, "big")


_widths = st.sampled_from([0] * 12 + [1, 2, 3, 4])  # mostly shortest, so some survive
_uints = st.sampled_from([0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63, 2**64 - 1]) | st.integers(
    0, 2**64 - 1
)
_TAGS = [0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 36, 37, 42, 52, 54, 100, 256, 258, 260, 261, 1004, 43000, 55799, 65535]


def _text_bytes() -> st.SearchStrategy[bytes]:
    valid = st.text(max_size=30).map(lambda s: s.encode("utf-8"))
    invalid = st.sampled_from([b"\xc3(", b"\xc0\x80", b"\xed\xa0\x80", b"\xff", b"a\x80b", b"\xf4\x90\x80\x80"])
    return valid | valid | valid | invalid


_scalar_items = st.one_of(
    st.tuples(st.just(0), _uints, _widths).map(lambda t: _head(*t)),
    st.tuples(st.just(1), _uints, _widths).map(lambda t: _head(*t)),
    st.tuples(st.binary(max_size=40) | st.sampled_from([bytes(31), bytes(32), bytes(33)]), _widths).map(
        lambda t: _head(2, len(t[0]), t[1]) + t[0]
    ),
    st.tuples(_text_bytes(), _widths).map(lambda t: _head(3, len(t[0]), t[1]) + t[0]),
    st.sampled_from([b"\xf4", b"\xf5", b"\xf6"]),
    st.sampled_from([b"\xf7", b"\xe0", b"\xf3", b"\xf8\x14", b"\xf8\x20", b"\xf8\xff", b"\xff"]),
    st.sampled_from([b"\xf9\x3c\x00", b"\xfa\x3f\x80\x00\x00", b"\xfb\x3f\xf0\x00\x00\x00\x00\x00\x00"])
    | st.tuples(st.sampled_from([0xF9, 0xFA, 0xFB]), st.binary(min_size=8, max_size=8)).map(
        lambda t: bytes([t[0]]) + t[1][: {0xF9: 2, 0xFA: 4, 0xFB: 8}[t[0]]]
    ),
    # indefinite strings: chunks of the same major type, or garbage
    st.lists(st.text(max_size=5), max_size=3).map(
        lambda cs: b"\x7f" + b"".join(_head(3, len(c.encode()), 0) + c.encode() for c in cs) + b"\xff"
    ),
    st.lists(st.binary(max_size=5), max_size=3).map(
        lambda cs: b"\x5f" + b"".join(_head(2, len(c), 0) + c for c in cs) + b"\xff"
    ),
)


def _array(children: list[bytes], width: int, indefinite: bool) -> bytes:
    if indefinite:
        return b"\x9f" + b"".join(children) + b"\xff"
    return _head(4, len(children), width) + b"".join(children)


def _text_key(s: str) -> bytes:
    raw = s.encode("utf-8")
    return _head(3, len(raw), 0) + raw


def _map(pairs: list[tuple[bytes, bytes]], order: str, width: int, indefinite: bool) -> bytes:
    if order == "canonical":
        # Mostly the store's order (length first, then bytewise), so valid maps occur.
        pairs = sorted(dict(pairs).items(), key=lambda kv: (len(kv[0]), kv[0]))
    elif order == "duplicate" and pairs:
        pairs = pairs + [pairs[0]]
    elif order == "reversed":
        pairs = sorted(dict(pairs).items(), key=lambda kv: (len(kv[0]), kv[0]), reverse=True)
    body = b"".join(k + v for k, v in pairs)
    if indefinite:
        return b"\xbf" + body + b"\xff"
    return _head(5, len(pairs), width) + body


def _containers(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    keys = st.text(max_size=6).map(_text_key) | st.text(max_size=6).map(_text_key) | children
    flags = st.sampled_from([False] * 9 + [True])
    return st.one_of(
        st.builds(_array, st.lists(children, max_size=5), _widths, flags),
        st.builds(
            _map,
            st.lists(st.tuples(keys, children), max_size=5),
            st.sampled_from(["canonical"] * 6 + ["asis", "duplicate", "reversed"]),
            _widths,
            flags,
        ),
        st.tuples(st.sampled_from(_TAGS) | st.integers(0, 2**64 - 1), children).map(
            lambda t: _head(6, t[0], 0) + t[1]
        ),
    )


#: Well-formed (mostly) CBOR with everything the store refuses mixed in.
loose_cbor = st.recursive(_scalar_items, _containers, max_leaves=20)


def corruptions(data: bytes) -> st.SearchStrategy[bytes]:
    """One to three mutations, a truncation, or random bytes spliced in."""
    one = mutations(data) if data else st.binary(min_size=1, max_size=3)

    def truncate(n: int) -> bytes:
        return data[:n]

    def splice(t: tuple[int, bytes]) -> bytes:
        i, junk = t
        return data[:i] + junk + data[i:]

    def overwrite(t: tuple[int, int]) -> bytes:
        i, b = t
        return data[:i] + bytes([b]) + data[i + 1 :]

    n = len(data)
    several = one.flatmap(lambda m: mutations(m) if m else st.just(m)).flatmap(
        lambda m: st.just(m) | (mutations(m) if m else st.just(m))
    )
    return st.one_of(
        one,
        several,
        st.integers(0, max(n - 1, 0)).map(truncate),
        st.tuples(st.integers(0, n), st.binary(min_size=1, max_size=9)).map(splice),
        st.tuples(st.integers(0, max(n - 1, 0)), st.integers(0, 255)).map(overwrite) if n else st.just(data),
    )


_options = st.fixed_dictionaries(
    {},
    optional={"links_only": st.booleans(), "max_items": st.sampled_from([None, 0, 1, 2, 5, 2**24])},
)


# ------------------------------------------------------------- valid input


def test_the_fast_path_is_enabled_with_the_installed_cbor2():
    # The project depends on cbor2 >= 6.3, whose loads/dumps are C builtins.
    assert codec._fast_loads is cbor2.loads
    assert codec._fast_dumps is cbor2.dumps


@SETTINGS
@given(values)
def test_every_valid_encoding_is_decoded_by_the_fast_path(v):
    data = codec.encode(v)
    got = fast_only(data)
    assert got is not _REFUSED, f"fast path refused a valid encoding {data.hex()}"
    assert same(got, v)  # v's maps may be in any order, decoded ones are canonical
    assert identical(got, codec.decode_strict(data))


@SETTINGS
@given(linked_values)
def test_every_valid_linked_encoding_is_decoded_by_the_fast_path(v):
    data = codec.encode(v, links_only=True)
    got = fast_only(data, links_only=True)
    assert got is not _REFUSED
    assert same(got, v)
    assert identical(got, codec.decode_strict(data, links_only=True))


def test_fast_path_is_taken_for_typical_objects():
    message = {
        "seq": 41,
        "role": "assistant",
        "content": "some text é " * 100,
        "parent": LINK,
        "run": "run_0123",
        "toolCalls": [
            {"id": "call_1", "name": "read_file", "arguments": '{"path": "a.py"}'},
            {"id": "call_2", "name": "bash", "arguments": '{"cmd": "ls"}'},
        ],
        "toolCallId": None,
        "ok": True,
        "big": 2**64 - 1,
        "neg": -(2**64),
    }
    data = codec.encode(message, links_only=True)
    reference = codec.decode_strict(data, links_only=True)
    with _strict_disabled():
        for _ in range(3):  # the second time the key tuples are cached
            got = codec.decode(data, links_only=True)
            assert same(got, message) and identical(got, reference)
        assert codec.decode(bytearray(data), links_only=True) == message
        assert codec.decode(memoryview(data), links_only=True) == message
        for scalar in (0, True, False, None, "", b"", [], {}, -1, 2**64 - 1, "x" * 300):
            assert identical(codec.decode(codec.encode(scalar)), scalar)


def test_bool_and_int_are_told_apart():
    for v in ([True, 1, False, 0, None], {"a": True, "b": 1}, True, 1, 0, False):
        data = codec.encode(v)
        got = fast_only(data)
        assert got is not _REFUSED
        assert identical(got, v)
    assert type(fast_only(b"\xf5")) is bool
    assert type(fast_only(b"\x01")) is int


def test_without_the_c_extension_decode_is_the_strict_decoder(monkeypatch):
    monkeypatch.setattr(codec, "_fast_loads", None)
    monkeypatch.setattr(codec, "_fast_dumps", None)
    data = codec.encode({"a": [1, LINK]})
    assert codec.decode(data, links_only=True) == {"a": [1, LINK]}
    with pytest.raises(DecodeError, match="trailing bytes"):
        codec.decode(data + b"\x00")
    monkeypatch.setattr(codec, "_decode_strict", _no_strict)
    with pytest.raises(_FellBack):
        codec.decode(data)


def test_self_test_refuses_a_python_cbor2(monkeypatch):
    import types

    fake = types.ModuleType("cbor2")
    fake.loads = lambda data, **kw: cbor2.loads(data, **kw)  # type: ignore[attr-defined]
    fake.dumps = lambda v, **kw: cbor2.dumps(v, **kw)  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "cbor2", fake)
    assert codec._fast_codec() == (None, None)


def test_self_test_refuses_a_cbor2_that_resolves_tags(monkeypatch):
    monkeypatch.setattr(codec, "_REFUSE_TAGS", {})
    assert codec._fast_codec() == (None, None)


# --------------------------------------------------- agreement on bad input


@SETTINGS
@given(loose_cbor, _options)
def test_loose_cbor_fast_and_strict_agree(data, kw):
    assert_agree(data, **kw)


@SETTINGS
@given(st.data(), _options)
def test_mutated_loose_cbor_fast_and_strict_agree(d, kw):
    base = d.draw(loose_cbor)
    assert_agree(d.draw(corruptions(base)), **kw)


@SETTINGS
@given(st.data(), _options)
def test_mutated_valid_encodings_fast_and_strict_agree(d, kw):
    v = d.draw(values | linked_values)
    data = codec.encode(v)
    assert_agree(d.draw(corruptions(data)), **kw)


@SETTINGS
@given(st.binary(max_size=80), _options)
def test_random_bytes_fast_and_strict_agree(data, kw):
    assert_agree(data, **kw)


def test_loose_cbor_exercises_both_outcomes():
    # The generator is only useful if it yields both valid and invalid input
    # that cbor2 itself accepts (so the walk and the re-encoding are tested).
    seen = {"fast": 0, "error": 0}
    cbor2_accepted_but_refused = 0

    @settings(max_examples=depth(fast=400, long=600), deadline=None, database=None)
    @given(loose_cbor)
    def run(data):
        nonlocal cbor2_accepted_but_refused
        outcome = assert_agree(data)
        seen[outcome] += 1
        if outcome == "error":
            try:
                cbor2.loads(data)
            except Exception:
                return
            cbor2_accepted_but_refused += 1

    run()
    assert seen["fast"] > 30, seen
    assert seen["error"] > 30, seen
    assert cbor2_accepted_but_refused > 30


# ------------------------------------------------------------ explicit cases


# (hex, a word of the strict reason): each is refused by decode with the
# strict decoder's message, and the fast path does not accept it.
REFUSED = [
    # floats: half, single, double, and as map values / keys
    ("f93c00", "floats"), ("fa3f800000", "floats"), ("fb3ff0000000000000", "floats"),
    ("f97e00", "floats"), ("fb7ff8000000000000", "floats"), ("a16161f90000", "floats"),
    ("a1f93c0001", "map key"),
    # tags: date/time, bignums in and out of range, sets, shared values, string refs
    ("c074323031332d30332d32315432303a30343a30305a", "tags"),
    ("c11a514b67b0", "tags"), ("c1fb41d4536b0c000000", "tags"),
    ("c24101", "tags"), ("c248ffffffffffffffff", "tags"), ("c249010000000000000000", "tags"),
    ("c34100", "tags"), ("c348ffffffffffffffff", "tags"), ("c349010000000000000000", "tags"),
    ("d9010283010203", "tags"), ("d9010280", "tags"),
    ("d81c81d81d00", "tags"), ("82d81c8100d81d00", "tags"), ("d81d00", "tags"),
    ("d9010082d81978203031323334353637383930313233343536373839303132333435363738393031d81900", "tags"),
    ("d9010063616263", "tags"), ("d81900", "tags"), ("d9d9f700", "tags"), ("d82a5820" + "00" * 32, "tags"),
    ("c4820a01", "tags"), ("c5820a01", "tags"), ("d8250100", "tags"), ("db000000010000000000", "tags"),
    # the same inside arrays and maps (the walk checks nested values itself)
    ("81fb3ff0000000000000", "floats"), ("81fa3f800000", "floats"), ("81f93c00", "floats"),
    ("a16161fb3ff0000000000000", "floats"), ("82f5fbfff0000000000000", "floats"),
    ("81c249010000000000000000", "tags"), ("a16161c349010000000000000000", "tags"),
    ("82c248ffffffffffffffff00", "tags"), ("81d9010283010203", "tags"), ("81c11a514b67b0", "tags"),
    ("a16161d82a5820" + "00" * 32, "tags"), ("8200d9d9f700", "tags"),
    ("81f7", "simple value"), ("81f0", "simple value"), ("a16161f820", "simple value"),
    # undefined and simple values
    ("f7", "simple value"), ("e0", "simple value"), ("f3", "simple value"), ("f814", "simple value"),
    ("f820", "simple value"), ("f8ff", "simple value"), ("8201f7", "simple value"), ("ff", "break"),
    # indefinite lengths
    ("9f01ff", "indefinite"), ("9fff", "indefinite"), ("bf616101ff", "indefinite"), ("bfff", "indefinite"),
    ("7f616161ff", "indefinite"), ("7fff", "indefinite"), ("5f4100ff", "indefinite"), ("5fff", "indefinite"),
    ("819f01ff", "indefinite"), ("a161619f01ff", "indefinite"),
    # duplicate and unsorted keys
    ("a2616101616101", "duplicate"), ("a2616101616102", "duplicate"), ("a2616201616101", "canonical order"),
    ("a262616101616201", "canonical order"),
    ("a262c3a901616102", "canonical order"),  # "é" (2 bytes) sorts after "a" (1 byte)...
    ("a26262620162c3a902", None),  # ..."bb" before "é" (same length, bytewise): valid
    ("a262c3a90162626202", "canonical order"),
    # non-minimal heads
    ("1817", "non-minimal"), ("190017", "non-minimal"), ("1a0000ffff", "non-minimal"),
    ("1b00000000ffffffff", "non-minimal"), ("3817", "non-minimal"), ("5800", "non-minimal"),
    ("780161", "non-minimal"), ("9800", "non-minimal"), ("b800", "non-minimal"), ("8218170a", "non-minimal"),
    ("a1780161610a", "non-minimal"),
    # trailing bytes
    ("0000", "trailing"), ("a0a0", "trailing"), ("8100ff", "trailing"), ("f6f6f6", "trailing"),
    ("a1616101" + "00", "trailing"),
    # invalid UTF-8 in values and keys
    ("62c328", "UTF-8"), ("62c080", "UTF-8"), ("63eda080", "UTF-8"), ("61ff", "UTF-8"), ("64f4908080", "UTF-8"),
    ("a161ff00", "UTF-8"), ("a162c08000", "UTF-8"), ("8261616180", "UTF-8"),
    # non-text keys
    ("a10101", "map key"), ("a1200101", "map key"), ("a1410101", "map key"), ("a1810101", "map key"),
    ("a1a00101", "map key"), ("a1f501", "map key"), ("a1f601", "map key"), ("a1c24101", "map key"),
    # truncated
    ("", "end of data"), ("19", "end of data"), ("6261", "runs past"), ("826161", "end of data"),
    ("a1", "more than the data"), ("a16161", "end of data"),
    # lengths declared far past the data
    ("9b0000000100000000", "more than the data"), ("9b8000000000000000", "more than the data"),
    ("bb0000000100000000", "more than the data"), ("bb8000000000000000", "more than the data"),
    ("5b0000000100000000", "runs past"), ("5b8000000000000000", "runs past"),
    ("7b0000000100000000", "runs past"), ("7b8000000000000000", "runs past"),
    ("5bffffffffffffffff", "runs past"), ("9bffffffffffffffff", "more than the data"),
    ("1c", "reserved"), ("9e", "reserved"),
]


@pytest.mark.parametrize(("hexdata", "reason"), REFUSED, ids=[r[0][:40] or "empty" for r in REFUSED])
def test_explicit_cases(hexdata, reason):
    data = bytes.fromhex(hexdata)
    outcome = assert_agree(data)
    if reason is None:
        assert outcome == "fast"
        return
    assert outcome == "error"
    with pytest.raises(DecodeError) as ei:
        codec.decode(data)
    assert reason in ei.value.reason
    with pytest.raises(DecodeError) as es:
        codec.decode_strict(data)
    assert (ei.value.reason, ei.value.offset) == (es.value.reason, es.value.offset)


@pytest.mark.parametrize(("hexdata", "_reason"), REFUSED, ids=[r[0][:40] or "empty" for r in REFUSED])
def test_explicit_cases_are_refused_even_if_cbor2_resolved_tags(monkeypatch, hexdata, _reason):
    # Defense in depth: with cbor2 left to interpret tags (bignums as ints,
    # shared values, string references, 55799 dropped), the walk and the
    # re-encoding check alone still never let a refused input through.
    monkeypatch.setattr(codec, "_REFUSE_TAGS", {})
    monkeypatch.setattr(codec, "_refuse_tag", lambda _decoder, tag: tag)
    assert_agree(bytes.fromhex(hexdata))


@SETTINGS
@given(loose_cbor)
def test_loose_cbor_agrees_even_if_cbor2_resolved_tags(data):
    with mock.patch.object(codec, "_REFUSE_TAGS", {}), mock.patch.object(
        codec, "_refuse_tag", lambda _decoder, tag: tag
    ):
        assert_agree(data)


def test_bignum_tags_are_refused_both_in_and_out_of_range():
    for tagged, plain in [("c248ffffffffffffffff", 2**64 - 1), ("c34101", -2), ("c249010000000000000000", 2**64)]:
        assert cbor2.loads(bytes.fromhex(tagged)) == plain  # cbor2 alone would return an int
        assert fast_only(bytes.fromhex(tagged)) is _REFUSED
        with pytest.raises(DecodeError, match="tags are not allowed"):
            codec.decode(bytes.fromhex(tagged))


def _nested_bytes(depth: int, opener: bytes = b"\x81", leaf: bytes = b"\x00") -> bytes:
    return opener * depth + leaf


def test_nesting_limit_is_the_strict_one():
    for opener in (b"\x81", b"\xa1\x61a"):
        ok = _nested_bytes(MAX_DEPTH, opener)
        assert fast_only(ok) is not _REFUSED
        assert assert_agree(ok) == "fast"
        # the innermost container empty: still MAX_DEPTH containers
        ok_empty = opener * (MAX_DEPTH - 1) + (b"\x80" if opener == b"\x81" else b"\xa0")
        assert assert_agree(ok_empty) == "fast"
        too_deep = opener * MAX_DEPTH + (b"\x80" if opener == b"\x81" else b"\xa0")
        assert assert_agree(too_deep) == "error"
        with pytest.raises(DecodeError, match=f"nesting deeper than {MAX_DEPTH}"):
            codec.decode(_nested_bytes(MAX_DEPTH + 1, opener))
    # one deep branch among shallow ones
    wide = b"\x83\x00" + _nested_bytes(MAX_DEPTH - 1) + b"\x00"
    assert assert_agree(wide) == "fast"
    wide = b"\x83\x00" + _nested_bytes(MAX_DEPTH) + b"\x00"
    assert assert_agree(wide) == "error"


@pytest.mark.parametrize("opener", [b"\x81", b"\xa1\x61a", b"\x9f", b"\xd8\x1c\x81", b"\xc6"])
def test_ten_thousand_deep_is_refused_fast_and_in_bounded_memory(opener):
    data = opener * 10_000 + b"\x00"
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        with pytest.raises(DecodeError) as ei:
            codec.decode(data)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0
    assert peak < 10 * MB
    with pytest.raises(DecodeError) as es:
        codec.decode_strict(data)
    assert str(ei.value) == str(es.value)


# Declared lengths of 2**32 and 2**63 (and 2**64-1), with some data after them.
_HUGE = [
    bytes([0x9B]) + (2**32).to_bytes(8, "big"),
    bytes([0x9B]) + (2**63).to_bytes(8, "big"),
    bytes([0xBB]) + (2**32).to_bytes(8, "big"),
    bytes([0xBB]) + (2**63).to_bytes(8, "big"),
    bytes([0x5B]) + (2**32).to_bytes(8, "big"),
    bytes([0x5B]) + (2**63).to_bytes(8, "big"),
    bytes([0x7B]) + (2**32).to_bytes(8, "big"),
    bytes([0x7B]) + (2**63).to_bytes(8, "big"),
    bytes([0x5B]) + (2**64 - 1).to_bytes(8, "big"),
    bytes([0x9A]) + (2**32 - 1).to_bytes(4, "big"),
    bytes([0x81, 0x9B]) + (2**40).to_bytes(8, "big"),
    bytes([0xA1, 0x61, 0x61, 0x5B]) + (2**40).to_bytes(8, "big"),
]


@pytest.mark.parametrize("head", _HUGE, ids=[h.hex() for h in _HUGE])
@pytest.mark.parametrize("tail", [b"", b"\x00" * 100, b"\x00" * 200_000])
def test_huge_declared_lengths_are_refused_in_small_memory(head, tail):
    data = head + tail
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as ei:
            codec.decode(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * MB + 2 * len(data), peak
    assert "more than the data" in ei.value.reason or "runs past" in ei.value.reason
    assert assert_agree(data) == "error"


_RSS = r"""
import json, resource, sys
from kxen_agent.store import codec
cases = [bytes.fromhex(h) for h in json.loads(sys.argv[1])]
codec.decode(codec.encode({"warm": [1, "up"]}))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
refused = 0
for data in cases:
    try:
        codec.decode(data)
    except codec.DecodeError:
        refused += 1
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"refused": refused, "kib": after - before, "fast": codec._fast_loads is not None}))
"""


def test_huge_declared_lengths_stay_small_in_rss_too():
    # ru_maxrss also sees what cbor2's C code allocates with malloc, which
    # tracemalloc may not; a fresh process keeps the high-water mark honest.
    cases = [h + b"\x00" * 64 for h in _HUGE]
    p = run_python(_RSS, json.dumps([c.hex() for c in cases]))
    assert p.returncode == 0, p.stderr.decode()
    out = json.loads(p.stdout)
    assert out == {"refused": len(cases), "kib": out["kib"], "fast": True}
    assert out["kib"] * 1024 < 10 * MB, out


def _shared_value_bomb(levels: int) -> bytes:
    """[x, x] nested ``levels`` times by reference: 2**levels leaves in ~6*levels bytes.

    Tag 28 marks a value shareable (numbered in the order the tags are met,
    so the outermost is 0); tag 29 refers to one already complete.
    """
    data = b"\xd8\x1c\x82\x00\x00"  # level 0, shareable number `levels`
    for k in range(1, levels + 1):
        data = b"\xd8\x1c\x82" + data + b"\xd8\x1d" + _head(0, levels - k + 1, 0)
    return data


def test_shared_value_bomb_is_what_it_claims():
    v = cbor2.loads(_shared_value_bomb(3))
    assert v == [[[[0, 0], [0, 0]], [[0, 0], [0, 0]]], [[[0, 0], [0, 0]], [[0, 0], [0, 0]]]]
    assert v[0] is v[1]


def test_shared_value_bombs_are_refused_fast():
    data = _shared_value_bomb(60)
    for patched in (False, True):
        with mock.patch.object(codec, "_REFUSE_TAGS", {} if patched else codec._REFUSE_TAGS):
            t0 = time.perf_counter()
            with pytest.raises(DecodeError, match="tags are not allowed"):
                codec.decode(data)
            assert time.perf_counter() - t0 < 1.0


def test_max_items_is_the_strict_limit():
    for v in ([0] * 5, {k: 0 for k in "abcde"}, [[0] * 5], {"a": [0, 0, 0, 0, 0]}):
        data = codec.encode(v)
        assert assert_agree(data, max_items=5) == "fast"
        assert assert_agree(data, max_items=4) == "error"
        with pytest.raises(DecodeError, match="more than the limit 4"):
            codec.decode(data, max_items=4)
    assert assert_agree(b"\x80", max_items=0) == "fast"
    assert assert_agree(b"\x81\x00", max_items=0) == "error"


def test_max_items_default_follows_the_module_limit(monkeypatch):
    monkeypatch.setattr(codec, "MAX_ITEMS", 3)
    assert fast_only(codec.encode([1, 2, 3])) == [1, 2, 3]
    assert fast_only(bytes.fromhex("8401020304")) is _REFUSED
    with pytest.raises(DecodeError, match="array declares 4 elements, more than the limit 3"):
        codec.decode(bytes.fromhex("8401020304"))


@pytest.mark.parametrize("n", [0, 1, 31, 33, 64])
def test_links_only_refuses_other_byte_string_lengths(n):
    for data in (codec.encode(bytes(n)), codec.encode({"a": [bytes(n)]}), codec.encode([LINK, bytes(n)])):
        assert fast_only(data) is not _REFUSED  # fine as plain CBOR
        assert fast_only(data, links_only=True) is _REFUSED
        assert assert_agree(data, links_only=True) == "error"
        with pytest.raises(DecodeError, match="links must be 32-byte ids"):
            codec.decode(data, links_only=True)


def test_links_only_accepts_32_bytes():
    data = codec.encode({"a": [LINK, {"b": LINK}], "c": LINK})
    assert assert_agree(data, links_only=True) == "fast"


def test_the_key_cache_does_not_admit_other_orders():
    ok = codec.encode({"a": 1, "bb": 2})
    assert assert_agree(ok) == "fast"
    assert ("a", "bb") in codec._KEYS_SEEN
    # the same keys in another order, duplicated, or of another type
    for hexdata in ("a2626262026161 01", "a3616101626262026161 01", "a2f5016262 02", "a201016262 02"):
        assert assert_agree(bytes.fromhex(hexdata.replace(" ", ""))) == "error"


def test_the_key_cache_stays_small():
    for i in range(2000):
        keys = {f"k{i}": 0, "x" * 2000: 1}  # too wide to be kept
        codec.decode(codec.encode(keys))
        codec.decode(codec.encode({f"k{i}": 0}))
    assert len(codec._KEYS_SEEN) <= codec._KEYS_SEEN_MAX
    assert all(sum(map(len, k)) <= codec._KEYS_SEEN_MAX_BYTES for k in codec._KEYS_SEEN)


_KEY_ALPHABET = ["a", "b", "z", "\x00", "\x7f", "\x80", "é", "ÿ", "\u0100", "\u07ff", "\u0800", "€", "\uffff",
                 "\U00010000", "😀", "\U0010ffff"]
_keys = st.lists(st.sampled_from(_KEY_ALPHABET), max_size=4).map("".join) | st.builds(
    lambda c, n: c * n, st.sampled_from(_KEY_ALPHABET), st.sampled_from([22, 23, 24, 25, 255, 256])
)


@SETTINGS
@given(st.dictionaries(_keys, st.integers(0, 3), max_size=8))
def test_key_order_is_the_same_for_cbor2_canonical_the_walk_and_the_strict_decoder(d):
    data = codec.encode(d)
    # cbor2's canonical mode sorts keys as we do (length first, then bytewise)...
    assert cbor2.dumps(d, canonical=True) == data
    # ...and the fast path (plain dumps + the walk's key order) accepts it...
    assert assert_agree(data) == "fast"
    # ...while any other order of the same entries is refused by both.
    items = list(codec.decode(data).items())
    if len(items) >= 2:
        swapped = dict(items[1:] + items[:1])
        bad = cbor2.dumps(swapped)
        assert assert_agree(bad) == "error"


@SETTINGS
@given(values)
def test_plain_cbor2_dumps_of_a_decoded_value_is_our_encoding(v):
    # The fast path's re-encoding check relies on this: dumps keeps the
    # (canonical) insertion order of decoded maps and writes shortest heads.
    data = codec.encode(v)
    assert cbor2.dumps(codec.decode(data)) == data
