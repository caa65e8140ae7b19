"""Bundles: export, verify and import; closure, idempotence, fast-forward, failures, streaming."""

from __future__ import annotations

import base64
import errno
import importlib
import io
import json
import os
import random
import struct
import tracemalloc
import zlib
from pathlib import Path

import blake3
import cbor2
import pytest
import zstandard

from kxen_agent.cli import main as cli_main
from kxen_agent.cli.store_cmds import register
from kxen_agent.store import Store, fsck
from kxen_agent.store.bundle import export as export_mod, hashing_reader as hashing_reader_mod
from kxen_agent.store.loose import LooseNames
from kxen_agent.store.bundle import (
    BadBundle,
    BundleRefused,
    NoSuchGroup,
    export_bundle,
    format_for_path,
    import_bundle,
    iter_bundle_objects,
    verify_bundle,
)
from kxen_agent.store.fold import fold_step_logs
from kxen_agent.store.fsio import FaultyIO, FileIO
from kxen_agent.store.refs import RefUpdate
from kxen_agent.store.repo import MissingObject
from .helpers import closure

HOSTILE = Path(__file__).parent / "hostile"


def chain(store: Store, group: str, n: int, *, tag: str, head: bytes | None = None, meta: bool = False) -> bytes:
    """Append ``n`` messages (each with a blob) to ``group``'s head; return the new head."""
    old = store.refs.get(group, "head") if store.refs.read(group).exists else None
    prev = head if head is not None else old
    with store.step(group) as step:
        for i in range(n):
            blob = step.put("blob", f"{tag}: tool output {i}\n".encode() * (1 + i % 5))
            v = {"role": "assistant" if i % 2 else "user", "text": f"{tag} says {i}", "out": blob}
            if prev is not None:
                v["parent"] = prev
            prev = step.put("message", v)
        step.update("head", old, prev)
        if meta and store.refs.get(group, "meta") is None:
            step.update("meta", None, step.put("session", {"name": group, "workspace": "/w"}))
        step.commit("test")
    return prev


def refs_of(store: Store, *groups: str) -> dict[str, dict[str, bytes]]:
    return {g: dict(store.refs.read(g).refs) for g in groups}


def state(root: str) -> dict[str, tuple[int, int]]:
    """Every file of a state dir but lock files, with size and mtime."""
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            if f.endswith(".lock"):
                continue
            st = os.stat(os.path.join(d, f))
            out[os.path.relpath(os.path.join(d, f), root)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def src(tmp_path) -> Store:
    """Two sessions sharing history (the second forked from the first), plus noise."""
    s = Store(str(tmp_path / "src"))
    chain(s, "ses/a", 12, tag="a", meta=True)
    first = s.get(s.refs.get("ses/a", "head"), "message")
    fork_point = first["parent"]
    chain(s, "ses/b", 4, tag="b", head=fork_point, meta=True)
    chain(s, "ses/other", 3, tag="other")
    s.put("blob", b"garbage nobody references")
    return s


# ------------------------------------------------------------------ an independent reader


def independent_verify(data: bytes) -> tuple[dict, dict[bytes, bytes]]:
    """Check a pack-form bundle from the spec alone (struct, zlib, blake3, zstandard, cbor2)."""
    assert data[:8] == b"KXBUNDLE"
    version, hlen = struct.unpack(">II", data[8:16])
    assert version == 1
    header = cbor2.loads(data[16 : 16 + hlen])
    assert zlib.crc32(data[: 16 + hlen]) == struct.unpack(">I", data[16 + hlen : 20 + hlen])[0]
    p = start = 20 + hlen
    assert data[p : p + 4] == b"KXPK"
    pver, dlen = struct.unpack(">II", data[p + 4 : p + 12])
    assert pver == 1
    d = data[p + 12 : p + 12 + dlen]
    assert zlib.crc32(data[p : p + 12 + dlen]) == struct.unpack(">I", data[p + 12 + dlen : p + 16 + dlen])[0]
    p += 16 + dlen
    plain = zstandard.ZstdDecompressor()
    with_dict = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(d)) if d else None
    objs: dict[bytes, bytes] = {}
    while data[p : p + 4] == b"\x8bKXE":
        method, oid, raw_len, stored_len, crc = struct.unpack(">B32sQQI", data[p + 4 : p + 57])
        stored = data[p + 57 : p + 57 + stored_len]
        assert zlib.crc32(data[p : p + 53] + stored) == crc
        raw = stored if method == 0 else (plain if method == 1 else with_dict).decompress(stored)
        assert len(raw) == raw_len and blake3.blake3(raw).digest() == oid and oid not in objs
        objs[oid] = raw
        p += 57 + stored_len
    assert data[p : p + 4] == b"\x8bKXZ" and struct.unpack(">Q", data[p + 4 : p + 12])[0] == len(objs)
    p += 12
    assert blake3.blake3(data[start:p]).digest() == data[p : p + 32]
    p += 32
    assert blake3.blake3(data[:p]).digest() == data[p : p + 32]
    assert p + 32 == len(data)
    assert header["objects"] == len(objs) and header["size"] == sum(map(len, objs.values()))
    return header, objs


