#!/usr/bin/env python3
"""Fuzz targets: every parser that reads bytes someone else wrote.

Each target takes one input and either accepts it or refuses it with the
project's typed error (:class:`~kxen_agent.errors.KxenError`, and for the
CBOR decoder exactly :class:`~kxen_agent.store.codec.DecodeError`).
Anything else is a crash: another exception (``IndexError``,
``struct.error``, ``ZstdError``, ``RecursionError``, ``MemoryError``...) or
a broken invariant, raised as ``AssertionError``:

``cbor``
    :func:`codec.decode`. Whatever is accepted re-encodes to the same bytes
    (strict means canonical); ``links_only`` never accepts more.
``loose``
    The input as a loose object file (a zstd frame: decompress, parse the
    header, decode the body), read both from bytes and through
    :class:`LooseObjects` on disk; and the input as *object bytes*,
    compressed the way a writer does and read back. An accepted object is
    canonical: re-encoding its value gives the same bytes and id.
``pack``
    A pack and its index: :class:`PackReader` (open, look up and read every
    object, ``verify``) and :func:`scan_entries`. The input is a container
    (:func:`join_pack_input`: 4-byte big-endian index length, the index, the
    pack). Each input runs three times: as given; with every checksum
    recomputed (header CRC, entry CRCs, trailers — so mutations reach past
    the checksums into the structure); and with the index rebuilt from the
    pack's own entries (so they reach the object reads).
``bundle``
    The input as a bundle file: :func:`verify_bundle`, then
    :func:`import_bundle` into a fresh state dir. Verify and import must
    agree; a refused bundle writes no object, ref or pack; an accepted one
    imports completely and fsck is clean. A pack-form input runs a second
    time with its checksums recomputed.

``schema``
    The session layer's object shapes (``session/schema.py``, spec §14.10):
    the first byte picks the kind, the rest is the CBOR body. A body that
    decodes is judged: the check either raises ``SchemaViolation`` or
    returns well-formed (32-byte link, kind) pairs; a message's fast path
    and its slow, rule-naming path must agree; an accepted value must read
    as the readers read it (a message as a ``Message`` for the provider).
``json``
    The JSON bundle's incremental tokenizer (``bundle/json_form.py``,
    :class:`_JsonStream`), fed in chunks of 1 to 64 KiB characters chosen by
    the input: read as a document of members (as a bundle is read), it must
    give exactly what ``json.loads`` with the same rules gives for the
    whole text (the same members and values, or a refusal), whatever the
    chunk size, and refuse only with ``BadBundle``.

Run under atheris (``python fuzz/targets.py TARGET [libFuzzer flags] DIRS``,
see ``fuzz/README.md``); the test suite calls the functions directly
(``tests/fuzz``). Scratch files go to a private directory under
``/dev/shm`` (or the system temp dir), removed at exit or by the next run.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import struct
import sys
import tempfile
from typing import Callable

if __name__ == "__main__":  # coverage feedback for the code under test only
    import atheris

    _instrumenting = atheris.instrument_imports(include=["kxen_agent"])
else:
    _instrumenting = contextlib.nullcontext()

with _instrumenting:
    import blake3

    from kxen_agent.errors import KxenError
    from kxen_agent.store import codec, fsck
    from kxen_agent.store.bundle import BUNDLE_MAGIC, import_bundle, verify_bundle
    from kxen_agent.store.fsio import FileIO
    from kxen_agent.store.loose import LooseObjects
    from kxen_agent.store.objects import (
        CorruptObject,
        SchemaViolation,
        compress_loose,
        decode_body,
        decompress_loose,
        encode_object,
        hash_bytes,
        links_of,
        parse_object,
    )
    from kxen_agent.store.pack import (
        END_SIZE,
        ENTRY_HEADER_SIZE,
        ENTRY_MAGIC,
        PACK_PREFIX_SIZE,
        TRAILER_SIZE,
        BadPack,
        PackReader,
        crc32,
        encode_index,
        parse_pack_header_prefix,
        scan_entries,
    )
    from kxen_agent.store.repo import Store
    from kxen_agent.session import schema as session_schema
    from kxen_agent.store.bundle.header import BadBundle
    from kxen_agent.store.bundle.json_form import _JsonStream

__all__ = [
    "TARGETS",
    "check_bundle_file",
    "check_loose_frame",
    "check_pack",
    "fix_bundle",
    "fix_index",
    "fix_pack",
    "fuzz_bundle",
    "fuzz_cbor",
    "fuzz_loose",
    "fuzz_json",
    "fuzz_pack",
    "fuzz_schema",
    "join_pack_input",
    "rebuild_index",
    "split_pack_input",
]

#: Objects read back per pack input (each read may decompress up to one object).
MAX_READS = 16

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_CRC_AT = ENTRY_HEADER_SIZE - 4  # the entry CRC covers the header up to itself
_STORED_AT = ENTRY_HEADER_SIZE - 12  # the stored length, before the CRC
_BUNDLE_PREFIX = 16  # magic, version, header length


class _NoSyncIO(FileIO):
    """Real files, no fsync: durability is not what the fuzzer checks, speed is."""

    def _fsync_fd(self, fd: int) -> None:
        self.fsyncs += 1


_IO = _NoSyncIO()
_ROOT: str | None = None


def _root() -> str:
    """This process's scratch dir, ``kxen-fuzz-<pid>-*``.

    libFuzzer exits without running ``atexit`` handlers, so the dirs of
    processes that are gone are removed here, when the next one starts.
    """
    global _ROOT
    if _ROOT is None:
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        for name in os.listdir(base):
            m = re.fullmatch(r"kxen-fuzz-(\d+)-.*", name)
            if m and not _alive(int(m.group(1))):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        _ROOT = tempfile.mkdtemp(prefix=f"kxen-fuzz-{os.getpid()}-", dir=base)
        atexit.register(shutil.rmtree, _ROOT, True)
    return _ROOT


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _scratch():
    d = tempfile.mkdtemp(dir=_root())
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class _ReusedStateDir:
    """One state dir per process, put back to its first state after every input.

    Making a state dir (its 256 fan-out directories and the rest of the
    skeleton) and removing it again cost ~15 ms, most of what the ``pack``
    and ``bundle`` targets spent per input (profiled: 60 % and 70 %), which
    made the long runs of ``fuzz/long.py`` take days. The dir is made once;
    :meth:`reset` removes every file and directory the input added (the
    store's own lock files aside, which never hold state) and checks that
    the skeleton is still whole, so each input still starts from a fresh
    state dir.

    ``version`` 1 makes a state dir of format version 1 holding only
    ``objects/pack/`` (no skeleton: fsck has 256 fewer directories to list);
    a reader accepts it as it is (``objects_spec.md`` §10.2), but the first
    write upgrades it, so only read-only checks may use one.
    """

    def __init__(self, version: int) -> None:
        self.version = version
        self._root: str | None = None
        self._skeleton: set[str] = set()

    @property
    def root(self) -> str:
        if self._root is None:
            self._root = os.path.join(tempfile.mkdtemp(dir=_root()), "state")
            if self.version == 1:
                os.makedirs(os.path.join(self._root, "objects", "pack"))
                with open(os.path.join(self._root, "FORMAT"), "wb") as f:
                    f.write(b"kxen-agent-state 1\n")
            else:
                Store(self._root, io=_IO).ensure_initialized()
            self._skeleton = self._dirs()
        return self._root

    def _dirs(self) -> set[str]:
        return set(_tree(self.root)[0])

    def reset(self) -> None:
        root = self.root
        locks = os.path.join(root, "locks") + os.sep
        dirs, files = _tree(root)
        for path in files:
            if path == os.path.join(root, "FORMAT"):
                continue
            if path.startswith(locks) and path.endswith((".lock", ".lease")):
                continue  # empty lock files: no state, and the store's lock objects keep their paths
            os.unlink(path)
        for path in reversed(dirs):  # deepest first
            if path not in self._skeleton and not os.listdir(path):
                os.rmdir(path)
        assert set(dirs) >= self._skeleton, "an input removed a skeleton directory"


def _tree(root: str) -> tuple[list[str], list[str]]:
    """(directories, other files) under ``root``, parents before children.

    ``os.scandir`` and the entries' cached types: ``os.walk`` would stat
    each entry again, which over a state dir's ~270 directories cost more
    than the input it checks.
    """
    dirs, files = [root], []
    i = 0
    while i < len(dirs):
        with os.scandir(dirs[i]) as it:
            for e in it:
                (dirs if e.is_dir(follow_symlinks=False) else files).append(e.path)
        i += 1
    return dirs, files


_PACK_STATE = _ReusedStateDir(version=1)
_BUNDLE_STATE = _ReusedStateDir(version=2)


# ================================================================== cbor


def fuzz_cbor(data: bytes) -> None:
    try:
        value = codec.decode(data)
    except codec.DecodeError as e:
        assert 0 <= e.offset <= len(data), f"error offset {e.offset} outside the {len(data)}-byte input"
        try:
            codec.decode(data, links_only=True)
        except codec.DecodeError:
            return
        raise AssertionError("links_only accepted bytes the plain decoder refused")
    again = codec.encode(value)
    assert again == data, f"accepted bytes re-encode differently: {data.hex()} -> {again.hex()}"
    try:
        linked = codec.decode(data, links_only=True)
    except codec.DecodeError:
        return
    assert codec.encode(linked, links_only=True) == data


# ================================================================== loose


def check_loose_frame(frame: bytes) -> bool:
    """Read ``frame`` as a loose object file; True if it holds a valid object."""
    try:
        raw = decompress_loose(frame, "fuzz")
        obj = parse_object(raw, "fuzz")
        value = decode_body(obj)
    except CorruptObject:
        return False
    again = encode_object(obj.kind, value)
    assert again.raw == raw and again.id == obj.id, "an accepted object is not canonical"
    assert all(type(x) is bytes and len(x) == 32 for x in links_of(obj.kind, value))
    return True


def _check_loose_on_disk(frame: bytes, valid: bool) -> None:
    """The same frame through :class:`LooseObjects` (the store's reader of files)."""
    with _scratch() as d:
        loose = LooseObjects(os.path.join(d, "objects"), _IO)
        wrong = hash_bytes(b"not the content" + frame)
        for oid in [wrong] + ([hash_bytes(decompress_loose(frame, "fuzz"))] if valid else []):
            path = loose.path(oid)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(frame)
            try:
                got = loose.read_raw(oid)
            except CorruptObject:
                assert oid == wrong or not valid, "LooseObjects refused a frame that reads from bytes"
                continue
            assert oid != wrong, "LooseObjects returned an object stored under someone else's id"
            assert got is not None and got.id == oid
            assert loose.read_path(path).id == oid


def fuzz_loose(data: bytes) -> None:
    valid = check_loose_frame(data)
    _check_loose_on_disk(data, valid)
    # The input as object bytes, stored as a writer stores them.
    check_loose_frame(compress_loose(data))


# ================================================================== pack


def split_pack_input(data: bytes) -> tuple[bytes, bytes]:
    """(index, pack) from the container :func:`join_pack_input` makes."""
    if len(data) < 4:
        return b"", data
    n = min(_U32.unpack_from(data)[0], len(data) - 4)
    return data[4 : 4 + n], data[4 + n :]


def join_pack_input(idx: bytes, pack: bytes) -> bytes:
    return _U32.pack(len(idx)) + idx + pack


def _entries(pack: bytes | bytearray) -> tuple[int | None, list[tuple[int, int]]]:
    """(data start, [(offset, end)]) of the entries a writer would have laid out.

    Walks entry headers by their stored lengths only (no other check), up to
    where the end record and trailer would begin.
    """
    if len(pack) < PACK_PREFIX_SIZE:
        return None, []
    try:
        dlen = parse_pack_header_prefix(bytes(pack[:PACK_PREFIX_SIZE]), "fuzz")
    except BadPack:
        return None, []
    start = PACK_PREFIX_SIZE + dlen + 4
    if start > len(pack):
        return None, []
    limit = len(pack) - TRAILER_SIZE - END_SIZE
    out = []
    pos = start
    while pos + ENTRY_HEADER_SIZE <= limit and pack[pos : pos + 4] == ENTRY_MAGIC:
        end = pos + ENTRY_HEADER_SIZE + _U64.unpack_from(pack, pos + _STORED_AT)[0]
        if end > limit:
            break
        out.append((pos, end))
        pos = end
    return start, out


def fix_pack(pack: bytes) -> bytes:
    """``pack`` with its header CRC, every entry CRC and its trailer recomputed."""
    b = bytearray(pack)
    start, entries = _entries(b)
    if start is not None:
        b[start - 4 : start] = _U32.pack(crc32(b[: start - 4]))
        for pos, end in entries:
            b[pos + _CRC_AT : pos + ENTRY_HEADER_SIZE] = _U32.pack(
                crc32(b[pos : pos + _CRC_AT], b[pos + ENTRY_HEADER_SIZE : end])
            )
    if len(b) >= TRAILER_SIZE:
        b[-TRAILER_SIZE:] = blake3.blake3(b[:-TRAILER_SIZE]).digest()
    return bytes(b)


def fix_index(idx: bytes, pack: bytes) -> bytes:
    """``idx`` naming ``pack``'s trailer, with its own trailer recomputed."""
    if len(idx) < 2 * TRAILER_SIZE or len(pack) < TRAILER_SIZE:
        return idx
    b = bytearray(idx)
    b[-2 * TRAILER_SIZE : -TRAILER_SIZE] = pack[-TRAILER_SIZE:]
    b[-TRAILER_SIZE:] = blake3.blake3(b[:-TRAILER_SIZE]).digest()
    return bytes(b)


def rebuild_index(pack: bytes) -> bytes | None:
    """An index of the entries found in ``pack`` (first copy of each id), or None."""
    start, entries = _entries(pack)
    if start is None or len(pack) < TRAILER_SIZE:
        return None
    ids, crcs, offsets = [], [], []
    for pos, _end in entries:
        oid = bytes(pack[pos + 5 : pos + 37])
        if oid in ids:
            continue
        ids.append(oid)
        crcs.append(_U32.unpack_from(pack, pos + _CRC_AT)[0])
        offsets.append(pos)
    return encode_index(ids, crcs, offsets, bytes(pack[-TRAILER_SIZE:]))


def _scan(pack: bytes) -> None:
    start, _ = _entries(pack)
    if start is None:
        return
    limit = max(start, len(pack) - TRAILER_SIZE - END_SIZE)
    skipped: list[tuple[int, int, str]] = []
    try:
        for _e in scan_entries(pack, start, limit, "fuzz", has_dict=True):
            pass
    except BadPack:
        pass
    for e in scan_entries(pack, start, limit, "fuzz", has_dict=True, resync=True,
                          skipped=lambda a, b, r: skipped.append((a, b, r))):
        assert start <= e.offset < e.end <= limit
    for a, b, _r in skipped:
        assert start <= a < b <= limit, (a, b)


def _fsck_with_pack(pack: bytes, idx: bytes) -> None:
    """Install the pack in a state dir and run fsck: it must report, never raise."""
    root = _PACK_STATE.root
    try:
        store = Store(root, io=_IO)
        base = os.path.join(store.pack_dir, "pack-" + (pack[-TRAILER_SIZE:].hex() if len(pack) >= TRAILER_SIZE else "0"))
        for ext, data in ((".pack", pack), (".idx", idx)):
            with open(base + ext, "wb") as f:
                f.write(data)
        rep = fsck(store)
        assert rep.packed <= len(idx) // 32
    finally:
        _PACK_STATE.reset()


def check_pack(pack: bytes, idx: bytes) -> bool:
    """Open, read and verify ``pack`` with index ``idx``; True if it verified.

    The reader's contract is the store's ``ObjectSource`` one, which fsck
    and gc rely on: opening and verifying raise :class:`BadPack`, reading an
    object returns it, or None, or raises :class:`CorruptObject` — nothing else.
    """
    _scan(pack)
    with _scratch() as d:
        path = os.path.join(d, "fuzz.pack")
        with open(path, "wb") as f:
            f.write(pack)
        try:
            reader = PackReader(path, idx, check_name=False)
        except BadPack:
            return False
        try:
            ids = list(reader.iter_ids())
            assert len(ids) == reader.count
            for oid in ids[:MAX_READS]:
                try:
                    obj = reader.read_raw(oid)
                except CorruptObject:
                    continue
                if obj is None:  # an unsorted index (which verify refuses) hides ids from the binary search
                    continue
                assert obj.id == oid, "a pack returned an object under another id"
                try:
                    decode_body(obj)
                except CorruptObject:
                    pass
            assert not reader.has(b"\x00" * 31) and reader.read_raw(b"\x00" * 33) is None
            try:
                reader.verify()
                verified = True
            except BadPack:
                verified = False
            if verified:
                for oid in ids:
                    assert reader.has(oid), f"a verified pack does not find its own id {oid.hex()}"
                    assert oid in reader.with_prefix(oid.hex()[:5])
        finally:
            reader.close()
    _fsck_with_pack(pack, idx)
    return verified


def fuzz_pack(data: bytes) -> None:
    idx, pack = split_pack_input(data)
    check_pack(pack, idx)
    fixed = fix_pack(pack)
    fixed_idx = fix_index(idx, fixed)
    if (fixed, fixed_idx) != (pack, idx):
        check_pack(fixed, fixed_idx)
    rebuilt = rebuild_index(fixed)
    if rebuilt is not None and rebuilt != fixed_idx:
        check_pack(fixed, rebuilt)


# ================================================================== bundle


def fix_bundle(data: bytes) -> bytes:
    """A pack-form bundle with its header CRC, pack checksums and trailer recomputed."""
    if not data.startswith(BUNDLE_MAGIC) or len(data) < _BUNDLE_PREFIX + 4 + TRAILER_SIZE:
        return data
    hlen = _U32.unpack_from(data, 12)[0]
    crc_at = _BUNDLE_PREFIX + hlen
    if crc_at + 4 > len(data) - TRAILER_SIZE:
        return data
    b = bytearray(data)
    b[crc_at : crc_at + 4] = _U32.pack(crc32(b[:crc_at]))
    b[crc_at + 4 : -TRAILER_SIZE] = fix_pack(bytes(b[crc_at + 4 : -TRAILER_SIZE]))
    b[-TRAILER_SIZE:] = blake3.blake3(b[:-TRAILER_SIZE]).digest()
    return bytes(b)


def _written(state_dir: str) -> list[str]:
    """Object, ref, reflog and pack files under ``state_dir`` (what an import must not leave behind)."""
    out = []
    for sub in ("objects", "refs", "logs"):
        if os.path.isdir(os.path.join(state_dir, sub)):
            out += _tree(os.path.join(state_dir, sub))[1]
    return sorted(out)


def check_bundle_file(path: str, state_dir: str, *, empty: bool = False) -> str:
    """Verify the bundle at ``path``, then import it into ``state_dir``; return
    ``"imported"`` or the refusal's reason. Checks that the two agree, that a
    refusal wrote nothing and that an import is complete and fsck-clean.
    ``empty``: the caller knows ``state_dir`` holds no object, ref or reflog."""
    try:
        info = verify_bundle(path)
        refused: KxenError | None = None
    except KxenError as e:
        info, refused = None, e
    before = [] if empty else _written(state_dir)
    store = Store(state_dir, io=_IO)
    try:
        res = import_bundle(store, path)
    except KxenError as e:
        assert refused is not None, f"verify accepted the bundle, import into an empty store refused it: {e}"
        assert type(e) is type(refused) and str(e) == str(refused), f"verify said {refused}, import said {e}"
        assert _written(state_dir) == before, "a refused import wrote files"
        return getattr(e, "reason", str(e))
    assert info is not None, f"verify refused the bundle ({refused}), import accepted it"
    assert res.info.digest == info.digest and res.info.objects == info.objects
    again = Store(state_dir, io=_IO)
    for group, refs in info.refs.items():
        assert again.refs.read(group).refs == dict(refs), f"ref group {group} not imported as the bundle says"
    rep = fsck(again)
    assert rep.clean, f"fsck after an import: {[p.line() for p in rep.problems]}"
    assert rep.objects >= info.objects
    return "imported"


def _check_bundle_bytes(data: bytes) -> str:
    root = _BUNDLE_STATE.root
    path = os.path.join(os.path.dirname(root), "in.kxb")
    try:
        with open(path, "wb") as f:
            f.write(data)
        return check_bundle_file(path, root, empty=True)
    finally:
        _BUNDLE_STATE.reset()


def fuzz_bundle(data: bytes) -> None:
    _check_bundle_bytes(data)
    fixed = fix_bundle(data)
    if fixed != data:
        _check_bundle_bytes(fixed)


# ================================================================== schema

#: The kinds the session schema judges, chosen by an input's first byte.
_SCHEMA_KINDS = ("message", "run", "journal", "session", "agent")
_KINDS_OR_BLOB = frozenset(_SCHEMA_KINDS) | {"blob"}


def schema_input(kind: str, body: bytes) -> bytes:
    """The ``schema`` target's input for a ``kind`` object of CBOR ``body``."""
    return bytes([_SCHEMA_KINDS.index(kind)]) + body


def fuzz_schema(data: bytes) -> None:
    if not data:
        return
    kind = _SCHEMA_KINDS[data[0] % len(_SCHEMA_KINDS)]
    try:
        value = codec.decode(data[1:], links_only=True)
    except codec.DecodeError:
        return
    try:
        links = session_schema.check(kind, value)
    except SchemaViolation as e:
        assert str(e) and "\n" not in str(e), f"a schema refusal is not one line: {e!r}"
        if kind == "message":
            _message_paths_agree(value, None)
        return
    assert type(links) is list
    for link, want in links:
        assert type(link) is bytes and len(link) == 32, f"schema returned a link that is not an id: {link!r}"
        assert want in _KINDS_OR_BLOB, f"schema asks for a link to kind {want!r}"
    if kind == "message":
        _message_paths_agree(value, links)
        _read_as_message(value)
    elif kind in ("run", "session"):
        # The readers compare these ids against the refs that name them.
        ref = f"runs/{value['id']}" if kind == "run" else "meta"
        ses = value["session"] if kind == "run" else value["id"]
        assert session_schema.misplaced(ses, ref, value) is None


def _message_paths_agree(value: object, links: list | None) -> None:
    """The fast path of the message check must say what the slow, rule-naming one says."""
    try:
        slow = session_schema._message_slow(value)
    except SchemaViolation:
        assert links is None, "the message fast path accepted what the slow path refuses"
        return
    assert links is not None, "the message slow path accepts what the fast path refused"
    assert sorted(slow) == sorted(links), f"the two message paths ask for other links: {links} vs {slow}"


def _read_as_message(value: dict) -> None:
    from kxen_agent.session.sessions import Message

    m = Message(oid=b"\0" * 32, seq=value["seq"], role=value["role"],
                content=value.get("content") if "contentBlob" not in value else "",
                run=value.get("run"), tool_calls=value.get("toolCalls", []),
                tool_call_id=value.get("toolCallId"), parent=value.get("parent"))
    d = m.to_provider()
    assert d["role"] in ("user", "assistant", "tool")
    for c in d.get("tool_calls", []):
        assert all(type(c[k]) is str for k in ("id", "name", "arguments"))
    m.to_json()


# ================================================================== json

_JSON_LIMIT = 1 << 16  # characters per member value: small, so that the limit is reached too


class _Chunked:
    """A binary stream that returns at most ``size`` bytes per read."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data = data
        self.size = size
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        n = self.size if n < 0 else min(n, self.size)
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out


def json_members(data: bytes, chunk: int) -> tuple[str, object]:
    """Read ``data`` as a bundle's top level is read: ``{``, then members, then the end.

    Returns ("ok", [(key, value)...]) or ("bad", reason).
    """
    js = _JsonStream(_Chunked(data, chunk), "fuzz")  # type: ignore[arg-type]
    js.CHUNK = chunk
    members: list[tuple[object, object]] = []
    try:
        js.expect("{")
        if js.peek() == "}":
            js.pos += 1
        else:
            while True:
                at = js.offset
                key = js.value(_JSON_LIMIT)
                # As the bundle reader reads its members: text keys, each once.
                if type(key) is not str:
                    raise js.bad("object keys must be strings", at)
                if any(k == key for k, _v in members):
                    raise js.bad(f"duplicate JSON key {key!r}", at)
                js.expect(":")
                members.append((key, js.value(_JSON_LIMIT)))
                c = js.peek()
                if c not in (",", "}"):
                    raise js.bad(f"expected ',' or '}}', found {c!r}")
                js.pos += 1
                if c == "}":
                    break
        if not js.at_eof():
            raise js.bad("trailing garbage")
    except BadBundle as e:
        assert e.offset is None or 0 <= e.offset <= len(data), f"offset {e.offset} outside the input"
        return "bad", e.reason
    return "ok", members


def _json_reference(data: bytes) -> tuple[str, object]:
    """What ``json`` says of the whole text, with the tokenizer's rules (no floats, no NaN, no duplicates)."""
    from kxen_agent.store.bundle import json_form

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "bad", "not UTF-8"
    pairs: list = []

    def top(p: list) -> dict:
        pairs.append(p)
        return json_form._no_dup_pairs(p)

    dec = json.JSONDecoder(object_pairs_hook=top, parse_float=json_form._no_float,
                           parse_constant=json_form._no_constant)
    try:
        ws = len(text) - len(text.lstrip(" \t\n\r"))
        value, end = dec.raw_decode(text, ws)
    except (ValueError, RecursionError, json_form._Reject) as e:
        return "bad", str(e)
    if text[end:].strip(" \t\n\r") or type(value) is not dict:
        return "bad", "not one object"
    return "ok", list(pairs[-1])


def fuzz_json(data: bytes) -> None:
    chunk = 1 + (data[0] if data else 0) * 256 if data[:1] else 1 << 16
    body = data[1:]
    got = json_members(body, chunk)
    whole = json_members(body, 1 << 20)
    # Which of two faults is named may differ (text is decoded ahead of the
    # parse: a bad UTF-8 byte further on can be met first), what is read may not.
    assert got == whole or got[0] == whole[0] == "bad", (
        f"the tokenizer reads differently in chunks of {chunk}: {got!r} vs {whole!r}")
    ref = _json_reference(body)
    if got[0] == "ok":
        assert ref[0] == "ok", f"the tokenizer accepted what json refuses ({ref[1]})"
        assert got[1] == ref[1], f"the tokenizer read {got[1]!r}, json {ref[1]!r}"
    elif ref[0] == "ok":
        # Refusing what json accepts is right only for the limit on a member's length.
        assert "longer than" in str(got[1]), f"the tokenizer refused JSON that json accepts: {got[1]}"


# ================================================================== entry point

TARGETS: dict[str, Callable[[bytes], None]] = {
    "cbor": fuzz_cbor,
    "loose": fuzz_loose,
    "pack": fuzz_pack,
    "bundle": fuzz_bundle,
    "schema": fuzz_schema,
    "json": fuzz_json,
}


def _ignoring(fn: Callable[[bytes], None], pattern: str | None) -> Callable[[bytes], None]:
    """``fn``, with exceptions matching ``pattern`` (``KXEN_FUZZ_IGNORE``) swallowed:
    to fuzz past a known, filed crash until it is fixed. Never used by the tests."""
    if not pattern:
        return fn
    rx = re.compile(pattern)

    def run(data: bytes) -> None:
        try:
            fn(data)
        except Exception as e:
            if not rx.search(f"{type(e).__name__}: {e}"):
                raise

    return run


def main(argv: list[str]) -> int:
    # The target is the first argument, or KXEN_FUZZ_TARGET (libFuzzer's
    # -fork and -minimize_crash re-run argv[0] with flags only).
    args = list(argv[1:])
    name = args.pop(0) if args and args[0] in TARGETS else os.environ.get("KXEN_FUZZ_TARGET")
    if name not in TARGETS:
        print(f"usage: {argv[0]} {{{','.join(TARGETS)}}} [libFuzzer flags] [CORPUS_DIR...]", file=sys.stderr)
        return 2
    os.environ["KXEN_FUZZ_TARGET"] = name
    import atheris

    atheris.Setup([argv[0], *args], _ignoring(TARGETS[name], os.environ.get("KXEN_FUZZ_IGNORE")))
    atheris.Fuzz()
    return 0  # pragma: no cover - atheris.Fuzz() exits the process


if __name__ == "__main__":
    sys.exit(main(sys.argv))
