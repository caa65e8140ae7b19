"""The encoder's fast path (cbor2's C encoder on a canonically reordered copy) writes the exact encoder's bytes.

``codec.encode`` takes the fast path only for values every node of which
``_enc`` would encode; these check it on random values (maps in any key
order, non-ASCII keys of every length, tuples, every integer width) and
that every value the exact encoder refuses is refused alike.
"""

from __future__ import annotations

import random

import pytest

from kxen_agent.store import codec

KEYS = ["a", "b", "aa", "ab", "zz", "é", "à", "éé", "x" * 23, "y" * 24, "\u4e2d", "\U0001f600", "ba", ""]


def _value(rng: random.Random, depth: int) -> object:
    pick = rng.randrange(10 if depth < 4 else 6)
    if pick == 0:
        return rng.choice([0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1, -1, -24, -25, -(2**64)])
    if pick == 1:
        return rng.choice([True, False, None])
    if pick == 2:
        return "".join(rng.choice(KEYS) for _ in range(rng.randrange(4)))
    if pick == 3:
        return bytes(rng.randrange(256) for _ in range(32))
    if pick in (4, 5):
        return rng.choice(["", "x" * 300, "\u00e9" * 200])
    if pick in (6, 7):
        keys = rng.sample(KEYS, rng.randrange(len(KEYS)))
        return {k: _value(rng, depth + 1) for k in keys}
    items = [_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return tuple(items) if pick == 8 else items


def test_the_fast_path_is_on_and_writes_the_exact_bytes_of_random_values() -> None:
    assert codec._fast_encode_ok
    rng = random.Random(32)
    for _ in range(3000):
        v = _value(rng, 0)
        assert codec.encode(v) == codec._encode_exact(v, False)
        assert codec.encode(v, links_only=True) == codec._encode_exact(v, True)
        assert codec.decode(codec.encode(v)) == codec.decode(codec._encode_exact(v, False))


class _Str(str):
    pass


class _Int(int):
    pass


@pytest.mark.parametrize("value", [
    1.5, {"a": 1.0}, {1: "a"}, {"a": {2: 3}}, [_Str("x")], {_Str("k"): 1}, _Int(3), 2**64, -(2**64) - 1,
    b"short", {"a": b"\x00" * 31}, "\ud800", {"a": "\udfff"}, {"k": set()}, [object()],
])
def test_a_value_outside_the_model_is_refused_as_the_exact_encoder_refuses_it(value: object) -> None:
    for links_only in (False, True):
        try:
            want = codec._encode_exact(value, links_only)
        except codec.EncodeError as e:
            with pytest.raises(codec.EncodeError) as got:
                codec.encode(value, links_only=links_only)
            assert str(got.value) == str(e)
        else:  # bytes of any length outside links_only
            assert codec.encode(value, links_only=links_only) == want


def test_nesting_at_the_limit_is_encoded_and_past_it_refused() -> None:
    ok: object = []
    for _ in range(codec.MAX_DEPTH - 1):
        ok = [ok]
    assert codec.encode(ok) == codec._encode_exact(ok, False)
    with pytest.raises(codec.EncodeError):
        codec.encode([ok])