def independent_closure(refs: dict, objs: dict[bytes, bytes]) -> set[bytes]:
    def links(v):
        if isinstance(v, bytes):
            yield v
        elif isinstance(v, dict):
            for x in v.values():
                yield from links(x)
        elif isinstance(v, list):
            for x in v:
                yield from links(x)

    seen, stack = set(), [oid for r in refs.values() for oid in r.values()]
    while stack:
        oid = stack.pop()
        if oid in seen:
            continue
        seen.add(oid)
        raw = objs[oid]
        head, body = raw.split(b"\x00", 1)
        if not head.startswith(b"blob "):
            stack.extend(links(cbor2.loads(body)))
    return seen


# ------------------------------------------------------------------ round trips


def test_pack_bundle_round_trip_checked_by_an_independent_reader(src, tmp_path):
    out = tmp_path / "two.kxb"
    info = export_bundle(src, ["ses/b", "ses/a"], out)
    want = closure(src, [v for r in refs_of(src, "ses/a", "ses/b").values() for v in r.values()])
    # Shared history is in the bundle once.
    assert info.objects == len(want) and info.refs == refs_of(src, "ses/a", "ses/b")
    header, objs = independent_verify(out.read_bytes())
    assert set(objs) == want == independent_closure(header["refs"], objs)
    assert header["refs"] == refs_of(src, "ses/a", "ses/b")
    assert verify_bundle(str(out)) == info

    dst = Store(str(tmp_path / "dst"))
    res = import_bundle(dst, str(out))
    assert res.new_objects == info.objects and dict(res.groups) == {"ses/a": "created", "ses/b": "created"}
    assert refs_of(dst, "ses/a", "ses/b") == refs_of(src, "ses/a", "ses/b")
    assert all(dst.read_raw(o).raw == src.read_raw(o).raw for o in want)
    assert fsck(Store(dst.root)).clean
    assert [e.reason for e in dst.refs.reflog("ses/a")] == [f"import bundle {info.content_digest[:16]}"] * 2


