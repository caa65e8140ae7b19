"""Packs: the byte format, the index, lookup, verification and the writer's durability."""

from __future__ import annotations

import errno
import importlib
import math
import os
import random
import struct
import tracemalloc

import blake3
import pytest

import kxen_agent.store.bundle
import kxen_agent.store.pack
from kxen_agent.store import RefUpdate, Store, fsck
from kxen_agent.store.bundle import export_bundle, import_bundle, verify_bundle
from kxen_agent.store.fsio import READ_OPS, FaultyIO, FileIO
from kxen_agent.store.fsio import TracingIO as SeamTracingIO
from kxen_agent.store.objects import MAX_OBJECT_SIZE, CorruptObject, compress_loose, encode_object
from kxen_agent.store.pack import (
    ENTRY_HEADER_SIZE,
    METHOD_STORED,
    METHOD_ZSTD,
    METHOD_ZSTD_DICT,
    BadPack,
    Compressor,
    Decompressor,
    Entry,
    PackReader,
    PackStream,
    PackWriter,
    choose_dictionary,
    encode_entry,
    encode_pack_header,
    parse_entry_fields,
    parse_entry_header,
    sample_dictionary,
    scan_entries,
)


class TracingIO(FileIO):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, str]] = []
        self.hook = lambda op, path: self.ops.append((op, path))


def messages(n: int, seed: int = 0) -> list:
    """Session-like objects: similar small messages and a few tool outputs."""
    rng = random.Random(seed)
    words = "the a file test run error value import session object tool call output read write fix".split()
    out = []
    parent = None
    for i in range(n):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(5, 60)))
        v = {"role": rng.choice(["user", "assistant", "tool"]), "text": text, "seq": i}
        if parent is not None:
            v["parent"] = parent
        if i % 7 == 0:
            blob = encode_object("blob", ("\n".join(f"line {j}: {rng.choice(words)}" for j in range(rng.randint(5, 80)))).encode())
            out.append(blob)
            v["output"] = blob.id
        m = encode_object("message", v)
        out.append(m)
        parent = m.id
    return out


def write_pack(pack_dir: str, objs, *, io: FileIO | None = None, dictionary: bytes | None = None):
    with PackWriter(pack_dir, io or FileIO(), dictionary) as w:
        for o in objs:
            w.add(o)
        return w.seal().commit()


# ------------------------------------------------------------------ round trip


@pytest.mark.parametrize("use_dict", [False, True])
def test_every_object_reads_back_and_lookup_agrees_with_a_sorted_list(tmp_path, use_dict):
    objs = messages(400)
    raws = [o.raw for o in objs]
    d = choose_dictionary(raws, sum(map(len, raws))) if use_dict else None
    assert (d is not None) == use_dict
    info = write_pack(str(tmp_path), objs, dictionary=d)
    r = PackReader.open(info.pack_path[:-5])
    assert r.count == len({o.id for o in objs}) == info.count
    assert list(r.iter_ids()) == sorted({o.id for o in objs})
    for o in objs:
        got = r.read_raw(o.id)
        assert got.raw == o.raw and got.kind == o.kind
        assert r.has(o.id)
    absent = encode_object("blob", b"not in the pack").id
    assert not r.has(absent) and r.read_raw(absent) is None
    some = objs[17].id.hex()
    assert r.with_prefix(some[:9]) == [objs[17].id]
    assert r.with_prefix("") == []
    r.verify()
    # The pack is named by the BLAKE3 of its content before the trailer.
    with open(info.pack_path, "rb") as f:
        data = f.read()
    assert blake3.blake3(data[:-32]).digest() == data[-32:] == bytes.fromhex(info.name)
    assert os.path.basename(info.pack_path) == f"pack-{info.name}.pack"
    r.close()


def test_a_dictionary_makes_small_similar_objects_smaller(tmp_path):
    objs = messages(600, seed=3)
    raws = [o.raw for o in objs]
    d = choose_dictionary(raws, sum(map(len, raws)))
    assert d is not None and d[:4] == b"\x37\xa4\x30\xec"
    plain = write_pack(str(tmp_path / "plain"), objs)
    with_dict = write_pack(str(tmp_path / "dict"), objs, dictionary=d)
    # Including the dictionary's own bytes, the pack is smaller.
    assert with_dict.size < 0.9 * plain.size, (with_dict.size, plain.size)
    # Training is deterministic: the same objects give the same pack.
    again = write_pack(str(tmp_path / "again"), objs, dictionary=choose_dictionary(raws, sum(map(len, raws))))
    assert again.name == with_dict.name


