"""A bundle's object bytes are bounded before anything is decompressed or hashed (``objects_spec.md`` §12.9, §12.13).

The reproduction: a real session, then 36 user messages whose text blobs
are 64 MiB of one letter each, each blob a zstd frame of a raw block and
512 RLE blocks (2 KiB): a 90 KB bundle declaring 2.4 GB of object bytes,
every id right. Before the bound, ``bundle verify`` took 25.5 s of CPU to
decompress and hash it all and said it was valid, and ``session import``
then let ``--resume`` read it. Now the header alone refuses it, in one line,
and neither command writes anything. The same kind of bundle, two messages
(128 MiB in 5 KB), shows the bound is what refuses it: the environment
variable that raises the ratio lets it verify.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import struct
import subprocess
from pathlib import Path
from typing import Callable

import blake3
import pytest

from kxen_agent.store import Store, codec
from kxen_agent.store.bundle import BadBundle, BundleLimits, verify_bundle
from kxen_agent.store.fsio import OS_IO
from kxen_agent.store.objects import MAX_OBJECT_SIZE, RawObject, decode_stored, encode_object, links_of
from tests.helpers import KXEN_AGENT, Cli, git_workspace, write_agent

ROOT = Path(__file__).resolve().parents[2]


def _corpus():
    spec = importlib.util.spec_from_file_location("kxen_hostile_bundles", ROOT / "tests" / "store" / "hostile" / "make_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


HB = _corpus()
ZSTD_MAGIC = bytes.fromhex("28b52ffd")
BLOCK = 128 << 10  # the largest zstd block


def letter_frame(head: bytes, fill: int, count: int) -> bytes:
    """A zstd frame of ``head`` (a raw block) then ``count`` bytes of ``fill`` (RLE blocks of 128 KiB): 4 bytes a block."""
    out = [ZSTD_MAGIC, bytes([0b1110_0000]), (len(head) + count).to_bytes(8, "little")]
    out.append(((1 if count == 0 else 0) | (len(head) << 3)).to_bytes(3, "little") + head)
    while count:
        n = min(count, BLOCK)
        count -= n
        out.append(((1 if count == 0 else 0) | (1 << 1) | (n << 3)).to_bytes(3, "little") + bytes([fill]))
    return b"".join(out)


def letter_blob(i: int, size: int = MAX_OBJECT_SIZE) -> tuple[bytes, bytes, int]:
    """A blob of ``size`` bytes of text (a number, then ``a``s): its id, its entry's frame, its object length."""
    head = b"blob %d\x00" % size + b"%d " % i
    count = size - (len(head) - len(b"blob %d\x00" % size))
    h = blake3.blake3(head)
    chunk = b"a" * (8 << 20)
    left = count
    while left:
        n = min(left, len(chunk))
        h.update(chunk[:n] if n < len(chunk) else chunk)
        left -= n
    return h.digest(), letter_frame(head, ord("a"), count), len(head) + count


def real_session(tmp: Path) -> tuple[str, dict[str, bytes], dict[bytes, RawObject]]:
    """A session the CLI ran in its own state dir: id, refs, every object its refs reach."""
    ws = git_workspace(tmp / "src-ws")
    agent = write_agent(tmp / "src-agent", [{"content": "done"}])
    kx = Cli(tmp / "src-state")
    ses = kx.run_json(ws, "hello", agent, expect=0).json()["session"]
    store = Store.open(str(tmp / "src-state"), namespaces=("sessions",))
    refs = dict(store.refs.read(f"sessions/{ses}").refs)
    objs: dict[bytes, RawObject] = {}
    stack = list(refs.values())
    while stack:
        oid = stack.pop()
        if oid not in objs:
            objs[oid] = store.read_raw(oid)
            stack.extend(links_of(objs[oid].kind, decode_stored(objs[oid])))
    return ses, refs, objs