def test_json_bundle_round_trip_and_is_plain_json(src, tmp_path):
    out = tmp_path / "a.json"
    info = export_bundle(src, ["ses/a"], out, fmt=format_for_path(str(out)))
    assert info.format == "json"
    doc = json.loads(out.read_text())
    assert doc["format"] == "kxen-bundle" and doc["version"] == 1 and doc["objectCount"] == info.objects
    for el in doc["objects"]:
        raw = base64.b64decode(el["bytes"])
        assert blake3.blake3(raw).hexdigest() == el["id"] and raw.startswith(el["kind"].encode() + b" ")
    dst = Store(str(tmp_path / "dst"))
    import_bundle(dst, str(out))
    assert refs_of(dst, "ses/a") == refs_of(src, "ses/a") and fsck(Store(dst.root)).clean
    # Rewritten with sorted keys and indentation, as `jq -S .` would: still the same bundle.
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(doc, sort_keys=True, indent=2))
    assert verify_bundle(str(pretty)).digest == info.digest
    dst2 = Store(str(tmp_path / "dst2"))
    assert import_bundle(dst2, str(pretty)).new_objects == info.objects
    # ...but not with an altered ref.
    doc["refs"]["ses/a"]["head"], doc["refs"]["ses/a"]["meta"] = doc["refs"]["ses/a"]["meta"], doc["refs"]["ses/a"]["head"]
    pretty.write_text(json.dumps(doc))
    with pytest.raises(BadBundle, match="digest mismatch"):
        verify_bundle(str(pretty))


def test_a_bundle_holds_exactly_what_the_refs_reach(src, tmp_path):
    head = src.refs.get("ses/a", "head")
    # An old value of the ref (only in the reflog) is not exported.
    older = chain(src, "ses/a", 2, tag="later")
    src.refs.transaction("ses/a", [RefUpdate("head", older, head)], reason="rewind")
    out = tmp_path / "a.kxb"
    export_bundle(src, ["ses/a"], out)
    got = {o.id for o in iter_bundle_objects(str(out))}
    assert got == closure(src, refs_of(src, "ses/a")["ses/a"].values())
    assert older not in got and not (got & closure(src, refs_of(src, "ses/other")["ses/other"].values()))


def test_export_is_deterministic_and_can_write_to_a_stream(src, tmp_path):
    out = tmp_path / "a.kxb"
    export_bundle(src, ["ses/a"], out)
    buf = io.BytesIO()
    info = export_bundle(src, ["ses/a"], buf)
    assert buf.getvalue() == out.read_bytes() and info.file_bytes == len(buf.getvalue())


def test_export_refuses_what_it_cannot_bundle_and_writes_nothing(src, tmp_path):
    out = tmp_path / "x.kxb"
    with pytest.raises(NoSuchGroup, match="ses/nope"):
        export_bundle(src, ["ses/a", "ses/nope"], out)
    src.refs.transaction("ses/other", [], reason="delete", deleted_ns=1)
    with pytest.raises(NoSuchGroup, match="marked deleted"):
        export_bundle(src, ["ses/other"], out)
    lost = b"\x07" * 32
    src.refs.transaction("ses/broken", [RefUpdate("head", None, lost)], reason="broken")
    with pytest.raises(MissingObject, match=lost.hex()):
        export_bundle(src, ["ses/broken"], out)
    assert os.listdir(tmp_path) == ["src"]


def test_progress_counts_every_object(src, tmp_path):
    class Counter:
        total = None
        n = 0

        def __call__(self, k=1):
            self.n += k

    out = tmp_path / "a.kxb"
    c = Counter()
    info = export_bundle(src, ["ses/a"], out, progress=c)
    assert c.n == c.total == info.objects
    for fn in (lambda p: verify_bundle(str(out), progress=p), lambda p: import_bundle(Store(str(tmp_path / "d")), str(out), progress=p)):
        c = Counter()
        fn(c)
        assert c.n == c.total == info.objects


# ------------------------------------------------------------------ import rules


def test_importing_the_same_bundle_twice_is_a_no_op(src, tmp_path):
    out = tmp_path / "ab.kxb"
    export_bundle(src, ["ses/a", "ses/b"], out)
    dst = Store(str(tmp_path / "dst"))
    import_bundle(dst, str(out))
    before = state(dst.root)
    res = import_bundle(dst, str(out))
    assert res.new_objects == 0 and res.pack is None and set(res.groups.values()) == {"unchanged"}
    assert state(dst.root) == before
    # The JSON form of the same bundle is the same import.
    export_bundle(src, ["ses/a", "ses/b"], tmp_path / "ab.json", fmt="json")
    assert import_bundle(dst, str(tmp_path / "ab.json")).new_objects == 0 and state(dst.root) == before