def test_no_dictionary_for_few_or_tiny_objects():
    objs = messages(5)
    assert choose_dictionary([o.raw for o in objs], 10_000) is None


def count_id_reads(r: PackReader) -> list[int]:
    """The index positions ``r`` reads an id at from now on (a binary search's probes), in order."""
    calls: list[int] = []
    real = r._id_at

    def counting(i):
        calls.append(i)
        return real(i)

    r._id_at = counting  # type: ignore[method-assign]
    return calls


def test_lookup_is_logarithmic_and_reads_only_the_entry(tmp_path):
    objs = [encode_object("blob", b"object %d" % i) for i in range(5000)]
    info = write_pack(str(tmp_path), objs)
    r = PackReader.open(info.pack_path[:-5])
    calls = count_id_reads(r)
    for o in objs[:200]:
        calls.clear()
        assert r.read_raw(o.id).raw == o.raw
        assert len(calls) <= math.ceil(math.log2(len(objs))) + 1
    r.close()
    # Damage one entry: the others still read (nothing reads the whole pack),
    # the damaged one is refused, and verify() finds it.
    victim = objs[100]
    r = PackReader.open(info.pack_path[:-5])
    off, _crc = r._locate(victim.id)
    r.close()
    with open(info.pack_path, "r+b") as f:
        f.seek(off + ENTRY_HEADER_SIZE + 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x10]))
    r = PackReader.open(info.pack_path[:-5])
    assert r.read_raw(objs[101].id).raw == objs[101].raw
    with pytest.raises(CorruptObject, match="checksum"):
        r.read_raw(victim.id)
    with pytest.raises(BadPack):
        r.verify()
    r.close()


def test_after_many_lookups_a_reader_answers_from_a_dict_with_the_same_answers(tmp_path):
    objs = [encode_object("blob", b"object %d" % i) for i in range(600)]
    info = write_pack(str(tmp_path), objs)
    r = PackReader.open(info.pack_path[:-5])
    absent = [encode_object("blob", b"absent %d" % i).id for i in range(300)]
    for a in absent:  # lookups past the threshold, each a binary search
        assert not r.has(a)
    calls = count_id_reads(r)
    for o in objs:
        assert r.read_raw(o.id).raw == o.raw
    for a in absent:
        assert not r.has(a) and r.read_raw(a) is None
    assert calls == []  # no binary search any more
    r.close()


# ------------------------------------------------------------------ durability


def test_writer_renames_the_pack_then_the_index_last(tmp_path):
    io = TracingIO()
    pack_dir = str(tmp_path / "objects" / "pack")
    info = write_pack(pack_dir, messages(30), io=io)
    ops = [(op, os.path.basename(p)) for op, p in io.ops if op != "write" and op != "append"]
    renames = [p for op, p in ops if op == "rename"]
    assert renames == [f"pack-{info.name}.pack", f"pack-{info.name}.idx"]
    i_pack = ops.index(("rename", f"pack-{info.name}.pack"))
    i_idx = ops.index(("rename", f"pack-{info.name}.idx"))
    # temp pack fsynced before its rename; the directory synced before the
    # index is named (the pack's name is durable first) and after.
    assert ops[i_pack - 1][0] == "fsync" and ops[i_pack - 1][1].startswith("tmp_pack_")
    assert ops[i_pack + 1] == ("fsync_dir", "pack")
    assert ops[i_idx - 1][0] == "fsync" and ops[i_idx - 1][1].startswith("tmp_idx_")
    assert ops[-1] == ("fsync_dir", "pack") and i_idx == len(ops) - 2
    assert sorted(os.listdir(pack_dir)) == [f"pack-{info.name}.idx", f"pack-{info.name}.pack"]


