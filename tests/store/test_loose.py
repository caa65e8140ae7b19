"""Loose objects on disk: readable by standard tools, written once, synced per batch."""

from __future__ import annotations

import collections
import os
import subprocess

import pytest
import zstandard

from kxen_agent.store import FileIO, Store
from kxen_agent.store.objects import encode_object

LINK_TARGET_TEXT = b"a blob that a message links to\n"


def _put_some(store: Store) -> list[tuple[bytes, bytes]]:
    """Objects of several kinds and sizes; returns (id, object bytes) pairs."""
    blob = encode_object("blob", LINK_TARGET_TEXT)
    big = encode_object("blob", os.urandom(300_000))  # several zstd blocks
    empty = encode_object("blob", b"")
    msg = encode_object("message", {"role": "user", "text": "héllo", "blob": blob.id, "n": -(2**64)})
    objs = [blob, big, empty, msg]
    for o in objs:
        assert store.put_raw(o) is True
    return [(o.id, o.raw) for o in objs]


@pytest.mark.tools("zstd", "b3sum")
def test_loose_files_verify_with_zstd_and_b3sum(store: Store):
    for oid, raw in _put_some(store):
        h = oid.hex()
        path = store.loose.path(oid)
        assert path == os.path.join(store.root, "objects", h[:2], h[2:])
        out = subprocess.run(
            f"zstd -dc '{path}' | b3sum", shell=True, capture_output=True, check=True, timeout=30
        ).stdout.decode()
        printed = out.split()[0]
        assert printed == h
        assert os.path.basename(os.path.dirname(path)) + os.path.basename(path) == printed
        # The frame declares its content size (what the reader relies on to
        # refuse before allocating), as the zstd CLI itself reports.
        listing = subprocess.run(
            ["zstd", "-lv", path], capture_output=True, check=True, timeout=30
        ).stdout.decode()
        assert f"({len(raw)} B)" in listing and "Decompressed Size" in listing
        with open(path, "rb") as f:
            frame = f.read()
        assert zstandard.get_frame_parameters(frame).content_size == len(raw)
        assert subprocess.run(
            ["zstd", "-dc", path], capture_output=True, check=True, timeout=30
        ).stdout == raw


def test_objects_read_back(store: Store):
    pairs = _put_some(store)
    for oid, raw in pairs:
        assert store.read_raw(oid).raw == raw
    assert sorted(store.iter_ids()) == sorted(oid for oid, _ in pairs)
    msg_id = pairs[-1][0]
    assert store.get(msg_id, "message")["text"] == "héllo"
    # A fresh Store on the same dir sees the same objects.
    again = Store(store.root)
    assert again.get(pairs[0][0]) == LINK_TARGET_TEXT


def test_existing_object_is_not_rewritten_but_freshened(store: Store):
    oid = store.put("blob", b"written twice")
    path = store.loose.path(oid)
    os.utime(path, (1_000_000_000, 1_000_000_000))
    before = os.stat(path)
    with open(path, "rb") as f:
        content = f.read()

    assert store.put_raw(encode_object("blob", b"written twice")) is False
    after = os.stat(path)
    assert after.st_ino == before.st_ino
    assert after.st_mtime > before.st_mtime + 1_000_000  # now-ish, not 2001
    with open(path, "rb") as f:
        assert f.read() == content
    assert [n for n in os.listdir(os.path.dirname(path)) if n.startswith("tmp_")] == []


class TracingIO(FileIO):
    """Records every traced operation the store performs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, str]] = []
        self.hook = lambda op, path: self.ops.append((op, path))


def _blobs_in_fanouts(prefixes: list[str], per_dir: int) -> list:
    found: dict[str, list] = {p: [] for p in prefixes}
    i = 0
    while any(len(v) < per_dir for v in found.values()):
        obj = encode_object("blob", b"fan-out %d" % i)
        bucket = found.get(obj.id.hex()[:2])
        if bucket is not None and len(bucket) < per_dir:
            bucket.append(obj)
        i += 1
    return [o for p in prefixes for o in found[p]]


def test_batch_shares_one_directory_fsync_per_fanout_dir(state_dir):
    objs = _blobs_in_fanouts(["00", "01", "fe"], per_dir=8)
    io = TracingIO()
    store = Store(str(state_dir), io=io)
    store.ensure_initialized()
    io.ops.clear()
    io.fsyncs = 0

    with store.batch():
        for o in objs:
            store.put_raw(o)
        # Before the batch ends no object's directory entry has been synced.
        assert [p for op, p in io.ops if op == "fsync_dir" and os.path.basename(p) in ("00", "01", "fe")] == []

    for o in objs:
        assert store.read_raw(o.id).raw == o.raw
    fanouts = {os.path.dirname(store.loose.path(o.id)) for o in objs}
    dir_syncs = collections.Counter(p for op, p in io.ops if op == "fsync_dir")
    assert {d: dir_syncs[d] for d in fanouts} == {d: 1 for d in fanouts}
    # The fan-out dirs are part of the state dir's skeleton (§10.3): their
    # names are durable already, so the barrier syncs nothing else.
    assert sum(dir_syncs.values()) == 3
    file_syncs = [p for op, p in io.ops if op == "fsync"]
    assert len(file_syncs) == len(objs)
    assert io.fsyncs == len(objs) + 3

    # Without a batch every write syncs its directory: 24 directory syncs.
    io2 = TracingIO()
    other = Store(str(state_dir.parent / "unbatched"), io=io2)
    for o in objs:
        other.put_raw(o)
    syncs2 = collections.Counter(p for op, p in io2.ops if op == "fsync_dir" and p in {
        os.path.dirname(other.loose.path(o.id)) for o in objs})
    assert sum(syncs2.values()) == len(objs)


def test_nested_batch_syncs_once_at_the_outer_end(state_dir):
    objs = _blobs_in_fanouts(["42"], per_dir=3)
    io = TracingIO()
    store = Store(str(state_dir), io=io)
    fanout = os.path.join(store.root, "objects", "42")
    with store.batch():
        with store.batch():
            store.put_raw(objs[0])
        store.put_raw(objs[1])
        assert ("fsync_dir", fanout) not in io.ops
        store.put_raw(objs[2])
    assert io.ops.count(("fsync_dir", fanout)) == 1


@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 65537, 3 * 65536 + 5])
def test_file_io_reads_whole_files_across_its_read_chunks(tmp_path, size):
    data = os.urandom(size)
    p = tmp_path / "f"
    p.write_bytes(data)
    assert FileIO().read(str(p)) == data