def test_a_newer_bundle_fast_forwards_and_only_new_objects_are_added(src, tmp_path):
    v1 = tmp_path / "v1.kxb"
    export_bundle(src, ["ses/a"], v1)
    dst = Store(str(tmp_path / "dst"))
    n1 = import_bundle(dst, str(v1)).new_objects
    chain(src, "ses/a", 3, tag="more")
    v2 = tmp_path / "v2.kxb"
    info = export_bundle(src, ["ses/a"], v2)
    res = import_bundle(dst, str(v2))
    assert dict(res.groups) == {"ses/a": "updated"} and res.new_objects == info.objects - n1 == 6
    assert refs_of(dst, "ses/a") == refs_of(src, "ses/a") and fsck(Store(dst.root)).clean


def test_diverged_or_older_bundles_are_refused_and_nothing_is_written(src, tmp_path):
    v1 = tmp_path / "v1.kxb"
    export_bundle(src, ["ses/a"], v1)
    chain(src, "ses/a", 2, tag="src-side")
    v2 = tmp_path / "v2.kxb"
    export_bundle(src, ["ses/a"], v2)

    older = Store(str(tmp_path / "older"))
    import_bundle(older, str(v2))
    before = state(older.root)
    with pytest.raises(BundleRefused, match=r"ses/a/head .*newer"):
        import_bundle(older, str(v1))
    assert state(older.root) == before

    diverged = Store(str(tmp_path / "diverged"))
    import_bundle(diverged, str(v1))
    chain(diverged, "ses/a", 1, tag="local-side")
    before = state(diverged.root)
    with pytest.raises(BundleRefused, match=r"ses/a/head .*diverged"):
        import_bundle(diverged, str(v2))
    assert state(diverged.root) == before
    assert fsck(Store(diverged.root)).clean

    extra = Store(str(tmp_path / "extra"))
    import_bundle(extra, str(v1))
    extra.refs.transaction("ses/a", [RefUpdate("pinned", None, extra.refs.get("ses/a", "head"))], reason="local ref")
    with pytest.raises(BundleRefused, match="ses/a/pinned .*no such ref"):
        import_bundle(extra, str(v2))


def test_transform_rewrites_refs_and_reads_the_bundles_objects(src, tmp_path):
    out = tmp_path / "a.kxb"
    export_bundle(src, ["ses/a"], out)
    dst = Store(str(tmp_path / "dst"))
    seen = []

    def rebind(group, refs, step):
        meta = dst.get(refs["meta"], "session")  # only in the staged pack at this point
        seen.append(meta["workspace"])
        new = step.put("session", {**meta, "workspace": "/runner-b", "previous": refs["meta"]})
        return {**refs, "meta": new}

    res = import_bundle(dst, str(out), transform=rebind)
    assert seen == ["/w"]
    meta = dst.get(dst.refs.get("ses/a", "meta"), "session")
    assert meta["workspace"] == "/runner-b" and res.refs["ses/a"]["meta"] == dst.refs.get("ses/a", "meta")
    assert fsck(Store(dst.root)).clean
    # Format 3: the rebound object was put in ses/a's step, so ses/a's
    # step-log record carries it (objects_spec.md §6.8).
    assert dst.steps.has(res.refs["ses/a"]["meta"])
    assert res.refs["ses/a"]["meta"] not in set(dst.loose.iter_ids())
    # A repeated import writes nothing (§12.10): the transform's put of an
    # object the store holds (in a step log, then, once folded, in a pack)
    # goes with the group's step, not committed (unchanged); no file is
    # added, removed or changes size.
    for folded in (False, True):
        if folded:
            fold_step_logs(dst)
        before = {k: v[0] for k, v in state(dst.root).items()}
        again = import_bundle(dst, str(out), transform=rebind)  # deterministic transform: a no-op
        assert set(again.groups.values()) == {"unchanged"} and again.new_objects == 0
        assert {k: v[0] for k, v in state(dst.root).items()} == before, folded
    assert fsck(Store(dst.root)).clean


