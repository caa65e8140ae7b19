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

Run under atheris (``python fuzz/targets.py TARGET [libFuzzer flags] DIRS``,
see ``fuzz/README.md``); the test suite calls the functions directly
(``tests/fuzz``). Scratch files go to a private directory under
``/dev/shm`` (or the system temp dir), removed at exit or by the next run.
"""

from __future__ import annotations

import atexit
import contextlib
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
    "fuzz_pack",
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


def _fsck_with_pack(pack: bytes, idx: bytes, d: str) -> None:
    """Install the pack in a state dir and run fsck: it must report, never raise."""
    store = Store(os.path.join(d, "state"), io=_IO)
    store.ensure_initialized()
    _IO.makedirs(store.pack_dir)
    base = os.path.join(store.pack_dir, "pack-" + (pack[-TRAILER_SIZE:].hex() if len(pack) >= TRAILER_SIZE else "0"))
    for ext, data in ((".pack", pack), (".idx", idx)):
        with open(base + ext, "wb") as f:
            f.write(data)
    rep = fsck(Store(store.root, io=_IO))
    assert rep.packed <= len(idx) // 32


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
        _fsck_with_pack(pack, idx, d)
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
        for dirpath, _dirs, files in os.walk(os.path.join(state_dir, sub)):
            out += [os.path.join(dirpath, f) for f in files]
    return sorted(out)


def check_bundle_file(path: str, state_dir: str) -> str:
    """Verify the bundle at ``path``, then import it into ``state_dir``; return
    ``"imported"`` or the refusal's reason. Checks that the two agree, that a
    refusal wrote nothing and that an import is complete and fsck-clean."""
    try:
        info = verify_bundle(path)
        refused: KxenError | None = None
    except KxenError as e:
        info, refused = None, e
    before = _written(state_dir)
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
    with _scratch() as d:
        path = os.path.join(d, "in.kxb")
        with open(path, "wb") as f:
            f.write(data)
        return check_bundle_file(path, os.path.join(d, "state"))


def fuzz_bundle(data: bytes) -> None:
    _check_bundle_bytes(data)
    fixed = fix_bundle(data)
    if fixed != data:
        _check_bundle_bytes(fixed)


# ================================================================== entry point

TARGETS: dict[str, Callable[[bytes], None]] = {
    "cbor": fuzz_cbor,
    "loose": fuzz_loose,
    "pack": fuzz_pack,
    "bundle": fuzz_bundle,
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