def test_a_sealed_pack_is_invisible_until_committed_and_an_aborted_one_leaves_nothing(tmp_path):
    store = Store(str(tmp_path / "state"))
    store.ensure_initialized()
    objs = messages(20)
    w = PackWriter(store.pack_dir, store.io)
    for o in objs:
        w.add(o)
    sealed = w.seal()
    assert not Store(store.root).has(objs[0].id)
    r = sealed.reader()  # readable before the commit (import checks refs with it)
    assert r.read_raw(objs[3].id).raw == objs[3].raw
    r.close()
    sealed.commit()
    assert Store(store.root).read_raw(objs[3].id).raw == objs[3].raw

    with pytest.raises(RuntimeError):
        with PackWriter(store.pack_dir, store.io) as w2:
            w2.add(encode_object("blob", b"x"))
            raise RuntimeError("crash")
    assert not [n for n in os.listdir(store.pack_dir) if n.startswith("tmp_")]


# ------------------------------------------------------------------ corruption


@pytest.mark.slow
def test_every_flipped_bit_of_a_pack_or_its_index_is_detected(tmp_path):
    objs = [encode_object("blob", b"alpha"), encode_object("message", {"t": "beta"}), encode_object("blob", b"gamma" * 30)]
    info = write_pack(str(tmp_path / "p"), objs)
    base = info.pack_path[:-5]
    files = {".pack": open(info.pack_path, "rb").read(), ".idx": open(base + ".idx", "rb").read()}
    for ext, data in files.items():
        for i in range(len(data)):
            bad = bytearray(data)
            bad[i] ^= 1 << (i % 8)
            d = tmp_path / "m"
            d.mkdir(exist_ok=True)
            for e2, d2 in files.items():
                (d / f"pack-{info.name}{e2}").write_bytes(bytes(bad) if e2 == ext else d2)
            try:
                r = PackReader.open(str(d / f"pack-{info.name}"))
            except BadPack:
                continue
            try:
                with pytest.raises((BadPack, CorruptObject)):
                    r.verify()
                    for o in objs:
                        r.read_raw(o.id)
            finally:
                r.close()


def test_scanner_resynchronises_after_a_corrupt_length(tmp_path):
    objs = [encode_object("blob", b"entry %d " % i * (i + 1)) for i in range(10)]
    info = write_pack(str(tmp_path), objs)
    data = bytearray(open(info.pack_path, "rb").read())
    r = PackReader.open(info.pack_path[:-5])
    start, end = r.data_start, r.entries_end
    off, _ = r._locate(objs[3].id)
    r.close()
    struct.pack_into(">Q", data, off + 45, 999_999)  # entry 3's stored length
    with pytest.raises(BadPack):
        list(scan_entries(bytes(data), start, end, "p", has_dict=False))
    skipped = []
    found = [e.id for e in scan_entries(bytes(data), start, end, "p", has_dict=False, resync=True,
                                        skipped=lambda a, b, why: skipped.append((a, b, why)))]
    assert found == [o.id for o in objs if o is not objs[3]]
    assert len(skipped) == 1 and skipped[0][0] == off


# ------------------------------------------------------------------ bounds


def _hostile_entries():
    oid = b"\x01" * 32
    yield encode_entry(METHOD_STORED, oid, 1 << 40, b"x"), "1099511627776-byte object"
    yield encode_entry(METHOD_ZSTD, oid, 10, b"y" * 11), "stores 11 bytes for a 10-byte object"
    yield encode_entry(METHOD_ZSTD_DICT, oid, 10, b"y"), "has none"
    yield encode_entry(5, oid, 10, b"y"), "unknown compression method"


@pytest.mark.parametrize("data,reason", list(_hostile_entries()))
def test_entry_headers_claiming_too_much_are_refused_before_reading(data, reason):
    with pytest.raises(BadPack, match=reason):
        parse_entry_header(data[:ENTRY_HEADER_SIZE], 0, "hostile", has_dict=False)


def _frame(declared: int, payload: bytes) -> bytes:
    block = (1 | (len(payload) << 3)).to_bytes(3, "little")
    return bytes.fromhex("28b52ffd") + bytes([0xE0]) + declared.to_bytes(8, "little") + block + payload