def test_a_failure_while_committing_leaves_no_trace(src, tmp_path):
    out = tmp_path / "a.kxb"
    export_bundle(src, ["ses/a"], out)

    class FailingIO(FileIO):
        def __init__(self):
            super().__init__()

            def hook(op, path):
                if op == "rename" and path.endswith(".idx"):
                    raise OSError(28, "No space left on device")

            self.hook = hook

    dst = Store(str(tmp_path / "dst"), io=FailingIO())
    dst.ensure_initialized()
    with pytest.raises(OSError, match="No space"):
        import_bundle(dst, str(out))
    s = Store(dst.root)
    assert list(s.refs.groups()) == [] and not list(s.iter_ids())
    assert [n for n in os.listdir(s.pack_dir) if not n.endswith(".pack")] == []
    rep = fsck(s)
    assert rep.clean and rep.objects == 0


# ------------------------------------------------------------------ corruption


@pytest.mark.slow
def test_every_flipped_bit_of_a_small_bundle_is_refused(tmp_path):
    data = (HOSTILE / "valid.kxb").read_bytes()
    assert verify_bundle(str(HOSTILE / "valid.kxb")).objects == 3
    path = tmp_path / "m.kxb"
    dst = Store(str(tmp_path / "dst"))
    dst.ensure_initialized()
    before = state(dst.root)
    for i in range(len(data)):
        for bit in range(8):
            m = bytearray(data)
            m[i] ^= 1 << bit
            path.write_bytes(bytes(m))
            with pytest.raises(BadBundle):
                verify_bundle(str(path))
            if bit == i % 8:  # one bit per byte through the whole import path too
                with pytest.raises(BadBundle):
                    import_bundle(dst, str(path))
    assert state(dst.root) == before and not list(Store(dst.root).refs.groups())


def test_flipped_bits_in_a_compressed_bundle_with_a_dictionary_are_refused(tmp_path):
    s = Store(str(tmp_path / "s"))
    chain(s, "ses/big", 70, tag="a session whose messages are long and alike, as agent transcripts are " * 6)
    out = tmp_path / "big.kxb"
    info = export_bundle(s, ["ses/big"], out)
    assert info.capabilities == ("zstd-dict",)
    data = out.read_bytes()
    rng = random.Random(7)
    # Every byte of the header and the dictionary's start, of the trailers, and a sample of the rest.
    positions = sorted(set(list(range(0, 300)) + list(range(len(data) - 80, len(data))) + rng.sample(range(len(data)), 300)))
    path = tmp_path / "m.kxb"
    for i in positions:
        m = bytearray(data)
        m[i] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(m))
        with pytest.raises(BadBundle):
            verify_bundle(str(path))


# ------------------------------------------------------------------ streaming


def _peaks(tmp_path: Path, mib: int) -> dict[str, int]:
    s = Store(str(tmp_path / f"s{mib}"))
    rng = random.Random(mib)
    with s.step("ses/big") as step:
        prev = None
        for i in range(mib):
            blob = step.put("blob", rng.randbytes(1 << 20))  # incompressible
            v = {"i": i, "out": blob, "note": "small messages between the big outputs " * 4}
            if prev:
                v["parent"] = prev
            prev = step.put("message", v)
        step.update("head", None, prev)
        step.commit("t")
    out = tmp_path / f"big{mib}.kxb"
    dst = Store(str(tmp_path / f"dst{mib}"))
    peaks = {}
    for name, fn in [("export", lambda: export_bundle(s, ["ses/big"], out)),
                     ("verify", lambda: verify_bundle(str(out))),
                     ("import", lambda: import_bundle(dst, str(out)))]:
        tracemalloc.start()
        try:
            fn()
            peaks[name] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert os.path.getsize(out) > mib << 20
    assert fsck(Store(dst.root)).clean
    return peaks


