"""Public CBOR and BLAKE3 test vectors, judged by our strict codec and ids.

The vectors (``tests/vectors/external/``, provenance beside them) were
written by others for other decoders, so they test our reading of RFC 8949
and BLAKE3, not our own idea of it. Our CBOR model (``objects_spec.md`` §2)
is a strict subset of CBOR: each vector is classified *independently of our
code* -- from its JSON ``decoded`` value, or from cbor2's reading of its
bytes -- as inside the model and canonically encoded (then we must decode it
to that value and encode that value back to the same bytes) or not (then the
strict and the fast decoder must both refuse it with a :class:`DecodeError`).
"""

from __future__ import annotations

import base64
import json
import unicodedata
from pathlib import Path
from typing import Any

import cbor2
import pytest

from kxen_agent.store import codec
from kxen_agent.store.codec import DecodeError
from kxen_agent.store.objects import hash_bytes

VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "external"


def _load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def _in_model(value: Any, depth: int = 0) -> bool:
    """Is ``value`` in kxen's CBOR model (§2): no floats, tags or other simple values?"""
    if depth > codec.MAX_DEPTH:
        return False
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -(2**64) <= value <= 2**64 - 1
    if isinstance(value, (str, bytes)):
        return True
    if isinstance(value, list):
        return all(_in_model(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _in_model(v, depth + 1) for k, v in value.items())
    return False  # floats, CBORTag, undefined, CBORSimpleValue, datetimes, ...


def _canonical(value: Any) -> bytes:
    """The RFC 8949 §4.2.1 (length-first key order) encoding, by cbor2 as the oracle."""
    return cbor2.dumps(value, canonical=True)


def _oracle_value(case: dict) -> tuple[bool, Any]:
    """(has a value in our model, that value) for one vector, without our codec.

    The value is cbor2's reading of the bytes; where the vector gives a JSON
    ``decoded`` value that is not a float, it must agree (dCBOR's "reduced"
    vectors give a float whose bytes are an integer: the bytes decide).
    """
    data = bytes.fromhex(case["hex"])
    try:
        value = cbor2.loads(data)
    except Exception:
        return False, None
    if "decoded" in case and not isinstance(case["decoded"], float) and not case.get("skipDecode"):
        assert value == case["decoded"], f"cbor2 reads {case['hex']} as {value!r}, the vector says {case['decoded']!r}"
    return _in_model(value), value


def _decoded(decode: Any, data: bytes) -> tuple[bool, Any]:
    try:
        return True, decode(data)
    except DecodeError:
        return False, None


def _accepts(data: bytes) -> tuple[bool, Any]:
    strict_ok, strict = _decoded(codec.decode_strict, data)
    fast_ok, fast = _decoded(codec.decode, data)
    assert strict_ok == fast_ok, f"fast and strict decoders disagree on {data.hex()}"
    if strict_ok:
        assert type(fast) is type(strict) and fast == strict
    return strict_ok, strict


def _cases(name: str) -> list[dict]:
    return [c for c in _load(name) if "hex" in c]


def _case_id(case: dict) -> str:
    return case["hex"][:40]


@pytest.mark.parametrize("case", _cases("rfc8949-appendix_a.json") + _cases("dcbor-valid.json"), ids=_case_id)
def test_valid_vectors_are_taken_exactly_when_in_the_model(case: dict) -> None:
    data = bytes.fromhex(case["hex"])
    in_model, value = _oracle_value(case)
    expected = in_model and _canonical(value) == data
    ok, got = _accepts(data)
    assert ok == expected, (
        f"{case.get('diagnostic', case['hex'])}: expected {'accept' if expected else 'refuse'}, "
        f"got {'accept' if ok else 'refuse'}"
    )
    if ok:
        assert got == value
        assert codec.encode(got) == data


@pytest.mark.parametrize("case", _cases("dcbor-invalid.json"), ids=_case_id)
def test_dcbor_invalid_vectors(case: dict) -> None:
    """Every non-deterministic encoding dCBOR refuses, we refuse too.

    Two of dCBOR's rules are not about determinism and are not ours
    (``objects_spec.md`` §2): it refuses text that is not in Unicode NFC (we
    store a tool's output as it came) and negative integers below -2**63 (we
    take the whole major type 1 range, down to -2**64). A vector refused only
    for one of those must be accepted and re-encode to the same bytes.
    """
    data = bytes.fromhex(case["hex"])
    ok, got = _accepts(data)
    not_our_rule = (isinstance(got, str) and unicodedata.normalize("NFC", got) != got) or (
        type(got) is int and -(2**64) <= got < -(2**63)
    )
    assert ok == not_our_rule, f"{case.get('diagnostic')} ({case.get('notes')}) was {'accepted' if ok else 'refused'}"
    if ok:
        assert codec.encode(got) == data


def test_the_vector_files_are_all_read() -> None:
    # A vector file that lost its cases would make the parametrised tests
    # pass vacuously.
    assert len(_cases("rfc8949-appendix_a.json")) >= 80
    assert len(_cases("dcbor-valid.json")) >= 35
    assert len(_cases("dcbor-invalid.json")) >= 30
    assert len(_load("blake3-test_vectors.json")["cases"]) >= 30


def _blake3_input(n: int) -> bytes:
    return bytes(i % 251 for i in range(n))


@pytest.mark.parametrize("case", _load("blake3-test_vectors.json")["cases"], ids=lambda c: f"len{c['input_len']}")
def test_object_ids_are_blake3_256_of_the_object_bytes(case: dict) -> None:
    # An object id is the first 32 bytes of BLAKE3's (extendable) output
    # over the object bytes (§4): the default 256-bit hash.
    assert hash_bytes(_blake3_input(case["input_len"])).hex() == case["hash"][:64]


def test_appendix_a_base64_matches_hex() -> None:
    # The two encodings of each vector agree (a guard against a damaged copy).
    for case in _load("rfc8949-appendix_a.json"):
        assert base64.b64decode(case["cbor"]) == bytes.fromhex(case["hex"])