def bomb(tmp: Path, n: int, size: int = MAX_OBJECT_SIZE) -> tuple[Path, str]:
    """A session bundle whose head is ``n`` user messages on the real session's, each with a text blob of ``size``."""
    ses, refs, objs = real_session(tmp)
    entries: dict[bytes, bytes] = {}  # id -> pack entry
    links: dict[bytes, list[bytes]] = {}
    raw_bytes = 0
    head = refs["head"]
    seq = decode_stored(objs[head])["seq"]
    for i in range(n):
        bid, frame, raw_len = letter_blob(i, size)
        entries[bid] = HB.entry(bid, frame, method=1, raw_len=raw_len)
        links[bid] = []
        raw_bytes += raw_len
        seq += 1
        msg = encode_object("message", {"seq": seq, "role": "user", "parent": head, "contentBlob": bid,
                                        "run": decode_stored(objs[refs["head"]]).get("run", "run_0")})
        objs[msg.id] = msg
        head = msg.id
    for oid, o in objs.items():
        entries[oid] = HB.stored_entry(o)
        links[oid] = list(links_of(o.kind, decode_stored(o))) if o.kind != "blob" else []
        raw_bytes += len(o.raw)
    new_refs = dict(refs, head=head)
    order: list[bytes] = []
    seen: set[bytes] = set()
    stack = [new_refs[k] for k in sorted(new_refs, reverse=True)]
    while stack:
        oid = stack.pop()
        if oid in seen:
            continue
        seen.add(oid)
        order.append(oid)
        stack.extend(reversed(links[oid]))
    header = codec.encode({"capabilities": [], "objects": len(order), "refs": {f"sessions/{ses}": new_refs},
                           "size": raw_bytes}, links_only=True)
    path = tmp / f"bomb-{n}.kxb"
    path.write_bytes(HB.bundle(header, HB.pack_section([entries[o] for o in order])))
    return path, ses