def test_export_import_and_verify_memory_does_not_grow_with_the_bundle(tmp_path):
    small, big = _peaks(tmp_path, 12), _peaks(tmp_path, 48)
    for step in ("export", "verify", "import"):
        assert big[step] < 12 << 20, (step, big)  # a few objects' worth, not 48 MiB
        assert big[step] < small[step] + (2 << 20), (step, small, big)  # and no more for 4x the bundle


# ------------------------------------------------------------------ fast paths: the same answers


def _outcome(path: str):
    try:
        i = verify_bundle(path)
        return ("ok", i.objects, i.object_bytes, i.pack_bytes, i.file_bytes, i.digest, dict(i.kinds))
    except BadBundle as e:
        return ("bad", str(e))


def test_reading_in_any_piece_size_gives_the_same_answers(tmp_path, monkeypatch):
    """The reader's read-ahead is invisible: every hostile file, and every cut
    and some flipped bits of a bundle with a dictionary, get the same answer
    (the same error, at the same offset) whatever the piece size."""
    s = Store(str(tmp_path / "s"))
    chain(s, "ses/big", 70, tag="a session whose messages are long and alike, as agent transcripts are " * 6)
    out = tmp_path / "big.kxb"
    assert export_bundle(s, ["ses/big"], out).capabilities == ("zstd-dict",)
    data = out.read_bytes()
    rng = random.Random(11)
    paths = [str(p) for p in sorted(HOSTILE.iterdir()) if p.suffix in (".kxb", ".json")]
    for i, cut in enumerate(sorted(set(range(0, 120)) | set(range(len(data) - 80, len(data) + 1)) | set(rng.sample(range(len(data)), 60)))):
        p = tmp_path / f"cut{i}.kxb"
        p.write_bytes(data[:cut])
        paths.append(str(p))
    for i in range(40):
        m = bytearray(data)
        m[rng.randrange(len(m))] ^= 1 << rng.randrange(8)
        p = tmp_path / f"flip{i}.kxb"
        p.write_bytes(bytes(m))
        paths.append(str(p))
    (tmp_path / "garbage.kxb").write_bytes(data + b"\0")
    paths.append(str(tmp_path / "garbage.kxb"))
    want = {p: _outcome(p) for p in paths}
    assert want[paths[-1]][0] == "bad" and want[str(tmp_path / "flip0.kxb")][0] == "bad"
    assert sum(w[0] == "ok" for w in want.values()) == 1 + sum(n.startswith("valid") for n in os.listdir(HOSTILE))  # the whole cut
    for piece in (1, 3, 57, 1000):
        monkeypatch.setattr(hashing_reader_mod, "_READ_CHUNK", piece)
        assert {p: _outcome(p) for p in paths} == want, piece


def test_export_writes_the_same_bundle_whatever_it_keeps_in_memory(src, tmp_path, monkeypatch):
    chain(src, "ses/a", 70, tag="a session whose messages are long and alike, as agent transcripts are " * 6)
    want = export_bundle(src, ["ses/a", "ses/b"], tmp_path / "want.kxb")
    assert want.capabilities == ("zstd-dict",)
    for budget in (0, 5000, 1 << 30):
        monkeypatch.setattr(export_mod, "EXPORT_KEEP_BUDGET", budget)
        got = export_bundle(src, ["ses/a", "ses/b"], tmp_path / f"k{budget}.kxb")
        assert (tmp_path / f"k{budget}.kxb").read_bytes() == (tmp_path / "want.kxb").read_bytes()
        assert got == want.__class__(**{**want.__dict__, "path": got.path})


