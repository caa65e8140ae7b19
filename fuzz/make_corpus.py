"""Generate the fuzz seed corpora and the crafted hostile inputs.

    .venv/bin/python fuzz/make_corpus.py            # both
    .venv/bin/python fuzz/make_corpus.py --seeds    # fuzz/corpus/<target>/ only
    .venv/bin/python fuzz/make_corpus.py --hostile  # fuzz/hostile/ only (deterministic)
    .venv/bin/python fuzz/make_corpus.py --derived  # fuzz/corpus/{schema,json}/ from the committed seeds

Seeds (``fuzz/corpus/<target>/``) are made from *real* objects: a state dir
filled by the library itself — runs of a script agent with tool calls
(messages, a blob, run states, journal entries, the agent lock, session
metadata) in a real Git workspace, a fork, and a second session of many
similar messages whose pack carries a zstd dictionary — then packed by gc
and exported as bundles in both forms. Session ids and timestamps are
random, so regenerating changes the bytes (not what they exercise). The
files are named ``<what>-<12 hex of sha1>``.

Hostile inputs (``fuzz/hostile/{object,loose,pack}/``, with ``MANIFEST.json``
mapping each file to the error it must produce) are built byte by byte,
every checksum right except where the defect is; zstd frames are
hand-assembled, so regenerating gives the same bytes. Hostile *bundles*
live in ``tests/store/hostile/`` (that corpus is reused, not copied).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import blake3  # noqa: E402


def _load_targets():
    # By path: under pytest, ``fuzz`` may name the tests/fuzz package.
    name = "kxen_fuzz_targets"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "targets.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


join_pack_input = _load_targets().join_pack_input
rebuild_index = _load_targets().rebuild_index
from kxen_agent.store import Store, codec, gc  # noqa: E402
from kxen_agent.store.fsio import FileIO  # noqa: E402
from kxen_agent.store.objects import MAX_OBJECT_SIZE, encode_object  # noqa: E402
from kxen_agent.store.pack import PackReader, encode_index  # noqa: E402

CORPUS = os.path.join(HERE, "corpus")
HOSTILE = os.path.join(HERE, "hostile")
_BUNDLE_CORPUS = os.path.join(ROOT, "tests", "store", "hostile", "make_corpus.py")


def _bundle_corpus():
    """The hostile-bundle generator, for its byte-level helpers (entries, packs, zstd frames)."""
    spec = importlib.util.spec_from_file_location("kxen_hostile_bundles", _BUNDLE_CORPUS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _NoSyncIO(FileIO):
    def _fsync_fd(self, fd: int) -> None:
        self.fsyncs += 1


# ================================================================== seeds

STEPS = [
    {"content": "Looking around.", "tool_calls": [
        {"name": "shell", "arguments": {"command": "echo effect >> effects.txt"}},
        {"name": "write_file", "arguments": {"path": "big.txt", "content": "kxen fuzz seed\n" * 90}},
    ]},
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]},
    {"content": "done"},
]


def _git_workspace(path: str) -> str:
    os.makedirs(path)
    ident = ["-c", "user.name=kxen fuzz", "-c", "user.email=fuzz@kxen.invalid", "-c", "commit.gpgsign=false"]
    with open(os.path.join(path, "README.md"), "w") as f:
        f.write("# fuzz seed workspace\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "initial"]):
        subprocess.run(["git", *ident, *args], cwd=path, check=True, capture_output=True)
    return path


def _name(what: str, data: bytes) -> str:
    return f"{what}-{hashlib.sha1(data).hexdigest()[:12]}"


def _put(target: str, what: str, data: bytes, out: dict[str, dict[str, bytes]]) -> None:
    out.setdefault(target, {})[_name(what, data)] = data


def _pack_files(store: Store) -> list[tuple[bytes, bytes]]:
    out = []
    for name in sorted(os.listdir(store.pack_dir)):
        if name.endswith(".pack"):
            base = os.path.join(store.pack_dir, name[:-5])
            with open(base + ".pack", "rb") as f, open(base + ".idx", "rb") as g:
                out.append((f.read(), g.read()))
    return out


N_MSGS, N_LINES = 64, 17


def seeds() -> dict[str, dict[str, bytes]]:
    """target -> file name -> bytes."""
    from kxen_agent.runtime.runner import Runner
    from kxen_agent.session.agent_def import default_agent_definition
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.session.transfer import export_sessions
    from kxen_agent.session.workspace import inspect_workspace

    out: dict[str, dict[str, bytes]] = {}
    tmp = tempfile.mkdtemp(prefix="kxen-corpus-")
    old_ttl = os.environ.get("KXEN_AGENT_LEASE_TTL_S")
    os.environ["KXEN_AGENT_LEASE_TTL_S"] = "3600"  # no lease renewer thread writes meanwhile
    try:
        ws = _git_workspace(os.path.join(tmp, "ws"))
        store = Store(os.path.join(tmp, "state"), io=_NoSyncIO())
        runner = Runner(store)
        res = runner.start(ws, "touch the workspace, then read it back", default_agent_definition(STEPS, name="seed"))
        assert res.status == "completed", res
        ss = SessionStore(store)
        fork = ss.fork(res.session)
        small = ss.create(default_agent_definition([{"content": "hi"}], name="tiny"), inspect_workspace(ws))
        head = ss.append_messages(None, [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}])
        from kxen_agent.store import RefUpdate

        store.refs.transaction(ss.group(small.id), [RefUpdate("head", None, head)], reason="seed")

        # Every loose object, as its file and as its object bytes (cbor: the body).
        for oid in sorted(store.loose.iter_ids()):
            obj = store.read_raw(oid)
            with open(store.loose.path(oid), "rb") as f:
                frame = f.read()
            if len(frame) <= 2048:
                _put("loose", f"loose-{obj.kind}", frame, out)
            if obj.kind != "blob":
                _put("cbor", f"body-{obj.kind}", obj.body, out)
            elif len(obj.raw) <= 2048:
                _put("loose", "raw-blob", obj.raw, out)

        # Bundles: one tiny session, the run and its fork, in both forms.
        for sessions, what in (([small.id], "tiny"), ([res.session, fork.id], "run-fork")):
            for fmt in ("pack", "json"):
                path = os.path.join(tmp, f"{what}.{fmt}")
                export_sessions(store, sessions, path, fmt=fmt)
                with open(path, "rb") as f:
                    _put("bundle", f"{what}-{fmt}", f.read(), out)

        # Packs: gc packs everything reachable.
        gc(store, prune=None)
        for pack, idx in _pack_files(store):
            _put("pack", "gc", join_pack_input(idx, pack), out)

        # A session of many similar messages: its pack and bundle carry a zstd dictionary.
        store2 = Store(os.path.join(tmp, "state2"), io=_NoSyncIO())
        ss2 = SessionStore(store2)
        many = ss2.create(default_agent_definition([{"content": "hi"}], name="many"), inspect_workspace(ws))
        # Few objects that still train a dictionary worth its size (>= 32 samples, >= 64 KiB).
        msgs = [
            {"role": ("user", "assistant")[i % 2], "content": "".join(
                f"step {i}.{j}: module m{(i * j) % 17} built, {(i + j) % 13} warnings, see line {i * 31 + j}; "
                for j in range(N_LINES))}
            for i in range(N_MSGS)
        ]
        head = ss2.append_messages(None, msgs)
        store2.refs.transaction(ss2.group(many.id), [RefUpdate("head", None, head)], reason="seed")
        path = os.path.join(tmp, "many.kxb")
        info = export_sessions(store2, [many.id], path, fmt="pack")
        assert info.capabilities == ("zstd-dict",), info.capabilities
        with open(path, "rb") as f:
            _put("bundle", "dictionary", f.read(), out)
        gc(store2, prune=None)
        for pack, idx in _pack_files(store2):
            assert PackReader.open(os.path.join(store2.pack_dir, "pack-" + pack[-32:].hex())).dictionary
            _put("pack", "dictionary", join_pack_input(idx, pack), out)

        # Hand-made CBOR values at the edges of the model.
        for v in (0, 23, 24, 2**64 - 1, -(2**64), "", "ü", b"\x00" * 32, [], {}, [None, True, False],
                  {"a": 1, "bb": [2, {"c": b"\x01" * 32}]}, [[[[[]]]]]):
            _put("cbor", "edge", codec.encode(v), out)
    finally:
        if old_ttl is None:
            os.environ.pop("KXEN_AGENT_LEASE_TTL_S", None)
        else:
            os.environ["KXEN_AGENT_LEASE_TTL_S"] = old_ttl
        shutil.rmtree(tmp, ignore_errors=True)

    # Small packs assembled from objects (the fuzzer mutates small inputs fastest).
    hb = _bundle_corpus()
    objs = [hb.MSG, hb.BLOB, hb.SES]
    pack = hb.pack_section([hb.stored_entry(o) for o in objs])
    _put("pack", "three-stored", join_pack_input(_index_of(pack), pack), out)
    big = hb.BIG
    pack = hb.pack_section([hb.entry(big.id, _rle_object(big.raw), method=1, raw_len=len(big.raw))])
    _put("pack", "one-zstd", join_pack_input(_index_of(pack), pack), out)
    return out


def _rle_object(raw: bytes) -> bytes:
    """A zstd frame of ``raw`` = header (raw block) + one repeated byte (RLE block)."""
    hb = _bundle_corpus()
    body_start = raw.index(b"\x00") + 1
    fill = raw[-1]
    assert raw[body_start:] == bytes([fill]) * (len(raw) - body_start)
    return hb.zstd_two_block_frame(raw[:body_start], fill, len(raw) - body_start)


def _entries_of(pack: bytes) -> list[tuple[bytes, int, int]]:
    from kxen_agent.store.pack import parse_pack_header_prefix, scan_entries

    start = 12 + parse_pack_header_prefix(pack[:12], "x") + 4
    return [(e.id, e.crc, e.offset) for e in scan_entries(pack, start, len(pack) - 44, "x", has_dict=True)]


def _index_of(pack: bytes) -> bytes:
    es = _entries_of(pack)
    return encode_index([e[0] for e in es], [e[1] for e in es], [e[2] for e in es], pack[-32:])


def derived_seeds(made: dict[str, dict[str, bytes]]) -> dict[str, dict[str, bytes]]:
    """The ``schema`` and ``json`` seeds, made from the other targets' seeds.

    ``schema``: each object body of the ``cbor`` seeds, behind the byte that
    names its kind (``targets.schema_input``). ``json``: each JSON-form
    bundle of the ``bundle`` seeds and the hand-made JSON bundles of
    ``tests/store/hostile/``, behind a byte choosing the read size (0: one
    character at a time; 1: 257; 255: 65 281).
    """
    t = _load_targets()
    out: dict[str, dict[str, bytes]] = {}
    for name, body in sorted(made.get("cbor", {}).items()):
        if name.startswith("body-"):
            kind = name.split("-")[1]
            _put("schema", f"body-{kind}", t.schema_input(kind, body), out)
    hostile_dir = os.path.dirname(_BUNDLE_CORPUS)
    jsons = [(n, b) for n, b in sorted(made.get("bundle", {}).items()) if b.lstrip()[:1] == b"{"]
    jsons += [(f, open(os.path.join(hostile_dir, f), "rb").read())
              for f in sorted(os.listdir(hostile_dir)) if f.endswith(".json") and f != "MANIFEST.json"]
    for i, (name, data) in enumerate(jsons):
        if len(data) <= 16 << 10:
            _put("json", name.rsplit("-", 1)[0].removesuffix(".json"), bytes([(0, 1, 255)[i % 3]]) + data, out)
    return out


def _read_corpus(target: str) -> dict[str, bytes]:
    d = os.path.join(CORPUS, target)
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))} if os.path.isdir(d) else {}


def write_seeds(*, derived_only: bool = False) -> dict[str, int]:
    if derived_only:  # from the committed seeds: the other targets' seeds stay as they are
        made = derived_seeds({t: _read_corpus(t) for t in ("cbor", "bundle")})
    else:
        made = seeds()
        made.update(derived_seeds(made))
    sizes = {}
    for target, files in made.items():
        d = os.path.join(CORPUS, target)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for name, data in sorted(files.items()):
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        sizes[target] = sum(len(b) for b in files.values())
    return sizes


# ================================================================== hostile

ZSTD_MAGIC = bytes.fromhex("28b52ffd")
_BLOCK = 128 * 1024  # zstd's largest block


def rle_frame(declared: int, total: int, byte: int = 0, *, head: bytes = b"", window_log: int | None = None) -> bytes:
    """A zstd frame declaring ``declared`` bytes that expands to ``head`` + ``total`` copies of ``byte``.

    RLE blocks of 128 KiB: a few KiB of input for up to 64 MiB of output.
    Single segment with an 8-byte content size, unless ``window_log`` asks
    for a window descriptor (then the content size is still declared).
    """
    if window_log is None:
        fh = bytes([0b1110_0000])  # FCS 8 bytes, single segment
    else:
        fh = bytes([0b1100_0000, (window_log - 10) << 3])  # FCS 8 bytes, window descriptor
    out = bytearray(ZSTD_MAGIC + fh + declared.to_bytes(8, "little"))
    blocks: list[tuple[int, int, bytes]] = []
    if head:
        blocks.append((0, len(head), head))
    left = total
    while left > 0:
        n = min(left, _BLOCK)
        blocks.append((1, n, bytes([byte])))
        left -= n
    for i, (btype, size, payload) in enumerate(blocks):
        last = 1 if i == len(blocks) - 1 else 0
        out += (last | (btype << 1) | (size << 3)).to_bytes(3, "little") + payload
    return bytes(out)


def _frame(raw: bytes) -> bytes:
    """A hand-made frame holding ``raw`` in one raw block (no library compressor)."""
    return rle_frame(len(raw), 0, head=raw) if raw else rle_frame(0, 0)


def _crc(*parts: bytes) -> int:
    import zlib

    c = 0
    for p in parts:
        c = zlib.crc32(p, c)
    return c


def hostile() -> dict[str, tuple[bytes, str]]:
    """relative path -> (bytes, expected error substring; '' for an input that must be accepted)."""
    hb = _bundle_corpus()
    c: dict[str, tuple[bytes, str]] = {}
    limit = MAX_OBJECT_SIZE + 17  # the longest object bytes

    # -- object bytes (header, body)
    c["object/length-2pow64.obj"] = (b"blob 18446744073709551616\x00", "exceeds the limit")
    c["object/length-20-digits.obj"] = (b"message 99999999999999999999\x00", "exceeds the limit")
    c["object/length-leading-zero.obj"] = (b"blob 01\x00a", "bad header")
    c["object/no-nul.obj"] = (b"blob " + b"9" * 40, "bad header")
    c["object/kind-tree.obj"] = (b"tree 0\x00", "unknown kind 'tree'")
    deep = b"\x81" * 1_000 + b"\x00"
    c["object/message-deep-cbor.obj"] = (b"message %d\x00" % len(deep) + deep, "nesting deeper than 64")
    arr = bytes.fromhex("9b0000000100000000")
    c["object/message-array-2pow32.obj"] = (b"message %d\x00" % len(arr) + arr, "4294967296 elements")
    short = codec.encode({"parent": b"abc"})
    c["object/message-short-link.obj"] = (b"message %d\x00" % len(short) + short, "links must be 32-byte ids")
    tag = bytes.fromhex("a1") + codec.encode("l") + b"\xd8\x2a" + codec.encode(b"\x00" * 32)  # a DAG-CBOR link
    c["object/message-tag42-link.obj"] = (b"message %d\x00" % len(tag) + tag, "tags are not allowed")

    # -- loose frames
    c["loose/declares-64mib-plus-1.zst"] = (rle_frame(limit + 1, 3), "more than the limit")
    c["loose/declares-2pow63.zst"] = (rle_frame(2**63, 3), "more than the limit")
    c["loose/expands-past-declared.zst"] = (rle_frame(1000, 4 * _BLOCK), "does not decompress")
    c["loose/holds-less-than-declared.zst"] = (rle_frame(limit, 3), "does not decompress")
    # The largest object there is, 64 MiB + header, from 2 KiB: read in bounded memory.
    head = b"blob %d\x00" % MAX_OBJECT_SIZE
    c["loose/largest-blob.zst"] = (rle_frame(len(head) + MAX_OBJECT_SIZE, MAX_OBJECT_SIZE, ord("a"), head=head), "")
    # As large, but not an object: refused only after decompressing (bounded by the limit).
    c["loose/largest-garbage.zst"] = (rle_frame(limit, limit, 0), "bad header")
    c["loose/window-2pow27.zst"] = (rle_frame(limit, limit, 0, window_log=27), "bad header")
    # A 2 GiB window: refused on the frame header, although the declared
    # 100-byte content would bound a one-shot buffer (§5.1: at most 128 MiB).
    c["loose/window-2pow31.zst"] = (rle_frame(100, 100, 0, window_log=31), "window of 2147483648 bytes, more than the limit 134217728")
    # The same around a valid object: accepted before the window was judged.
    hb_head = b"blob 5\x00"
    c["loose/window-2pow31-valid-object.zst"] = (rle_frame(len(hb_head) + 5, 5, ord("a"), head=hb_head, window_log=31),
                                                 "window of 2147483648 bytes, more than the limit 134217728")
    skippable = bytes.fromhex("502a4d18") + (4).to_bytes(4, "little") + b"skip"
    good = _frame(encode_object("blob", b"x").raw)
    c["loose/skippable-then-frame.zst"] = (skippable + good, "24 bytes follow the zstd frame")
    c["loose/frame-then-skippable.zst"] = (good + skippable, "follow the zstd frame")
    c["loose/dictionary-id.zst"] = (ZSTD_MAGIC + bytes([0b1110_0001, 7]) + good[5:], "names dictionary 7; a loose object uses none")
    c["loose/checksum-flag-wrong.zst"] = (ZSTD_MAGIC + bytes([0b1110_0100]) + good[5:] + b"\x00\x00\x00\x00",
                                          "doesn't match checksum")
    c["loose/reserved-block-type.zst"] = (ZSTD_MAGIC + bytes([0b1110_0000]) + (5).to_bytes(8, "little")
                                          + (1 | (3 << 1) | (5 << 3)).to_bytes(3, "little") + b"hello",
                                          "does not decompress")

    # -- packs (name.pack + name.idx)
    objs = [hb.MSG, hb.BLOB, hb.SES]

    def pack_pair(name: str, pack: bytes, idx: bytes | None, why: str) -> None:
        c[f"pack/{name}.pack"] = (pack, why)
        c[f"pack/{name}.idx"] = ((rebuild_index(pack) or b"") if idx is None else idx, why)

    def idx_with(entries: list[tuple[bytes, int, int]], trailer: bytes, fan: list[int] | None = None) -> bytes:
        idx = bytearray(encode_index([e[0] for e in entries], [e[1] for e in entries], [e[2] for e in entries], trailer))
        if fan is not None:
            idx[8 : 8 + 1024] = struct.pack(">256I", *fan)
            idx[-32:] = blake3.blake3(bytes(idx[:-32])).digest()
        return bytes(idx)

    valid = hb.pack_section([hb.stored_entry(o) for o in objs])
    es = _entries_of(valid)
    pack_pair("valid", valid, None, "")
    fan = [0xFFFFFFFF] * 256
    pack_pair("fanout-2pow32", valid, idx_with(es, valid[-32:], fan), "does not fit its 4294967295 objects")
    fan = [3] * 256
    fan[0] = 5
    pack_pair("fanout-not-monotonic", valid, idx_with(es, valid[-32:], fan), "not monotonic")
    moved = [(i, c_, o + 10**12) for i, c_, o in es]
    pack_pair("offset-2pow40", valid, idx_with(moved, valid[-32:]), "outside the pack's entries")
    into = [(i, c_, len(valid) - 40) for i, c_, o in es]
    pack_pair("offset-into-trailer", valid, idx_with(into, valid[-32:]), "outside the pack's entries")
    mid = [(i, c_, o + 3) for i, c_, o in es]
    pack_pair("offset-mid-entry", valid, idx_with(mid, valid[-32:]), "bad entry magic")
    same = [(i, c_, es[0][2]) for i, c_, o in es]
    pack_pair("offsets-all-first", valid, idx_with(same, valid[-32:]), "which holds object")
    crcs = [(i, c_ ^ 1, o) for i, c_, o in es]
    pack_pair("index-crc-differs", valid, idx_with(crcs, valid[-32:]), "entry checksum differs")
    idx = bytearray(_index_of(valid))
    idx[1032 : 1032 + 64] = idx[1032 + 32 : 1032 + 64] + idx[1032 : 1032 + 32]  # swap two ids
    idx[-32:] = blake3.blake3(bytes(idx[:-32])).digest()
    pack_pair("index-ids-unsorted", valid, bytes(idx), "fanout disagrees")
    pack_pair("index-other-pack", valid, idx_with(es, b"\x01" * 32), "trailer does not match")
    pack_pair("empty-pack", b"", _index_of(valid), "empty file")
    pack_pair("one-byte-pack", b"K", _index_of(valid), "too short")
    pack_pair("empty-index", valid, b"", "too short")
    fake = hashlib.sha256(b"fake").digest()
    pack_pair("hash-mismatch", hb.pack_section([hb.entry(fake, hb.BLOB.raw)]), None, "not to its id")
    p = hb.pack_section([hb.entry(hb.BLOB.id, hb.BLOB.raw, raw_len=2**40, stored_len=len(hb.BLOB.raw))])
    pack_pair("entry-declares-2pow40", p, None, "1099511627776-byte object")
    p = hb.pack_section([hb.entry(hb.BLOB.id, hb.BLOB.raw, method=1, raw_len=len(hb.BLOB.raw), stored_len=2**40)])
    pack_pair("entry-stores-2pow40", p, None, "stores 1099511627776 bytes")
    bomb = rle_frame(limit, limit, 0)
    p = hb.pack_section([hb.entry(fake, bomb, method=1, raw_len=limit)])
    pack_pair("entry-64mib-bomb", p, None, "bad header")
    p = hb.pack_section([hb.entry(fake, rle_frame(5000, 5000, 0), method=1, raw_len=1000)])
    pack_pair("entry-frame-declares-more", p, None, "zstd frame declares")
    head = b"KXPK" + struct.pack(">II", 1, 2**31)
    pack_pair("dictionary-2pow31", head + struct.pack(">I", _crc(head)) + b"\x00" * 60, idx_with([], b"\x00" * 32),
              "exceeds the 1048576-byte limit")
    junk_dict = bytes.fromhex("37a430ec") + b"\x07\x00\x00\x00" + b"\xff" * 200  # zstd dictionary magic, garbage after
    p = hb.pack_section([hb.entry(hb.BIG.id, _rle_object(hb.BIG.raw), method=2, raw_len=len(hb.BIG.raw))],
                        dictionary=junk_dict)
    pack_pair("dictionary-garbage", p, None, "dictionary")
    p = hb.pack_section([hb.stored_entry(o) for o in objs], count=2**63)
    pack_pair("end-count-2pow63", p, None, "end record counts 9223372036854775808")
    big = hb.BIG.raw
    big_head = big[: big.index(b"\x00") + 1]
    wide = rle_frame(len(big), len(big) - len(big_head), big[-1], head=big_head, window_log=31)
    p = hb.pack_section([hb.entry(hb.BIG.id, wide, method=1, raw_len=len(big))])
    pack_pair("entry-window-2pow31", p, None, "window of 2147483648 bytes, more than the limit 134217728")
    return c


def write_hostile() -> None:
    made = hostile()
    shutil.rmtree(HOSTILE, ignore_errors=True)
    for rel, (data, _why) in made.items():
        path = os.path.join(HOSTILE, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    with open(os.path.join(HOSTILE, "MANIFEST.json"), "w") as f:
        json.dump({rel: why for rel, (_d, why) in sorted(made.items())}, f, indent=1, sort_keys=True)
        f.write("\n")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", action="store_true")
    ap.add_argument("--hostile", action="store_true")
    ap.add_argument("--derived", action="store_true",
                    help="only the schema and json seeds, from the committed cbor and bundle seeds")
    a = ap.parse_args(argv)
    both = not (a.seeds or a.hostile or a.derived)
    if a.derived:
        for target, n in sorted(write_seeds(derived_only=True).items()):
            print(f"corpus/{target}: {n} bytes")
    if a.seeds or both:
        for target, n in sorted(write_seeds().items()):
            print(f"corpus/{target}: {n} bytes")
    if a.hostile or both:
        write_hostile()
        print(f"hostile: {len(hostile())} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