@pytest.mark.parametrize(
    "stored,raw_len,reason",
    [
        (_frame(1 << 40, b"abc"), 100, "declares 1099511627776 bytes"),
        (_frame(MAX_OBJECT_SIZE + 100, b"abc"), 100, "declares"),
        (bytes.fromhex("28b52ffd") + bytes([0xE0]) + (10).to_bytes(8, "little") + (1 | 2 << 1 | (1 << 17) << 3).to_bytes(3, "little") + b"a", 64, "declares 10 bytes"),
        (bytes.fromhex("28b52ffd") + bytes([0xE0]) + (64).to_bytes(8, "little") + (1 | 1 << 1 | (1 << 17) << 3).to_bytes(3, "little") + b"a", 64, "does not decompress"),
        (b"not zstd at all", 100, "not a zstd frame"),
    ],
)
def test_a_frame_cannot_make_the_reader_allocate_past_the_entry(stored, raw_len, reason):
    e = Entry(0, METHOD_ZSTD, b"\x02" * 32, raw_len, len(stored), 0)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptObject, match=reason):
            Decompressor(None).decompress(e, stored, "hostile")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


# ------------------------------------------------------------------ copying


def test_entries_copy_verbatim_between_packs_with_the_same_dictionary(tmp_path):
    objs = messages(300, seed=9)
    raws = [o.raw for o in objs]
    d = choose_dictionary(raws, sum(map(len, raws)))
    a = write_pack(str(tmp_path / "a"), objs, dictionary=d)
    ra = PackReader.open(a.pack_path[:-5])
    with PackWriter(str(tmp_path / "b"), FileIO(), ra.dictionary) as w:
        for o in objs[::2]:
            _e, head, stored = ra.entry(o.id)
            assert w.add_entry(head, stored)
            assert not w.add_entry(head, stored)  # once only
        b = w.seal().commit()
    rb = PackReader.open(b.pack_path[:-5])
    for o in objs[::2]:
        assert rb.read_raw(o.id).raw == o.raw
        assert rb.entry(o.id)[1:] == ra.entry(o.id)[1:]  # same bytes, no recompression
    _e, head, stored = ra.entry(objs[1].id)
    with PackWriter(str(tmp_path / "c"), FileIO(), ra.dictionary) as w:
        with pytest.raises(BadPack, match="checksum"):
            w.add_entry(head, stored[:-1] + bytes([stored[-1] ^ 1]))
        w.abort()
    ra.close()
    rb.close()


# ------------------------------------------------------------------ fast paths: the same bytes


def _stream_bytes(dictionary, feed) -> tuple[bytes, bytes]:
    out = bytearray()
    st = PackStream(out.extend, dictionary)
    feed(st)
    st.finish()
    return bytes(out), st.index()


@pytest.mark.parametrize("use_dict", [False, True])
def test_batch_compression_and_checked_copies_write_the_pack_that_one_add_per_object_writes(use_dict):
    rng = random.Random(4)
    objs = messages(500, seed=4)
    # incompressible objects (stored raw), one larger than the write buffer
    objs[10:10] = [encode_object("blob", rng.randbytes(3000)), encode_object("blob", rng.randbytes((1 << 20) + 5))]
    raws = [o.raw for o in objs]
    d = choose_dictionary(raws, sum(map(len, raws))) if use_dict else None
    assert (d is not None) == use_dict
    c = Compressor(d)
    assert c.compress_many(raws) == [c.compress(r) for r in raws]  # one thread: a large object
    small = [r for r in raws if len(r) <= 64 << 10]
    assert c.compress_many(small) == [c.compress(r) for r in small]  # threads
    assert c.compress_many(raws[:3]) == [c.compress(r) for r in raws[:3]]  # below the batch threshold
    assert {m for m, _f in c.compress_many(raws)} == {METHOD_STORED, METHOD_ZSTD_DICT if use_dict else METHOD_ZSTD}

    def one_by_one(st):
        for o in objs + objs[:3]:
            st.add(o)

    want = _stream_bytes(d, one_by_one)
    for batch in (1, 5000, 1 << 20):
        assert _stream_bytes(d, lambda st: st.add_many(objs + objs[:3], batch_bytes=batch)) == want
    # Entries copied with and without re-checking: the same pack again.
    entries = [(want[0][e.offset : e.offset + ENTRY_HEADER_SIZE], want[0][e.offset + ENTRY_HEADER_SIZE : e.end], e)
               for e in scan_entries(want[0], len(encode_pack_header(d)), len(want[0]) - 44, "p", has_dict=use_dict)]
    assert len(entries) == len(objs)
    assert _stream_bytes(d, lambda st: [st.add_entry(h, s) for h, s, _e in entries]) == want
    assert _stream_bytes(d, lambda st: [st.add_checked_entry(h, s, e.id, e.raw_len, e.crc) for h, s, e in entries * 2]) == want
    assert parse_entry_fields(entries[0][0], 0, "p", has_dict=use_dict) == (
        entries[0][2].method, entries[0][2].id, entries[0][2].raw_len, entries[0][2].stored_len, entries[0][2].crc)