def test_import_finds_loose_objects_by_listing_or_by_stat(src, tmp_path, monkeypatch):
    out = tmp_path / "ab.kxb"
    info = export_bundle(src, ["ses/a", "ses/b"], out)
    objs = list(iter_bundle_objects(str(out)))
    for cap in (None, 0):
        dst = Store(str(tmp_path / f"dst{cap}"))
        with dst.batch():
            for o in objs[::3]:  # a third of them already here, loose
                dst.put_raw(o)
        if cap is not None:  # every non-empty fan-out dir is "too big to list": a stat per lookup
            monkeypatch.setattr(LooseNames, "MIN_CAP", cap)
            monkeypatch.setattr(LooseNames, "PER_LOOKUP", cap)
        names = LooseNames(dst.loose, len(objs))
        for o in objs:
            assert names.has(o.id) == dst.loose.has(o.id)
        assert not names.has(b"\xee" * 32)
        assert (None in names.names.values()) == (cap is not None)
        res = import_bundle(dst, str(out))
        assert res.new_objects == info.objects - len(objs[::3])
        assert refs_of(dst, "ses/a", "ses/b") == refs_of(src, "ses/a", "ses/b")
        assert fsck(Store(dst.root)).clean
        assert import_bundle(dst, str(out)).new_objects == 0
        monkeypatch.undo()


def test_a_bundle_that_cannot_be_read_is_one_bad_bundle_and_imports_nothing(src, tmp_path):
    bundle = str(tmp_path / "a.kxb")
    export_bundle(src, ["ses/a"], bundle)
    disk = FaultyIO(1, errno.EIO, reads=True)  # the first read is the bundle's open
    with pytest.raises(BadBundle, match="cannot open: Input/output error") as ei:
        verify_bundle(bundle, io=disk)
    assert ei.value.where == bundle and disk.faults == 1
    dst = Store(str(tmp_path / "dst"), io=FaultyIO(None, reads=True))
    dst.io.fail_at = dst.io.read_count + 1
    with pytest.raises(BadBundle, match="cannot open"):
        import_bundle(dst, bundle)
    assert not dst.refs.read("ses/a").exists and list(dst.iter_ids()) == []


def test_the_bundle_package_exports_a_sorted_all_of_its_modules_public_names():
    import kxen_agent.store.bundle as pkg

    names = ("closure", "export", "hashing_reader", "header", "import_", "json_form", "pack_form", "verify")
    mods = [importlib.import_module(f"kxen_agent.store.bundle.{n}") for n in names]
    assert pkg.__all__ == sorted(pkg.__all__)
    assert set(pkg.__all__) == set().union(*(m.__all__ for m in mods))
    assert all(getattr(pkg, n) is getattr(m, n) for m in mods for n in m.__all__)
    assert all(m.__all__ == sorted(m.__all__) for m in mods)


# ------------------------------------------------------------------ CLI


def test_bundle_verify_command(src, tmp_path, capsys, monkeypatch):
    register(cli_main.app)
    monkeypatch.setenv("KXEN_AGENT_STATE_DIR", str(tmp_path / "no-state-dir-needed"))
    out = tmp_path / "ab.kxb"
    info = export_bundle(src, ["ses/a", "ses/b"], out)
    assert cli_main.main(["bundle", "verify", str(out)]) == 0
    text, err = capsys.readouterr()
    assert err == "" and f"{info.objects} objects" in text and info.digest in text
    assert f"{src.refs.get('ses/b', 'head').hex()} ses/b/head" in text
    assert cli_main.main(["bundle", "verify", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr()[0])
    assert doc["objects"] == info.objects and doc["refs"]["ses/a"]["head"] == src.refs.get("ses/a", "head").hex()
    assert cli_main.main(["bundle", "verify", str(HOSTILE / "ref-to-missing-object.kxb")]) == 1
    text, err = capsys.readouterr()
    assert text == "" and len(err.strip().splitlines()) == 1 and "ref ses/demo/old points to object" in err
    assert not os.path.exists(tmp_path / "no-state-dir-needed")