@pytest.fixture(scope="module")
def reproduction(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return bomb(tmp_path_factory.mktemp("bomb"), 36)


def child_cpu(run: Callable[[], subprocess.CompletedProcess]) -> tuple[subprocess.CompletedProcess, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cli(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("KXEN_AGENT_")}
    full.update(KXEN_AGENT_STATE_DIR=str(tmp / "state"), **(env or {}))
    return subprocess.run([KXEN_AGENT, *args], capture_output=True, text=True, env=full, timeout=120)


def test_the_reproduction_is_small_and_declares_2_4_gb(reproduction: tuple[Path, str]) -> None:
    path, _ = reproduction
    data = path.read_bytes()
    assert len(data) < 100_000, len(data)
    (hlen,) = struct.unpack(">I", data[12:16])
    header = codec.decode(data[16:16 + hlen], links_only=True)
    assert header["size"] > 2_400_000_000 and header["objects"] > 36


def test_verify_refuses_the_bomb_from_its_header_in_one_line(reproduction: tuple[Path, str], tmp_path: Path) -> None:
    path, _ = reproduction
    done, cpu = child_cpu(lambda: cli(tmp_path, "bundle", "verify", str(path)))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "object bytes in a file of" in lines[0] and "more than 256 times its size" in lines[0], lines[0]
    assert "KXEN_AGENT_BUNDLE_MAX_RATIO" in lines[0] and "(at byte 16)" in lines[0], lines[0]
    assert cpu < 5, f"bundle verify took {cpu:.1f} s of CPU"  # 25.5 s when it hashed 2.4 GB
    assert not (tmp_path / "state").exists()


def test_import_of_the_bomb_changes_nothing(reproduction: tuple[Path, str], tmp_path: Path) -> None:
    path, _ = reproduction
    ws = git_workspace(tmp_path / "ws")
    done, cpu = child_cpu(lambda: cli(tmp_path, "session", "import", str(path), "--workspace", str(ws)))
    assert done.returncode == 1 and "more than 256 times its size" in done.stderr, done.stderr
    assert cpu < 5, cpu
    assert not (tmp_path / "state").exists()
    # Into a state dir that holds a session of its own: not a byte changes.
    agent = write_agent(tmp_path / "agent", [{"content": "mine"}])
    kx = Cli(tmp_path / "state")
    kx.run_json(ws, "mine", agent, expect=0)
    before = {p: p.read_bytes() for p in sorted((tmp_path / "state").rglob("*")) if p.is_file()}
    done = cli(tmp_path, "session", "import", str(path), "--workspace", str(ws))
    assert done.returncode == 1 and "more than 256 times its size" in done.stderr, done.stderr
    assert {p: p.read_bytes() for p in sorted((tmp_path / "state").rglob("*")) if p.is_file()} == before
    kx.fsck_clean()


def test_the_limit_is_what_refuses_it(tmp_path: Path) -> None:
    """Three 64 MiB letters in 10 KB: refused by default, valid (ids and all) once the ratio is raised."""
    path, _ = bomb(tmp_path, 3)
    assert path.stat().st_size < 12000
    done = cli(tmp_path, "bundle", "verify", str(path))
    assert done.returncode == 1 and "more than 256 times its size" in done.stderr, done.stderr
    done = cli(tmp_path, "bundle", "verify", str(path), env={"KXEN_AGENT_BUNDLE_MAX_RATIO": "100000"})
    assert done.returncode == 0, done.stderr
    done = cli(tmp_path, "bundle", "verify", str(path),
               env={"KXEN_AGENT_BUNDLE_MAX_RATIO": "100000", "KXEN_AGENT_BUNDLE_MAX_BYTES": str(100 << 20)})
    assert done.returncode == 1 and "more than the 104857600 this reader accepts" in done.stderr, done.stderr
    assert "KXEN_AGENT_BUNDLE_MAX_BYTES" in done.stderr
    done = cli(tmp_path, "bundle", "verify", str(path), env={"KXEN_AGENT_BUNDLE_MAX_RATIO": "lots"})
    assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
    assert "KXEN_AGENT_BUNDLE_MAX_RATIO='lots' is not a positive whole number" in done.stderr


def test_two_largest_objects_are_always_accepted() -> None:
    """However small the file: a 64 MiB object of one letter is a real tool output, not a bomb."""
    limits = BundleLimits()
    assert limits.allowed(100) == 2 * (MAX_OBJECT_SIZE + 17)
    assert limits.allowed(1 << 20) == 256 << 20
    assert limits.allowed(1 << 40) == limits.max_bytes == 4 << 30
    assert limits.allowed(None) == limits.max_bytes


def test_a_header_that_understates_the_bytes_is_refused_before_the_entry_is_decompressed(tmp_path: Path) -> None:
    bid, frame, raw_len = letter_blob(0, 1 << 20)
    raw = b"blob %d\x00" % (1 << 20) + b"0 " + b"a" * ((1 << 20) - 2)
    assert blake3.blake3(raw).digest() == bid
    obj = RawObject(bid, "blob", raw, raw.index(b"\x00") + 1)
    header = codec.encode({"capabilities": [], "objects": 1, "refs": {"other/x": {"r": bid}}, "size": 1000},
                          links_only=True)
    path = tmp_path / "understated.kxb"
    path.write_bytes(HB.bundle(header, HB.pack_section([HB.entry(bid, frame, method=1, raw_len=raw_len)])))
    with pytest.raises(BadBundle) as bad:
        verify_bundle(str(path))
    # The entry's offset: refused from its header, not after decompressing it.
    assert (f"the objects hold more than the 1000 object bytes the header declares (this one has {len(raw)})"
            in str(bad.value)), bad.value
    assert bad.value.offset == 16 + len(header) + 4 + 16
    assert len(obj.raw) == raw_len


class _NoSize:
    """The default seam, except that the file's size cannot be asked (a pipe's case)."""

    def __getattr__(self, name: str):
        return getattr(OS_IO, name)

    def fstat(self, f):
        raise OSError("no size")


def test_without_the_file_s_size_the_ratio_is_held_as_it_reads(tmp_path: Path) -> None:
    path, _ = bomb(tmp_path, 9, 16 << 20)  # 144 MiB in a few KB: past the floor of two objects
    with pytest.raises(BadBundle) as bad:
        verify_bundle(str(path), io=_NoSize(), limits=BundleLimits(max_ratio=256))  # type: ignore[arg-type]
    assert "more than 256 times as many (a compression bomb?)" in str(bad.value), bad.value
    verify_bundle(str(path), io=_NoSize(), limits=BundleLimits(max_ratio=1 << 20))  # type: ignore[arg-type]


# ---------------------------------------------------------------- the header and the decode budget (§2.7, §12.7)


def _header_of_refs(names: int) -> bytes:
    """A pack-form header whose one group holds ``names`` refs (canonical CBOR built by hand: the encoder refuses it)."""
    oid = b"\x11" * 32
    small = codec.encode({"capabilities": [], "objects": 1, "refs": {"other/x": {"PLACEHOLDER": oid}}, "size": 7},
                         links_only=True)
    one = b"\xa1" + codec.encode("PLACEHOLDER") + codec.encode(oid)
    assert small.count(one) == 1
    inner = b"\xba" + names.to_bytes(4, "big") + b"".join(codec.encode("r%06d" % i) + codec.encode(oid)
                                                         for i in range(names))
    return small.replace(one, inner)


def test_a_10_mb_header_of_2pow18_refs_is_refused_as_a_header(tmp_path: Path) -> None:
    """Question (4) of the step-log issue: the decode budget governs a header, and the refusal says so."""
    header = _header_of_refs(1 << 18)
    assert 10_000_000 < len(header) < 16 << 20
    path = tmp_path / "refs.kxb"
    path.write_bytes(HB.bundle(header, HB.pack_section([])))
    done = cli(tmp_path, "bundle", "verify", str(path))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    err = done.stderr
    assert "header is over the decode budget: map declares 262144 entries" in err, err
    assert "524288 data items a bundle header may hold (at most 262139 group and ref names" in err, err
    assert "one object" not in err, err
    # The spec's vector (§12.7) is this refusal, word for word.
    spec = (ROOT / "objects_spec.md").read_text()
    block = spec[spec.index("bundle-header: over-budget"):]
    want = block[block.index("error: ") + 7: block.index("\n", block.index("error: "))]
    assert err.strip() == f"kxen-agent: error: bad bundle {path}: {want}", (err, want)


def test_the_largest_header_the_budget_allows_decodes(tmp_path: Path) -> None:
    """262 139 names is the bound exactly: one group and 262 138 refs decode, one more ref does not."""
    from kxen_agent.store.bundle import parse_bundle_header
    from kxen_agent.store.bundle.header import MAX_HEADER_NAMES, encode_bundle_head

    assert MAX_HEADER_NAMES == 262139
    for refs, ok in ((MAX_HEADER_NAMES - 1, True), (MAX_HEADER_NAMES, False)):
        head = encode_bundle_head(_header_of_refs(refs))
        hlen = struct.unpack(">I", head[12:16])[0]
        args = (head[:16], head[16:16 + hlen], head[16 + hlen:], "b")
        if ok:
            assert len(parse_bundle_header(*args).refs["other/x"]) == refs
        else:
            with pytest.raises(BadBundle, match="a bundle header may hold"):
                parse_bundle_header(*args)


def test_the_json_form_is_held_to_the_same_bound(tmp_path: Path) -> None:
    import json

    oid = "11" * 32
    groups = {"g/%06d" % i: {"r": oid} for i in range(131070)}  # 262140 names
    doc = {"format": "kxen-bundle", "version": 1, "capabilities": [], "refs": groups, "objectCount": 0,
           "objectBytes": 0, "objects": [], "digest": "00" * 32}
    path = tmp_path / "refs.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadBundle) as bad:
        verify_bundle(str(path))
    assert "header holds 262140 group and ref names, more than the 262139 a bundle header may hold" in str(bad.value)


def test_a_writer_refuses_a_header_past_the_bound_in_one_line() -> None:
    from kxen_agent.errors import UsageError
    from kxen_agent.store.bundle.header import _Header

    refs = {"g/%06d" % i: {"r": b"\x11" * 32} for i in range(131070)}
    with pytest.raises(UsageError, match="too many refs for one bundle: 262140 group and ref names"):
        _Header((), refs, 1, 7).cbor()


def test_the_json_form_declaring_a_bomb_is_refused_from_its_members(tmp_path: Path) -> None:
    """The JSON form holds no compression, but its members are judged by the same bound before any object."""
    import json

    doc = json.loads((ROOT / "tests" / "store" / "hostile" / "valid.json").read_text())
    doc["objectBytes"] = 150_000_000  # what 3 objects can hold, more than the floor a small file allows
    path = tmp_path / "bomb.json"
    path.write_text(json.dumps(doc))
    done = cli(tmp_path, "bundle", "verify", str(path))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "header declares 150000000 object bytes in a file of" in done.stderr, done.stderr
    assert "more than 256 times its size" in done.stderr, done.stderr