def test_the_dictionary_choice_hands_over_the_objects_it_compressed():
    objs = messages(700, seed=6)
    by_id = {o.id: o for o in objs}
    small = [o.id for o in objs]
    total = sum(len(o.raw) for o in objs)
    pre: dict = {}
    d = sample_dictionary(by_id.__getitem__, small, total, pre)
    assert d is not None and d == sample_dictionary(by_id.__getitem__, small, total)
    c = Compressor(d)
    assert pre and all(pre[i] == c.compress(by_id[i].raw) for i in pre)
    want = _stream_bytes(d, lambda st: [st.add(o) for o in objs])
    assert _stream_bytes(d, lambda st: st.add_many(objs, precompressed=dict(pre))) == want
    nothing: dict = {}
    assert sample_dictionary(by_id.__getitem__, small[:10], total, nothing) is None and not nothing


def test_malformed_entry_headers_fail_the_fast_parse_as_the_full_one():
    head = encode_entry(METHOD_ZSTD, b"\x01" * 32, 100, b"x" * 40)[:ENTRY_HEADER_SIZE]
    rng = random.Random(2)
    cases = [head, head[:-1], b""]
    for i in range(ENTRY_HEADER_SIZE):
        for _ in range(3):
            m = bytearray(head)
            m[i] = rng.randrange(256)
            cases.append(bytes(m))
    for case in cases:
        for has_dict in (False, True):
            try:
                e = parse_entry_header(case, 7, "w", has_dict=has_dict)
                full = (e.method, e.id, e.raw_len, e.stored_len, e.crc)
            except BadPack as ex:
                full = str(ex)
            try:
                fast = parse_entry_fields(case, 7, "w", has_dict=has_dict)
            except BadPack as ex:
                fast = str(ex)
            assert fast == full


# ------------------------------------------------------------------ the store


def test_store_reads_packed_and_loose_objects_alike(tmp_path):
    store = Store(str(tmp_path / "state"))
    store.ensure_initialized()
    objs = messages(50)
    write_pack(store.pack_dir, objs[:30], io=store.io)
    for o in objs[30:]:
        store.put_raw(o)
    store = Store(store.root)
    for o in objs:
        assert store.read_raw(o.id).raw == o.raw
    assert store.resolve(objs[5].hex[:12]) == objs[5].id
    assert set(store.iter_ids()) == {o.id for o in objs}
    rep = fsck(store)
    assert rep.clean and rep.packed == 30 and rep.loose == len(objs) - 30


