"""Hostile inputs are refused fast, with the right error, in bounded memory."""

from __future__ import annotations

import json
import os
import time
import tracemalloc

import pytest

from kxen_agent.store import codec, objects
from kxen_agent.store.objects import CorruptObject, decompress_loose

from . import hostile_cases
from .helpers import run_python

LIMIT = 10 * 1024 * 1024

CASES = hostile_cases.cases()


@pytest.mark.parametrize(("name", "expected", "thunk"), CASES, ids=[c[0] for c in CASES])
def test_refused_with_small_python_peak(name, expected, thunk):
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        with pytest.raises(Exception) as ei:
            thunk()
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert type(ei.value).__name__ == expected, repr(ei.value)  # notably not RecursionError/MemoryError
    assert peak < LIMIT, f"{name}: traced peak {peak} bytes"
    assert elapsed < 1.0, f"{name}: took {elapsed:.2f}s"


_MEASURE = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import hostile_cases
out = []
for name, expected, thunk in hostile_cases.cases():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        thunk()
        got = None
    except Exception as e:
        got = type(e).__name__
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out.append({"name": name, "expected": expected, "got": got, "kib": after - before, "s": elapsed})
print(json.dumps(out))
"""


def test_refused_with_small_rss_in_a_fresh_process():
    # ru_maxrss also sees allocations made in C (libzstd), which tracemalloc
    # does not; a fresh process keeps the high-water mark meaningful.
    p = run_python(_MEASURE, os.path.dirname(hostile_cases.__file__))
    assert p.returncode == 0, p.stderr.decode()
    results = json.loads(p.stdout)
    assert len(results) == len(CASES)
    for r in results:
        assert r["got"] == r["expected"], r
        assert r["kib"] * 1024 < LIMIT, r
        assert r["s"] < 1.0, r


def test_hand_assembled_frame_is_valid_when_it_tells_the_truth():
    # The hostile frames above differ from this one only in the declared size.
    assert decompress_loose(hostile_cases.zstd_frame(3, b"abc"), "x") == b"abc"


@pytest.mark.parametrize(
    ("frame_of", "reason"),
    [
        (lambda f: hostile_cases.zstd_frame(2**40, b"abc"), "declares 1099511627776 bytes, more than the limit"),
        (lambda f: hostile_cases.zstd_frame_without_size(b"blob 1\x00x"), "does not declare its content size"),
        (lambda f: f + b"\x00", "1 bytes follow the zstd frame"),
        (lambda f: f[:-1], "truncated"),
        (lambda f: b"PK\x03\x04" + f[4:], "not a zstd frame"),
        (lambda f: b"", "not a zstd frame"),
    ],
)
def test_frame_rejections_name_the_reason(frame_of, reason):
    frame = objects.compress_loose(objects.encode_object("blob", b"payload").raw)
    with pytest.raises(CorruptObject) as ei:
        decompress_loose(frame_of(frame), "objects/ab/cd")
    assert reason in ei.value.reason
    assert ei.value.where == "objects/ab/cd"


def test_declared_size_must_match_the_content():
    raw = objects.encode_object("blob", b"payload").raw
    frame = bytearray(objects.compress_loose(raw))
    # Small single-segment frame: FHD then a 1-byte Frame_Content_Size.
    assert frame[4] & 0b1110_0000 == 0b0010_0000 and frame[5] == len(raw)
    frame[5] = len(raw) + 1
    with pytest.raises(CorruptObject):
        decompress_loose(bytes(frame), "x")
    # A truthful but smaller limit is enforced too.
    with pytest.raises(CorruptObject, match="more than the limit 4"):
        decompress_loose(objects.compress_loose(raw), "x", limit=4)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"blob %d\x00" % (objects.MAX_OBJECT_SIZE + 1), "exceeds the limit"),
        (b"blob 999999999\x00", "declared length 999999999 exceeds the limit"),
        (b"message 999999999\x00", "declared length 999999999 exceeds the limit"),  # longer than any legal header
        (b"blob 05\x00hello", "bad header"),
        (b"blob 5 \x00hello", "bad header"),
        (b"Blob 5\x00hello", "bad header"),
        (b"blob 5hello", "bad header"),
        (b"tree 5\x00hello", "unknown kind 'tree'"),
        (b"blob 6\x00hello", "header declares 6 body bytes but 5 follow"),
        (b"blob 4\x00hello", "header declares 4 body bytes but 5 follow"),
    ],
)
def test_object_header_rejections(raw, reason):
    with pytest.raises(CorruptObject) as ei:
        objects.parse_object(raw, "x")
    assert reason in ei.value.reason


def test_structured_body_must_be_strict():
    body = bytes.fromhex("a2616200616100")  # unsorted keys
    raw = b"message %d\x00" % len(body) + body
    obj = objects.parse_object(raw, "x")
    with pytest.raises(CorruptObject, match="map keys are not in canonical order"):
        objects.decode_body(obj)
    short_link = codec.encode({"a": b"abc"})
    obj = objects.parse_object(b"message %d\x00" % len(short_link) + short_link, "x")
    with pytest.raises(CorruptObject, match="links must be 32-byte ids"):
        objects.decode_body(obj)


def test_reads_trust_the_admitted_form_fsck_proves_it(tmp_path):
    # A store admits objects in canonical form only (its encoder, an
    # import's strict check): a read verifies the id and decodes, fsck
    # re-proves the form. An object planted with a matching id but
    # unsorted keys therefore reads, and fsck names it.
    from kxen_agent.store import Store, fsck

    body = bytes.fromhex("a2616200616100")  # {"b": 0, "a": 0}: unsorted keys
    raw = b"message %d\x00" % len(body) + body
    obj = objects.parse_object(raw, "x")
    store = Store(str(tmp_path / "state"))
    store.ensure_initialized()
    path = store.loose.path(obj.id)
    with open(path, "wb") as f:
        f.write(objects.compress_loose(raw))
    assert store.get(obj.id) == {"b": 0, "a": 0}
    rep = fsck(store)
    assert [(p.kind, p.where) for p in rep.problems] == [("corrupt-object", path)]
    assert "canonical order" in rep.problems[0].message


@pytest.mark.parametrize("data", ["", "ff", "1b00", "5a00000010", "a1", "c24101", "d81c8100"])
def test_decode_admitted_still_refuses_what_cbor2_cannot_decode_and_every_tag(data):
    # Garbage, truncations, lengths past the end and tags (a bignum, a
    # shared value) fail with the strict decoder's message.
    with pytest.raises(codec.DecodeError):
        codec.decode_admitted(bytes.fromhex(data))