def _damage(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


@pytest.mark.parametrize("bad", ["loose", "packed", "both"])
def test_a_corrupt_copy_is_passed_over_while_another_copy_is_good(tmp_path, bad):
    store = Store(str(tmp_path / "state"))
    store.ensure_initialized()
    obj = encode_object("blob", b"kept twice " * 40)
    info = write_pack(store.pack_dir, [obj], io=store.io)
    store.put_raw(obj)
    # Put a loose copy next to the packed one (put_raw skips objects a pack holds).
    path = store.loose.path(obj.id)
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(compress_loose(obj.raw))
    if bad in ("loose", "both"):
        _damage(path, os.path.getsize(path) - 2)
    if bad in ("packed", "both"):
        r = PackReader.open(info.pack_path[:-5])
        off, _crc = r._locate(obj.id)
        r.close()
        _damage(info.pack_path, off + ENTRY_HEADER_SIZE + 3)
    store = Store(store.root)
    if bad == "both":
        with pytest.raises(CorruptObject):
            store.read_raw(obj.id)
    else:
        assert store.get(obj.id) == obj.body
    # fsck checks every copy and names the bad one(s).
    rep = fsck(store)
    assert not rep.clean and len(rep.problems) == (2 if bad == "both" else 1)


def test_a_broken_index_is_named_by_fsck_and_does_not_stop_the_store(tmp_path):
    store = Store(str(tmp_path / "state"))
    store.ensure_initialized()
    info = write_pack(store.pack_dir, messages(10), io=store.io)
    good = encode_object("blob", b"loose and fine")
    store.put_raw(good)
    idx = info.idx_path
    data = bytearray(open(idx, "rb").read())
    data[8 + 4 * 10] ^= 0xFF  # the fanout is no longer monotonic
    open(idx, "wb").write(bytes(data))
    store = Store(store.root)
    assert store.read_raw(good.id).raw == good.raw
    rep = fsck(store)
    assert [p.kind for p in rep.problems] == ["corrupt-pack"]
    assert "fanout" in rep.problems[0].message


def test_a_reader_keeps_reading_a_pack_removed_under_it(tmp_path):
    store = Store(str(tmp_path / "state"))
    store.ensure_initialized()
    objs = messages(40)
    old = write_pack(store.pack_dir, objs[:20], io=store.io)
    reader = Store(store.root)
    assert reader.read_raw(objs[0].id).raw == objs[0].raw
    # Another process repacks: a new pack with everything, the old one removed.
    write_pack(store.pack_dir, objs, io=store.io)
    os.unlink(old.idx_path)
    os.unlink(old.pack_path)
    for o in objs:  # the old mapping still serves; the rest come from a reload
        assert reader.read_raw(o.id).raw == o.raw
    reader.reload_packs()
    assert [getattr(p, "path") for p in reader.packs] != [old.pack_path]
    assert all(reader.read_raw(o.id).raw == o.raw for o in objs)


# ------------------------------------------------------------------ the I/O seam


class _MapRecordingIO(FaultyIO):
    """A disk whose reads fail at ``fail_at``; remembers every mapping it handed out."""

    def __init__(self, fail_at: int | None) -> None:
        super().__init__(fail_at, errno.EIO, reads=True, sync=False)
        self.maps: list = []

    def map_file(self, path: str):
        m = super().map_file(path)
        self.maps.append(m)
        return m


@pytest.mark.parametrize("fail_at, fails", [(1, ".idx"), (2, ".pack")])
def test_a_pack_whose_mapping_fails_raises_oserror_and_leaves_nothing_mapped(tmp_path, fail_at, fails):
    objs = messages(30)
    base = write_pack(str(tmp_path), objs).pack_path[:-5]
    io = _MapRecordingIO(fail_at)
    with pytest.raises(OSError) as ei:
        PackReader.open(base, io=io)
    # The error the disk gave, naming the file (the store turns it into a
    # BrokenPack that fsck names); no mapping made before it stays open.
    assert ei.value.errno == errno.EIO and ei.value.filename == base + fails
    assert io.faults == 1 and io.read_count == fail_at
    assert len(io.maps) == fail_at - 1 and all(m.closed for m in io.maps)
    # The disk heals: the same pack opens and reads through the same seam.
    io.heal()
    r = PackReader.open(base, io=io)
    assert [o.raw for o in map(r.read_raw, (o.id for o in objs))] == [o.raw for o in objs]
    io.fail_at = io.read_count + 1
    with pytest.raises(OSError):
        r.mtime()  # a stat, through the seam too
    r.close()
    assert all(m.closed for m in io.maps)


def test_a_sealed_pack_is_read_through_its_writers_io(tmp_path):
    objs = messages(20)
    io = _MapRecordingIO(None)
    w = PackWriter(str(tmp_path / "pack"), io)
    for o in objs:
        w.add(o)
    sealed = w.seal()
    io.fail_at = io.read_count + 1
    with pytest.raises(OSError):
        sealed.reader()
    assert io.maps == []
    io.heal()
    r = sealed.reader()
    assert all(r.read_raw(o.id).raw == o.raw for o in objs)
    r.close()
    sealed.discard()
    assert os.listdir(tmp_path / "pack") == [] and all(m.closed for m in io.maps)


def test_the_seam_sees_the_packs_mappings_and_the_bundles_open(tmp_path):
    io = SeamTracingIO(sync=False)
    reads: list[tuple[str, str]] = []
    io.read_hook = lambda op, path: reads.append((op, path))
    info = write_pack(str(tmp_path / "p"), messages(20), io=io)
    base = info.pack_path[:-5]
    reads.clear()
    r = PackReader.open(base, io=io)
    assert reads == [("mmap", base + ".idx"), ("mmap", base + ".pack")]
    r.mtime()
    assert reads[-1] == ("stat", info.pack_path)
    r.close()
    # Reads are seen on their own channel: they are never in the trace of changes.
    assert io.trace and not [op for op in io.trace if op.kind in READ_OPS]

    src = Store(str(tmp_path / "src"), io=io)
    with src.step("ses/a") as step:
        blob = step.put("blob", b"tool output\n" * 40)
        head = step.put("message", {"role": "tool", "text": "ran it", "out": blob})
        step.update("head", None, head)
        step.commit("test")
    bundle = str(tmp_path / "a.kxb")
    export_bundle(src, ["ses/a"], bundle)
    reads.clear()
    verify_bundle(bundle, io=io)
    assert reads[0] == ("open", bundle)
    dst = Store(str(tmp_path / "dst"), io=io)
    reads.clear()
    res = import_bundle(dst, bundle)
    assert res.new_objects == 2
    assert reads.count(("open", bundle)) == 1
    # Import reads the pack it staged (to check the refs) before committing
    # its index: that mapping goes through the store's seam as well.
    staged = [p for op, p in reads if op == "mmap" and os.path.basename(p).startswith("tmp_pack_")]
    assert len(staged) == 1 and os.path.dirname(staged[0]) == dst.pack_dir


def test_the_pack_package_exports_a_sorted_all_of_its_modules_public_names():
    pack = kxen_agent.store.pack
    mods = [importlib.import_module(f"kxen_agent.store.pack.{n}") for n in ("compress", "format", "reader", "stream", "writer")]
    assert pack.__all__ == sorted(pack.__all__)
    assert set(pack.__all__) == set().union(*(m.__all__ for m in mods))
    assert all(getattr(pack, n) is getattr(m, n) for m in mods for n in m.__all__)
    assert all(m.__all__ == sorted(m.__all__) for m in mods)


def test_a_method_2_frame_may_name_the_packs_dictionary_and_no_other() -> None:
    """§12.3: `zstd -D dict` writes the dictionary's id into the frame; a reader takes it, but no other id."""
    import zstandard

    from kxen_agent.store.objects import CorruptObject
    from kxen_agent.store.pack import Decompressor

    samples = [(f"message {i}: the build of module m{i % 7} passed with {i % 5} warnings " * 8).encode()
               for i in range(200)]
    d = zstandard.train_dictionary(4096, samples, k=1024, d=8, steps=0, threads=1)
    raw = samples[3]
    ident = int.from_bytes(d.as_bytes()[4:8], "little")
    assert ident == d.dict_id() != 0
    named = zstandard.ZstdCompressor(dict_data=d, write_content_size=True, write_dict_id=True).compress(raw)
    anonymous = zstandard.ZstdCompressor(dict_data=d, write_content_size=True, write_dict_id=False).compress(raw)
    assert zstandard.get_frame_parameters(named).dict_id == ident
    dec = Decompressor(d.as_bytes())
    assert dec.decompress_raw(2, len(raw), named, "t") == raw
    assert dec.decompress_raw(2, len(raw), anonymous, "t") == raw
    # Another id in the frame header (the frame's 4-byte Dictionary_ID field follows the descriptor).
    fhd = named[4]
    assert fhd & 0b11 == 3  # a 4-byte Dictionary_ID
    at = 5 if fhd & 0x20 else 6  # single segment: no window descriptor before the id
    other = named[:at] + (ident ^ 1).to_bytes(4, "little") + named[at + 4:]
    with pytest.raises(CorruptObject, match=f"names dictionary {ident ^ 1}; this pack's dictionary is {ident}"):
        dec.decompress_raw(2, len(raw), other, "t")
    with pytest.raises(CorruptObject, match=f"names dictionary {ident}; a method-1 entry uses none"):
        Decompressor(None).decompress_raw(1, len(raw), named, "t")
